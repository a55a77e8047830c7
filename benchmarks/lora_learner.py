"""Learner step time and peak memory with and without LoRA on the same model, side by side.

Each configuration runs in a fresh process (spawned, so one's peak memory is not the other's):
the model is loaded, wrapped with LoRA adapters or not, and a streaming GRPO learner with a KL
term and AdamW takes ``--steps`` steps on the same random batches (the first is a warm-up and
is not timed). Full fine-tuning loads a second copy of the model as the KL reference, as
``train`` does; LoRA uses the base with its adapters disabled. Reported per configuration: the
trainable parameters, the median step time (consuming the batch and the step), the peak memory
(``torch.cuda.max_memory_allocated`` on a GPU; the process's peak resident set on a CPU, which
includes Python and torch themselves), and the learner's state counted from its tensors
(weights, reference, gradients, optimizer state, peak accumulator buffers). The configurations
alternate, ``--repeats`` times each, because this machine is shared; the last lines give the
LoRA/full ratios. A measurement, not a test: it exits 0 whatever the numbers, 2 on bad
arguments.

    python benchmarks/lora_learner.py [--hidden 256 --layers 4 --rank 8 --device cpu]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch

from thundersync.cli_output import print_verdict, strict_json

CONFIGS = ("full", "lora")
MIB = 2**20


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def batch_shape(args: argparse.Namespace) -> Any:
    from thundersync.core.random_batches import BatchShape

    return BatchShape(
        max_groups=args.groups,
        min_groups=args.groups,
        max_group_size=args.group_size,
        min_group_size=args.group_size,
        max_tokens=args.tokens,
        infra_failure_rate=0.0,
        reward_values=(0.0, 1.0),
    )


def run_config(folder: str, config: str, args: argparse.Namespace) -> dict[str, Any]:
    """One configuration in this (fresh) process: step times and memory."""
    from thundersync import GRPO, Learner
    from thundersync.core.random_batches import random_batch
    from thundersync.lora import BaseOfAdapter, LoraSettings, add_adapters
    from thundersync.models import load_model

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    model = load_model(folder).to(device)
    if config == "lora":
        settings = LoraSettings(rank=args.rank, target_modules=("all-linear",))
        model = add_adapters(model, settings, seed=0)
        reference: torch.nn.Module = BaseOfAdapter(model)
    else:
        reference = load_model(folder).to(device)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-6)
    shape = batch_shape(args)
    learner = Learner(model, GRPO(kl_coef=0.01), optimizer, streaming=True, reference=reference)
    seconds, peak_buffers = [], 0
    for step in range(args.steps):
        events = random_batch(
            100 + step,
            model.config.vocab_size,
            shape,
            policy_version=learner.policy_version,
            arrival="shuffled",
        )
        started = time.perf_counter()
        for event in events:
            learner.consume(event)
        metrics = learner.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step:  # the first step warms up
            seconds.append(time.perf_counter() - started)
        peak_buffers = max(peak_buffers, metrics["peak_buffer_bytes"])
    weights = tensor_bytes(model.parameters())
    if config == "full":
        weights += tensor_bytes(reference.parameters())
    state = [v for s in optimizer.state.values() for v in s.values()]
    learner_state = (
        weights + tensor_bytes(p.grad for p in trainable) + tensor_bytes(state) + peak_buffers
    )
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {
        "config": config,
        "trainable_params": sum(p.numel() for p in trainable),
        "step_s": statistics.median(seconds),
        "peak_memory_bytes": peak,
        "learner_state_bytes": learner_state,
    }


def _child(folder: str, config: str, args: argparse.Namespace, queue) -> None:
    queue.put(run_config(folder, config, args))


def measure(folder: str, config: str, args: argparse.Namespace) -> dict[str, Any]:
    """``run_config`` in a spawned process (a fresh peak)."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(folder, config, args, queue))
    process.start()
    try:
        result = queue.get(timeout=args.timeout_s)
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--arch", default="qwen3", choices=["qwen3", "llama", "gpt2"])
    parser.add_argument("--model", default=None, help="a model folder (default: a tiny one)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the tiny model")
    parser.add_argument("--layers", type=int, default=4, help="layers of the tiny model")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (every linear layer)")
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups per batch")
    parser.add_argument("--group-size", type=int, default=4, help="trajectories per group")
    parser.add_argument("--tokens", type=int, default=128, help="most tokens per trajectory")
    parser.add_argument("--steps", type=int, default=4, help="learner steps (first: warm-up)")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs per config")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    parser.add_argument("--json", action="store_true", help="a JSON report; verdict to stderr")
    args = parser.parse_args(argv)
    for name in ("hidden", "layers", "rank", "groups", "group_size", "tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (the first warms up), got {args.steps}")
    return args


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per configuration: the median of each measured quantity over its runs."""
    keys = ("trainable_params", "step_s", "peak_memory_bytes", "learner_state_bytes")
    return {
        c: {k: statistics.median(r[k] for r in runs if r["config"] == c) for k in keys}
        for c in CONFIGS
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from thundersync.models import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="thundersync-lora-bench-") as tmp:
        folder = args.model or str(
            build_tiny_model(tmp, args.arch, hidden_size=args.hidden, num_layers=args.layers)
        )
        runs = []
        for r in range(args.repeats):
            for config in CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS)):
                runs.append(measure(folder, config, args))
                print(f"lora_learner: run {len(runs)}/{2 * args.repeats} done", file=sys.stderr)
    table = summary(runs)
    full, lora = table["full"], table["lora"]
    ratios = {k: lora[k] / full[k] for k in full}
    line = (
        f"lora_learner: LoRA/full step time {ratios['step_s']:.2f}, peak memory "
        f"{ratios['peak_memory_bytes']:.2f}, learner state {ratios['learner_state_bytes']:.3f}"
    )
    if args.json:
        print(strict_json({"device": args.device, "runs": runs, "median": table, "ratios": ratios}))
    else:
        print(f"{'':6} {'trainable':>12} {'step s':>8} {'peak MiB':>9} {'state MiB':>10}")
        for config, row in table.items():
            print(
                f"{config:6} {row['trainable_params']:12,.0f} {row['step_s']:8.3f} "
                f"{row['peak_memory_bytes'] / MIB:9.1f} {row['learner_state_bytes'] / MIB:10.2f}"
            )
        print(f"device {args.device}; peak memory on a CPU is the process's resident peak")
    print_verdict(line, to_stderr=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
