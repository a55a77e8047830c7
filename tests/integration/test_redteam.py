"""Red-team suite: hostile commands are contained or bounded in both sandboxes.

Each test runs in a fresh sandbox of each kind (Docker cases are marked ``docker``), checks
the host afterwards, and every sandbox is checked for leftover processes and containers when
it closes. Nothing here sends traffic beyond loopback: a connect from a namespace without a
network fails before any packet leaves.

Decisions the tests pin down:
- bubblewrap sees only /usr, selected /etc files and the interpreter (read-only) plus its
  workspace: host secrets elsewhere are invisible, not just unwritable.
- ``download`` of a link that leaves the workspace is refused (bubblewrap: ValueError;
  Docker: the link is the container's own and tarfile's ``data`` filter refuses absolute
  links); links inside downloaded folders arrive as links, never as their targets.
- Background processes die when their command ends (the call is stateless), not only at close.
- The workspace lies on a disk of its own (``disk_mb``): filling it is the agent's ENOSPC.
- Making a user namespace fails (bubblewrap: a seccomp filter; Docker: its default profile).
- ``close()`` from another thread (a cancelled run) kills a command that ignores SIGTERM at
  once, and the ``execute`` running it raises SandboxError.
"""

from __future__ import annotations

import os
import random
import resource
import socket
import stat
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from environments.sandboxes import Sandbox, SandboxError, SandboxSpec, make_sandbox
from environments.sandboxes.bwrap import MAX_FILE_BYTES
from environments.sandboxes.protocol import ExecResult

REPO = Path(__file__).resolve().parents[2]
OUTPUT_LIMIT = 4096
MEMORY_MB = 256
PIDS = 64
DISK_MB = 384  # above MAX_FILE_BYTES, so the file size limit is what the fill tests meet first


@pytest.fixture
def token() -> str:
    """A unique number put into hostile commands' argv so their processes can be found."""
    return str(random.randrange(10**8, 10**9))


def processes_with(text: str) -> list[str]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    if text.encode() in fh.read():
                        found.append(name)
            except OSError:
                continue
    return found


