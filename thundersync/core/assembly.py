"""Assembly: rebuild trajectories from events arriving in any order, and say what is known.

Every event is checked completely before it changes anything: its own values
(``validation.check_event``), then against what was consumed before (``EventOrderError``: a
duplicate, a turn beyond the episode's end, teacher scores whose length differs from the
action's) and against the model (``InvalidEventError``: a context longer than the model takes).
A rejected event leaves no trace, so the learner stays usable.
"""

from __future__ import annotations

import re

from thundersync.core.validation import EventLimits, VersionWindow, check_event, describe
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord
from thundersync.protocol.errors import (
    EventOrderError,
    IncompleteBatchError,
    InvalidEventError,
)

__all__ = ["Assembler", "EventOrderError", "natural_key"]


def natural_key(text: str) -> tuple:
    """Sort key so that 'g2' < 'g10': the canonical batch order of group and episode ids.
    The raw id breaks ties ('g1' vs 'g01'), so the order is total and never arrival order."""
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text))
    return (parts, text)


def context_floor(
    prompt: int, actions: dict[int, int], observations: dict[int, int], num_turns: int | None
) -> int:
    """A lower bound of an episode's context length from the token counts known so far: the
    prompt, every action, and each observation that a later action follows (the last
    observation is never context). Exact once every event of the episode has arrived."""
    last = num_turns - 1 if num_turns is not None else max(actions, default=-1)
    return prompt + sum(actions.values()) + sum(n for k, n in observations.items() if k < last)


