"""The GPU path in one prepared run (``make gpu-check``): what only a CUDA machine can show.

Each item runs in turn and is written to the JSON report as soon as it ends (a run stopped
at a time limit keeps what it finished), with one summary line on stdout:

- ``environment``: Python, torch and its CUDA, the GPUs, transformers, vLLM (or why not);
- ``install`` (``--install``): ``pip install`` of what is missing — a CUDA build of torch and
  vLLM — before anything imports them;
- ``train-bitwise``: a model large enough that the GPU matters (warm-started on the GPU, built
  locally), ``thundersync train --device cuda --deterministic`` in sync and in streaming for
  3 steps: the final weights bitwise equal, training moved them, no staleness;
- ``engine-hf`` and ``engine-vllm``: the rollout engine on the GPU with an in-place weight
  update (the learner's flat vector, as training sends it): the same tokens as a fresh
  engine built from the updated checkpoint, and the log-prob mismatch against the learner's
  own forward pass of the sampled tokens (docs/design.md §5);
- ``opd``: on-policy distillation with the teacher on the GPU, every turn scored;
- ``balanced``: sync against streaming step times on the matrix's balanced workload
  (``benchmarks/matrix.py``, the grading calibrated to the GPU learner's time), side by side;
- ``test-gpu``: the tests marked ``gpu`` (``tests/integration/test_gpu.py``).

``--dry-run`` runs every item on the CPU at a tiny size and reports it ``skipped: no CUDA``
(``failed`` where the script's own logic broke), so that the first run on a GPU cannot fail
on a typo; ``make test`` runs it (``tests/unit/test_gpu_check.py``). Without CUDA and without
``--dry-run`` nothing is checked and the exit status is 2. Exit status 1: an item failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class ItemFailed(Exception):
    """An item ran and its check did not hold (the message says which)."""


class ItemSkipped(Exception):
    """An item could not run here (the message says why)."""


@dataclass(frozen=True, slots=True)
class Size:
    """How large each item runs: a GPU-sized run, or the dry run's tiny one on the CPU."""

    hidden_size: int
    num_layers: int
    num_heads: int
    demos: int
    warm_steps: int
    warm_lr: float
    bias_steps: int
    corrupt_fraction: float
    tasks: int
    group: int
    balanced_steps: int
    balanced_tasks: int
    balanced_group: int
    balanced_modes: tuple[str, ...]


GPU_SIZE = Size(
    hidden_size=768,
    num_layers=6,
    num_heads=12,
    demos=64,
    warm_steps=160,
    warm_lr=1e-3,
    bias_steps=4,
    corrupt_fraction=0.5,
    tasks=4,
    group=8,
    balanced_steps=4,
    balanced_tasks=4,
    balanced_group=8,
    balanced_modes=("sync", "streaming"),
)
"""About 43M parameters: the learner's passes are GPU work, not Python overhead. A short bias
phase: a wider model turns to guessing sooner (hidden 256, 4 layers, 160 steps at 1e-3 on the
CPU: 8 bias steps at 0.6 left 9 % of sampled episodes solved, 40 left none), and groups need
differing rewards for the update to move."""
DRY_SIZE = Size(
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    demos=32,
    warm_steps=60,
    warm_lr=3e-3,
    bias_steps=30,
    corrupt_fraction=0.6,
    tasks=2,
    group=4,
    balanced_steps=3,
    balanced_tasks=1,
    balanced_group=2,
    balanced_modes=("sync", "streaming"),
)
"""The test suite's warm model's shape (its groups' rewards differ, so training moves it)."""


@dataclass
class Check:
    """What the items share: where they run, at what size, and what earlier items made."""

    device: str
    dry_run: bool
    size: Size
    work: Path
    deadline: float
    made: dict[str, Any] = field(default_factory=dict)

    def train(self, out: Path, *args: str) -> Path:
        """``thundersync train`` into ``out`` on this check's device (a subprocess, as a user
        runs it); its stderr is kept beside the run for the report."""
        command = [
            *(sys.executable, "-m", "thundersync.cli", "train", "--out", str(out)),
            *("--device", self.device, "--env-kwargs", '{"tools": "python"}'),
            *("--tasks-per-step", str(self.size.tasks), "--group-size", str(self.size.group)),
            *("--max-new-tokens", "16", "--seed", "0"),
            *args,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=self.left(), cwd=ROOT, env=_env()
        )
        if done.returncode != 0:
            raise ItemFailed(f"train exited {done.returncode}: {_tail(done.stderr)}")
        return out

    def left(self) -> float:
        """Seconds left before the check's deadline (an item past it is skipped)."""
        return max(self.deadline - time.monotonic(), 1.0)


