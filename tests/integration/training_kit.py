"""Shared by the ``thundersync train`` integration tests: run the command, read its run
folder, and check that a killed run left no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from thundersync.protocol.events import read_jsonl

SMALL = ["--tasks-per-step", "2", "--group-size", "4", "--max-new-tokens", "16", "--lr", "3e-3"]


def train(out: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "train", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    last = sorted((out / "checkpoints").glob("step-*"))[-1]
    return load_file(last / "model.safetensors")


def token_events(out: Path) -> list[tuple]:
    """Every sampled action's length and episode, in a canonical order."""
    records = read_jsonl(out / "events.jsonl")
    turns = [
        (r["episode_id"], r["turn"], r["action_ids_len"])
        for r in records
        if r["event"] == "TurnCompleted"
    ]
    return sorted(turns)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def final_weights_of(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def start_until_first_checkpoint(
    out: Path, *args: str, timeout_s: float = 900.0
) -> subprocess.Popen:
    """A ``train`` run in the background, returned once its first step (and so its first
    checkpoint, saved before the step's line) is done. Reads the run's stderr line by line,
    no polling; the lines read are kept as ``proc.early_stderr`` (``kill_worker`` adds them).
    A run that prints no step 1 within ``timeout_s`` is killed and the test fails."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "thundersync.cli", "train", "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(timeout_s, proc.kill)
    watchdog.start()
    lines: list[str] = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if line.startswith("train: step 1/"):
                break
    finally:
        watchdog.cancel()
    proc.early_stderr = "".join(lines)  # type: ignore[attr-defined]
    if not (out / "checkpoints" / "step-000001").is_dir():
        proc.kill()
        proc.wait()
        raise AssertionError(f"no first checkpoint: {proc.early_stderr[-2000:]}")  # type: ignore[attr-defined]
    return proc


def descendants(pid: int) -> dict[int, int]:
    """The processes below ``pid`` now, each with its start time (``stat``'s field 22), which
    tells it from a later process given the same pid: a long session wraps the pid counter
    (``pid_max`` 32768 here) and hands low pids out again within seconds."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(int(name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    found: dict[int, int] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if (fields := _stat(child)) is not None:
                found[child] = int(fields[19])
                todo.append(child)
    return found


def spawned_workers(pid: int) -> list[int]:
    """The worker processes ``pid`` spawned (its children running ``spawn_main``), oldest
    first. Only children: a worker's own child, between its fork and its exec, shows the
    worker's command line too."""
    family = descendants(pid)
    ours = [p for p in family if (f := _stat(p)) is not None and int(f[1]) == pid]
    return sorted((p for p in ours if b"spawn_main" in cmdline(p)), key=lambda p: (family[p], p))


def wait_gone(pids: dict[int, int] | set[int], timeout_s: float = 30.0) -> None:
    """Wait until every process of ``pids`` (from ``descendants``: pid and start time) has
    exited; a pid now held by a process started later is a new process, not one left behind."""
    deadline = time.monotonic() + timeout_s
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if _same(p, pids)}
        time.sleep(0.2)
    assert not alive, f"processes left behind by the killed run: {sorted(alive)}"


def _same(pid: int, family: dict[int, int] | set[int]) -> bool:
    """``pid`` still runs (not a zombie) and is the process ``family`` recorded."""
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return False
    return not isinstance(family, dict) or int(fields[19]) == family[pid]


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, ... (None once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cmdline(pid: int) -> bytes:
    """A process's command line (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_worker(
    proc: subprocess.Popen, pick: Callable[[dict[int, int]], int], signum: int = signal.SIGKILL
) -> tuple[dict[int, int], str]:
    """Send ``signum`` to one of a running ``train``'s processes (``pick`` chooses it from its
    descendants) and wait for the run to end; returns the run's processes as they were, and
    its stderr."""
    try:
        family = descendants(proc.pid)
        os.kill(pick(family), signum)
        _, rest = proc.communicate(timeout=180)
        stderr = getattr(proc, "early_stderr", "") + rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return family, stderr


def noisy_copy(model_dir: Path, out: Path, *, scale: float = 0.05) -> Path:
    """``model_dir`` with seeded noise added to every parameter (a student for OPD tests:
    the teacher's behaviour, with a gap to close), tokenizer included."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=scale)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return out
