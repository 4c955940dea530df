"""The gated skip (speedrun/gated_skip.py), the study written only against the study interface
(docs/adding-a-study.md): its gate learns, starts small, is logged, and names its arms."""
import math

import pytest
import torch

import train_gpt_medium as T
from speedrun.data import TokenStream, find_shards

ARGV = ["--preset", "tiny", "--gated-skip-layer", "2"]


def test_gate_gets_a_gradient_within_two_training_steps(shard_dir):
    args = T.resolve_args(ARGV)
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=args.train_seq_len)
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    proc = T.Dist()
    stream = TokenStream(find_shards(str(shard_dir / "syn_train_*.bin"), "x"), args.train_seq_len, "x")
    start, end = model.scalar_layout["gated_skip"]
    window = torch.tensor(2)
    grads = []
    for step in range(2):
        T.train_step(model, stream.next_batch(proc.virtual_ranks), window, proc)
        grads.append(model.scalars.grad[start:end].clone())
        opt.step(step, args.num_iterations)
    # step 0: the lm head is still zero, nothing reaches the head's input; step 1: the gate learns
    assert grads[0].abs().sum() == 0 and grads[1].abs().sum() > 0
    assert model.added_params() == {"gated-skip": 1}  # the study once, under its name


def test_gate_starts_small_and_is_logged():
    model = T.GPT(T.model_config(T.resolve_args(ARGV)), max_seq_len=64)
    assert model.named_scalars()["gated_skip.gate"] == pytest.approx(1 / (1 + math.exp(4)))


def test_variant_name_and_bad_layer():
    assert T.resolve_args(ARGV).variant == "gated-skip-L2"
    assert T.resolve_args(["--preset", "tiny", "--gated-skip-layer", "0"]).variant == "gated-skip-L0"
    with pytest.raises(T.UsageError, match="--gated-skip-layer must be in 0..4"):
        T.resolve_args(["--preset", "tiny", "--gated-skip-layer", "5"])  # 6 layers: layer 5 is the head's input
    with pytest.raises(T.UsageError, match="--gated-skip-layer cannot be combined with --dlo-groups"):
        T.resolve_args(["--preset", "tiny", "--gated-skip-layer", "2", "--dlo-groups", "2", "--init-from", __file__])
