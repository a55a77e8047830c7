"""One episode: its key in a run, and the record every consumer folds its events into.

``EpisodeKey`` says where an episode sits in a run (batch, task group, sample); the ids that
events carry (``s3-g1-e0``) are built and parsed here and nowhere else. ``EpisodeRecord`` is
what is known of one episode: the events that arrived, by kind and turn. The learner's
assembler (which checks each event before folding it), the OPD teacher, the trainer's batch
accounting, the episode runner and the ATIF export all read the same record
(docs/design.md §2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from thundersync.protocol import events as ev
from thundersync.protocol.errors import InvariantError
from thundersync.protocol.types import Trajectory, Turn

__all__ = ["EpisodeKey", "EpisodeRecord"]

_KEY = re.compile(r"(?:s(?P<step>\d+)|v)-g(?P<group>\d+)-e(?P<sample>\d+)")


@dataclass(frozen=True, slots=True, order=True)
class EpisodeKey:
    """Episode ``sample`` of task group ``group`` in training batch ``step`` (``None``: an
    evaluation, whose groups are the evaluated tasks). Its ids are ``s<step>-g<group>`` and
    ``s<step>-g<group>-e<sample>`` (``v-g<group>…`` in evaluation)."""

    step: int | None
    group: int
    sample: int

    @property
    def group_id(self) -> str:
        batch = "v" if self.step is None else f"s{self.step}"
        return f"{batch}-g{self.group}"

    @property
    def episode_id(self) -> str:
        return f"{self.group_id}-e{self.sample}"

    @classmethod
    def parse(cls, episode_id: str) -> EpisodeKey | None:
        """The key of one of the run's episode ids; ``None`` for any other id (an episode
        of the user's own events, say)."""
        match = _KEY.fullmatch(episode_id)
        if match is None:
            return None
        step = match["step"]
        return cls(None if step is None else int(step), int(match["group"]), int(match["sample"]))

    @classmethod
    def batch(cls, step: int | None, num_groups: int, group_size: int) -> list[EpisodeKey]:
        """The keys of one batch: ``num_groups`` groups of ``group_size``, in id order."""
        return [cls(step, g, e) for g in range(num_groups) for e in range(group_size)]


def step_of(episode_id: str) -> int | None:
    """The training batch an episode id belongs to (``None``: not a training episode)."""
    key = EpisodeKey.parse(episode_id)
    return None if key is None else key.step


