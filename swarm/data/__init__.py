"""Data files as studies: ``swarm run --data FILE`` (verl's RL row format or plain prompt/answer
rows, jsonl or parquet), scored by verl's reward functions or the user's.

Outside ``swarm.client`` on purpose: reading parquet needs pyarrow and the default reward needs
verl (and torch), which a client must not import; both are imported only when used.
"""

from swarm.data._reward import load_reward
from swarm.data._rows import DataError, DataTask, Row, file_sha256, read_rows
from swarm.data._study import DataOptions, DataStudy, build_study

__all__ = ["DataError", "DataOptions", "DataStudy", "DataTask", "Row", "build_study", "file_sha256", "load_reward", "read_rows"]
