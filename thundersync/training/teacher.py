"""The OPD teacher worker: scores each turn's action tokens as soon as the turn is sampled.

It follows each episode's token events (prompt, actions, observations) and scores turn k the
moment action k and every observation before it are known — while turn k's tool call still
runs — with one incremental forward that reuses the episode's KV cache (docs/design.md §3,
on-policy distillation). ``TeacherScored`` and a ``teacher`` span go to the trainer's queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thundersync import events as ev
from thundersync.types import Trajectory, Turn


@dataclass(slots=True)
class _Episode:
    started: ev.EpisodeStarted
    actions: dict[int, ev.TurnCompleted] = field(default_factory=dict)
    observations: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    next_turn: int = 0
    num_turns: int | None = None

    def trajectory(self, upto: int) -> Trajectory:
        turns = tuple(
            Turn(
                self.actions[k].action_ids,
                self.actions[k].action_logprobs,
                self.actions[k].policy_version,
                self.observations.get(k, ()),
            )
            for k in range(upto + 1)
        )
        s = self.started
        return Trajectory(s.episode_id, s.group_id, s.group_size, s.task_id, s.prompt_ids, turns)

    def ready(self, k: int) -> bool:
        return k in self.actions and all(j in self.observations for j in range(k))


def teacher_main(
    model_dir: str, dtype: str, device: str, deterministic: bool, inbox: Any, output: Any
) -> None:
    """The worker's entry point: score until a ``None`` arrives on ``inbox``."""
    import torch

    from thundersync.models import deterministic_cuda, load_model
    from thundersync.policy import Policy

    if deterministic:
        deterministic_cuda(device)

    teacher = Policy(load_model(model_dir, dtype=getattr(torch, dtype)).to(device))
    episodes: dict[str, _Episode] = {}
    while True:
        event = inbox.get()
        if event is None:
            return
        episode = _apply(episodes, event)
        if episode is None:
            continue
        while episode.ready(episode.next_turn):
            _score(teacher, episode, output)
            episode.next_turn += 1
        if episode.num_turns is not None and episode.next_turn >= episode.num_turns:
            del episodes[episode.started.episode_id]  # frees its KV cache


def _apply(episodes: dict[str, _Episode], event: ev.Event) -> _Episode | None:
    if isinstance(event, ev.EpisodeStarted):
        episodes[event.episode_id] = _Episode(event)
        return episodes[event.episode_id]
    episode = episodes.get(getattr(event, "episode_id", ""))
    if episode is None:
        return None
    if isinstance(event, ev.TurnCompleted):
        episode.actions[event.turn] = event
    elif isinstance(event, ev.ToolFinished):
        episode.observations[event.turn] = event.observation_ids
    elif isinstance(event, ev.EpisodeCompleted):
        episode.num_turns = event.num_turns
    return episode


def _score(teacher: Any, episode: _Episode, output: Any) -> None:
    k = episode.next_turn
    started = ev.now()
    logprobs = teacher.score_turn(episode.trajectory(k), k, episode.cache)
    eid = episode.started.episode_id
    output.put(ev.TeacherScored(episode_id=eid, turn=k, teacher_logprobs=logprobs))
    output.put(
        ev.SpanRecorded(
            name="teacher",
            started=started,
            finished=ev.now(),
            worker="teacher",
            episode_id=eid,
            turn=k,
        )
    )
