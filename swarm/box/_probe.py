"""Whether this machine can build the box, and if not, what is missing (named for the error).

Three things are needed: the ``bwrap`` program (Debian/Ubuntu package ``bubblewrap``; ``.ci/setup``
installs it), user namespaces that bubblewrap may create (off on some hardened kernels and in some
containers: ``kernel.unprivileged_userns_clone``, ``user.max_user_namespaces``, AppArmor's
``apparmor_restrict_unprivileged_userns``) and seccomp filters. The probe starts one empty box with
the same namespaces (about 50 ms) and caches the answer for the process.
"""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess

__all__ = ["BoxUnavailable", "missing"]


class BoxUnavailable(RuntimeError):
    """The box cannot be built here; the message names what is missing."""


class _Missing:
    """``missing()``: None when the box can be built, else what is missing; ``missing.bwrap``: its path."""

    bwrap: str | None = None

    @functools.cache  # noqa: B019 -- one probe per process, on a module-level singleton
    def __call__(self) -> str | None:
        self.bwrap = shutil.which("bwrap")
        if self.bwrap is None:
            return ("bubblewrap is not installed (no `bwrap` on PATH): install the `bubblewrap` package "
                    "(apt-get install bubblewrap; .ci/setup does)")
        if platform.machine() not in ("x86_64", "aarch64"):
            return f"the box's seccomp filter supports x86_64 and aarch64, not {platform.machine()}"
        try:
            done = subprocess.run([self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                                   "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc", "--", "true"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap could not be started: {exc}"
        if done.returncode != 0:
            return ("bubblewrap cannot create the box's namespaces (user, mount, PID, network): "
                    f"{done.stderr.strip() or done.returncode}; user namespaces may be disabled "
                    "(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, or "
                    "kernel.apparmor_restrict_unprivileged_userns=0)")
        try:
            with open("/proc/self/status") as status:
                if "Seccomp:" not in status.read():
                    return "this kernel has no seccomp (CONFIG_SECCOMP_FILTER)"
        except OSError:
            pass
        return None


missing = _Missing()
