"""The repository stands on its own: no tracked file names a file outside it, and every repository
path the docs (README and the pages under ``docs/``) name exists.

The project began beside a folder of notes (a design, a style guide, measured facts) that a clone
does not have; citing them sent readers to files they cannot open. Read from ``git ls-files``, so
only what a clone holds counts; the docs' paths also count the untracked files git does not ignore
(what the next commit adds: in a fresh clone those are tracked, or absent and the test fails there).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Split so that this file does not name them itself.
_OUTSIDE = ("../" + "shared", "FACTS" + ".md", "DESIGN" + ".md", "STYLE" + ".md")
_LINK = re.compile(r"\]\(([^)\s]+)\)")  # a markdown link's target
_CODE_PATH = re.compile(r"`([A-Za-z0-9_.-]+/[^`\s]*)`")  # `folder/...` in backticks
_PLACEHOLDER = re.compile(r"[<>*{}$…]|\bN\b")  # `studies/<id>/`, `checkpoints/step-N/`: patterns, not paths


def _git(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, input=stdin,
                          check=stdin is None).stdout


def _tracked(*, unadded: bool = False) -> list[str]:
    """Tracked files; with ``unadded``, also the untracked ones git does not ignore."""
    extra = ("--others", "--exclude-standard") if unadded else ()
    return [p for p in _git("ls-files", "-z", "--cached", *extra).split("\0") if p]


def _docs(tracked: set[str]) -> list[str]:
    """README and every page of the docs site."""
    return sorted(p for p in tracked if p == "README.md" or (p.startswith("docs/") and p.endswith(".md")))


def _text(path: str) -> str | None:
    """A tracked file's text; None for a binary file (a NUL byte) or one missing from the work tree."""
    try:
        data = (ROOT / path).read_bytes()
    except OSError:
        return None
    return None if b"\0" in data[:8192] else data.decode(errors="replace")


def _exists(path: str, tracked: set[str]) -> bool:
    """A tracked file, or a folder holding one."""
    path = path.rstrip("/")
    return path in tracked or any(t.startswith(path + "/") for t in tracked)


def test_no_tracked_file_names_a_file_outside_the_repository() -> None:
    tracked = _tracked()
    names = {Path(p).name for p in tracked}
    found = []
    for path in tracked:
        text = _text(path)
        for number, line in enumerate((text or "").splitlines(), 1):
            found += [f"{path}:{number}: {name}" for name in _OUTSIDE
                      if name in line and (name.startswith("..") or name not in names)]
    assert not found, "files named that are not in the repository:\n" + "\n".join(found)


def test_every_repository_path_the_docs_name_exists() -> None:
    """Markdown links in every tracked .md file, relative to it; and in README and the docs pages every
    `folder/...` path in backticks under a top-level folder of the repository, unless it is a placeholder
    or a run output (a path git ignores, e.g. `artifacts/daemon.json`)."""
    tracked = set(_tracked(unadded=True))
    top = {p.split("/", 1)[0] for p in tracked if "/" in p}
    missing = []
    for doc in sorted(p for p in tracked if p.endswith(".md")):
        for target in _LINK.findall(_text(doc) or ""):
            if re.match(r"[a-z]+:|#", target):  # a URL or an anchor
                continue
            resolved = (ROOT / doc).parent / target.split("#", 1)[0]
            if not _exists(str(resolved.resolve().relative_to(ROOT)), tracked):
                missing.append(f"{doc}: link to {target}")
    named = {(doc, p) for doc in _docs(tracked) for p in _CODE_PATH.findall(_text(doc) or "")
             if p.split("/", 1)[0] in top and not _PLACEHOLDER.search(p)}
    ignored = set(_git("check-ignore", "--stdin", stdin="\n".join(sorted({p for _, p in named}))).split())
    missing += [f"{doc}: `{p}`" for doc, p in sorted(named) if p not in ignored and not _exists(p, tracked)]
    assert not missing, "paths the docs name that are not in the repository:\n" + "\n".join(missing)