class Assembler:
    """Applies rollout events to per-episode records; rejects bad or contradictory events.

    ``needs_rewards``: GRPO needs every reward and whole groups before the step; OPD needs
    every teacher score instead. ``versions``: the policy versions accepted (None: any).
    """

    def __init__(
        self,
        limits: EventLimits | None = None,
        *,
        needs_rewards: bool = True,
        versions: VersionWindow | None = None,
    ) -> None:
        self.limits = limits or EventLimits()
        self.needs_rewards = needs_rewards
        self.versions = versions
        self.records: dict[str, EpisodeRecord] = {}
        self.group_sizes: dict[str, int] = {}
        self.group_members: dict[str, int] = {}

    def apply(self, event: ev.Event) -> EpisodeRecord | None:
        """Apply one event; returns the record it changed (None for non-episode events)."""
        check_event(event, self.limits)
        if self.versions is not None:
            self.versions.check(event)
        episode_id = getattr(event, "episode_id", None)
        if episode_id is None or isinstance(event, ev.GradientComputed):
            return None
        rec = self.records.get(episode_id) or EpisodeRecord(episode_id)
        where = describe(event)
        match event:
            case ev.EpisodeStarted():
                self._start(rec, event, where)
            case ev.TurnCompleted():
                self._turn(rec, event, where)
            case ev.ToolFinished():
                self._check_turn(rec, event.turn, where)
                if event.turn in rec.tools:
                    raise EventOrderError(f"{where}: turn {event.turn}'s tool already finished")
                self._check_context(rec, where, observation=(event.turn, event.observation_ids))
            case ev.EpisodeCompleted():
                self._complete(rec, event, where)
            case ev.RewardReady():
                if rec.reward is not None:
                    raise EventOrderError(f"{where}: reward already consumed")
                self._check_empty(rec.num_turns, event, where)
            case ev.TeacherScored():
                self._check_turn(rec, event.turn, where)
                if event.turn in rec.scores:
                    raise EventOrderError(f"{where}: turn {event.turn} already scored")
                action = rec.actions.get(event.turn)
                if action is not None:
                    self._check_lengths(action, event.teacher_logprobs, where)
            case _:
                return None
        rec.fold(event)  # checked: now it changes the record
        self.records[episode_id] = rec
        return rec

    def _start(self, rec: EpisodeRecord, event: ev.EpisodeStarted, where: str) -> None:
        if rec.started is not None:
            raise EventOrderError(f"{where}: episode already started")
        size = self.group_sizes.get(event.group_id, event.group_size)
        if event.group_size != size:
            raise EventOrderError(
                f"{where}: group_size={event.group_size}, but group {event.group_id!r} has "
                f"group_size={size} (expected one size >= 1 for every member)"
            )
        members = self.group_members.get(event.group_id, 0) + 1
        if members > size:
            raise EventOrderError(
                f"{where}: group {event.group_id!r} already has its {size} episodes"
            )
        self._check_context(rec, where, prompt=event.prompt_ids)
        self.group_sizes[event.group_id] = size
        self.group_members[event.group_id] = members

    def _turn(self, rec: EpisodeRecord, event: ev.TurnCompleted, where: str) -> None:
        self._check_turn(rec, event.turn, where)
        if event.turn in rec.actions:
            raise EventOrderError(f"{where}: turn {event.turn} already completed")
        if event.turn in rec.scores:
            self._check_lengths(event, rec.scores[event.turn].teacher_logprobs, where)
        self._check_context(rec, where, action=(event.turn, event.action_ids))

    def _complete(self, rec: EpisodeRecord, event: ev.EpisodeCompleted, where: str) -> None:
        if rec.num_turns is not None:
            raise EventOrderError(f"{where}: episode already completed")
        beyond = [k for k in (*rec.actions, *rec.scores, *rec.tools) if k >= event.num_turns]
        if beyond:
            raise EventOrderError(
                f"{where}: num_turns={event.num_turns} but turn(s) {sorted(set(beyond))} exist"
            )
        self._check_empty(event.num_turns, rec.reward, where)
        self._check_context(rec, where, num_turns=event.num_turns)

    @staticmethod
    def _check_turn(rec: EpisodeRecord, turn: int, where: str) -> None:
        if rec.num_turns is not None and turn >= rec.num_turns:
            raise EventOrderError(f"{where}: turn {turn} outside 0..num_turns-1 ({rec.num_turns})")

    @staticmethod
    def _check_lengths(action: ev.TurnCompleted, teacher: tuple[float, ...], where: str) -> None:
        if len(teacher) != len(action.action_ids):
            raise EventOrderError(
                f"{where}: teacher_logprobs has {len(teacher)} values but turn {action.turn}'s "
                f"action has {len(action.action_ids)} tokens (expected one score per token)"
            )

    @staticmethod
    def _check_empty(num_turns: int | None, reward: ev.RewardReady | None, where: str) -> None:
        """An episode without actions has nothing to train on: only an infra failure may."""
        if num_turns == 0 and reward is not None and not reward.infra_failure:
            raise EventOrderError(f"{where}: an episode with 0 turns must be an infra failure")

    def _check_context(
        self,
        rec: EpisodeRecord,
        where: str,
        *,
        prompt: tuple[int, ...] | None = None,
        action: tuple[int, tuple] | None = None,
        observation: tuple[int, tuple] | None = None,
        num_turns: int | None = None,
    ) -> None:
        """Refuse the event if, with it, the episode's context exceeds the model's maximum."""
        limit = self.limits.max_context_tokens
        if limit is None:
            return
        prompt_ids = prompt if prompt is not None else rec.started.prompt_ids if rec.started else ()
        actions = {k: len(a.action_ids) for k, a in rec.actions.items()}
        observations = {k: len(t.observation_ids) for k, t in rec.tools.items()}
        if action is not None:
            actions[action[0]] = len(action[1])
        if observation is not None:
            observations[observation[0]] = len(observation[1])
        turns = num_turns if num_turns is not None else rec.num_turns
        length = context_floor(len(prompt_ids), actions, observations, turns)
        if length > limit:
            raise InvalidEventError(
                f"{where}: episode {rec.episode_id!r}'s context would hold at least {length} "
                f"tokens, more than the model's maximum of {limit} (its position embeddings)"
            )

    # --- the batch -------------------------------------------------------------------------------

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

    def complete_groups(self) -> dict[str, list[EpisodeRecord]]:
        """``groups()``, after checking that every input of the step is there.

        GRPO needs whole groups, every reward, and the tokens of every episode that is not an
        infra failure (an infra failure is dropped from its group, so its tokens may be
        missing); OPD needs the tokens and teacher scores of every episode.
        """
        groups = self.groups()
        if not groups:
            raise IncompleteBatchError("step() on an empty batch: no EpisodeStarted consumed")
        orphans = [r.episode_id for r in self.records.values() if r.started is None]
        if orphans:
            raise IncompleteBatchError(f"events for episodes never started: {orphans[:5]}")
        for gid, members in groups.items():
            size = members[0].started.group_size if members[0].started else 0
            if self.needs_rewards and len(members) != size:
                raise IncompleteBatchError(
                    f"group {gid!r}: {len(members)} of {size} episodes consumed"
                )
            for m in members:
                if self.needs_rewards and not m.has_reward:
                    raise IncompleteBatchError(f"episode {m.episode_id!r}: no RewardReady yet")
                if self.needs_rewards and m.is_infra_failure:
                    continue
                if not m.tokens_ready:
                    raise IncompleteBatchError(f"episode {m.episode_id!r}: tokens incomplete")
                if not self.needs_rewards and not m.teacher_ready:
                    raise IncompleteBatchError(f"episode {m.episode_id!r}: teacher scores missing")
        return groups
