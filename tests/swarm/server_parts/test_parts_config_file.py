"""``--config FILE`` read in process: a file whose ``server`` key is not a table is refused with a
``ValueError`` naming the file, as a malformed TOML file is (it used to end in an AttributeError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swarm.config import ServerConfig, engine_choice


def test_a_server_key_that_is_not_a_table_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('server = "fast"\n')
    with pytest.raises(ValueError, match=r"config\.toml: \[server\] must be a table"):
        ServerConfig.from_toml(path)
    with pytest.raises(ValueError, match=r"\[server\] must be a table"):
        engine_choice(path)


def test_a_server_table_and_flat_keys_both_still_read(tmp_path: Path) -> None:
    table, flat = tmp_path / "table.toml", tmp_path / "flat.toml"
    table.write_text('[server]\nlr = 0.002\nmodel = "tiny-bpe"\n')
    flat.write_text('lr = 0.002\nmodel = "tiny-bpe"\n')
    for path in (table, flat):
        assert ServerConfig.from_toml(path).lr == 0.002
        assert engine_choice(path) == {"model": "tiny-bpe"}
