"""SandboxPool: bounded, blocking, closes what it hands out."""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from environments.sandboxes import SandboxError, SandboxPool, SandboxSpec
from environments.sandboxes.protocol import ExecResult


class FakeSandbox:
    workdir = "/workspace"

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.num_closes = 0

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        return ExecResult(output=cmd, exit_code=0, timed_out=False, duration_s=0.0)

    def upload(self, src: Path, dst: str) -> None:
        raise NotImplementedError

    def download(self, src: str, dst: Path) -> None:
        raise NotImplementedError

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        raise NotImplementedError

    def stop_processes(self) -> None:
        pass

    def close(self) -> None:
        self.num_closes += 1


def test_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="size must be >= 1, got 0"):
        SandboxPool(0)


def test_never_more_than_size_sandboxes_at_once() -> None:
    pool = SandboxPool(2, factory=FakeSandbox)
    active, peak, lock = 0, 0, threading.Lock()

    def episode(_: int) -> None:
        nonlocal active, peak
        with pool.sandbox(SandboxSpec()):
            with lock:
                active += 1
                peak = max(peak, active)
            time.sleep(0.02)
            with lock:
                active -= 1

    with ThreadPoolExecutor(6) as executor:
        list(executor.map(episode, range(12)))
    assert peak == 2 and pool.num_active == 0


def test_acquire_blocks_when_full_and_times_out() -> None:
    pool = SandboxPool(1, factory=FakeSandbox)
    held = pool.acquire(SandboxSpec())
    start = time.monotonic()
    with pytest.raises(SandboxError, match="no sandbox slot free after 0.2 s"):
        pool.acquire(SandboxSpec(), timeout=0.2)
    assert time.monotonic() - start >= 0.2
    pool.release(held)
    pool.release(pool.acquire(SandboxSpec(), timeout=0.2))


def test_release_closes_on_every_path_and_frees_the_slot() -> None:
    pool = SandboxPool(1, factory=FakeSandbox)
    with pytest.raises(RuntimeError), pool.sandbox(SandboxSpec()) as sb:
        raise RuntimeError("episode failed")
    assert sb.num_closes == 1 and pool.num_active == 0
    pool.release(sb)
    assert pool.acquire(SandboxSpec(), timeout=0.1) is not None


def test_a_failing_factory_does_not_leak_a_slot() -> None:
    def broken(spec: SandboxSpec) -> FakeSandbox:
        raise SandboxError("image missing")

    pool = SandboxPool(1, factory=broken)
    for _ in range(3):
        with pytest.raises(SandboxError, match="image missing"):
            pool.acquire(SandboxSpec(), timeout=0.1)


def test_close_closes_open_sandboxes_and_refuses_new_ones() -> None:
    pool = SandboxPool(3, factory=FakeSandbox)
    open_ = [pool.acquire(SandboxSpec()) for _ in range(2)]
    pool.close()
    assert [sb.num_closes for sb in open_] == [1, 1]
    with pytest.raises(SandboxError, match="closed"):
        pool.acquire(SandboxSpec())


def test_real_bwrap_sandboxes_run_concurrently_and_are_removed() -> None:
    roots = []
    with SandboxPool(2) as pool:

        def episode(i: int) -> str:
            with pool.sandbox(SandboxSpec()) as sb:
                roots.append(sb.root)
                return sb.execute(f"echo {i} > f; cat f", 10).output

        with ThreadPoolExecutor(4) as executor:
            outputs = list(executor.map(episode, range(4)))
    assert outputs == [f"{i}\n" for i in range(4)]
    assert not any(root.exists() for root in roots)
