"""Small GGUF files for tests, written with the ``gguf`` library: a tiny random Llama that converts in
seconds (SmolLM2's real tokenizer and chat template, copied from the registry package's file), and
files that must be refused (another architecture, an encoder, a cut-off copy).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TINY_LLAMA = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128, "context": 512}


def smollm2_gguf() -> Path:
    """The registry package's GGUF file (``swarm.models.resolve.locate``)."""
    from swarm.models.named import REGISTRY_MODELS
    from swarm.models.resolve import locate

    return locate(REGISTRY_MODELS["smollm2-135m"])


def write_tiny_llama(path: Path, architecture: str = "llama", seed: int = 0) -> Path:
    """A random Llama of ``TINY_LLAMA``'s shape under ``architecture``'s name, with SmolLM2's tokenizer
    and chat template (vocabulary 49,152), F32 tensors: a valid GGUF model for ``architecture == "llama"``."""
    from gguf import GGUFReader, GGUFWriter

    source = GGUFReader(str(smollm2_gguf()))
    s, vocab = TINY_LLAMA, int(source.fields["llama.vocab_size"].contents())
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(s["layers"])
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(s["hidden"] // s["heads"])
    writer.add_tokenizer_model(source.fields["tokenizer.ggml.model"].contents())
    writer.add_token_list(source.fields["tokenizer.ggml.tokens"].contents())
    writer.add_token_types(source.fields["tokenizer.ggml.token_type"].contents())
    writer.add_token_merges(source.fields["tokenizer.ggml.merges"].contents())
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("unknown", writer.add_unk_token_id), ("padding", writer.add_pad_token_id)):
        add(int(source.fields[f"tokenizer.ggml.{key}_token_id"].contents()))
    writer.add_chat_template(source.fields["tokenizer.chat_template"].contents())
    rng = np.random.default_rng(seed)
    head = s["hidden"] // s["heads"]

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(vocab, s["hidden"]))
    writer.add_tensor("output_norm.weight", np.ones(s["hidden"], dtype=np.float32))
    for i in range(s["layers"]):
        for name, shape in (("attn_q", (s["hidden"], s["hidden"])), ("attn_k", (s["kv_heads"] * head, s["hidden"])),
                            ("attn_v", (s["kv_heads"] * head, s["hidden"])), ("attn_output", (s["hidden"], s["hidden"])),
                            ("ffn_gate", (s["ffn"], s["hidden"])), ("ffn_up", (s["ffn"], s["hidden"])),
                            ("ffn_down", (s["hidden"], s["ffn"]))):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(*shape))
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(s["hidden"], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_truncated(source: Path, path: Path, keep: float = 0.5) -> Path:
    """The first ``keep`` of ``source``: what an interrupted download leaves."""
    with source.open("rb") as reader, path.open("wb") as writer:
        writer.write(reader.read(int(source.stat().st_size * keep)))
    return path

