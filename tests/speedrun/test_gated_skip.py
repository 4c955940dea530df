"""The gated skip (speedrun/gated_skip.py), the study written only against the study interface
(docs/adding-a-study.md): its gate learns, starts small, is logged, and names its arms."""
import math

import pytest

import train_gpt as S
import train_gpt_medium as T
from study_training import trained_steps

ARGV = ["--preset", "tiny", "--gated-skip-layer", "2"]
BASES = {"r14": (T, []), "r18": (T, ["--base", "r18"]), "small": (S, [])}  # one test, every base


@pytest.mark.parametrize("base", BASES)
def test_gate_gets_a_gradient_within_two_training_steps(shard_dir, base):
    track, flags = BASES[base]
    grads = []
    for model in trained_steps(track, ARGV + flags, str(shard_dir / "syn_train_*.bin"), steps=2):  # after backward
        grads.append(model.scalar_grad("gated_skip").clone())
    # r14 and small: at step 0 the lm head is still zero, nothing reaches the head's input; by step 1 the gate learns
    assert grads[1].abs().sum() > 0
    assert model.added_params() == {"gated-skip": 1}  # the study once, under its name
    assert "gated_skip.gate" in model.named_scalars()


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
