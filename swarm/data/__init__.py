"""Data files as studies: ``swarm run --data FILE`` (verl's RL row format or plain prompt/answer
rows, jsonl or parquet; or a ``datasets`` folder or Hugging Face dataset name, its columns named with
``--prompt-key`` / ``--answer-key``), scored by verl's reward functions or the user's.

Outside ``swarm.client`` on purpose: reading parquet needs pyarrow, datasets by name need
``datasets`` and the default reward needs verl (and torch), which a client must not import; each is
imported only when used.
"""

from swarm.data._reward import load_reward
from swarm.data._rows import DataError, DataTask, Row, RowKeys, file_sha256, final_answer
from swarm.data._source import DatasetMissing, dataset_source, is_dataset, read_rows, save_snapshot
from swarm.data._study import DataOptions, DataStudy, build_study

__all__ = ["DataError", "DataOptions", "DataStudy", "DataTask", "DatasetMissing", "Row", "RowKeys", "build_study",
           "dataset_source", "file_sha256", "final_answer", "is_dataset", "load_reward", "read_rows", "save_snapshot"]
