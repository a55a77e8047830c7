"""Docker exec output under load: how many short commands come back wrong when the exec
stream is read from the socket alone, against reading first what the HTTP client buffered
past the upgrade response's headers (``capture._buffered``; docs/design.md, sandboxes).

Four Docker sandboxes, one thread each, run ``cat`` of a two-byte file ``--execs`` times per
round, the two ways alternating by round (this machine is shared and noisy: run it beside a
CPU-bound load, as ``yes > /dev/null`` twice on 2 cores, to see the difference). It prints,
per round and way, the commands whose output or exit status was wrong and how many streams
had bytes buffered. A measurement, not a test: it exits 0 whatever it finds, 2 without
Docker.

    python benchmarks/docker_exec_output.py [--rounds 2 --execs 250]
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments.sandboxes import capture, docker_daemon, make_sandbox  # noqa: E402
from environments.sandboxes.protocol import SandboxSpec  # noqa: E402

SANDBOXES = 4


def run_round(execs: int, socket_only: bool) -> tuple[int, int]:
    """(wrong outputs, streams with buffered bytes) of ``SANDBOXES`` × ``execs`` commands."""
    read_buffer, wrong, buffered = capture._buffered, [0], [0]
    lock = threading.Lock()

    def chosen(sock: object) -> bytes:
        data = read_buffer(sock)
        with lock:
            buffered[0] += bool(data)
        return b"" if socket_only else data

    def worker() -> None:
        sandbox = make_sandbox(SandboxSpec(workdir="/app"), kind="docker")
        try:
            sandbox.execute("echo 1 > /tmp/r", timeout=30)
            for _ in range(execs):
                result = sandbox.execute("cat /tmp/r", timeout=60)
                if (result.output, result.exit_code) != ("1\n", 0):
                    with lock:
                        wrong[0] += 1
        finally:
            sandbox.close()

    capture._buffered = chosen
    try:
        threads = [threading.Thread(target=worker) for _ in range(SANDBOXES)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        capture._buffered = read_buffer
    return wrong[0], buffered[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--execs", type=int, default=250, help="commands per sandbox and round")
    args = parser.parse_args()
    if args.rounds < 1 or args.execs < 1:
        parser.error("--rounds and --execs must be at least 1")
    if not docker_daemon.docker_available():
        print("no Docker daemon answers", file=sys.stderr)
        return 2
    total = SANDBOXES * args.execs
    for round_number in range(args.rounds):
        for socket_only in (True, False):
            wrong, buffered = run_round(args.execs, socket_only)
            way = "socket only " if socket_only else "buffer first"
            print(
                f"round {round_number} {way}: {wrong} of {total} wrong, "
                f"{buffered} with bytes buffered past the headers",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
