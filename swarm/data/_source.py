"""Where rows come from: a data file, a ``datasets`` folder, or a Hugging Face dataset name.

``--data`` (and ``--heldout``) take, in this order:

- an existing ``.jsonl`` / ``.parquet`` file (``_rows.read_file``);
- an existing folder, optionally ``FOLDER:SPLIT``: a ``Dataset.save_to_disk`` folder
  (``datasets.load_from_disk``; a saved ``DatasetDict`` needs a split, default ``train``), or any other
  folder ``datasets.load_dataset`` reads as a local dataset repository (parquet, jsonl or csv files);
- ``org/name[@revision][:config][:split]``, a dataset on the Hugging Face Hub (the repo id told from a
  path by ``swarm.models.hub.parse_hub_name``'s rules; split default ``train``, slices as datasets
  takes them, ``train[:1000]``; ``name::test`` keeps the default config), loaded with
  ``datasets.load_dataset(name, config, split=split)``. ``datasets`` decides where it comes from:
  online it asks the Hub and downloads what the cache lacks; with ``HF_HUB_OFFLINE=1`` (or
  ``HF_DATASETS_OFFLINE=1``), or when the Hub cannot be reached, it reads only its cache
  (``HF_DATASETS_CACHE``, else ``$HF_HOME/datasets``): the Arrow tables an earlier ``load_dataset`` of
  that name and config prepared. A name it cannot load raises ``DatasetMissing`` with the reason and
  the command that fetches it.

A dataset's rows are numbered from 1 in its split's order and named ``SPEC: row N`` in errors, as a
file's are. ``datasets`` is imported only when a folder or name is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swarm.data._rows import DataError, Row, RowKeys, check_columns, read_file, to_rows
from swarm.models.hub import parse_hub_name

DEFAULT_SPLIT = "train"
_SAVED_MARKERS = ("state.json", "dataset_dict.json")  # what save_to_disk writes (a Dataset, a DatasetDict)


class DatasetMissing(DataError):
    """A dataset name that is neither a local path nor loadable now (not cached, and offline or unknown)."""


@dataclass(frozen=True)
class DatasetSource:
    """A source read through ``datasets``: a Hub name or a local folder (see the module docstring)."""

    spec: str                    # as given: what errors and the study name show
    path: str                    # the repo id, or the folder
    config: str | None = None
    split: str | None = None     # None: the default (train), or a saved Dataset's only table
    revision: str | None = None
    folder: bool = False

    @property
    def stem(self) -> str:
        """A short name for task ids: the folder's or the repo's last part, and the split."""
        parts = [Path(self.path).name, self.config, self.split]
        return "-".join(part for part in parts if part)


def dataset_source(spec: str | Path) -> DatasetSource | None:
    """``spec`` as a folder or Hub name, or None when it is a file (or names nothing)."""
    text = str(spec)
    if Path(text).expanduser().is_file():
        return None
    if Path(text).expanduser().is_dir():
        return DatasetSource(text, str(Path(text).expanduser()), folder=True)
    head, sep, split = text.rpartition(":")
    if sep and head and Path(head).expanduser().is_dir():
        return DatasetSource(text, str(Path(head).expanduser()), split=split or None, folder=True)
    name, _, rest = text.partition(":")
    config, _, split = rest.partition(":")
    hub = parse_hub_name(name)
    if hub is None:
        return None
    return DatasetSource(text, hub.repo_id, config or None, split or None, hub.revision)


def read_rows(spec: str | Path, keys: RowKeys | None = None) -> list[Row]:
    """Every row of a data file, dataset folder or dataset name; ``DataError`` (``DatasetMissing`` for a
    name it cannot load) on the first problem."""
    keys = keys or RowKeys()
    source = dataset_source(spec)
    if source is not None:
        return to_rows(source.spec, records(source, keys), keys)
    if not Path(spec).expanduser().exists():
        raise DataError(spec, None, "no such file, folder or dataset name (org/name[:config][:split])")
    return read_file(Path(spec).expanduser(), keys)


def records(source: DatasetSource, keys: RowKeys) -> list[tuple[int, Any]]:
    """The rows of ``source`` as ``(number, dict)`` pairs, numbered from 1."""
    dataset = load(source)
    check_columns(source.spec, list(dataset.column_names), keys)
    return list(enumerate(dataset.to_list(), start=1))


def load(source: DatasetSource) -> Any:
    """The ``datasets.Dataset`` of ``source``; ``DataError`` (``DatasetMissing``) when it cannot be loaded."""
    import datasets  # heavy, and only for folders and names

    try:
        if source.folder and any((Path(source.path) / marker).is_file() for marker in _SAVED_MARKERS):
            return _split_of(source, datasets.load_from_disk(source.path))
        return datasets.load_dataset(source.path, source.config, split=source.split or DEFAULT_SPLIT,
                                     revision=source.revision)
    except DataError:
        raise
    except (ConnectionError, FileNotFoundError, datasets.exceptions.DatasetNotFoundError) as exc:
        if source.folder:
            raise DataError(source.spec, None, f"datasets cannot read this folder: {exc}") from None
        raise DatasetMissing(source.spec, None, _missing(source, exc)) from None
    except ValueError as exc:  # an unknown split or config, a cache without this config: datasets says which
        if not source.folder and "Couldn't find cache" in str(exc):
            raise DatasetMissing(source.spec, None, _missing(source, exc)) from None
        raise DataError(source.spec, None, " ".join(str(exc).split())) from None


def _split_of(source: DatasetSource, saved: Any) -> Any:
    """The split a ``load_from_disk`` result stands for: a Dataset itself, or one split of a DatasetDict."""
    if not hasattr(saved, "keys"):
        if source.split is not None:
            raise DataError(source.spec, None, "a saved Dataset has no splits: name the folder without ':SPLIT'")
        return saved
    split = source.split or DEFAULT_SPLIT
    if split not in saved:
        raise DataError(source.spec, None, f"the saved DatasetDict has no split {split!r} (splits: "
                                           f"{', '.join(saved)}): name one as FOLDER:SPLIT")
    return saved[split]


def fetch_command(source: DatasetSource, offline: bool = False) -> str:
    """The command that puts ``source`` into the datasets cache, where an offline load finds it
    (``offline``: prefixed with ``HF_HUB_OFFLINE=0``, since the user's shell has it set).

    ``hf download --repo-type dataset`` alone is not enough: offline, ``datasets`` reads the Arrow tables
    a ``load_dataset`` prepared, not the hub cache's raw files."""
    args = [repr(source.path)]
    if source.config is not None:
        args.append(repr(source.config))
    args.append(f"split={source.split or DEFAULT_SPLIT!r}")
    if source.revision is not None:
        args.append(f"revision={source.revision!r}")
    command = f"python -c \"import datasets; datasets.load_dataset({', '.join(args)})\""
    return f"HF_HUB_OFFLINE=0 {command}" if offline else command


def _missing(source: DatasetSource, exc: Exception) -> str:
    import datasets.config  # its reading of HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, the one the load obeyed

    offline = bool(datasets.config.HF_HUB_OFFLINE)
    reason = "HF_HUB_OFFLINE is set" if offline else " ".join(str(exc).split())
    return (f"not a local path, and as a Hugging Face dataset it cannot be loaded ({reason}) and is not in the "
            f"datasets cache ({datasets.config.HF_DATASETS_CACHE}): fetch it first with "
            f"`{fetch_command(source, offline)}`")


def save_snapshot(spec: str | Path, keys: RowKeys, path: Path) -> Path:
    """Write the rows of a dataset folder or name, as they are (its own columns), to the parquet file
    ``path``, so a study trains on one fixed copy (``researcher start --data NAME``); ``path``."""
    source = dataset_source(spec)
    if source is None:
        raise DataError(spec, None, "not a dataset folder or name")
    dataset = load(source)
    check_columns(source.spec, list(dataset.column_names), keys)
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.to_parquet(str(path))
    return path


def is_dataset(spec: str | Path) -> bool:
    """Whether ``spec`` is read through ``datasets`` (a folder or a name), not as a file."""
    return dataset_source(spec) is not None

