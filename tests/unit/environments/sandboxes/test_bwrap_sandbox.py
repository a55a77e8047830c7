"""BwrapSandbox: workspace, paths, environment, copies, limits and life cycle."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from environments.sandboxes import (
    BwrapSandbox,
    NeedsDockerError,
    SandboxError,
    SandboxSpec,
    bwrap,
    bwrap_session,
    host_view,
)


@pytest.fixture
def task_files(tmp_path: Path) -> Path:
    files = tmp_path / "task"
    (files / "pkg").mkdir(parents=True)
    (files / "pkg" / "mod.py").write_text("VALUE = 42\n")
    (files / "README").write_text("hello\n")
    return files


@pytest.fixture
def sandbox(task_files: Path) -> Iterator[BwrapSandbox]:
    sb = BwrapSandbox(SandboxSpec(files=task_files, workdir="/testbed", env={"FOO": "a b"}))
    try:
        yield sb
    finally:
        sb.close()


def test_task_files_are_in_the_workdir_and_the_host_copy_is_untouched(
    sandbox: BwrapSandbox, task_files: Path
) -> None:
    result = sandbox.execute("pwd; cat README; echo changed > README; ls pkg", 10)
    assert result.output == "/testbed\nhello\nmod.py\n" and result.exit_code == 0
    assert (task_files / "README").read_text() == "hello\n"


@pytest.mark.parametrize("workdir", ["/workspace", "/testbed", "/tmp/work", "/srv/app/deep"])
def test_any_absolute_workdir_is_the_cwd_and_home(workdir: str) -> None:
    with BwrapSandbox(SandboxSpec(workdir=workdir)) as sb:
        result = sb.execute('pwd; echo "$HOME"; touch made && ls', 10)
    assert result.output == f"{workdir}\n{workdir}\nmade\n"


@pytest.mark.parametrize("workdir", ["relative", "/", "/usr/src", "/proc/x", "/etc"])
def test_unusable_workdir_is_rejected_by_name(workdir: str) -> None:
    with pytest.raises(ValueError, match="SandboxSpec.workdir"):
        BwrapSandbox(SandboxSpec(workdir=workdir))


def test_spec_env_is_set_and_host_env_is_not_leaked(
    sandbox: BwrapSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THUNDERSYNC_HOST_ONLY", "leak")
    result = sandbox.execute('echo "$FOO|${THUNDERSYNC_HOST_ONLY:-unset}"', 10)
    assert result.output == "a b|unset\n"


def test_python_and_pytest_are_the_projects_interpreter(sandbox: BwrapSandbox) -> None:
    script = 'echo "${PATH%%:*}"; python3 -c "import sys; print(sys.prefix)"; pytest --version'
    result = sandbox.execute(script, 30)
    path_head, prefix, pytest_version = result.output.splitlines()[:3]
    assert path_head == str(Path(sys.executable).parent)
    assert prefix == sys.prefix
    assert pytest_version.startswith("pytest ")


def test_files_persist_between_calls_but_shell_state_does_not(sandbox: BwrapSandbox) -> None:
    sandbox.execute("export X=1; cd pkg; echo data > new.txt", 10)
    result = sandbox.execute('pwd; echo "${X:-none}"; cat pkg/new.txt', 10)
    assert result.output == "/testbed\nnone\ndata\n"


def test_exit_code_and_interleaved_stderr(sandbox: BwrapSandbox) -> None:
    result = sandbox.execute("echo out; echo err >&2; exit 3", 10)
    assert (result.output, result.exit_code, result.timed_out) == ("out\nerr\n", 3, False)


def test_signal_death_is_reported_as_128_plus_signal(sandbox: BwrapSandbox) -> None:
    assert sandbox.execute("kill -9 $$", 10).exit_code == 137


def test_output_is_truncated_to_the_spec_limit() -> None:
    with BwrapSandbox(SandboxSpec(max_output_bytes=100)) as sb:
        result = sb.execute("printf 'a%.0s' $(seq 1000); printf 'z%.0s' $(seq 50)", 10)
    assert result.truncated
    assert result.output.startswith("a" * 50 + "\n[... output truncated: 950 bytes omitted")
    assert result.output.endswith("z" * 50)


def test_upload_and_download_round_trip_files_and_folders(
    sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    src = tmp_path / "in"
    (src / "deep").mkdir(parents=True)
    (src / "deep" / "x.txt").write_text("x")
    (tmp_path / "one.txt").write_text("one")
    sandbox.upload(src, "/testbed/uploaded")
    sandbox.upload(tmp_path / "one.txt", "new/dir/one.txt")
    result = sandbox.execute("cat uploaded/deep/x.txt new/dir/one.txt; echo y >>new/dir/one.txt", 9)
    assert result.output == "xone" and result.exit_code == 0
    sandbox.download("/testbed/uploaded", tmp_path / "back")
    sandbox.download("new/dir/one.txt", tmp_path / "one_back.txt")
    assert (tmp_path / "back" / "deep" / "x.txt").read_text() == "x"
    assert (tmp_path / "one_back.txt").read_text() == "oney\n"


def test_upload_errors_name_the_path(sandbox: BwrapSandbox, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("f")
    with pytest.raises(ValueError, match="outside the workspace"):
        sandbox.upload(tmp_path / "f", "/etc/f")
    with pytest.raises(IsADirectoryError, match="pkg"):
        sandbox.upload(tmp_path / "f", "pkg")
    with pytest.raises(FileNotFoundError, match="missing"):
        sandbox.upload(tmp_path / "missing", "x")
    with pytest.raises(FileNotFoundError, match="nothing"):
        sandbox.download("nothing", tmp_path / "nothing")


def test_files_made_in_the_sandbox_are_downloadable_and_removable(
    sandbox: BwrapSandbox, tmp_path: Path
) -> None:
    sandbox.execute("mkdir -p a/b && echo z > a/b/c && chmod 000 a/b/c && chmod 500 a/b", 10)
    sandbox.download("a", tmp_path / "a")
    assert (tmp_path / "a" / "b" / "c").read_text() == "z\n"
    root = sandbox.root
    sandbox.close()
    assert not root.exists()


def test_closed_sandbox_refuses_every_call_and_closes_twice(tmp_path: Path) -> None:
    sb = BwrapSandbox(SandboxSpec())
    sb.close()
    sb.close()
    with pytest.raises(SandboxError, match="closed"):
        sb.execute("true", 5)
    with pytest.raises(SandboxError, match="closed"):
        sb.upload(tmp_path, "x")
    with pytest.raises(SandboxError, match="closed"):
        sb.download("x", tmp_path / "x")


def test_a_build_context_needs_docker(tmp_path: Path) -> None:
    with pytest.raises(NeedsDockerError, match="build_context"):
        BwrapSandbox(SandboxSpec(build_context=tmp_path))


def test_a_non_positive_timeout_is_rejected(sandbox: BwrapSandbox) -> None:
    with pytest.raises(ValueError, match="timeout"):
        sandbox.execute("true", 0)


def test_missing_task_files_fail_creation_without_leaving_a_workspace(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        BwrapSandbox(SandboxSpec(files=tmp_path / "nope"))
    pattern = f"thundersync-bwrap-{os.getpid()}-*"
    assert list(Path(tempfile.gettempdir()).glob(pattern)) == []


def test_a_workdir_over_the_interpreter_is_rejected() -> None:
    with pytest.raises(ValueError, match="interpreter folder"):
        BwrapSandbox(SandboxSpec(workdir=str(Path(sys.prefix).parent)))


def test_read_only_task_files_still_leave_the_workdir_writable(tmp_path: Path) -> None:
    files = tmp_path / "ro"
    files.mkdir()
    (files / "a.txt").write_text("a")
    files.chmod(0o500)
    try:
        with BwrapSandbox(SandboxSpec(files=files)) as sb:
            result = sb.execute("touch new && cat a.txt", 10)
    finally:
        files.chmod(0o700)
    assert (result.output, result.exit_code) == ("a", 0)


def test_a_bwrap_setup_failure_is_a_sandbox_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = host_view.mount_args
    monkeypatch.setattr(
        host_view, "mount_args", lambda *a: [*real(*a), "--ro-bind", "/nonexistent-src", "/x"]
    )
    with BwrapSandbox(SandboxSpec()) as sb, pytest.raises(SandboxError, match="nonexistent-src"):
        sb.execute("echo never", 5)


def test_an_interpreter_under_tmp_stays_visible_and_tmp_is_writable(monkeypatch) -> None:
    """CI may clone the project (and its .venv) under /tmp: the sandbox's private /tmp must
    not hide it, and the sandbox user must be able to create temp files."""
    host_dir = Path(tempfile.mkdtemp(prefix="fake-venv-", dir="/tmp"))
    try:
        (host_dir / "probe.txt").write_text("visible")
        host_dir.chmod(0o755)
        (host_dir / "probe.txt").chmod(0o644)
        real = host_view.interpreter_dirs
        monkeypatch.setattr(host_view, "interpreter_dirs", lambda: [*real(), str(host_dir)])
        sandbox = BwrapSandbox(SandboxSpec())
        try:
            result = sandbox.execute(f"cat {host_dir}/probe.txt && mktemp && stat -c %a /tmp", 10)
        finally:
            sandbox.close()
        assert result.exit_code == 0, result.output
        assert result.output.startswith("visible")
        assert result.output.strip().endswith("1777")
    finally:
        import shutil

        shutil.rmtree(host_dir)


def test_memory_mb_bounds_the_sandboxs_total_memory_where_cgroups_exist() -> None:
    """Four processes of 150 MiB each fit the per-process limit but not a 400 MiB total: the
    kernel kills some of them, and the sandbox's peak stays at the limit."""
    from environments.sandboxes import cgroup

    if not cgroup.available():
        pytest.skip("no writable cgroup v1 memory controller: only per-process limits apply")
    sandbox = BwrapSandbox(SandboxSpec(memory_mb=400))
    try:
        hog = 'python3 -c "import time; x = bytearray(150 * 2**20); time.sleep(2); print(1)"'
        result = sandbox.execute(f"for i in 1 2 3 4; do {hog} & done; wait", 30)
        assert sandbox.cgroup is not None
        peak = int((sandbox.cgroup / "memory.max_usage_in_bytes").read_text())
        group = sandbox.cgroup
    finally:
        sandbox.close()
    assert "Killed" in result.output
    assert peak <= 400 * 2**20
    assert not group.exists()


