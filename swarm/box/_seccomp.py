"""The box's seccomp filter: no program is executed and no process is made; threads are.

Installed by ``swarm.box._inside`` in the boxed interpreter itself, after it started: from then on
``execve``/``execveat`` fail with EPERM (the exec allow-list is the interpreter already running, so
``os.system``, ``subprocess`` and a re-exec all fail), ``fork``/``vfork`` and a ``clone`` without
``CLONE_THREAD`` fail with EPERM (the process count is one), ``clone3`` answers ENOSYS (its flags sit
behind a pointer a filter cannot read; glibc then falls back to ``clone``, which threads pass), and
``ptrace``/``process_vm_*`` fail with EPERM. A system call of another ABI (x32, i386 on x86_64) kills
the process: a filter keyed by x86_64 numbers would not see it.

Built by hand with the classic BPF opcodes (no libseccomp binding is needed), for x86_64 and aarch64.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

__all__ = ["SeccompUnavailable", "filter_program", "install"]

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16
CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000

# machine -> (AUDIT_ARCH, denied with EPERM, clone, clone3, seccomp(2), x32 bit to refuse)
_ARCH: dict[str, tuple[int, dict[str, int], int, int, int, bool]] = {
    "x86_64": (0xC000003E, {"fork": 57, "vfork": 58, "execve": 59, "ptrace": 101, "execveat": 322,
                            "process_vm_readv": 310, "process_vm_writev": 311}, 56, 435, 317, True),
    "aarch64": (0xC00000B7, {"execve": 221, "ptrace": 117, "execveat": 281,
                             "process_vm_readv": 270, "process_vm_writev": 271}, 220, 435, 277, False),
}


class SeccompUnavailable(RuntimeError):
    """This machine's architecture or kernel cannot take the filter."""


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes:
    """The filter as ``struct sock_filter[]`` bytes for ``machine`` (default: this one)."""
    machine = machine or platform.machine()
    if machine not in _ARCH:
        raise SeccompUnavailable(f"no seccomp filter for the {machine} architecture (x86_64 and aarch64 only)")
    arch, denied, clone, clone3, _, x32 = _ARCH[machine]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog = [_op(_LD_W_ABS, _OFF_ARCH), _op(_JEQ_K, arch, 1, 0), _op(_RET_K, _RET_KILL_PROCESS),
            _op(_LD_W_ABS, _OFF_NR)]
    if x32:
        prog += [_op(_JGE_K, _X32_BIT, 0, 1), _op(_RET_K, _RET_KILL_PROCESS)]
    for nr in denied.values():
        prog += [_op(_JEQ_K, nr, 0, 1), _op(_RET_K, eperm)]
    prog += [_op(_JEQ_K, clone3, 0, 1), _op(_RET_K, enosys)]
    # clone: a thread (CLONE_THREAD in the low word of the first argument) passes, a process does not.
    prog += [_op(_JEQ_K, clone, 0, 4), _op(_LD_W_ABS, _OFF_ARG0), _op(_JSET_K, CLONE_THREAD, 0, 1),
             _op(_RET_K, _RET_ALLOW), _op(_RET_K, eperm)]
    prog.append(_op(_RET_K, _RET_ALLOW))
    return b"".join(prog)


class _Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """Install the filter on every thread of this process (``SECCOMP_FILTER_FLAG_TSYNC``); for good."""
    program = filter_program()
    seccomp_nr = _ARCH[platform.machine()][4]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to filter without privileges
        raise SeccompUnavailable(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {errno.errorcode.get(ctypes.get_errno())}")
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _Fprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    # seccomp(SECCOMP_SET_MODE_FILTER=1, SECCOMP_FILTER_FLAG_TSYNC=1, &fprog)
    if libc.syscall(seccomp_nr, 1, 1, ctypes.byref(fprog)) != 0:
        raise SeccompUnavailable(f"seccomp(SECCOMP_SET_MODE_FILTER) failed: "
                                 f"{errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}")
