"""Runs a few optimiser steps of train_gpt_medium.py's own training pieces (train_step, Optimizers) on fixed
synthetic tokens and prints one JSON line: the loss on a held-out sequence after every step (as float.hex, so
equality is bitwise) and a SHA-256 of every parameter's bytes at the end. Works alone or under torchrun (gloo).

    python tests/trajectory_driver.py STEPS [FLAGS...]
"""
import hashlib
import json
import os
import sys
from pathlib import Path

# The reference is checked on whatever machine CI gets: matmul and elementwise kernels are pinned to the AVX2 code
# paths every x86-64 CPU of the last decade runs, so most last bits do not depend on whether MKL, oneDNN and ATen
# picked AVX-512 (or AMX/BF16 units). Some CPU kinds still differ (an Intel Xeon with AMX did, under every MKL_CBWR
# branch): the reference file keeps one result per CPU kind, each from the reference commit's code.
for _name, _value in (("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2"), ("MKL_CBWR", "AVX2,STRICT"),
                      ("MKL_ENABLE_INSTRUCTIONS", "AVX2")):
    os.environ[_name] = _value
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt_medium as T  # noqa: E402
from speedrun.model import cast_model  # noqa: E402
from speedrun.distributed import setup_distributed  # noqa: E402

SNOO_EVERY = 3  # fires at steps 0, 3, 6: the momentum-buffer path runs too (the schedule's 28 is too far)
SEQ_LEN = 64


def documents(seed):
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 2000, (SEQ_LEN + 1,), generator=gen)
    seq[torch.rand(SEQ_LEN + 1, generator=gen) < 0.05] = 50256
    seq[0] = 50256
    return seq[:-1], seq[1:]


def main():
    steps, flags = int(sys.argv[1]), sys.argv[2:]
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # the reference was written with one thread: matmul sums in the same order
    proc = setup_distributed()
    args = T.resolve_args(["--preset", "tiny", *flags])
    low = {"bf16": torch.bfloat16, "fp32": torch.float32, "auto": torch.float32}[args.low_precision]
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=SEQ_LEN)
    cast_model(model, low)
    opt = T.Optimizers(model, proc.rank, proc.world_size, fused_adam=False, ns_dtype=low)
    opt.snoo.every = SNOO_EVERY
    window = torch.tensor(2)
    held_out = documents(10_000)
    losses = []
    for step in range(steps):
        batches = [documents(100 * step + v) for v in proc.virtual_ranks]
        T.train_step(model, batches, window, proc, opt.reducer)
        opt.step(step, args.num_iterations)
        with torch.no_grad():
            losses.append(model(*held_out, window).item().hex())
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    if proc.rank == 0:
        print(json.dumps(dict(losses=losses, params_sha256=digest.hexdigest())))
    if proc.world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