def test_etc_shows_the_hosts_entries_read_only_with_the_sandbox_user(
    sandbox: BwrapSandbox,
) -> None:
    """``/etc`` is one read-only copy per process (``shared_etc``): the host's entries as they
    are, the sandbox's own user in ``passwd``, nothing writable; and a copy removed from under
    the process (a temp folder cleaned) is made again, not a sandbox that cannot start."""
    files = [f"/etc/{name}" for name in ("hosts", "os-release", "nsswitch.conf")]
    files = [path for path in files if Path(path).is_file()]
    assert files, "the host has none of the /etc files this test reads"
    for path in files:
        result = sandbox.execute(f"cat {path}", 10)
        assert result.output == Path(path).read_text(), path
    result = sandbox.execute("id -un; touch /etc/x; echo x >> /etc/hosts", 10)
    assert result.output.splitlines()[0] == bwrap.SANDBOX_USER or os.geteuid() != 0
    assert result.exit_code != 0 and not Path("/etc/x").exists()
    copy = host_view.shared_etc()
    assert host_view.shared_etc() == copy, "one copy per process"
    shutil.rmtree(copy.parent)
    with BwrapSandbox(SandboxSpec()) as again:
        assert again.execute(f"cat {files[0]}", 10).output == Path(files[0]).read_text()
    assert host_view.shared_etc() != copy and host_view.shared_etc().is_dir()