@dataclass(slots=True)
class EpisodeRecord:
    """The events of one episode that arrived so far, by kind and turn. ``fold`` adds one
    without checking it; the learner's ``Assembler`` checks every event before it folds."""

    episode_id: str
    started: ev.EpisodeStarted | None = None
    actions: dict[int, ev.TurnCompleted] = field(default_factory=dict)
    tools: dict[int, ev.ToolFinished] = field(default_factory=dict)
    scores: dict[int, ev.TeacherScored] = field(default_factory=dict)
    completed: ev.EpisodeCompleted | None = None
    reward: ev.RewardReady | None = None

    def fold(self, event: ev.Event) -> bool:
        """Record ``event`` (one of this episode's); False for a kind an episode does not
        hold (a ``GradientComputed``, a span)."""
        match event:
            case ev.EpisodeStarted():
                self.started = event
            case ev.TurnCompleted():
                self.actions[event.turn] = event
            case ev.ToolFinished():
                self.tools[event.turn] = event
            case ev.TeacherScored():
                self.scores[event.turn] = event
            case ev.EpisodeCompleted():
                self.completed = event
            case ev.RewardReady():
                self.reward = event
            case _:
                return False
        return True

    # --- what is known ---------------------------------------------------------------------

    @property
    def group_id(self) -> str | None:
        return self.started.group_id if self.started else None

    @property
    def known_start(self) -> ev.EpisodeStarted:
        """``EpisodeStarted``; only asked for once it was folded."""
        if self.started is None:
            raise InvariantError(f"episode {self.episode_id!r}: used before EpisodeStarted")
        return self.started

    @property
    def known_completion(self) -> ev.EpisodeCompleted:
        """``EpisodeCompleted``; only asked for once it was folded."""
        if self.completed is None:
            raise InvariantError(f"episode {self.episode_id!r}: used before EpisodeCompleted")
        return self.completed

    @property
    def known_reward(self) -> ev.RewardReady:
        """``RewardReady``; only asked for once it was folded."""
        if self.reward is None:
            raise InvariantError(f"episode {self.episode_id!r}: reward used before RewardReady")
        return self.reward

    @property
    def num_turns(self) -> int | None:
        """The episode's turns, once ``EpisodeCompleted`` said."""
        return self.completed.num_turns if self.completed else None

    @property
    def stop_reason(self) -> str:
        return self.completed.stop_reason if self.completed else ""

    @property
    def has_reward(self) -> bool:
        return self.reward is not None

    @property
    def reward_value(self) -> float:
        """The reward; only asked for once ``RewardReady`` was folded."""
        if self.reward is None:
            raise InvariantError(f"episode {self.episode_id!r}: reward used before RewardReady")
        return float(self.reward.reward)

    @property
    def is_infra_failure(self) -> bool:
        return self.reward is not None and self.reward.infra_failure

    def turn_ready(self, k: int) -> bool:
        """Action k and every token before it are known."""
        return (
            self.started is not None
            and all(j in self.actions for j in range(k + 1))
            and all(j in self.tools for j in range(k))
        )

    @property
    def tokens_ready(self) -> bool:
        """Every token the policy saw or produced is known (the last observation is never
        part of any context, so it is not waited for)."""
        return self.num_turns is not None and self.turn_ready(self.num_turns - 1)

    @property
    def teacher_ready(self) -> bool:
        return self.num_turns is not None and all(k in self.scores for k in range(self.num_turns))

    @property
    def complete(self) -> bool:
        """Started, every turn played, completed and graded."""
        return (
            self.started is not None
            and self.reward is not None
            and self.num_turns is not None
            and all(k in self.actions for k in range(self.num_turns))
        )

    @property
    def turns(self) -> tuple[ev.TurnCompleted, ...]:
        """The actions of turns ``0, 1, …`` (up to ``num_turns`` once completed)."""
        last = self.num_turns if self.num_turns is not None else len(self.actions)
        return tuple(self.actions[k] for k in range(last) if k in self.actions)

    @property
    def num_action_tokens(self) -> int:
        """Action tokens of the episode's turns (all known turns before ``EpisodeCompleted``)."""
        last = self.num_turns if self.num_turns is not None else len(self.actions)
        return sum(len(a.action_ids) for k, a in self.actions.items() if k < last)

    def observation(self, k: int) -> tuple[int, ...]:
        """Turn k's observation tokens (none yet, or none after the last turn)."""
        tool = self.tools.get(k)
        return tool.observation_ids if tool is not None else ()

    def events(self) -> list[ev.EpisodeEvent]:
        """The folded events in causal order."""
        out: list[ev.EpisodeEvent] = [self.started] if self.started else []
        for k in sorted(self.actions):
            out += [self.actions[k], *(x[k] for x in (self.tools, self.scores) if k in x)]
        return out + [e for e in (self.completed, self.reward) if e is not None]

    def trajectory(self, upto_turn: int | None = None) -> Trajectory:
        """The trajectory of turns ``0..upto_turn`` (all known turns when None)."""
        if self.started is None:
            raise InvariantError(f"episode {self.episode_id!r}: trajectory before EpisodeStarted")
        last = self.num_turns - 1 if self.num_turns is not None else len(self.actions) - 1
        last = last if upto_turn is None else upto_turn
        turns = tuple(
            Turn(
                action_ids=self.actions[k].action_ids,
                action_logprobs=self.actions[k].action_logprobs,
                policy_version=self.actions[k].policy_version,
                observation_ids=self.observation(k),
                teacher_logprobs=self.scores[k].teacher_logprobs if k in self.scores else None,
            )
            for k in range(last + 1)
        )
        return Trajectory(
            episode_id=self.episode_id,
            group_id=self.started.group_id,
            group_size=self.started.group_size,
            task_id=self.started.task_id,
            prompt_ids=self.started.prompt_ids,
            turns=turns,
            reward=float(self.reward.reward) if self.reward else None,  # validated: fits a float
            infra_failure=self.is_infra_failure,
            stop_reason=self.stop_reason,
            details=dict(self.reward.details) if self.reward else {},
        )
