"""Bytes of Adam state (bf16 exp_avg and exp_avg_sq) per rank for record #18's full-size model, with every Adam
parameter replicated (before the sharding) and sharded by OddStepAdam's rule, counted from the parameter shapes
(the model is built on the meta device: no memory, no GPU).

    .venv/bin/python benchmarks/r18_adam_state_memory.py [WORLD_SIZE ...]   (default: 8)
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from speedrun.r18.model import R18Config, R18GPT  # noqa: E402
from speedrun.r18.optim import ADAM_LABELS, SCALAR_LABELS, adam_shards_rows  # noqa: E402

MOMENT_BYTES = 2 * torch.finfo(torch.bfloat16).bits // 8  # exp_avg and exp_avg_sq, bf16 each


def main():
    world_sizes = [int(w) for w in sys.argv[1:]] or [8]
    with torch.device("meta"):
        model = R18GPT(R18Config())
    adam = [(name, p) for name, p in model.named_parameters() if p.label in ADAM_LABELS + SCALAR_LABELS]
    print(f"Adam parameters of R18GPT(R18Config()) (the full preset): {len(adam)}, "
          f"{sum(p.numel() for _, p in adam):,} elements")
    for world_size in world_sizes:
        replicated = sum(p.numel() for _, p in adam) * MOMENT_BYTES
        sharded = sum(p.numel() // (world_size if adam_shards_rows(p, world_size) else 1) for _, p in adam)
        whole = [name for name, p in adam if not adam_shards_rows(p, world_size)]
        print(f"world size {world_size}: Adam state per rank {replicated:,} bytes ({replicated / 2**20:.1f} MiB) "
              f"replicated -> {sharded * MOMENT_BYTES:,} bytes ({sharded * MOMENT_BYTES / 2**20:.1f} MiB) sharded; "
              f"kept whole on every rank: {len(whole)} parameters, "
              f"{sum(p.numel() for n, p in adam if n in whole) * MOMENT_BYTES:,} bytes ({', '.join(whole)})")


if __name__ == "__main__":
    main()
