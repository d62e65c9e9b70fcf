"""``--config FILE`` read in process: a file whose ``server`` key is not a table is refused with a
``ValueError`` naming the file, as a malformed TOML file is (it used to end in an AttributeError); keys
flat or in section tables; every key documented, in one section, listed by ``swarm serve --help``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarm.config import ENGINE_KEYS, SECTIONS, ServerConfig, engine_choice, key_help, read_config_file


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


def test_every_key_has_one_section_and_a_meaning() -> None:
    listed = [key for keys in SECTIONS.values() for key in keys]
    assert sorted(listed) == sorted([*ServerConfig.model_fields, *ENGINE_KEYS])  # each exactly once
    for key in listed:
        assert key_help(key)[2], f"{key} has no description"


def test_keys_grouped_in_section_tables_read_as_the_flat_file(tmp_path: Path) -> None:
    grouped, flat = tmp_path / "grouped.toml", tmp_path / "flat.toml"
    grouped.write_text('[optimiser]\nlr = 0.002\n[batching]\ngroup_size = 4\nbatch_groups = 2\n'
                       '[engines]\nmodel = "tiny-bpe"\n')
    flat.write_text('lr = 0.002\ngroup_size = 4\nbatch_groups = 2\nmodel = "tiny-bpe"\n')
    assert read_config_file(grouped) == read_config_file(flat)
    assert ServerConfig.from_toml(grouped) == ServerConfig(lr=0.002, group_size=4, batch_groups=2)


@pytest.mark.parametrize(("text", "error"), [
    ("[optimiser]\ngroup_size = 4\n", r"\[optimiser\] holds no 'group_size'; its keys: \['lr'"),
    ("lr = 0.1\n[optimiser]\nlr = 0.2\n", r"'lr' is set twice"),
])
def test_a_key_in_the_wrong_table_or_set_twice_is_refused_by_name(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        read_config_file(path)


def test_serve_help_lists_every_key_by_section() -> None:
    shown = subprocess.run([sys.executable, "-m", "swarm.cli", "serve", "--help"], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "200"}, check=True).stdout
    for section, keys in SECTIONS.items():
        assert f"[{section}]" in shown
        assert all(f" {key} = " in shown for key in keys), section
    assert "oldest policy lag a sample may have" in shown
