"""Weights as versioned, chunked, SHA-256-checked payloads: a full snapshot or a delta over a base.

``encode`` turns ``{name: tensor}`` (CPU, Hugging Face names) into one self-describing payload cut
into ``chunk_bytes`` pieces, each listed in a ``Manifest`` with its size and SHA-256; ``decode``
checks every chunk and rebuilds the tensors bit for bit. The payload is a small JSON header (per
tensor: name, dtype, shape, encoding, byte range) followed by 64-byte-aligned sections.

A **delta** compares raw bits, never values, so ``-0.0`` vs ``0.0`` and NaN payloads round-trip
exactly. Per tensor it keeps whichever of these is smallest: nothing (no bit changed), the changed
elements' flat indices (int32, or int64 past 2**31 elements) plus their new bits, a packed bitmask of
the changed elements plus their new bits, or the whole tensor (when most elements changed, as with
AdamW at a high learning rate on a tiny model, a delta costs about what a snapshot does, never more).
A delta records a checksum of each base tensor it relies on (its bytes summed as 64-bit words), so
applying it onto the wrong base (another version, another model) fails with ``ShardError`` instead of
silently serving a model nobody trained.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, Field

FORMAT = 1
_ALIGN = 64  # every section starts at a multiple of this, so tensors can be views of the payload
_PREFIX = struct.Struct("<8sQ")  # magic, header length
_MAGIC = b"SWPOOL01"
_PARTS = {"dense": ("data",), "sparse": ("indices", "values"), "mask": ("mask", "values"), "same": ()}
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # element size -> same-size int


class ShardError(ValueError):
    """A payload that must not be used: a chunk failing its size or hash, a missing or mismatched
    base for a delta, a manifest that does not match its chunks."""


class ChunkInfo(BaseModel):
    index: int = Field(ge=0)
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    """What a version's chunks are: sent first, so a receiver can check each chunk as it arrives."""

    version: int
    base_version: int | None = None  # None: a full snapshot; else a delta over that version
    chunks: list[ChunkInfo]
    total_bytes: int = Field(ge=0)

    @property
    def kind(self) -> Literal["full", "delta"]:
        return "full" if self.base_version is None else "delta"


def verify_chunk(info: ChunkInfo, data: bytes) -> None:
    """Raise ``ShardError`` naming the chunk unless ``data`` has ``info``'s size and SHA-256."""
    if len(data) != info.size:
        raise ShardError(f"chunk {info.index}: {len(data)} bytes, the manifest says {info.size}")
    if hashlib.sha256(data).hexdigest() != info.sha256:
        raise ShardError(f"chunk {info.index}: SHA-256 mismatch (corrupted in transit or at rest)")