def test_close_kills_every_process_left_in_the_sandboxs_cgroup() -> None:
    """Where a sandbox has a memory cgroup, its leftovers are found there (every process of it
    is born inside and cannot leave), whatever their uid: here a host process put in the group
    stands for one that outlived its command."""
    from environments.sandboxes import cgroup

    if not cgroup.available():
        pytest.skip("no writable cgroup v1 memory controller: leftovers are found by uid")
    sandbox = BwrapSandbox(SandboxSpec())
    try:
        assert sandbox.cgroup is not None
        command = ["sh", "-c", "echo in; exec sleep 60"]  # says so once it is in the group
        leftover = subprocess.Popen(cgroup.wrap(sandbox.cgroup, command), stdout=subprocess.PIPE)
        assert leftover.stdout is not None and leftover.stdout.readline() == b"in\n"
        assert str(leftover.pid) in (sandbox.cgroup / "cgroup.procs").read_text().split()
        group = sandbox.cgroup
    finally:
        sandbox.close()
    assert leftover.wait(timeout=10) == -9
    leftover.stdout.close()
    assert not group.exists()


def test_one_session_runs_the_commands_and_tmp_lives_as_long_as_it() -> None:
    """Commands share one namespace (one bwrap start per sandbox, not per command), so /tmp
    persists between them as in a container; a timed-out command takes its session down and
    the next one starts a fresh one (a fresh /tmp, the workspace kept)."""
    with BwrapSandbox(SandboxSpec()) as sb:
        first = sb.execute("echo $PPID; echo kept > /tmp/t; echo file > w.txt", 10)
        again = sb.execute("echo $PPID; cat /tmp/t", 10)
        assert again.output == first.output.splitlines()[0] + "\nkept\n"
        assert sb.execute("sleep 30", 0.5).timed_out
        after = sb.execute("cat /tmp/t 2>/dev/null || echo gone; cat w.txt", 10)
    assert after.output == "gone\nfile\n"


