"""What the box shows its client, as a bubblewrap command line (``BoxPlan.bwrap_argv``).

The client sees, read-only: the system's libraries (``/usr``, ``/lib*``, a few files of ``/etc``),
the interpreter's prefix, the virtual environment, the ``swarm`` package, the study's own folder and
any extra read-only paths (a model, a data file). Its run folder (also its HOME and TMPDIR; there is
no /tmp) is writable: a private tmpfs of ``disk_mb`` MiB at the run folder's path, so what the client
writes there stays in the box and cannot fill the machine's disk, except the output files named in
``outputs``: the real files, bound read-write (each capped by ``RLIMIT_FSIZE``). Everything else does
not exist in the box: the home folders, the repository's ``artifacts/``, the server's state dir and
its tokens (masked with an empty tmpfs even where a read-only path contains it); the root is read-only.

Namespaces: user (no capabilities, no further user namespaces), mount, PID (the box dies whole with
its first process), IPC, UTS, cgroup and network (only loopback; ``swarm.box._forward`` hands the
server's port in).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BoxPlan"]

# Read-only system paths (each bound if present; a symlink, as on merged-/usr systems, is recreated).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl",
                "/etc/ca-certificates", "/etc/mime.types")


@dataclass(frozen=True)
class BoxPlan:
    """One boxed process's view of the file system and its namespaces."""

    run_dir: Path
    """the client's working folder (writable: a private tmpfs of ``disk_mb`` MiB at this path)"""
    study_dir: Path
    """the study's own folder (read-only)"""
    read_only: Sequence[Path] = ()
    """more read-only paths: the interpreter, the environment, the swarm package, a model, a data file"""
    outputs: Sequence[Path] = ()
    """files the client writes that must outlive the box (bound read-write; created empty if missing)"""
    hidden: Sequence[Path] = ()
    """paths masked with an empty tmpfs wherever a read-only path would show them (the server's state)"""
    disk_mb: int = 64
    """the run folder's size: writes past it fail with ENOSPC"""
    extra_args: Sequence[str] = field(default_factory=tuple)
    """bubblewrap arguments added before the command (``--block-fd``, ``--info-fd``)"""

    @staticmethod
    def interpreter_paths() -> list[Path]:
        """The running interpreter's prefix, its virtual environment and the ``swarm`` package's folder."""
        import swarm

        paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
                 Path(swarm.__file__).resolve().parent, Path(sys.executable).resolve().parent}
        return sorted(p for p in paths if not any(q in p.parents for q in paths))

    def bwrap_argv(self, bwrap: str, command: Sequence[str]) -> list[str]:
        """The whole ``bwrap …`` command line that runs ``command`` in the box."""
        argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
                "--cap-drop", "ALL", "--hostname", "box"]
        for system_dir in SYSTEM_DIRS:
            argv += _system(Path(system_dir))
        for system_file in SYSTEM_FILES:
            argv += ["--ro-bind-try", system_file, system_file]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        # Parents before children, so a read-only study folder inside the run folder stays visible,
        # and a run folder inside a read-only folder is still writable.
        mounts: list[tuple[Path, list[str]]] = [(self.run_dir, ["--size", str(self.disk_mb << 20), "--tmpfs"])]
        mounts += [(path, ["--ro-bind"]) for path in {self.study_dir, *self.read_only}]
        for path, how in sorted(mounts, key=lambda m: (len(m[0].parts), m[1][0] != "--size")):
            argv += [*how, str(path)] if how[0] == "--size" else [*how, str(path), str(path)]
        visible = [path for path, how in mounts if how == ["--ro-bind"]]
        for path in self.hidden:
            if any(path == root or root in path.parents for root in visible):
                argv += ["--tmpfs", str(path)]
        for path in self.outputs:
            argv += ["--bind", str(path), str(path)]
        # The root bubblewrap built the view on is a tmpfs: read-only, so nothing lands outside the run folder.
        return [*argv, "--remount-ro", "/", "--chdir", str(self.run_dir), *self.extra_args, "--", *command]


def _system(path: Path) -> list[str]:
    if path.is_symlink():
        return ["--symlink", str(path.readlink()), str(path)]
    return ["--ro-bind", str(path), str(path)] if path.is_dir() else []
