"""Cluster projections: the modes' step times on a cluster not rented yet, from stated inputs.

``thundersync simulate --project FILE.toml`` reads a cluster shape (rollout and learner GPUs),
a model's generation throughput and training throughput, and an episode distribution (turns,
tokens per turn, tool time per turn, grading time; log-normal, each with its median and σ),
draws the batches' completion and reward times from them, and runs the simulator of
``harness/simulate.py`` (docs/design.md §4) on them. Every figure it prints is a projection
from the file's inputs, which it prints beside them with the sources the file names;
``benchmarks/projections/`` ships examples. The model is deliberately simple (stated in the
output): all of a batch's sequences decode concurrently at an equal share of the rollout's
throughput (capped at one sequence's own speed), and the learner's cost of a trajectory is
its tokens over the learners' training throughput.
"""

from __future__ import annotations

import math
import random
import statistics
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from harness.simulate import bound_step, registered_modes, simulate, step_times
from harness.workload import Workload
from thundersync.training.modes import baseline_mode, mode_from_label


@dataclass(frozen=True, slots=True)
class LogNormal:
    """A positive quantity: ``median`` · exp(σ·N(0, 1)), clipped to [low, high]."""

    median: float
    sigma: float = 0.0
    low: float = 0.0
    high: float = math.inf

    def draw(self, rng: random.Random) -> float:
        return min(
            max(self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)), self.low), self.high
        )


@dataclass(frozen=True, slots=True)
class Projection:
    """A cluster and a workload, as stated in a projection file."""

    name: str
    rollout_gpus: int
    learner_gpus: int
    generation_tokens_per_s_per_gpu: float
    """Decode throughput of one rollout GPU with a full batch (tokens/s, all sequences)."""
    sequence_tokens_per_s: float
    """One sequence's decode speed when it has the GPU to itself (tokens/s)."""
    training_tokens_per_s_per_gpu: float
    """Forward + backward tokens per second of one learner GPU."""
    tasks: int
    group: int
    prompt_tokens: float
    turns: LogNormal
    action_tokens: LogNormal
    observation_tokens: LogNormal
    tool_s: LogNormal
    grading_s: LogNormal
    optimizer_s: float
    weight_sync_s: float
    sources: dict[str, str]

    @property
    def episodes(self) -> int:
        return self.tasks * self.group

    def decode_rate(self) -> float:
        """Tokens/s of one sequence while the whole batch decodes."""
        share = self.rollout_gpus * self.generation_tokens_per_s_per_gpu / self.episodes
        return min(share, self.sequence_tokens_per_s)


_NUMBERS = ("rollout_gpus", "learner_gpus", "tasks", "group")
_RATES = (
    "generation_tokens_per_s_per_gpu",
    "sequence_tokens_per_s",
    "training_tokens_per_s_per_gpu",
    "prompt_tokens",
    "optimizer_s",
    "weight_sync_s",
)
_DISTRIBUTIONS = ("turns", "action_tokens", "observation_tokens", "tool_s", "grading_s")


def load_projection(path: Path) -> Projection:
    """A projection file (TOML: the fields of ``Projection``; distributions as tables of
    median, sigma, low, high; ``[sources]`` naming where each number comes from).
    ValueError naming the file and field for anything missing or out of range."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: not a readable TOML projection file ({exc})") from exc
    known = {f.name for f in fields(Projection)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {', '.join(unknown)}")
    missing = sorted(known - set(data) - {"sources"})
    if missing:
        raise ValueError(f"{path}: missing field(s) {', '.join(missing)}")
    values: dict[str, Any] = {"name": str(data["name"]), "sources": {}}
    for name in _NUMBERS:
        value = data[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1_000_000:
            raise ValueError(f"{path}: {name} must be an integer from 1 to 1000000, got {value!r}")
        values[name] = value
    for name in _RATES:
        values[name] = _positive(path, name, data[name], allow_zero=name.endswith("_s"))
    for name in _DISTRIBUTIONS:
        table = data[name]
        if not isinstance(table, dict) or "median" not in table:
            raise ValueError(f"{path}: {name} must be a table with a median (and sigma, low, high)")
        extra = sorted(set(table) - {"median", "sigma", "low", "high"})
        if extra:
            raise ValueError(f"{path}: {name}: unknown key(s) {', '.join(extra)}")
        values[name] = LogNormal(
            _positive(path, f"{name}.median", table["median"]),
            _positive(path, f"{name}.sigma", table.get("sigma", 0.0), allow_zero=True),
            _positive(path, f"{name}.low", table.get("low", 0.0), allow_zero=True),
            _positive(path, f"{name}.high", table.get("high", math.inf)),
        )
    sources = data.get("sources", {})
    if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
        raise ValueError(f"{path}: [sources] must map field names to strings")
    values["sources"] = dict(sources)
    return Projection(**values)


def _positive(path: Path, name: str, value: Any, *, allow_zero: bool = False) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and value == math.inf and name.endswith(".high"):
        return math.inf
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{path}: {name} must be a {kind} finite number, got {value!r}")
    return float(value)


def draw_steps(p: Projection, *, steps: int, seed: int) -> tuple[Workload, list[tuple[float, ...]]]:
    """``steps`` batches drawn from ``p``: the workload (reward-ready times; the learner's
    batched cost per trajectory) and each batch's completion times (for early start)."""
    rng = random.Random(seed)
    rate = p.decode_rate()
    ready, completed, tokens = [], [], []
    for _ in range(steps):
        rewards, ends = [], []
        for _ in range(p.episodes):
            turns = max(1, round(p.turns.draw(rng)))
            elapsed, learned = 0.0, p.prompt_tokens
            for _ in range(turns):
                action = p.action_tokens.draw(rng)
                elapsed += action / rate + p.tool_s.draw(rng)
                learned += action + p.observation_tokens.draw(rng)
            ends.append(elapsed)
            rewards.append(elapsed + p.grading_s.draw(rng))
            tokens.append(learned)
        ready.append(tuple(rewards))
        completed.append(tuple(ends))
    cost = statistics.mean(tokens) / (p.learner_gpus * p.training_tokens_per_s_per_gpu)
    work = Workload(
        p.name,
        tuple(ready),
        cost,
        0.0,
        optimizer_s=p.optimizer_s,
        sync_s=p.weight_sync_s,
        notes={"decode_tokens_per_s_per_sequence": rate, "learner_s_per_trajectory": cost},
    )
    return work, completed


