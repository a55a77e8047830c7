"""Synthetic rollout batches as event streams: random groups, turns, rewards and arrival orders
(for the exactness certificate, the property tests and the learner benchmark)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from thundersync.protocol import events as ev


@dataclass(frozen=True, slots=True)
class BatchShape:
    """Bounds for ``random_batch``; defaults are the certificate's (docs/design.md §3)."""

    max_groups: int = 3
    """Groups per batch: min_groups..max_groups."""
    max_group_size: int = 16
    """Episodes per group: min_group_size..max_group_size."""
    max_turns: int = 8
    """Actions per episode: 1..max_turns."""
    max_tokens: int = 300
    """Upper bound on an episode's total context length."""
    infra_failure_rate: float = 0.05
    min_groups: int = 1
    min_group_size: int = 1
    reward_values: tuple[float, ...] = (0.0, 0.0, 1.0, 1.0, 0.5)
    """Rewards are drawn from these (ties and all-equal groups happen) or, a
    ``continuous_rate`` of the time, uniformly from [0, 1)."""
    continuous_rate: float = 0.25


def random_episode_events(
    rng: random.Random,
    vocab_size: int,
    shape: BatchShape,
    *,
    episode_id: str,
    group_id: str,
    group_size: int,
    policy_version: int,
    teacher: bool,
) -> list[ev.Event]:
    """One episode's events in causal order (reward last)."""
    budget = rng.randint(2, shape.max_tokens)
    prompt_len = rng.randint(1, max(1, budget // 4))
    num_turns = rng.randint(1, shape.max_turns)
    per_turn = max(1, (budget - prompt_len) // num_turns)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(4, vocab_size) for _ in range(n))

    out: list[ev.Event] = [
        ev.EpisodeStarted(
            episode_id=episode_id,
            group_id=group_id,
            group_size=group_size,
            task_id=f"task-{group_id}",
            prompt_ids=ids(prompt_len),
            policy_version=policy_version,
        )
    ]
    for k in range(num_turns):
        n_action = rng.randint(1, max(1, per_turn // 2))
        action = ids(n_action)
        logprobs = tuple(-rng.expovariate(1.0) for _ in action)
        out.append(
            ev.TurnCompleted(
                episode_id=episode_id,
                turn=k,
                action_ids=action,
                action_logprobs=logprobs,
                policy_version=policy_version,
            )
        )
        if teacher:
            out.append(
                ev.TeacherScored(
                    episode_id=episode_id,
                    turn=k,
                    teacher_logprobs=tuple(-rng.expovariate(1.0) for _ in action),
                )
            )
        if k < num_turns - 1 or rng.random() < 0.5:
            out.append(
                ev.ToolFinished(
                    episode_id=episode_id,
                    turn=k,
                    observation_ids=ids(rng.randint(0, per_turn // 2)),
                    duration_s=rng.expovariate(10.0),
                    exit_code=0,
                    timed_out=False,
                )
            )
    out.append(ev.EpisodeCompleted(episode_id=episode_id, num_turns=num_turns, stop_reason="x"))
    continuous = rng.random() < shape.continuous_rate
    reward = rng.random() if continuous else rng.choice(shape.reward_values)
    out.append(
        ev.RewardReady(
            episode_id=episode_id,
            reward=reward,
            infra_failure=rng.random() < shape.infra_failure_rate,
        )
    )
    return out


def random_batch(
    seed: int,
    vocab_size: int,
    shape: BatchShape = BatchShape(),
    *,
    policy_version: int = 0,
    teacher: bool = False,
    arrival: str = "interleaved",
) -> list[ev.Event]:
    """A batch's events. ``arrival``: ``interleaved`` (episodes' streams merged at random,
    each in causal order: how a real rollout looks), ``shuffled`` (any order at all),
    ``batch`` (episode after episode)."""
    rng = random.Random(seed)
    streams = []
    for g in range(rng.randint(shape.min_groups, shape.max_groups)):
        size = rng.randint(shape.min_group_size, shape.max_group_size)
        for i in range(size):
            streams.append(
                random_episode_events(
                    rng,
                    vocab_size,
                    shape,
                    episode_id=f"g{g}-e{i}",
                    group_id=f"g{g}",
                    group_size=size,
                    policy_version=policy_version,
                    teacher=teacher,
                )
            )
    if arrival == "batch":
        return [e for s in streams for e in s]
    if arrival == "shuffled":
        flat = [e for s in streams for e in s]
        rng.shuffle(flat)
        return flat
    if arrival != "interleaved":
        raise ValueError(f"arrival: expected interleaved|shuffled|batch, got {arrival!r}")
    out, cursors = [], [0] * len(streams)
    live = list(range(len(streams)))
    while live:
        s = rng.choice(live)
        out.append(streams[s][cursors[s]])
        cursors[s] += 1
        if cursors[s] == len(streams[s]):
            live.remove(s)
    return out
