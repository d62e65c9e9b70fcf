"""Hugging Face Hub names: ``--model org/name[@revision]`` to a snapshot folder in the hub cache.

A name is told from a path by its shape and by the disk: exactly one slash, nothing before the
organisation (no ``./``, ``/`` or ``~``), a repo id's characters (letters, digits, ``-``, ``_``, ``.``;
no ``--`` or ``..``), an optional ``@revision`` (a branch, a tag or a 40-hex commit), and no file or
folder of that name on disk: a local folder that looks like ``org/name`` is loaded as a folder.

Resolution goes through ``huggingface_hub.snapshot_download`` into the hub cache (``HF_HUB_CACHE``,
else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``), so a model fetched with ``hf download`` or by
transformers is found, and one fetched here is theirs too:

- offline (``HF_HUB_OFFLINE=1``) only the cache is read (``local_files_only``);
- a commit is immutable: a cached one is used without asking the Hub;
- otherwise the Hub says which commit the revision names now and what is missing is downloaded;
  without a network the cached copy of that revision is used (huggingface_hub's own fallback).

Only what an engine reads is fetched (``FILES``: configs, tokenizers, chat templates and transformers'
safetensors weights; never pickled ``.bin`` weights, ONNX, GGUF or other copies). A name neither cached nor downloadable
raises ``HubModelMissing``, a ``ValueError`` whose text is the ``hf download`` command that fetches
exactly those files. huggingface_hub is imported only when a name is resolved: ``parse_hub_name`` is
standard library, as ``swarm.models.named`` (which the researcher reads) needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FILES", "HubModelMissing", "HubName", "cached_snapshot", "download_command", "hub_snapshot",
           "parse_hub_name"]

# What the engines read from a Hugging Face folder (fnmatch patterns, as ``hf download --include`` takes):
# transformers' weights are model.safetensors or the shards its index names (model-00001-of-00004...), so
# not a second copy in another layout (Mistral's consolidated.safetensors).
FILES = ("*.json", "model*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")

_PART = r"[A-Za-z0-9](?:[\w.-]*[A-Za-z0-9_])?"  # a repo id part: no leading or trailing '.' or '-'
_NAME = re.compile(rf"(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[\w.][\w./-]*))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_MAX_REPO_ID = 96  # the Hub's limit


@dataclass(frozen=True)
class HubName:
    """A model on the Hugging Face Hub: its repo id and, if one was named, a revision."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"

    def pinned(self, snapshot: Path) -> HubName:
        """This name at the commit of ``snapshot`` (a snapshot folder is named by its commit)."""
        return HubName(self.repo_id, snapshot.name)


class HubModelMissing(ValueError):
    """A Hub model that is not in the cache and cannot be downloaded now (offline or unreachable)."""


def parse_hub_name(model: str) -> HubName | None:
    """``model`` as a Hub name, or None when it is not shaped like one or names an existing path."""
    match = _NAME.fullmatch(model)
    if match is None or Path(model).expanduser().exists():
        return None
    repo, revision = match["repo"], match["revision"]
    if "--" in repo or ".." in repo or len(repo) > _MAX_REPO_ID or repo.endswith(".gguf"):
        return None
    if revision is not None and ".." in revision:
        return None
    return HubName(repo, revision)


def download_command(name: HubName, cache_dir: str | Path | None = None) -> str:
    """The ``hf download`` command that puts what ``hub_snapshot`` loads into the cache."""
    parts = ["hf", "download", name.repo_id]
    if name.revision is not None:
        parts += ["--revision", name.revision]
    for pattern in FILES:
        parts += ["--include", f"'{pattern}'"]
    if cache_dir is not None:
        parts += ["--cache-dir", str(cache_dir)]
    return " ".join(parts)


def hub_snapshot(name: HubName, cache_dir: str | Path | None = None) -> Path:
    """The snapshot folder of ``name`` in the hub cache (``cache_dir``, default huggingface_hub's),
    downloaded first when online and missing (see the module docstring). ``HubModelMissing`` when it
    is not cached and cannot be downloaded; ``ValueError`` for a repo or revision the Hub does not
    have, a private or gated repo without a token, or a snapshot without weights an engine loads."""
    from huggingface_hub import is_offline_mode
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError

    offline = is_offline_mode()
    commit = name.revision is not None and _COMMIT.fullmatch(name.revision) is not None
    tries = [True] if offline else [True, False] if commit else [False]  # local_files_only, in order
    reason = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
    for local_only in tries:
        try:
            folder = _snapshot(name, cache_dir, local_only)
        except LocalEntryNotFoundError as exc:
            if isinstance(exc, IncompleteSnapshotError):
                reason = "its cached snapshot misses files (an interrupted download)"
            continue
        return _checked(folder, name)
    raise HubModelMissing(f"model {name} is not a local path, and as a Hugging Face Hub name it is not in the hub cache "
                          f"({_cache_root(cache_dir)}) and {reason}: download it first with "
                          f"`{download_command(name, cache_dir)}`")


def cached_snapshot(name: HubName, cache_dir: str | Path | None = None) -> Path | None:
    """The snapshot folder of ``name`` if the cache holds it, else None; never asks the Hub."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return _snapshot(name, cache_dir, local_only=True)
    except (LocalEntryNotFoundError, ValueError):
        return None


def _snapshot(name: HubName, cache_dir: str | Path | None, local_only: bool) -> Path:
    """``snapshot_download`` of ``FILES``, its Hub errors as ``ValueError`` with the fix."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        return Path(snapshot_download(name.repo_id, revision=name.revision, cache_dir=cache_dir,
                                      local_files_only=local_only, allow_patterns=list(FILES)))
    except RevisionNotFoundError:
        raise ValueError(f"the Hugging Face Hub has no revision {name.revision!r} of {name.repo_id}") from None
    except RepositoryNotFoundError:  # also a gated repo (GatedRepoError) without access
        raise ValueError(f"no model {name.repo_id} on the Hugging Face Hub, or it is private or gated: check the "
                         "name, or log in with `hf auth login` (and accept its terms on the Hub)") from None
    except HfHubHTTPError as exc:
        raise ValueError(f"the Hugging Face Hub refused {name}: {exc}") from None


def _checked(folder: Path, name: HubName) -> Path:
    if not (folder / "config.json").is_file():
        raise ValueError(f"{name} ({folder}) has no config.json: not a transformers model")
    if not any(folder.glob("model*.safetensors")):
        raise ValueError(f"{name} ({folder}) has no safetensors weights; swarm loads only those (not pickled .bin "
                         "files): pick a repo or revision that has them, or convert it into a local folder")
    return folder


def _cache_root(cache_dir: str | Path | None) -> str:
    if cache_dir is not None:
        return str(cache_dir)
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)
