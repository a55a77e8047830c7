"""The OPD teacher worker: scores each turn's action tokens as soon as the turn is sampled.

It follows each episode's token events (prompt, actions, observations) and scores turn k the
moment action k and every observation before it are known — while turn k's tool call still
runs — with one incremental forward that reuses the episode's KV cache (docs/design.md §3,
on-policy distillation). ``TeacherScored`` and a ``teacher`` span go to the trainer's queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord
from thundersync.training.control import Inbox, Outbox, Stop, TeacherMessage

if TYPE_CHECKING:  # torch and the model: imported in the worker only
    from thundersync.core.policy import Policy


@dataclass(slots=True)
class _Scoring:
    """An episode being scored: its record, the teacher's KV cache, the next turn to score."""

    record: EpisodeRecord
    cache: dict[str, Any] = field(default_factory=dict)
    next_turn: int = 0


def teacher_main(
    model_dir: str,
    dtype: str,
    device: str,
    deterministic: bool,
    inbox: Inbox[TeacherMessage],
    output: Outbox[ev.Event],
) -> None:
    """The worker's entry point: score until ``Stop`` arrives on ``inbox``."""
    import torch

    from thundersync.core.policy import Policy
    from thundersync.models import deterministic_cuda, load_model

    if deterministic:
        deterministic_cuda(device)

    teacher = Policy(load_model(model_dir, dtype=getattr(torch, dtype)).to(device))
    episodes: dict[str, _Scoring] = {}
    while not isinstance(event := inbox.get(), Stop):
        if isinstance(event, ev.EpisodeStarted):
            episodes[event.episode_id] = _Scoring(EpisodeRecord(event.episode_id))
        episode = episodes.get(event.episode_id)
        if episode is None:
            continue
        record = episode.record
        record.fold(event)
        while record.turn_ready(episode.next_turn):
            _score(teacher, episode, output)
            episode.next_turn += 1
        if record.num_turns is not None and episode.next_turn >= record.num_turns:
            del episodes[record.episode_id]  # frees its KV cache


def _score(teacher: Policy, episode: _Scoring, output: Outbox[ev.Event]) -> None:
    k = episode.next_turn
    started = ev.now()
    logprobs = teacher.score_turn(episode.record.trajectory(k), k, episode.cache)
    eid = episode.record.episode_id
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
