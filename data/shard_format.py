"""The token shard file format of the modded-nanogpt speedrun, read and written here only (training reads shards
through speedrun/data.py, the data tools through data/shards.py; both use this module).

A shard is a header of 256 little-endian int32 values ([0] magic 20240520, [1] version 1, [2] token count N, the
rest zero) followed by N little-endian uint16 tokens, and nothing else. No torch here: the data tools must not load
it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from speedrun.errors import UsageError, file_problem

HEADER_INTS, MAGIC, VERSION = 256, 20240520, 1
HEADER_BYTES, TOKEN_BYTES = HEADER_INTS * 4, 2
GPT2_VOCAB = 50257  # token ids a training shard may hold: 0..50256
MAX_TOKEN = 2**16 - 1  # the largest id a shard can store


class ShardError(UsageError, ValueError):
    """A shard (or a pattern meant to find shards) is unusable; the message is one line naming it."""


def read_header(path) -> int:
    """Checks the header of `path` and returns its token count; the payload is not looked at."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
    except OSError as e:
        raise ShardError(file_problem(path, e)) from None
    if len(raw) < HEADER_BYTES:
        raise ShardError(f"{path}: malformed header: file has {len(raw)} bytes, a header needs {HEADER_BYTES}")
    header = np.frombuffer(raw, dtype="<i4")
    if header[0] != MAGIC:
        raise ShardError(f"{path}: wrong magic number {int(header[0])} (expected {MAGIC}); not a token shard")
    if header[1] != VERSION:
        raise ShardError(f"{path}: unsupported shard version {int(header[1])} (expected {VERSION})")
    count = int(header[2])
    if count < 0:
        raise ShardError(f"{path}: malformed header: negative token count {count}")
    return count


def validate_shard(path) -> int:
    """Checks header and file size (exactly header + 2 bytes per token); returns the token count."""
    path = Path(path)
    count = read_header(path)
    expected = HEADER_BYTES + TOKEN_BYTES * count
    actual = path.stat().st_size
    if actual < expected:
        raise ShardError(
            f"{path}: truncated payload: header says {count} tokens ({expected} bytes in all), file has {actual} bytes"
        )
    if actual > expected:
        raise ShardError(f"{path}: {actual - expected} extra bytes after the {count} tokens the header announces")
    return count


def validate_nonempty_shard(path, context="") -> int:
    """validate_shard, also refusing a shard without tokens (no run can read one); returns the token count."""
    count = validate_shard(path)
    if count == 0:
        raise ShardError(f"{path}: the shard holds no tokens{context}")
    return count


def read_tokens_into(path, count: int, out: np.ndarray) -> None:
    """Reads the `count` tokens of the validated shard `path` into `out` (uint16, length `count`, e.g. the numpy
    view of a pinned tensor). Token ids outside GPT-2's vocabulary are refused here, naming the file, rather than
    failing inside a kernel."""
    try:
        with open(path, "rb") as f:
            f.seek(HEADER_BYTES)
            got = f.readinto(out) // TOKEN_BYTES
    except OSError as e:
        raise ShardError(file_problem(path, e)) from None
    if got != count:  # the file shrank after the size check
        raise ShardError(f"{path}: truncated payload: {got} tokens present, header says {count}")
    if count and int(out.max()) >= GPT2_VOCAB:
        at = int(np.argmax(out >= GPT2_VOCAB))
        raise ShardError(f"{path}: token id {int(out[at])} at position {at} is outside GPT-2's vocabulary of "
                         f"{GPT2_VOCAB} (not a GPT-2 token shard?)")


def load_tokens(path) -> np.ndarray:
    """Validates `path` (header and size) and returns its tokens as a native uint16 array."""
    count = validate_shard(path)
    tokens = np.fromfile(path, dtype="<u2", count=count, offset=HEADER_BYTES)
    return tokens.astype(np.uint16, copy=False)


def write_shard(path, tokens) -> None:
    """Writes `tokens` as a shard at `path`; readers never see a partial file (temp file, then os.replace)."""
    path = Path(path)
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise ShardError(f"{path}: tokens must be a 1-D sequence, got shape {array.shape}")
    if array.dtype != np.uint16:
        if array.size and not np.issubdtype(array.dtype, np.integer):
            raise ShardError(f"{path}: tokens must be integers, got dtype {array.dtype}")
        if array.size and (array.min() < 0 or array.max() > MAX_TOKEN):
            raise ShardError(f"{path}: tokens must lie in 0..{MAX_TOKEN}, got {array.min()}..{array.max()}")
    if len(array) > np.iinfo(np.int32).max:
        raise ShardError(f"{path}: {len(array)} tokens do not fit the int32 header count")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = MAGIC, VERSION, len(array)
    temp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(temp, "wb") as f:
            f.write(header.tobytes())
            f.write(array.astype("<u2", copy=False).tobytes())
        os.replace(temp, path)
    finally:
        if temp.exists():
            temp.unlink()
