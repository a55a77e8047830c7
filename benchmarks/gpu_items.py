"""``gpu_check.py``'s items but the engines' (``gpu_engine_item.py``): the environment, the
install, the warm model, sync against streaming bitwise, OPD, the balanced row, the GPU tests."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from gpu_context import ROOT, Check, ItemFailed, ItemSkipped, child_env, tail


def environment(check: Check) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "transformers": transformers.__version__,
        "vllm": module_version("vllm"),
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


def module_version(module: str) -> str | None:
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
    if module_version("vllm") is None:
        commands.append([*pip, "vllm"])
    if module_version("thundersync") is None:
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
            failed.append(f"pip install {what} exited {done.returncode}: {tail(done.stderr, 300)}")
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


def noisy_copy(model_dir: Path, out: Path, scale: float = 0.02) -> Path:
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
        noisy_copy(model, student)
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
        command, capture_output=True, text=True, timeout=check.left(), cwd=ROOT, env=child_env()
    )
    if not report.is_file():
        raise ItemFailed(f"pytest exited {done.returncode} with no report: {tail(done.stdout)}")
    outcomes = junit_outcomes(report)
    details = {"outcomes": outcomes, "exit_status": done.returncode}
    failed = {name: o for name, o in outcomes.items() if o.startswith(("failed", "error"))}
    if failed:
        details["output_tail"] = tail(done.stdout, 4000)
        raise ItemFailed(f"{len(failed)} of {len(outcomes)} failed: {sorted(failed)}", details)
    if done.returncode not in (0, 5) or not outcomes:
        raise ItemFailed(f"pytest exited {done.returncode}: {tail(done.stdout)}", details)
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