def encode(version: int, weights: Mapping[str, torch.Tensor],
           base: tuple[int, Mapping[str, torch.Tensor]] | None = None,
           chunk_bytes: int = 1 << 20) -> tuple[Manifest, list[bytes]]:
    """``weights`` as a full snapshot (``base=None``) or as a delta over ``base = (version, weights)``,
    cut into chunks of at most ``chunk_bytes``. Tensors are read, not kept: encode before the next update."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    base_version, base_weights = base if base is not None else (None, None)
    entries: list[dict] = []
    sections: list[torch.Tensor] = []  # flat uint8 tensors, in payload order
    for name, tensor in weights.items():
        flat = _flat_bits(tensor)
        entry: dict[str, object] = {"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape)}
        old = base_weights.get(name) if base_weights is not None else None
        if old is None or old.dtype != tensor.dtype or tuple(old.shape) != tuple(tensor.shape):
            entries.append({**entry, "mode": "dense"})
            sections.append(_bytes_of(flat))
            continue
        old_flat = _flat_bits(old)
        entry["base_checksum"] = _checksum(old_flat)
        changed = flat != old_flat
        count = int(torch.count_nonzero(changed))
        numel, size = flat.numel(), tensor.element_size()
        index_dtype = torch.int32 if numel < 2**31 else torch.int64
        costs = {"same": 0 if count == 0 else None, "dense": numel * size,
                 "sparse": count * (size + index_dtype.itemsize), "mask": (numel + 7) // 8 + count * size}
        mode = min((m for m in costs if costs[m] is not None), key=lambda m: costs[m])
        entries.append({**entry, "mode": mode})
        if mode == "dense":
            sections.append(_bytes_of(flat))
        elif mode == "sparse":
            entries[-1]["index_dtype"] = str(index_dtype).removeprefix("torch.")
            entries[-1]["count"] = count
            sections.append(_bytes_of(changed.nonzero().flatten().to(index_dtype)))
            sections.append(_bytes_of(flat[changed]))
        elif mode == "mask":
            entries[-1]["count"] = count
            sections.append(torch.from_numpy(np.packbits(changed.numpy())))
            sections.append(_bytes_of(flat[changed]))
    payload = _assemble(version, base_version, entries, sections)
    chunks = [bytes(payload[i:i + chunk_bytes]) for i in range(0, len(payload), chunk_bytes)]
    infos = [ChunkInfo(index=i, size=len(c), sha256=hashlib.sha256(c).hexdigest()) for i, c in enumerate(chunks)]
    return Manifest(version=version, base_version=base_version, chunks=infos, total_bytes=len(payload)), chunks


def decode(manifest: Manifest, chunks: Sequence[bytes],
           base: Mapping[str, torch.Tensor] | tuple[int, Mapping[str, torch.Tensor]] | None = None,
           ) -> dict[str, torch.Tensor]:
    """The tensors of a verified payload. A delta needs ``base`` (the weights of
    ``manifest.base_version``, optionally as ``(version, weights)`` to check the number too); it is
    applied onto a copy, ``base`` is never modified."""
    if len(chunks) != len(manifest.chunks):
        raise ShardError(f"version {manifest.version}: {len(chunks)} chunks, the manifest lists {len(manifest.chunks)}")
    for info, data in zip(manifest.chunks, chunks):
        verify_chunk(info, data)
    if isinstance(base, tuple):
        base_version, base = base
        if base_version != manifest.base_version:
            raise ShardError(f"version {manifest.version} is a {manifest.kind} over base {manifest.base_version}, "
                             f"not over version {base_version}")
    if manifest.kind == "delta" and base is None:
        raise ShardError(f"version {manifest.version} is a delta over version {manifest.base_version}: "
                         "a base is needed")
    payload = bytearray(manifest.total_bytes)
    offset = 0
    for data in chunks:
        payload[offset:offset + len(data)] = data
        offset += len(data)
    if offset != manifest.total_bytes:
        raise ShardError(f"version {manifest.version}: chunks hold {offset} bytes, "
                         f"the manifest says {manifest.total_bytes}")
    header, sections_start = _read_header(payload)
    if header.get("version") != manifest.version or header.get("base_version") != manifest.base_version:
        raise ShardError(f"payload of version {header.get('version')} (base {header.get('base_version')}) "
                         f"under the manifest of version {manifest.version} (base {manifest.base_version})")
    reader = _Sections(payload, sections_start)
    return {entry["name"]: _decode_entry(entry, reader, base) for entry in header["tensors"]}


# -- insides ---------------------------------------------------------------------------------------------


def _flat_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as same-size integers (bit patterns), flat, on CPU."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(_BITS[flat.element_size()])


def _bytes_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _checksum(bits: torch.Tensor) -> int:
    """The sum of the tensor's bytes read as 64-bit words, modulo 2**64 (numpy's unsigned sum wraps,
    and is many times faster than a torch int64 reduction): a fingerprint, not a defence against forgery."""
    raw = bits.reshape(-1).view(torch.uint8).numpy()
    whole = len(raw) // 8 * 8
    total = int(raw[:whole].view(np.uint64).sum(dtype=np.uint64)) + int(raw[whole:].sum())
    return total % 2**64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _assemble(version: int, base_version: int | None, entries: list[dict], sections: list[torch.Tensor]) -> bytearray:
    """Header then sections, each at an aligned offset recorded in the header (relative to the first)."""
    offsets, at = [], 0
    for section in sections:
        offsets.append(at)
        at = _aligned(at + section.numel())
    refs = iter(zip(offsets, sections))
    for entry in entries:  # sections were appended entry by entry, in this order
        for part in _PARTS[entry["mode"]]:
            start, section = next(refs)
            entry[part] = [start, section.numel()]
    header = json.dumps({"format": FORMAT, "version": version, "base_version": base_version,
                         "tensors": entries}).encode()
    start = _aligned(_PREFIX.size + len(header))
    payload = bytearray(start + at)
    payload[:_PREFIX.size] = _PREFIX.pack(_MAGIC, len(header))
    payload[_PREFIX.size:_PREFIX.size + len(header)] = header
    view = memoryview(payload)
    for offset, section in zip(offsets, sections):
        view[start + offset:start + offset + section.numel()] = section.numpy()
    return payload


def _read_header(payload: bytearray) -> tuple[dict, int]:
    if len(payload) < _PREFIX.size:
        raise ShardError("payload shorter than its header")
    magic, length = _PREFIX.unpack_from(payload)
    if magic != _MAGIC or _PREFIX.size + length > len(payload):
        raise ShardError("not a weights payload (bad magic or header length)")
    header = json.loads(bytes(payload[_PREFIX.size:_PREFIX.size + length]))
    if header.get("format") != FORMAT:
        raise ShardError(f"payload format {header.get('format')}, this reader knows {FORMAT}")
    return header, _aligned(_PREFIX.size + length)


class _Sections:
    """Typed views into the payload's sections (no copies)."""

    def __init__(self, payload: bytearray, start: int) -> None:
        self._payload, self._start = payload, start

    def read(self, ref: list[int], dtype: torch.dtype) -> torch.Tensor:
        offset, nbytes = ref
        if self._start + offset + nbytes > len(self._payload):
            raise ShardError("a section runs past the end of the payload")
        raw = torch.frombuffer(self._payload, dtype=torch.uint8, count=nbytes, offset=self._start + offset) \
            if nbytes else torch.empty(0, dtype=torch.uint8)
        return raw.view(dtype)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ShardError(f"unknown dtype {name!r} in the payload")
    return dtype


