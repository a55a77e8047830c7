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
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_context import DRY_SIZE, GPU_SIZE, Check, ItemFailed, ItemSkipped
from gpu_engine_item import engine_item
from gpu_items import balanced, environment, install, opd, test_gpu, train_bitwise

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
