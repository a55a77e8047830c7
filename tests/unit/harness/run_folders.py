"""Synthetic run folders, as ``thundersync train`` leaves them, for the replay's and the
benchmark matrix's tests."""

from __future__ import annotations

import json
from pathlib import Path


def write_run(folder: Path, config: dict, steps: list[dict]) -> Path:
    """A run folder whose step n (from 1) trains on batch n-1. Each step: ``start``, ``end``,
    ``rewards`` and optional ``completed`` / ``teacher`` times (absolute), ``spans`` as
    (name, started, finished) or, a backward, (name, started, finished, episode); or instead
    of ``rewards``, ``episodes`` as (episode, tokens, completed, reward) with episode
    ``g<group>-e<sample>`` of one turn (its prompt ``tokens`` - 2 and an action of 2)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"micro_batch_size": 8, **config}))
    metrics, events, spans = [], [], []
    previous_end = 0.0
    for n, step in enumerate(steps):
        metrics.append(
            {
                "step": n + 1,
                "step_base": 1,
                "submitted_at": step["start"],
                "finished_at": step["end"],
                "step_time_s": step["end"] - previous_end,
            }
        )
        previous_end = step["end"]
        for kind, key in (
            ("RewardReady", "rewards"),
            ("EpisodeCompleted", "completed"),
            ("TeacherScored", "teacher"),
        ):
            for i, t in enumerate(step.get(key, ())):
                events.append({"event": kind, "t": t, "episode_id": f"s{n}-g0-e{i}"})
        for name, tokens, completed, reward in step.get("episodes", ()):
            eid, group = f"s{n}-{name}", f"s{n}-{name.split('-')[0]}"
            events += [
                {"event": "EpisodeStarted", "t": step["start"], "episode_id": eid}
                | {"group_id": group, "group_size": 8, "prompt_ids_len": tokens - 2},
                {"event": "TurnCompleted", "t": completed, "episode_id": eid, "turn": 0}
                | {"action_ids_len": 2},
                {"event": "EpisodeCompleted", "t": completed, "episode_id": eid, "num_turns": 1},
                {"event": "RewardReady", "t": reward, "episode_id": eid},
            ]
        for name, lo, hi, *episode in step["spans"]:
            span = {"name": name, "started": lo, "finished": hi, "worker": "learner"}
            if episode:
                span["episode_id"] = f"s{n}-{episode[0]}"
            spans.append(span)
    for name, rows in (("metrics", metrics), ("events", events), ("spans", spans)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def sync_step(start: float, rewards: tuple[float, ...]) -> dict:
    """A sync step: rewards at ``start`` + each; then 0.4 s of learning in a 0.5 s ``step``
    (0.1 of it the optimizer) and 0.05 s of weight publishing."""
    last = start + max(rewards)
    return {
        "start": start,
        "end": last + 0.55,
        "rewards": tuple(start + r for r in rewards),
        "spans": [
            ("step", last, last + 0.5),
            ("optimizer", last + 0.4, last + 0.5),
            ("weight_publish", last + 0.5, last + 0.55),
        ],
    }


# One group of two trajectories of 10 tokens, rewarded 0.1 s and 0.5 s after their batch
# starts. The learner: f = 1 ms and g = 2 ms a padded token (3 ms for a forward and a
# backward), no fixed cost; optimizer 50 ms, weight publishing 50 ms.
#   sync: 0.5 + one batched pass of 2 x 10 tokens (60 ms) + 0.1 = 0.66 s
#   streaming: e0's lone piece at 0.1 (30 ms), e1 final at 0.5 (30 ms): 0.53 + 0.1 = 0.63 s
EPISODES = (("g0-e0", 10, 0.1), ("g0-e1", 10, 0.5))
SYNC_S, STREAMING_S = 0.66, 0.63


def _sync_step(at: float) -> dict:
    return {
        "start": at,
        "end": at + SYNC_S,
        "episodes": [(name, n, at + t, at + t) for name, n, t in EPISODES],
        "spans": [
            ("step", at + 0.5, at + 0.61),
            ("optimizer", at + 0.56, at + 0.61),
            ("weight_publish", at + 0.61, at + 0.66),
        ],
    }


def _streaming_step(at: float) -> dict:
    return {
        "start": at,
        "end": at + STREAMING_S,
        "episodes": [(name, n, at + t, at + t) for name, n, t in EPISODES],
        "spans": [
            ("backward", at + 0.1, at + 0.13, "g0-e0"),
            ("backward", at + 0.5, at + 0.53, "g0-e1"),
            ("step", at + 0.53, at + 0.58),
            ("optimizer", at + 0.53, at + 0.58),
            ("weight_publish", at + 0.58, at + 0.63),
        ],
    }


def _run(folder: Path, mode: str, step, starts) -> Path:
    return write_run(folder, {"mode": mode}, [step(at) for at in starts])


def two_mode_runs(folder: Path) -> dict[str, Path]:
    """A sync and a streaming run of the same workload, four steps each (above)."""
    return {
        "sync": _run(folder / "sync", "sync", _sync_step, [0.0, 0.66, 1.32, 1.98]),
        "streaming": _run(
            folder / "streaming", "streaming", _streaming_step, [0.0, 0.63, 1.26, 1.89]
        ),
    }
