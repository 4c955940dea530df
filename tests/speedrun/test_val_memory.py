"""Validation's lm head runs in pieces of at most VAL_HEAD_CHUNK_TOKENS tokens on both tracks, so the peak memory of
a validation step does not grow with --val-seq-len beyond one piece's logits (the small track's record validation
ran its head unchunked over 262,144 tokens: tens of GB of logits). Measured on CPU in a fresh process per case as
the rise of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs) over the head's part of
each validation forward (the CPU path's dense attention mask is quadratic in the sequence, FlexAttention's on the
GPU is not: the head is what this bounds), with the piece shrunk to 128 tokens; the same measurement with
chunking off is the control that shows the measurement sees the logits."""
import subprocess
import sys

import pytest

from conftest import ROOT

CHUNK = 128
VOCAB_ROW_BYTES = 50304 * 4  # one token's fp32 logits
MEASURE = """
import re, sys, torch
import importlib
import speedrun.layers as layers
from speedrun.distributed import Dist
from speedrun.training import Track, validate
torch.set_num_threads(1)
track_name, chunk_tokens, seq_len, train_files, val_files = sys.argv[1:]
layers.VAL_HEAD_CHUNK_TOKENS = int(chunk_tokens)
track = importlib.import_module(track_name)
track_of = lambda module: next(v for v in vars(module).values() if isinstance(v, Track))
args = track.resolve_args(["--preset", "tiny", "--val-seq-len", seq_len, "--val-tokens", str(8 * int(seq_len)),
                           "--train-files", train_files, "--val-files", val_files])
torch.manual_seed(0)
model = track.GPT(track.model_config(args), max_seq_len=args.val_seq_len)
fewest = track_of(track).val_head_chunks

def status(key):
    return int(re.search(key + r":\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS

rises = []
head = model.head

def measured_head(*args, **kwargs):  # the head's part of each validation forward
    reset_peak()
    start = status("VmRSS")
    out = head(*args, **kwargs)
    rises.append(status("VmHWM") - start)
    return out

validate(model, args, Dist(), torch.tensor(1), fewest)  # first use: lazy allocations, thread pools
model.head = measured_head
validate(model, args, Dist(), torch.tensor(1), fewest)
print(max(rises))
"""


def peak_rise(track, chunk_tokens, seq_len, shard_dir):
    """The most bytes the process's peak resident set rose by over the head of one validation forward."""
    result = subprocess.run([sys.executable, "-c", MEASURE, track, str(chunk_tokens), str(seq_len),
                             str(shard_dir / "syn_train_*.bin"), str(shard_dir / "syn_val_*.bin")],
                            capture_output=True, text=True, cwd=ROOT, timeout=300,
                            env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                 # every block over 128 KiB its own mapping, unmapped when freed: the resident
                                 # set follows the live tensors (glibc's heap would keep and reuse freed pieces)
                                 "MALLOC_MMAP_THRESHOLD_": "131072"})
    if "clear_refs" in result.stderr:
        pytest.skip("this kernel does not let a process reset its peak resident set")
    assert result.returncode == 0, result.stderr[-2000:]
    return int(result.stdout.split()[-1])


def fewest_head_chunks(track):
    import importlib
    from speedrun.training import Track
    return next(v for v in vars(importlib.import_module(track)).values() if isinstance(v, Track)).val_head_chunks


@pytest.mark.slow
@pytest.mark.parametrize("track", ["train_gpt_medium", "train_gpt"])
def test_validation_head_peak_memory_does_not_grow_with_val_seq_len_beyond_one_chunk(track, shard_dir):
    """Guards: the validation head's peak resident memory (fresh processes) stays flat as --val-seq-len grows."""
    # Both lengths split into pieces of exactly CHUNK tokens (the track's fewest pieces of the short one).
    short = CHUNK * fewest_head_chunks(track)
    long = 4 * short
    chunked = peak_rise(track, CHUNK, long, shard_dir) - peak_rise(track, CHUNK, short, shard_dir)
    unchunked = peak_rise(track, 10 ** 9, long, shard_dir) - peak_rise(track, 10 ** 9, short, shard_dir)
    extra_piece_logits = (long - short) // fewest_head_chunks(track) * VOCAB_ROW_BYTES  # one fp32 copy
    print(f"{track}: the head's peak rise from --val-seq-len {short} to {long}: chunked {chunked / 2**20:.1f} MiB, "
          f"unchunked {unchunked / 2**20:.1f} MiB (one fp32 copy of the extra logits per piece "
          f"{extra_piece_logits / 2**20:.1f} MiB)")
    assert unchunked > extra_piece_logits  # the control: the measurement sees the logits
    assert abs(chunked) < CHUNK * VOCAB_ROW_BYTES / 4  # under a quarter of one piece's logits: flat
