"""A seccomp filter for bubblewrap sandboxes: making a user namespace fails with EPERM.

A user namespace gives its creator every capability inside it (``unshare -Ur`` is "root"), and
with them mount, network and other namespaces: kernel attack surface an agent has no need for.
Docker's default seccomp profile refuses it already; bubblewrap needs this filter.

Why a filter, not bubblewrap's ``--disable-userns``: bubblewrap here is 0.8.0, whose
``--disable-userns`` works by lowering ``user.max_user_namespaces`` inside a user namespace that
bwrap itself makes, so it requires ``--unshare-user``; as root the sandbox deliberately runs as
a per-sandbox uid without a user namespace (see ``bwrap.py``), where the option is refused. The
filter works the same with and without root.

What it refuses (the same rule as Docker's profile): ``unshare`` and ``clone`` whose flags
include ``CLONE_NEWUSER`` get EPERM; ``clone3``, whose flags sit behind a pointer that seccomp
cannot read, gets ENOSYS, on which glibc falls back to ``clone``. Everything else is allowed.
The program covers the native and compat ABIs of x86-64 (x86-64, x32, i386) and of AArch64
(AArch64, ARM); a process of any other ABI gets ENOSYS for every call. On other machines
``program()`` is None and sandboxes run without the filter (``available()``).
"""

from __future__ import annotations

import os
import platform
import struct

CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes (linux/filter.h)
LD_W_ABS, ALU_AND_K, JMP_JEQ_K, JMP_JSET_K, RET_K = 0x20, 0x54, 0x15, 0x45, 0x06
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little endian)
NR_OFFSET, ARCH_OFFSET, ARG0_LOW_OFFSET = 0, 4, 16

# audit arch -> (clone, unshare, clone3) syscall numbers
ABIS = {
    "x86_64": {0xC000003E: (56, 272, 435), 0x40000003: (120, 310, 435)},
    "aarch64": {0xC00000B7: (220, 97, 435), 0x40000028: (120, 337, 435)},
}
X86_64_ARCH = 0xC000003E


def available() -> bool:
    """True when this machine's ABIs are covered, so sandboxes here refuse user namespaces."""
    return platform.machine() in ABIS


Instruction = tuple[int, int, int, int]
"""One ``struct sock_filter``: code, jump if true, jump if false, k."""


def program() -> bytes | None:
    """The filter as ``struct sock_filter[]`` bytes (what ``bwrap --seccomp FD`` reads)."""
    abis = ABIS.get(platform.machine())
    if abis is None:
        return None
    code: list[Instruction] = []
    for arch, numbers in abis.items():
        block = _abi_block(arch, *numbers)
        code += [(LD_W_ABS, 0, 0, ARCH_OFFSET), (JMP_JEQ_K, 0, len(block), arch), *block]
    code.append((RET_K, 0, 0, RET_ERRNO | ENOSYS))
    return b"".join(struct.pack("=HBBI", *insn) for insn in code)


def _abi_block(arch: int, clone: int, unshare: int, clone3: int) -> list[Instruction]:
    """Instructions for one ABI, entered with its arch matched; every path returns."""
    load: list[Instruction] = [(LD_W_ABS, 0, 0, NR_OFFSET)]
    if arch == X86_64_ARCH:  # x32 calls carry the x32 bit: check them as their x86-64 twins
        load.append((ALU_AND_K, 0, 0, ~X32_SYSCALL_BIT & 0xFFFFFFFF))
    return [
        *load,
        (JMP_JEQ_K, 0, 1, clone3),
        (RET_K, 0, 0, RET_ERRNO | ENOSYS),
        (JMP_JEQ_K, 1, 0, unshare),
        (JMP_JEQ_K, 0, 3, clone),
        (LD_W_ABS, 0, 0, ARG0_LOW_OFFSET),
        (JMP_JSET_K, 0, 1, CLONE_NEWUSER),
        (RET_K, 0, 0, RET_ERRNO | EPERM),
        (RET_K, 0, 0, RET_ALLOW),
    ]


def program_fd() -> int | None:
    """A pipe's read end holding ``program()`` (the caller passes it to bwrap and closes it);
    None where the filter is unavailable."""
    code = program()
    if code is None:
        return None
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, code)  # a few hundred bytes: well within a pipe's buffer
    finally:
        os.close(write_fd)
    return read_fd
