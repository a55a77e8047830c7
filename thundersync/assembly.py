"""Assembly: rebuild trajectories from events arriving in any order, and say what is known."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from thundersync import events as ev
from thundersync.types import Trajectory, Turn


class EventOrderError(ValueError):
    """An event contradicts what the learner already consumed (duplicate, wrong lengths...)."""


def natural_key(text: str) -> tuple:
    """Sort key so that 'g2' < 'g10': the canonical batch order of group and episode ids.
    The raw id breaks ties ('g1' vs 'g01'), so the order is total and never arrival order."""
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text))
    return (parts, text)


@dataclass(slots=True)
class EpisodeRecord:
    """Everything consumed so far about one episode."""

    episode_id: str
    started: ev.EpisodeStarted | None = None
    actions: dict[int, ev.TurnCompleted] = field(default_factory=dict)
    observations: dict[int, tuple[int, ...]] = field(default_factory=dict)
    teacher: dict[int, tuple[float, ...]] = field(default_factory=dict)
    num_turns: int | None = None
    stop_reason: str = ""
    reward: ev.RewardReady | None = None

    @property
    def group_id(self) -> str | None:
        return self.started.group_id if self.started else None

    @property
    def has_reward(self) -> bool:
        return self.reward is not None

    @property
    def is_infra_failure(self) -> bool:
        return self.reward is not None and self.reward.infra_failure

    def turn_ready(self, k: int) -> bool:
        """Action k and every token before it are known."""
        return (
            self.started is not None
            and all(j in self.actions for j in range(k + 1))
            and all(j in self.observations for j in range(k))
        )

    @property
    def tokens_ready(self) -> bool:
        """Every token the policy saw or produced is known (the last observation is never
        part of any context, so it is not waited for)."""
        return self.num_turns is not None and self.turn_ready(self.num_turns - 1)

    @property
    def teacher_ready(self) -> bool:
        return self.num_turns is not None and all(k in self.teacher for k in range(self.num_turns))

    def trajectory(self, upto_turn: int | None = None) -> Trajectory:
        """The trajectory of turns ``0..upto_turn`` (all known turns when None)."""
        assert self.started is not None
        last = self.num_turns - 1 if self.num_turns is not None else len(self.actions) - 1
        last = last if upto_turn is None else upto_turn
        turns = tuple(
            Turn(
                action_ids=self.actions[k].action_ids,
                action_logprobs=self.actions[k].action_logprobs,
                policy_version=self.actions[k].policy_version,
                observation_ids=self.observations.get(k, ()),
                teacher_logprobs=self.teacher.get(k),
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
            reward=self.reward.reward if self.reward else None,
            infra_failure=self.is_infra_failure,
            stop_reason=self.stop_reason,
        )


class Assembler:
    """Applies rollout events to per-episode records; rejects contradictory events."""

    def __init__(self) -> None:
        self.records: dict[str, EpisodeRecord] = {}
        self.group_sizes: dict[str, int] = {}
        self.group_members: dict[str, int] = {}

    def record(self, episode_id: str) -> EpisodeRecord:
        if episode_id not in self.records:
            self.records[episode_id] = EpisodeRecord(episode_id)
        return self.records[episode_id]

    def apply(self, event: ev.Event) -> EpisodeRecord | None:
        """Apply one event; returns the record it changed (None for non-episode events)."""
        episode_id = getattr(event, "episode_id", None)
        if episode_id is None or isinstance(event, ev.GradientComputed):
            return None
        rec = self.record(episode_id)
        where = f"{type(event).__name__}(episode_id={episode_id!r})"
        match event:
            case ev.EpisodeStarted():
                if rec.started is not None:
                    raise EventOrderError(f"{where}: episode already started")
                self._join_group(event, where)
                if not event.prompt_ids:
                    raise EventOrderError(
                        f"{where}: empty prompt_ids; a policy's first token needs context (an "
                        "agent without a tokenizer cannot feed a learner)"
                    )
                rec.started = event
            case ev.TurnCompleted():
                self._check_turn(rec, event.turn, where)
                if event.turn in rec.actions:
                    raise EventOrderError(f"{where}: turn {event.turn} already completed")
                if len(event.action_ids) != len(event.action_logprobs):
                    raise EventOrderError(
                        f"{where}: turn {event.turn} has {len(event.action_ids)} action_ids "
                        f"but {len(event.action_logprobs)} action_logprobs"
                    )
                if not event.action_ids:
                    raise EventOrderError(f"{where}: turn {event.turn} has no action tokens")
                rec.actions[event.turn] = event
            case ev.ToolFinished():
                rec.observations[event.turn] = event.observation_ids
            case ev.EpisodeCompleted():
                if rec.num_turns is not None:
                    raise EventOrderError(f"{where}: episode already completed")
                beyond = [k for k in (*rec.actions, *rec.teacher) if k >= event.num_turns]
                if event.num_turns < 0 or beyond:
                    raise EventOrderError(
                        f"{where}: num_turns={event.num_turns} but turn(s) {sorted(beyond)} exist"
                    )
                rec.num_turns, rec.stop_reason = event.num_turns, event.stop_reason
                self._check_empty(rec, where)
            case ev.RewardReady():
                if rec.reward is not None:
                    raise EventOrderError(f"{where}: reward already consumed")
                rec.reward = event
                self._check_empty(rec, where)
            case ev.TeacherScored():
                self._check_turn(rec, event.turn, where)
                rec.teacher[event.turn] = event.teacher_logprobs
            case _:
                return None
        return rec

    def _join_group(self, event: ev.EpisodeStarted, where: str) -> None:
        size = self.group_sizes.setdefault(event.group_id, event.group_size)
        if event.group_size < 1 or event.group_size != size:
            raise EventOrderError(
                f"{where}: group_size={event.group_size}, but group {event.group_id!r} has "
                f"group_size={size} (expected one size >= 1 for every member)"
            )
        members = self.group_members.get(event.group_id, 0) + 1
        if members > size:
            raise EventOrderError(
                f"{where}: group {event.group_id!r} already has its {size} episodes"
            )
        self.group_members[event.group_id] = members

    @staticmethod
    def _check_turn(rec: EpisodeRecord, turn: int, where: str) -> None:
        if turn < 0 or (rec.num_turns is not None and turn >= rec.num_turns):
            raise EventOrderError(f"{where}: turn {turn} outside 0..num_turns-1 ({rec.num_turns})")

    @staticmethod
    def _check_empty(rec: EpisodeRecord, where: str) -> None:
        """An episode without actions has nothing to train on: only an infra failure may."""
        if rec.num_turns == 0 and rec.reward is not None and not rec.reward.infra_failure:
            raise EventOrderError(f"{where}: an episode with 0 turns must be an infra failure")

    def groups(self) -> dict[str, list[EpisodeRecord]]:
        """Started episodes by group, both in canonical (natural id) order."""
        out: dict[str, list[EpisodeRecord]] = {}
        for rec in self.records.values():
            if rec.started is not None:
                out.setdefault(rec.started.group_id, []).append(rec)
        return {
            g: sorted(out[g], key=lambda r: natural_key(r.episode_id))
            for g in sorted(out, key=natural_key)
        }
