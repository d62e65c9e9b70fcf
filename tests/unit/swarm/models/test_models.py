"""The model resolver (``swarm.models.resolve``): registry models and GGUF files become one cached
Hugging Face folder, converted once even when two processes start together; a file that is not a
convertible causal LM is refused with the reason before anything is cached or served."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, free_port
from support.gguf_files import smollm2_gguf, write_tiny_llama, write_truncated

from swarm.models.named import RegistryModel
from swarm.models.resolve import locate, model_name, resolve_model_folder

pytestmark = pytest.mark.timeout(600)


def _cached(root: Path) -> list[str]:
    """What a reader could take from the cache: folders, not locks or staging leftovers."""
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.exists() else []


def test_registry_name_and_its_file_share_one_conversion() -> None:
    folder = resolve_model_folder("smollm2-135m")  # the test session's cache (tests/conftest.py)
    assert resolve_model_folder(str(smollm2_gguf())) == folder
    marker = json.loads((folder / "swarm-model.json").read_text())
    assert (marker["architecture"], marker["parameters"], marker["vocab_size"]) == ("llama", 134_515_008, 49_152)
    assert (marker["eos"], marker["pad"]) == ("<|im_end|>", "<|endoftext|>")  # the conversion names <|im_start|>
    assert model_name("smollm2-135m", folder) == "smollm2-135m"
    assert model_name(str(smollm2_gguf()), folder) == "SmolLM2-135M-Instruct.Q4_1"


def test_two_processes_converting_at_once_convert_once(tmp_path: Path) -> None:
    gguf, cache = write_tiny_llama(tmp_path / "tiny-llama.gguf"), tmp_path / "cache"
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO);"
            "from swarm.models.resolve import resolve_model_folder;"
            "print(resolve_model_folder(sys.argv[1], cache_dir=sys.argv[2]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(gguf), str(cache)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [p.communicate(timeout=500) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    assert len({out.strip() for out, _ in results}) == 1
    assert sum("converting" in err for _, err in results) == 1, [err[-2000:] for _, err in results]
    folder = Path(results[0][0].strip())
    assert _cached(cache) == [folder.name]
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 2, 64)


@pytest.mark.parametrize("case, reason", [
    ("truncated", "truncated"),
    ("encoder", "not a decoder-only causal LM"),
    ("unknown", "transformers cannot dequantise GGUF architecture 'no-such-arch'"),
    ("missing", "does not exist"),
    ("text", "not a readable GGUF file"),
])
def test_a_file_that_cannot_be_converted_is_refused_and_nothing_is_cached(case: str, reason: str,
                                                                          tmp_path: Path) -> None:
    path = tmp_path / f"{case}.gguf"
    if case == "truncated":
        write_truncated(smollm2_gguf(), path)
    elif case == "encoder":
        write_tiny_llama(path, architecture="bert")
    elif case == "unknown":
        write_tiny_llama(path, architecture="no-such-arch")
    elif case == "text":
        path.write_text("not a model\n" * 100)
    with pytest.raises(ValueError, match=reason):
        resolve_model_folder(str(path), cache_dir=tmp_path / "cache")
    assert _cached(tmp_path / "cache") == []


def test_a_missing_registry_package_names_its_install_command() -> None:
    entry = RegistryModel(package="no_such_registry_package", file="m.gguf", install="pip install no-such-pkg",
                          parameters=1, context=1)
    with pytest.raises(ValueError, match="pip install no-such-pkg"):
        locate(entry)


def test_serve_refuses_a_bad_gguf_before_serving(tmp_path: Path) -> None:
    bad = write_tiny_llama(tmp_path / "encoder.gguf", architecture="bert")
    done = subprocess.run([sys.executable, "-m", "swarm.cli", "serve", "--model", str(bad), "--port", str(free_port()),
                           "--state-dir", str(tmp_path / "state")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "SWARM_MODEL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "not a decoder-only causal LM" in " ".join(done.stderr.split())
    assert _cached(tmp_path / "cache") == []
