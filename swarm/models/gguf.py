"""GGUF files into Hugging Face folders: read, check and dequantise once, so every engine loads a folder.

A GGUF file (llama.cpp's single-file format) holds quantised weights, the tokenizer and the chat
template. transformers dequantises the architectures it knows into fp32 tensors; the result is
saved as an ordinary folder that the torch engine, vLLM, verl and pool workers all read.

What is checked before the (slow) dequantisation, so a bad file fails in a second with a clear
``ValueError`` and nothing reaches the cache: the file parses (a truncated download does not: its
tensor data would run past the end), its architecture is one transformers can dequantise, and it is
a decoder-only causal LM (not an encoder such as T5's or an embedding model).

What the converted tokenizer gets fixed (transformers 5.10's GGUF tokenizer conversion): the end of
a ChatML turn ``<|im_end|>`` becomes the eos token (the conversion takes ``<|im_start|>``), a pad
token is set (the engines batch rows), the maximum length is the model's context, and decoding
keeps spaces exactly as sampled (``clean_up_tokenization_spaces`` off), so decode(ids) is the text
that was returned and re-rendered.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["GGUF_FORMAT", "convert_gguf", "file_sha256", "gguf_architecture"]

GGUF_FORMAT = 1  # bump when the conversion below changes: cached folders of an older format rebuild
_NOT_CAUSAL = {"t5", "t5encoder", "umt5", "bert", "nomic-bert", "jina-bert-v2", "clip", "mamba"}
_CHATML_END = "<|im_end|>"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 8 MiB blocks (about 0.3 s for a 100 MB model)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def gguf_architecture(path: Path) -> str:
    """The file's ``general.architecture`` after checking that it parses whole; ``ValueError`` with
    the reason otherwise."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise ValueError("reading a GGUF model needs the 'gguf' package: pip install gguf==0.19.0") from exc
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        architecture = bytes(field.parts[field.data[0]]).decode()
        end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    except KeyError:
        raise ValueError(f"{path} is a GGUF file without general.architecture: not a model") from None
    except Exception as exc:  # the reader raises ValueError, IndexError, struct errors... on a bad file
        raise ValueError(f"{path} is not a readable GGUF file (truncated or corrupt?): {exc}") from None
    if not reader.tensors or end > path.stat().st_size:
        raise ValueError(f"{path} is truncated: its tensors need {end} bytes, the file has {path.stat().st_size}")
    return architecture


def _check_supported(architecture: str, path: Path) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if architecture in _NOT_CAUSAL or architecture.startswith(("t5", "bert")):
        raise ValueError(f"{path} holds a {architecture!r} model, not a decoder-only causal LM that can be trained")
    known = architecture.replace("-", "_") in GGUF_SUPPORTED_ARCHITECTURES or architecture in GGUF_SUPPORTED_ARCHITECTURES
    if not known:
        raise ValueError(f"transformers cannot dequantise GGUF architecture {architecture!r} ({path}); "
                         f"it reads: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}")


def convert_gguf(path: Path, target: Path) -> dict[str, Any]:
    """Dequantise ``path`` into the (new, empty) folder ``target`` and return what was converted.

    ``target`` is a staging folder: the caller renames it into place, so a failure here leaves
    nothing in the cache. Raises ``ValueError`` for a file that is not a convertible causal LM."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    architecture = gguf_architecture(path)
    _check_supported(architecture, path)
    log.info("converting %s (%s) to a Hugging Face folder: this dequantises every tensor once", path.name, architecture)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except Exception as exc:  # transformers raises many kinds for files it cannot map
        raise ValueError(f"transformers could not load {path} as a causal LM: {type(exc).__name__}: {exc}") from None
    eos_ids = _fix_tokenizer(tokenizer, model.config.max_position_embeddings)
    model.config.eos_token_id = eos_ids[0]
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=model.config.bos_token_id)
    target.mkdir(parents=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return {"architecture": architecture, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": len(tokenizer), "eos": tokenizer.eos_token, "pad": tokenizer.pad_token}


def _fix_tokenizer(tokenizer: Any, context: int) -> list[int]:
    """Set eos, pad, the length limit and exact decoding (see the module docstring); the ids that
    end a reply, eos first."""
    vocab = tokenizer.get_vocab()
    if "{%" in (tokenizer.chat_template or "") and _CHATML_END in vocab and _CHATML_END in tokenizer.chat_template:
        tokenizer.eos_token = _CHATML_END
    if tokenizer.eos_token is None:
        raise ValueError("the GGUF tokenizer names no end-of-sequence token")
    if tokenizer.pad_token is None:
        # A token the model never has to emit in a reply, else eos (padding is masked either way).
        tokenizer.pad_token = "<|endoftext|>" if "<|endoftext|>" in vocab else tokenizer.eos_token
    tokenizer.model_max_length = int(context)
    tokenizer.clean_up_tokenization_spaces = False
    if not tokenizer.chat_template:
        raise ValueError("the GGUF file has no chat template (tokenizer.chat_template): the server renders "
                         "chat messages with it")
    ends = [tokenizer.eos_token_id]
    if tokenizer.pad_token_id not in ends and tokenizer.pad_token == "<|endoftext|>":
        ends.append(tokenizer.pad_token_id)  # a document end also ends a reply
    return [int(i) for i in ends]