def project(p: Projection, *, steps: int = 20, seed: int = 0, staleness: int = 1) -> dict[str, Any]:
    """The modes' mean step times for ``p`` (streaming reward-triggered and with early start),
    the bound, and the speed-ups over sync: projections, with the inputs that made them."""
    work, completed = draw_steps(p, steps=steps, seed=seed)
    result = simulate(work, staleness=staleness)
    # early start: each trajectory's work ready at its completion, the batch closing at its
    # last reward, run by the registered mode whose learner streams
    streams = next(m for m in registered_modes(staleness) if m.learner_contract().streams)
    early_work = replace(
        work, ready_s=tuple(completed), gates_s=tuple(max(r) for r in work.ready_s)
    )
    times = result["step_time_s"]
    times[f"{streams.label}-early"] = statistics.mean(step_times(streams, early_work))
    times["bound-early"] = statistics.mean(
        max(bound_step(ends, work), max(rewards) + work.optimizer_s + work.sync_s)
        for ends, rewards in zip(completed, work.ready_s)
    )
    base = times[baseline_mode().label]
    result["speedup_vs_sync"] = {k: base / v for k, v in times.items() if not k.startswith("bound")}
    result["projection"] = True
    result["inputs"] = {f.name: getattr(p, f.name) for f in fields(Projection)}
    return result


def print_projection(result: dict[str, Any]) -> None:
    inputs = result["inputs"]
    print(f"simulate: PROJECTION, not a measurement: {inputs['name']}")
    print("inputs:")
    for name, value in inputs.items():
        if name in ("name", "sources"):
            continue
        shown = (
            f"median {value.median:g}, sigma {value.sigma:g}"
            + (f", {value.low:g}..{value.high:g}" if value.low or value.high != math.inf else "")
            if isinstance(value, LogNormal)
            else f"{value:g}"
        )
        source = inputs["sources"].get(name)
        print(f"  {name:<34}{shown}" + (f"  [{source}]" if source else ""))
    print(
        f"  => {result['decode_tokens_per_s_per_sequence']:.1f} tokens/s per sequence while the "
        f"batch decodes; {result['learner_s_per_trajectory']:.2f} s of learner time per trajectory"
    )
    print(f"{'mode':<18}{'step time':>12}{'vs sync':>9}   (mean of {result['steps']} drawn steps)")
    for mode, t in result["step_time_s"].items():
        speed = result["speedup_vs_sync"].get(mode)
        print(f"{mode:<18}{t:>10.1f} s{'' if speed is None else f'{speed:>8.2f}x'}")
    speed = result["speedup_vs_sync"]
    print(
        f"simulate: projected speed-up over sync: streaming {speed['streaming']:.2f}x, with "
        f"early start {speed['streaming-early']:.2f}x (zero staleness); async(k) "
        f"{max(v for k, v in speed.items() if _stale(k)):.2f}x (stale)"
    )


def _stale(label: str) -> bool:
    """Whether ``label`` names a mode that trains on stale tokens (not a variant such as
    ``streaming-early``, nor the bound)."""
    try:
        return not mode_from_label(label, staleness=1).exact
    except ValueError:
        return False