def wait_gone(text: str, within_s: float = 1.0) -> list[str]:
    deadline = time.monotonic() + within_s
    while (found := processes_with(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def uid_processes(uid: int) -> list[str]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as fh:
                    uids = next(line for line in fh if line.startswith("Uid:")).split()
            except (OSError, StopIteration):
                continue
            if int(uids[1]) == uid:
                found.append(name)
    return found


@pytest.fixture
def sandbox(kind: str, token: str, leftovers: Callable) -> Iterator[Sandbox]:
    spec = SandboxSpec(
        memory_mb=MEMORY_MB, pids=PIDS, max_output_bytes=OUTPUT_LIMIT, disk_mb=DISK_MB
    )
    sb = make_sandbox(spec, kind)
    try:
        yield sb
    finally:
        sb.close()
    assert wait_gone(token) == [], f"processes with token {token} outlived the sandbox"
    processes, containers = leftovers()
    assert processes == [] and containers == []
    if kind == "bwrap" and os.geteuid() == 0:
        assert uid_processes(sb.uid) == []


def run(sb: Sandbox, cmd: str, timeout: float = 10.0) -> ExecResult:
    result = sb.execute(cmd, timeout)
    assert isinstance(result.output, str)
    assert len(result.output) <= OUTPUT_LIMIT + 200
    return result


def assert_still_works(sb: Sandbox) -> None:
    result = run(sb, "echo alive")
    assert (result.output, result.exit_code) == ("alive\n", 0)


# --- writes outside the workspace -------------------------------------------------------


@pytest.mark.parametrize("folder", ["/etc", "/usr/bin", "/root", str(REPO)])
def test_write_outside_workspace_leaves_host_unchanged(
    sandbox: Sandbox, kind: str, token: str, folder: str
) -> None:
    target = Path(folder) / f"thundersync-pwn-{token}"
    result = run(sandbox, f"echo pwned > {target} && echo wrote")
    try:
        assert not target.exists(), f"the sandbox wrote {target} on the host"
        if kind == "bwrap" or folder == str(REPO):
            assert result.exit_code != 0 and "wrote" not in result.output
    finally:
        target.unlink(missing_ok=True)


def test_chmod_and_chown_of_system_files_leave_host_unchanged(sandbox: Sandbox, kind: str) -> None:
    before = os.stat("/usr/bin/env")
    result = run(sandbox, "chmod 4777 /usr/bin/env; chown 12345 /usr/bin/env; chmod 777 /etc")
    after = os.stat("/usr/bin/env")
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)
    assert stat.S_IMODE(os.stat("/etc").st_mode) != 0o777
    if kind == "bwrap":
        assert result.exit_code != 0


def test_setuid_copy_does_not_grant_root(sandbox: Sandbox, kind: str) -> None:
    if kind == "docker":
        pytest.skip("commands run as the container's root by design; nothing to escalate to")
    result = run(sandbox, "cp /usr/bin/id ./myid && chmod u+s ./myid && ./myid -u")
    assert result.exit_code == 0
    assert result.output.strip() != "0"


def test_mount_is_refused(sandbox: Sandbox) -> None:
    result = run(sandbox, "mount -t tmpfs none /usr && echo mounted")
    assert result.exit_code != 0 and "mounted" not in result.output


# --- reads of host files ----------------------------------------------------------------


def test_host_secret_in_temp_dir_is_invisible(sandbox: Sandbox, tmp_path: Path, token: str) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(f"SECRET-{token}")
    result = run(sandbox, f"cat {secret}; ls {tmp_path}")
    assert f"SECRET-{token}" not in result.output and result.exit_code != 0


def test_host_secret_in_root_home_is_invisible(sandbox: Sandbox, token: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to plant a secret in /root")
    secret = Path(f"/root/.thundersync-redteam-{token}")
    secret.write_text(f"SECRET-{token}")
    try:
        result = run(sandbox, f"cat {secret}; cat /root/.thundersync-redteam-*; ls -a /root")
    finally:
        secret.unlink()
    assert f"SECRET-{token}" not in result.output


def test_repository_files_are_invisible(sandbox: Sandbox) -> None:
    result = run(sandbox, f"cat {REPO}/pyproject.toml")
    assert result.exit_code != 0 and "[project]" not in result.output


def test_host_shadow_file_is_unreadable(sandbox: Sandbox, kind: str) -> None:
    result = run(sandbox, "cat /etc/shadow")
    if kind == "bwrap":
        assert result.exit_code != 0
    host_lines = set(Path("/etc/shadow").read_text().splitlines()) - {""}
    leaked = host_lines & set(result.output.splitlines())
    assert all(line.split(":")[1] in ("*", "!", "!*") for line in leaked)


def test_sandboxes_cannot_see_each_other(sandbox: Sandbox, kind: str, token: str) -> None:
    with make_sandbox(SandboxSpec(), kind) as other:
        run(other, f"echo SECRET-{token} > secret.txt")
        host_copy = Path(getattr(other, "workspace", "/nonexistent")) / "secret.txt"
        result = run(sandbox, f"cat secret.txt; cat {host_copy}")
    assert f"SECRET-{token}" not in result.output


def test_proc_shows_only_the_sandbox_and_sysctls_are_read_only(sandbox: Sandbox) -> None:
    hostname = socket.gethostname()
    result = run(sandbox, "echo pwned > /proc/sys/kernel/hostname; ls /proc | grep -c '^[0-9]'")
    assert socket.gethostname() == hostname
    assert int(result.output.split()[-1]) < 20


# --- network ------------------------------------------------------------------------------


def test_loopback_listener_on_the_host_is_unreachable(sandbox: Sandbox) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = f"import socket; socket.create_connection(('127.0.0.1', {port}), 1); print('OK')"
        result = run(sandbox, f'python3 -c "{code}"')
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.exit_code != 0 and "OK" not in result.output


def test_public_address_is_unreachable(sandbox: Sandbox) -> None:
    code = "import socket; socket.create_connection(('1.1.1.1', 80), 1); print('OK')"
    result = run(sandbox, f'python3 -c "{code}"', timeout=5)
    assert result.exit_code != 0 and "OK" not in result.output
    assert "unreachable" in result.output.lower()


def test_dns_lookup_fails(sandbox: Sandbox) -> None:
    code = "import socket; print(socket.getaddrinfo('example.com', 80))"
    result = run(sandbox, f'python3 -c "{code}"', timeout=5)
    assert result.exit_code != 0 and not result.timed_out


# --- processes ----------------------------------------------------------------------------


def test_fork_bomb_is_bounded_and_sandbox_survives(sandbox: Sandbox) -> None:
    result = run(sandbox, ":(){ :|:& };:", timeout=5)
    assert result.duration_s < 6.0
    assert_still_works(sandbox)


@pytest.mark.parametrize("limit", [1.0, 2.5])
def test_hung_process_times_out_within_a_second(sandbox: Sandbox, token: str, limit: float) -> None:
    result = run(sandbox, f"sleep 1000.{token}", timeout=limit)
    assert result.timed_out and result.exit_code is None
    assert limit <= result.duration_s <= limit + 1.0
    assert wait_gone(token) == []


def test_process_ignoring_sigterm_is_killed_on_time(sandbox: Sandbox, token: str) -> None:
    result = run(sandbox, f"trap '' TERM INT HUP; sleep 1000.{token}; echo done", timeout=1.0)
    assert result.timed_out and 1.0 <= result.duration_s <= 2.0
    assert wait_gone(token) == []


@pytest.mark.parametrize(
    "spawn",
    [
        "nohup sleep 1000.{t} >/dev/null 2>&1 &",
        "setsid sleep 1000.{t} >/dev/null 2>&1 &",
        "( ( sleep 1000.{t} >/dev/null 2>&1 & ) & )",
        'python3 -c "import os\nif os.fork() == 0:\n os.setsid()\n if os.fork() == 0:\n'
        "  os.execvp('sleep', ['sleep', '1000.{t}'])\"",
    ],
    ids=["nohup", "setsid", "double-fork", "python-daemon"],
)
def test_background_daemon_dies_with_its_command(sandbox: Sandbox, token: str, spawn: str) -> None:
    result = run(sandbox, spawn.format(t=token) + "\necho started", timeout=5)
    assert "started" in result.output and result.duration_s < 3.0
    assert wait_gone(token) == []
    assert_still_works(sandbox)


def test_daemon_is_killed_at_timeout(sandbox: Sandbox, token: str) -> None:
    result = run(sandbox, f"setsid sleep 1000.{token} & sleep 2000.{token}", timeout=1.0)
    assert result.timed_out and result.duration_s <= 2.0
    assert wait_gone(token) == []


@pytest.mark.parametrize("kill", ["kill -9 $PPID", "kill -9 -1", "kill -9 1", "kill -9 {pid}"])
def test_killing_parents_leaves_host_alive_and_sandbox_working(sandbox: Sandbox, kill: str) -> None:
    result = run(sandbox, kill.format(pid=os.getpid()) + "; echo after", timeout=5)
    assert not result.timed_out
    assert_still_works(sandbox)


# --- resources ----------------------------------------------------------------------------


def test_memory_hog_is_bounded(sandbox: Sandbox) -> None:
    code = "b = bytearray(1024 * 1024 * 1024); print('ALLOCATED')"
    result = run(sandbox, f'python3 -c "{code}"', timeout=10)
    assert result.exit_code != 0 and "ALLOCATED" not in result.output
    assert_still_works(sandbox)


def test_disk_fill_is_bounded_by_file_size_limit(sandbox: Sandbox) -> None:
    size_mb = MAX_FILE_BYTES // 2**20 + 64
    result = run(sandbox, f"head -c {size_mb}M /dev/zero > big; stat -c %s big; rm -f big")
    assert int(result.output.split()[-1]) <= MAX_FILE_BYTES


def test_filling_the_workspace_meets_its_disk_and_the_sandbox_recovers(sandbox: Sandbox) -> None:
    fill = "for i in 1 2; do head -c 200M /dev/zero > fill$i || echo FAILED; done; du -sm ."
    result = run(sandbox, fill, timeout=60)
    assert "No space left on device" in result.output and "FAILED" in result.output
    assert int(result.output.split()[-2]) <= DISK_MB
    result = run(sandbox, "rm -f fill*; echo ok > ok.txt && cat ok.txt")
    assert (result.output, result.exit_code) == ("ok\n", 0)


def test_user_namespaces_cannot_be_made(sandbox: Sandbox, kind: str) -> None:
    result = run(sandbox, "unshare -U true; echo rc=$?; unshare -Ur id -u; echo rc=$?")
    assert result.output.count("rc=1") == 2, result.output
    assert "Operation not permitted" in result.output
    if kind == "bwrap":
        nested = run(sandbox, "bwrap --unshare-user --ro-bind / / true && echo NESTED")
        assert nested.exit_code != 0 and "NESTED" not in nested.output
    threads = "import threading; t = threading.Thread(target=print, args=('ok',)); t.start()"
    assert run(sandbox, f'python3 -c "{threads}"').output == "ok\n"


@pytest.mark.serial  # bounds the time to close
def test_close_from_another_thread_kills_a_command_ignoring_sigterm_at_once(
    sandbox: Sandbox, token: str
) -> None:
    threading.Timer(0.5, sandbox.close).start()
    start = time.monotonic()
    with pytest.raises(SandboxError, match="closed while its command ran"):
        sandbox.execute(f"trap '' TERM INT HUP; sleep 1000.{token}; echo done", 60)
    assert time.monotonic() - start < 2.5
    assert wait_gone(token) == []


def test_endless_output_is_truncated_with_bounded_memory(sandbox: Sandbox) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run(sandbox, "yes", timeout=2.0)
    grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert result.timed_out and result.truncated and 2.0 <= result.duration_s <= 3.0
    assert "output truncated" in result.output
    assert grown_kb < 64 * 1024


def test_huge_command_runs(sandbox: Sandbox) -> None:
    result = run(sandbox, ": " + "A" * 1_000_000 + "\necho ok")
    assert (result.output, result.exit_code) == ("ok\n", 0)


def test_huge_argv_inside_fails_cleanly(sandbox: Sandbox) -> None:
    result = run(sandbox, "/bin/echo $(head -c 3000000 /dev/zero | tr '\\0' a) | wc -c")
    assert "Argument list too long" in result.output and not result.timed_out


def test_binary_and_invalid_utf8_output(sandbox: Sandbox) -> None:
    result = run(sandbox, "printf 'ok\\377\\376\\000end'")
    assert result.output == "ok\ufffd\ufffd\x00end"
    result = run(sandbox, "head -c 200000 /dev/urandom")
    assert result.truncated and result.exit_code == 0


# --- host-side copies -----------------------------------------------------------------------


def test_download_of_link_to_host_file_does_not_leak(sandbox: Sandbox, tmp_path: Path) -> None:
    run(sandbox, "ln -s /etc/passwd leak")
    dst = tmp_path / "leak"
    with pytest.raises((ValueError, tarfile.TarError, SandboxError)):
        sandbox.download("leak", dst)
    assert not dst.exists() or dst.read_bytes() != Path("/etc/passwd").read_bytes()


def test_download_of_folder_keeps_links_as_links(
    sandbox: Sandbox, kind: str, tmp_path: Path
) -> None:
    run(sandbox, "mkdir d && echo x > d/f && ln -s /etc d/etc && mkfifo d/pipe")
    dst = tmp_path / "d"
    try:
        sandbox.download("d", dst)
    except (tarfile.TarError, ValueError):
        assert kind == "docker"  # tarfile's data filter refuses the absolute link
        return
    assert (dst / "f").read_text() == "x\n"
    assert (dst / "etc").is_symlink() and not (dst / "pipe").exists()


@pytest.mark.parametrize("dst", ["evil/thundersync-pwn-{t}", "../../../etc/thundersync-pwn-{t}"])
def test_upload_through_link_or_dotdot_stays_inside(
    sandbox: Sandbox, kind: str, tmp_path: Path, token: str, dst: str
) -> None:
    run(sandbox, "ln -s /etc evil")
    src = tmp_path / "payload"
    src.write_text("pwned")
    target = Path(f"/etc/thundersync-pwn-{token}")
    try:
        if kind == "bwrap":
            with pytest.raises(ValueError, match="outside the workspace"):
                sandbox.upload(src, dst.format(t=token))
        else:
            sandbox.upload(src, dst.format(t=token))
        assert not target.exists()
    finally:
        target.unlink(missing_ok=True)