def _decode_entry(entry: dict, reader: _Sections, base: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
    name, dtype, shape, mode = entry["name"], _dtype(entry["dtype"]), tuple(entry["shape"]), entry["mode"]
    bits_dtype = _BITS[torch.empty(0, dtype=dtype).element_size()]
    if mode == "dense":
        return reader.read(entry["data"], bits_dtype).view(dtype).reshape(shape)
    old = base.get(name) if base is not None else None
    if old is None or old.dtype != dtype or tuple(old.shape) != shape:
        found = "missing" if old is None else f"{old.dtype} {tuple(old.shape)}"
        raise ShardError(f"the base does not fit the delta: {name} is {found}, the delta needs {dtype} {shape}")
    out = _flat_bits(old).clone()
    if _checksum(out) != entry["base_checksum"]:
        raise ShardError(f"the base does not match the delta's base version: {name} differs")
    if mode == "sparse":
        indices = reader.read(entry["indices"], _dtype(entry["index_dtype"])).long()
        out[indices] = reader.read(entry["values"], bits_dtype)
    elif mode == "mask":
        packed = reader.read(entry["mask"], torch.uint8).numpy()
        changed = torch.from_numpy(np.unpackbits(packed, count=out.numel()).astype(bool))
        out[changed] = reader.read(entry["values"], bits_dtype)
    elif mode != "same":
        raise ShardError(f"unknown encoding {mode!r} for {name}")
    return out.view(dtype).reshape(shape)