def test_a_workdir_the_agent_closed_to_others_still_runs_the_next_session() -> None:
    """``chmod 700`` of the workdir (its owner's, a common command) made every later session
    fail to start (bwrap enters the workdir without the capabilities it drops), so grading,
    which starts one after ``stop_processes``, became an infrastructure failure: an episode
    dropped from training at the agent's will (red team, 2026-12-07). Closed to its owner
    too, a command fails as the agent's own, saying why."""
    with BwrapSandbox(SandboxSpec(workdir="/app")) as sb:
        sb.execute("echo kept > f && chmod 700 /app", 10)
        sb.stop_processes()  # the next command starts a new session, as grading's does
        assert sb.execute("pwd; cat f", 10).output == "/app\nkept\n"
        sb.execute("chmod 000 /app", 10)
        sb.stop_processes()
        denied = sb.execute("echo never", 10)
        assert denied.exit_code == 126
        assert denied.output == "thundersync: cannot enter /app: Permission denied\n"


def test_a_command_that_kills_its_session_is_reported_killed_and_the_next_one_runs() -> None:
    with BwrapSandbox(SandboxSpec()) as sb:
        killed = sb.execute("echo before; kill -9 $PPID; sleep 5; echo never", 10)
        assert (killed.output, killed.exit_code, killed.timed_out) == ("before\n", 137, False)
        assert sb.execute("echo ok", 10).output == "ok\n"