def _env() -> dict[str, str]:
    """The subprocesses' environment: this checkout importable, the hub offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()


# --- items -----------------------------------------------------------------------------------


def environment(check: Check) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "transformers": transformers.__version__,
        "vllm": _version("vllm"),
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["gpus"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
            }
            for i in range(torch.cuda.device_count())
        ]
    return info


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    for dist in (module, f"{module}-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


def install_commands() -> list[list[str]]:
    """What ``--install`` runs, in order, for what is missing: PyPI's torch and vllm wheels
    for Linux are CUDA builds (vllm pins the torch it was built with, so it comes after torch
    and may replace it); then this project and its test tools. Probed in subprocesses, so
    that this process imports torch only after the installs."""
    pip = [sys.executable, "-m", "pip", "install", "--retries", "1", "--timeout", "15"]
    probe = "import torch, sys; sys.exit(torch.version.cuda is None)"
    commands = []
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode != 0:
        commands.append([*pip, "torch"])
    if _version("vllm") is None:
        commands.append([*pip, "vllm"])
    if _version("thundersync") is None:
        commands.append([*pip, "-e", f"{ROOT}[dev]"])
    return commands


def install(check: Check) -> dict[str, Any]:
    commands = install_commands()
    details: dict[str, Any] = {"commands": [" ".join(c[2:]) for c in commands]}
    if check.dry_run:
        shown = "; ".join(details["commands"]) or "nothing (all there)"
        raise ItemSkipped(f"dry run: would run pip {shown}")
    failed = []
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=check.left())
        if done.returncode != 0:
            what = " ".join(command[8:])
            failed.append(f"pip install {what} exited {done.returncode}: {_tail(done.stderr, 300)}")
    if failed:
        raise ItemFailed("; ".join(failed) + " (is a package registry reachable?)", details)
    return details


def warm_model(check: Check) -> Path:
    """The GPU-sized warm model (ToySum, warm-started on the check's device), built once."""
    if "model" not in check.made:
        from thundersync.training.warmstart import WarmStartConfig, warm_start

        s = check.size
        config = WarmStartConfig(
            env_kwargs={"tools": "python"},
            num_demos=s.demos,
            steps=s.warm_steps,
            bias_steps=s.bias_steps,
            corrupt_fraction=s.corrupt_fraction,
            lr=s.warm_lr,
            hidden_size=s.hidden_size,
            num_layers=s.num_layers,
            num_heads=s.num_heads,
            seed=1,
            device=check.device,
        )
        started = time.monotonic()
        check.made["model"] = warm_start(config, check.work / "warm")
        check.made["warm_start_s"] = round(time.monotonic() - started, 1)
    return check.made["model"]


def model_facts(check: Check) -> dict[str, Any]:
    """The warm model's size and how long its warm start took."""
    from safetensors import safe_open

    folder = warm_model(check)
    count = 0
    with safe_open(str(folder / "model.safetensors"), framework="pt") as weights:
        for name in weights.keys():  # noqa: SIM118 (safe_open is no dict)
            shape = weights.get_slice(name).get_shape()
            count += math.prod(shape)
    return {"parameters": count, "warm_start_s": check.made["warm_start_s"]}


def train_bitwise(check: Check) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    model = warm_model(check)
    common = ["--model", str(model), "--steps", "3", "--deterministic", "--lr", "3e-4"]
    common += ["--objective", '{"kl_coef": 0.04}']
    runs = {}
    for mode in ("sync", "streaming"):
        runs[mode] = check.train(check.work / f"bitwise-{mode}", "--mode", mode, *common)
    last = {m: _last_checkpoint(r) for m, r in runs.items()}
    a, b = (load_file(last[m] / "model.safetensors") for m in ("sync", "streaming"))
    start = load_file(model / "model.safetensors")
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    moved = max(float((a[k].float() - start[k].float()).abs().max()) for k in a)
    metrics = {m: _metrics(r) for m, r in runs.items()}
    details = {
        **model_facts(check),
        "bitwise_equal": not differing,
        "tensors_differing": differing[:5],
        "max_weight_change": moved,
        "devices": sorted({r["learner"]["device"] for m in metrics.values() for r in m}),
        "max_staleness": max(
            r["learner"].get("max_staleness_seen", 0) for r in metrics["streaming"]
        ),
        "step_times_s": {m: _step_times(r) for m, r in metrics.items()},
        "rewards": {m: [r.get("reward_mean") for r in rs] for m, rs in metrics.items()},
    }
    if differing:
        raise ItemFailed(f"sync and streaming weights differ in {len(differing)} tensors", details)
    if moved == 0.0:
        raise ItemFailed("training changed no weight (every group's rewards equal?)", details)
    if not check.dry_run and details["devices"] != ["cuda:0"]:
        raise ItemFailed(f"the learner ran on {details['devices']}, not cuda:0", details)
    if details["max_staleness"]:
        raise ItemFailed("streaming trained on stale data", details)
    return details


def _last_checkpoint(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step-*"))[-1]


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _step_times(records: list[dict[str, Any]]) -> list[float]:
    return [round(r["finished_at"] - r["submitted_at"], 3) for r in records]


def engine_item(kind: str) -> Callable[[Check], dict[str, Any]]:
    def run(check: Check) -> dict[str, Any]:
        return engine_check(check, kind)

    run.__name__ = f"engine_{kind}"
    return run


def engine_check(check: Check, kind: str) -> dict[str, Any]:
    """The engine takes new weights in place (the learner's flat vector, policy version 1):
    its samples then equal a fresh engine's built from those weights' checkpoint, and the
    log-probs it reports match the learner's forward pass of the same tokens."""
    import torch

    from thundersync.models import load_model
    from thundersync.training.engines.engine import GenerationRequest, SamplingParams

    if kind == "vllm" and _version("vllm") is None:
        raise ItemSkipped(
            "vLLM is not installed here (`--install` or `pip install vllm` on a machine that "
            "reaches a package registry)"
        )
    model_dir = warm_model(check)
    updated = check.work / f"updated-{kind}"
    if not updated.is_dir():
        _noisy_copy(model_dir, updated)
    flat = torch.nn.utils.parameters_to_vector(load_model(updated).parameters()).detach()
    build = _engine_factory(check, kind)
    prompt = [list(range(5, 12)), list(range(20, 31)), list(range(7, 10))]
    greedy = [
        GenerationRequest(tuple(p), SamplingParams(16, temperature=0.0), i)
        for i, p in enumerate(prompt)
    ]
    sampled = [
        GenerationRequest(tuple(p), SamplingParams(16), 100 + i) for i, p in enumerate(prompt)
    ]
    started = time.monotonic()
    engine = build(model_dir)
    built_s = time.monotonic() - started
    try:
        before = engine.generate(sampled)
        started = time.monotonic()
        engine.load_weights(flat.to(check.device), policy_version=1)
        load_s = time.monotonic() - started
        after_greedy, after = engine.generate(greedy), engine.generate(sampled)
    finally:
        engine.close()
    fresh = build(updated)
    try:
        fresh_greedy, fresh_sampled = fresh.generate(greedy), fresh.generate(sampled)
    finally:
        fresh.close()
    learner = load_model(updated).to(check.device)
    mismatch = [
        abs(a - b)
        for request, completion in zip(sampled, after)
        for a, b in zip(completion.logprobs, _learner_logprobs(learner, request, completion))
    ]
    details = {
        "engine_start_s": round(built_s, 2),
        "load_weights_s": round(load_s, 4),
        "policy_versions": sorted({c.policy_version for c in after + after_greedy}),
        "greedy_equal_fresh": [c.token_ids for c in after_greedy]
        == [c.token_ids for c in fresh_greedy],
        "sampled_equal_fresh": [c.token_ids for c in after] == [c.token_ids for c in fresh_sampled],
        "changed_by_update": [c.logprobs for c in before] != [c.logprobs for c in after],
        "logprob_mismatch_max": max(mismatch),
        "logprob_mismatch_mean": sum(mismatch) / len(mismatch),
        "tokens_compared": len(mismatch),
    }
    if details["policy_versions"] != [1]:
        raise ItemFailed(f"policy versions after the load: {details['policy_versions']}", details)
    if not details["greedy_equal_fresh"]:
        raise ItemFailed(
            "greedy tokens after the in-place load differ from a fresh engine's", details
        )
    if not details["changed_by_update"]:
        raise ItemFailed("the in-place load changed nothing the engine reports", details)
    limit = 1e-3 if kind == "hf" else 1e-2
    if details["logprob_mismatch_max"] > limit:
        raise ItemFailed(f"log-prob mismatch against the learner above {limit}", details)
    return details


def _engine_factory(check: Check, kind: str) -> Callable[[Path], Any]:
    if kind == "hf":
        from thundersync.training.engines.hf import HFEngine

        return lambda folder: HFEngine(folder, device=check.device, batch_invariant=True)
    from thundersync.training.engines.vllm import VLLMEngine

    return lambda folder: VLLMEngine(folder, batch_invariant=True, max_num_seqs=8)


def _learner_logprobs(model: Any, request: Any, completion: Any) -> list[float]:
    """log π(token | context) of each sampled token by a plain forward pass (the learner's
    float32 model; temperature 1)."""
    import torch

    ids = list(request.prompt_ids) + list(completion.token_ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(request.prompt_ids)
    return [float(logp[start + i - 1, t]) for i, t in enumerate(completion.token_ids)]


def _noisy_copy(model_dir: Path, out: Path, scale: float = 0.02) -> Path:
    """``model_dir`` with seeded noise on every parameter (an update to load), tokenizer too."""
    import torch
    from transformers import AutoTokenizer

    from thundersync.models import load_model

    model = load_model(model_dir)
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator), alpha=scale)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out


def opd(check: Check) -> dict[str, Any]:
    model = warm_model(check)
    student = check.work / "student"
    if not student.is_dir():
        _noisy_copy(model, student)
    run = check.train(
        check.work / "opd",
        *("--algo", "opd", "--model", str(student), "--teacher", str(model)),
        *("--mode", "streaming", "--steps", "2", "--lr", "3e-4"),
    )
    records = _metrics(run)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    spans = [json.loads(line) for line in (run / "spans.jsonl").read_text().splitlines()]
    turns = sum(1 for e in events if e["event"] == "TurnCompleted")
    scored = sum(1 for s in spans if s["name"] == "teacher")
    details = {
        "teacher_kl": [r["teacher_kl"] for r in records],
        "turns": turns,
        "turns_scored": scored,
        "devices": sorted({r["learner"]["device"] for r in records}),
        "step_times_s": _step_times(records),
    }
    if any(kl is None for kl in details["teacher_kl"]):
        raise ItemFailed("a step has no teacher KL", details)
    if scored != turns:
        raise ItemFailed(f"the teacher scored {scored} of {turns} turns", details)
    return details


def balanced(check: Check) -> dict[str, Any]:
    """The matrix's balanced row (its grading calibrated to this device's learner), sync and
    streaming in one run, as ``benchmarks/matrix.py --device`` runs it."""
    import dataclasses

    import matrix

    s = check.size
    args = argparse.Namespace(
        steps=s.balanced_steps,
        seed=0,
        tasks=s.balanced_tasks,
        group=s.balanced_group,
        repeats=1,
        device=check.device,
    )
    model = warm_model(check)
    folder = check.work / "matrix"
    learner, rollout = matrix.probe(model, folder, args)
    workload = matrix.calibrated("balanced", learner, rollout, s.balanced_tasks * s.balanced_group)
    workload = dataclasses.replace(workload, modes=s.balanced_modes)
    row = matrix.run_row(model, folder, workload, args)
    modes = row["modes"]
    return {
        "probe_learner_s": round(learner, 4),
        "probe_rollout_s": round(rollout, 4),
        "grade_latency_s": workload.env_kwargs["grade_latency_s"],
        "makespan_over_learner": row["makespan_over_learner"],
        "baseline": matrix.BASELINE,
        "step_time_s": {m: c["step_time_s"] for m, c in modes.items()},
        "speedup_vs_sync": {m: c["speedup_vs_sync"] for m, c in modes.items()},
        "efficiency": {m: c["efficiency"] for m, c in modes.items() if "efficiency" in c},
        "simulator_error": {m: c["simulated"]["error"] for m, c in modes.items()},
    }


TEST_GPU = "tests/integration/test_gpu.py"


def test_gpu(check: Check) -> dict[str, Any]:
    """``make test-gpu``'s tests (pytest -m gpu), read back from their JUnit report."""
    report = check.work / "test-gpu.xml"
    command = [
        *(sys.executable, "-m", "pytest", "-q", "-m", "gpu", TEST_GPU),
        *("-p", "no:cacheprovider", f"--junitxml={report}"),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=check.left(), cwd=ROOT, env=_env()
    )
    if not report.is_file():
        raise ItemFailed(f"pytest exited {done.returncode} with no report: {_tail(done.stdout)}")
    outcomes = junit_outcomes(report)
    details = {"outcomes": outcomes, "exit_status": done.returncode}
    failed = {name: o for name, o in outcomes.items() if o.startswith(("failed", "error"))}
    if failed:
        details["output_tail"] = _tail(done.stdout, 4000)
        raise ItemFailed(f"{len(failed)} of {len(outcomes)} failed: {sorted(failed)}", details)
    if done.returncode not in (0, 5) or not outcomes:
        raise ItemFailed(f"pytest exited {done.returncode}: {_tail(done.stdout)}", details)
    if all(o.startswith("skipped") for o in outcomes.values()) and not check.dry_run:
        raise ItemFailed("every GPU test skipped on a machine with CUDA", details)
    return details


def junit_outcomes(report: Path) -> dict[str, str]:
    """Each test case's outcome in a JUnit XML report: passed, or skipped/failed/error with
    its message."""
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("name", "?")
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                kind = {"failure": "failed"}.get(tag, tag)
                outcome = f"{kind}: {(found.get('message') or '').strip()[:300]}"
                break
        outcomes[name] = outcome
    return outcomes


ITEMS: tuple[tuple[str, Callable[[Check], dict[str, Any]]], ...] = (
    ("train-bitwise", train_bitwise),
    ("engine-hf", engine_item("hf")),
    ("engine-vllm", engine_item("vllm")),
    ("opd", opd),
    ("balanced", balanced),
    ("test-gpu", test_gpu),
)
"""The items after ``environment`` and ``install``, most telling first (a run stopped at its
time limit has done those)."""


# --- the run -----------------------------------------------------------------------------------


def run_item(
    name: str, item: Callable[[Check], dict[str, Any]], check: Check, *, checks: bool = True
) -> dict[str, Any]:
    """One item's record: passed, failed (with the reason), or skipped (with why). In the dry
    run an item that ``checks`` something on the GPU and passed on the CPU is reported skipped
    (what it would check was not checked)."""
    started = time.monotonic()
    record: dict[str, Any] = {"item": name}
    if time.monotonic() >= check.deadline:
        record.update(status="skipped", reason="out of time (--budget-s)")
        return record
    try:
        record["details"] = item(check)
        record["status"] = "passed"
    except ItemSkipped as exc:
        record.update(status="skipped", reason=str(exc))
    except ItemFailed as exc:
        record.update(status="failed", reason=str(exc.args[0]))
        if len(exc.args) > 1:
            record["details"] = exc.args[1]
    except subprocess.TimeoutExpired:
        record.update(status="failed", reason="out of time (--budget-s) while it ran")
    except Exception as exc:  # the script's own logic broke: what the dry run is for
        record.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        record["traceback"] = traceback.format_exc()[-3000:]
    record["seconds"] = round(time.monotonic() - started, 1)
    if checks and check.dry_run and record["status"] == "passed":
        record.update(status="skipped", reason="no CUDA (dry run: ran on the CPU at a tiny size)")
    return record


def headline(item: str, d: dict[str, Any]) -> str:
    """What an item measured, in a few words (the report holds the rest)."""
    if item == "environment":
        gpus = ", ".join(g["name"] for g in d.get("gpus", [])) or "no GPU"
        return f"torch {d['torch']} (CUDA {d['torch_cuda']}), {gpus}, vLLM {d['vllm']}"
    if item == "train-bitwise":
        times = "; ".join(
            f"{m} {sorted(t)[len(t) // 2]:.2f} s" for m, t in d["step_times_s"].items()
        )
        equal = "bitwise equal" if d["bitwise_equal"] else "DIFFERENT"
        return f"{d['parameters'] / 1e6:.1f}M params, sync vs streaming {equal}; step {times}"
    if item.startswith("engine-"):
        same = "==" if d["greedy_equal_fresh"] else "!="
        return (
            f"in-place load {same} fresh engine; log-prob mismatch max "
            f"{d['logprob_mismatch_max']:.1e} over {d['tokens_compared']} tokens"
        )
    if item == "opd":
        kl = ", ".join(f"{k:.4f}" for k in d["teacher_kl"])
        return f"{d['turns_scored']}/{d['turns']} turns scored, teacher KL per step {kl}"
    if item == "balanced":
        base = d["baseline"]
        ratios = ", ".join(f"{m} {r:.2f}x" for m, r in d["speedup_vs_sync"].items() if m != base)
        return f"{base} step {d['step_time_s'][base]:.3f} s; T_sync/T {ratios}"
    if item == "test-gpu":
        counts: dict[str, int] = {}
        for outcome in d["outcomes"].values():
            key = outcome.split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return ""


def summary(record: dict[str, Any]) -> str:
    """The item's line: status, why (or what it measured), seconds."""
    line = f"gpu-check: {record['item']:<14} {record['status']}"
    if "reason" in record:
        line += f": {record['reason']}"
    if record.get("details"):
        try:
            said = headline(record["item"], record["details"])
            line += f"{'; ' if 'reason' in record else ': '}{said}"
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            line += f" (no headline: {type(exc).__name__} {exc})"
    if "seconds" in record:
        line += f" ({record['seconds']} s)"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--report", type=Path, default=Path("gpu-check.json"), help="JSON report")
    parser.add_argument(
        "--dry-run", action="store_true", help="every item on the CPU at a tiny size (no GPU)"
    )
    parser.add_argument(
        "--install", action="store_true", help="pip install a CUDA torch and vLLM where missing"
    )
    parser.add_argument(
        "--budget-s", type=float, default=600.0, help="items not started by then are skipped"
    )
    parser.add_argument("--only", default=None, help="comma-separated items to run (default all)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs in this folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model here is built locally
    names = [name for name, _ in ITEMS]
    only = args.only.split(",") if args.only else names
    unknown = sorted(set(only) - set(names))
    if unknown:
        parser.error(f"--only: unknown {','.join(unknown)}; known {','.join(names)}")

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="thundersync-gpu-check-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        check = Check(
            device="cpu" if args.dry_run else "cuda",
            dry_run=args.dry_run,
            size=DRY_SIZE if args.dry_run else GPU_SIZE,
            work=work,
            deadline=started + args.budget_s,
        )
        report: dict[str, Any] = {"dry_run": args.dry_run, "started": time.time(), "items": []}

        def record(entry: dict[str, Any]) -> None:
            report["items"].append(entry)
            report["seconds"] = round(time.monotonic() - started, 1)
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(json.dumps(report, indent=2, default=str))
            print(summary(entry), flush=True)

        if args.install:  # before this process imports torch
            record(run_item("install", install, check, checks=False))
        import torch

        if not torch.cuda.is_available() and not args.dry_run:
            print(
                "gpu-check: no CUDA GPU here: nothing checked (--dry-run runs every item on "
                "the CPU)",
                file=sys.stderr,
            )
            return 2
        record(run_item("environment", environment, check, checks=False))
        for name, item in ITEMS:
            if name in only:
                record(run_item(name, item, check))
    failed = [e["item"] for e in report["items"] if e["status"] == "failed"]
    print(
        f"gpu-check: {len(report['items']) - len(failed)} of {len(report['items'])} items "
        f"without failure in {report['seconds']} s; report {args.report}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
