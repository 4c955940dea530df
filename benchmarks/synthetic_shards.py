"""Synthetic token shards for the GPU benchmarks and checks: GPU machines often cannot download FineWeb, and step
times, memory and the checks' pass/fail do not depend on what the tokens say."""
import numpy as np

from data.shard_format import write_shard


def synthetic_tokens(n, rng):
    """Zipf-distributed GPT-2 token ids in documents that start with 50256 (about 1000 tokens each)."""
    tokens = (rng.zipf(1.2, n) % 50257).astype(np.uint16)
    tokens[rng.random(n) < 1e-3] = 50256
    tokens[0] = 50256
    return tokens


def make_shards(folder, train_tokens, val_tokens, prefix="synthetic"):
    """One validation and one training shard of synthetic tokens in `folder`, named <prefix>_val_000000.bin and
    <prefix>_train_000001.bin (prefix "fineweb": upstream's names); returns their globs (train, val)."""
    rng = np.random.default_rng(0)
    write_shard(folder / f"{prefix}_val_000000.bin", synthetic_tokens(val_tokens, rng))
    write_shard(folder / f"{prefix}_train_000001.bin", synthetic_tokens(train_tokens, rng))
    return str(folder / f"{prefix}_train_*.bin"), str(folder / f"{prefix}_val_*.bin")