def test_the_sessions_init_is_out_of_its_commands_reach() -> None:
    """The init runs as the commands' uid; non-dumpable, it cannot be ptraced, and its memory,
    descriptors and environment cannot be read through /proc, so no command can stop it from
    killing what the command leaves behind."""
    probe = (
        "import ctypes, os, sys\n"
        "init = os.getppid()\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('attach', libc.ptrace(16, init, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH
        "for path in ('mem', 'environ', 'fd'):\n"
        "    try:\n"
        "        (os.listdir if path == 'fd' else open)(f'/proc/{init}/{path}')\n"
        "        print(path, 'open')\n"
        "    except PermissionError:\n"
        "        print(path, 'denied')\n"
    )
    with BwrapSandbox(SandboxSpec()) as sb:
        result = sb.execute(f"python3 -c {shlex.quote(probe)}", 10)
    lines = result.output.splitlines()
    assert lines[0] == "attach -1 1", result.output  # EPERM
    assert lines[1:] == ["mem denied", "environ denied", "fd denied"], result.output


def test_a_command_longer_than_an_argv_string_runs_whole() -> None:
    """Past ``MAX_ARGV_CMD_BYTES`` the init sources the command from a memfd."""
    from environments.sandboxes.bwrap_session import MAX_ARGV_CMD_BYTES

    body = "".join(f"x{i}=1\n" for i in range(MAX_ARGV_CMD_BYTES // 4))
    with BwrapSandbox(SandboxSpec()) as sb:
        result = sb.execute(body + 'echo "$x0 $x' + str(MAX_ARGV_CMD_BYTES // 4 - 1) + '"', 20)
    assert (result.output, result.exit_code) == ("1 1\n", 0)


def test_a_session_started_by_a_thread_that_ended_is_replaced_before_the_next_command() -> None:
    """bwrap dies with the thread that started it (``--die-with-parent``): a sandbox used from
    another thread after that one ended runs its next command in a new session, not as a
    command reported killed."""
    import threading

    with BwrapSandbox(SandboxSpec()) as sb:
        results = []
        worker = threading.Thread(target=lambda: results.append(sb.execute("echo $PPID", 10)))
        worker.start()
        worker.join()
        session = sb._session
        assert session is not None and results[0].exit_code == 0
        session.proc.wait(timeout=10)  # the thread's end took the session with it
        result = sb.execute("echo again", 10)
    assert (result.output, result.exit_code) == ("again\n", 0)


def test_a_sandbox_whose_pipes_number_past_1024_still_runs_commands() -> None:
    """A session's pipes live as long as its sandbox: with hundreds of sandboxes open their
    descriptor numbers pass ``select``'s limit of 1024, so the session waits with ``poll``."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit ({hard}) is below 1200")
    if soft != resource.RLIM_INFINITY and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with BwrapSandbox(SandboxSpec()) as sb:
            sb.execute("true", 10)
            assert sb._session is not None and sb._session.results >= 1024
            result = sb.execute("echo high", 10)
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert (result.output, result.exit_code) == ("high\n", 0)


def test_tools_run_behind_the_trainer_and_cannot_raise_their_priority() -> None:
    """A sandbox's processes run at ``NICE`` and cannot go below it; where the kernel groups
    processes by session (autogroups) and the host may set a group's nice (root), the session's
    group is at ``NICE`` too, for every sandbox of a burst started together (a group of its
    own at nice 0 weighs as much as the whole trainer)."""
    nice = bwrap_session.NICE
    sandboxes = [BwrapSandbox(SandboxSpec()) for _ in range(4)]
    try:
        outputs = [
            sb.execute("nice; renice -n 0 -p $$ >/dev/null 2>&1; nice", 10) for sb in sandboxes
        ]
        assert all(out.output.split() == [str(nice), str(nice)] for out in outputs)
        pid = os.getpid()
        settable = Path("/proc/self/autogroup").is_file() and (
            Path(f"/proc/{pid}/task/{pid}/children").is_file()  # how the host finds the group
        )
        if os.geteuid() == 0 and settable:
            groups = [sb.execute("cat /proc/self/autogroup", 10).output for sb in sandboxes]
            assert all(group.split()[-2:] == ["nice", str(nice)] for group in groups)
            assert len(set(groups)) == len(sandboxes)  # each session a group of its own
    finally:
        for sb in sandboxes:
            sb.close()
