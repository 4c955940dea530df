"""The study flags compose: several variants in one model build, start from the baseline and train."""
import math

import pytest
import torch

import train_gpt_medium as T
from conftest import synthetic_tokens

COMBINATIONS = [
    ["--backout-layers", "3", "--laurel", "rw+lr", "--laurel-rank", "4"],
    ["--backout-layers", "2,3", "--backout-transform", "tanh", "--laurel", "pa", "--laurel-where", "both"],
    ["--rolling-skip", "--laurel", "rw+lr+pa", "--laurel-rank", "4", "--laurel-k", "2"],
    ["--backout-layers", "3", "--backout-mode", "concat-mlp", "--backout-concat-dim", "8",
     "--laurel", "rw", "--num-layers", "8"],
]


def build(argv, seed=0):
    args = T.resolve_args(["--preset", "tiny", *argv])
    torch.manual_seed(seed)
    model = T.GPT(T.model_config(args), max_seq_len=128)
    return args, model


@pytest.mark.slow
@pytest.mark.parametrize("argv", COMBINATIONS, ids=lambda a: " ".join(a))
def test_combined_variants_report_each_addition_and_train(argv):
    """Guards: backout, rolling-skip and LAuReL combined in one model report each addition and train below ln(50304)."""
    args, model = build(argv)
    added = model.added_params()
    if "--backout-layers" in argv:
        assert added.get("backout", 0) != 0
    if "--laurel" in argv:
        assert added["laurel"] > 0
    if "--rolling-skip" in argv:
        assert added["rolling"] == 2 * (model.cfg.num_layers - 3)
    names = model.named_scalars()
    assert any(n.startswith("laurel.") for n in names)
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    tokens = torch.from_numpy(synthetic_tokens(64 * 8 * 4 + 1, 5).astype("int64"))
    losses = []
    for step in range(4):
        chunk = tokens[step * 512: step * 512 + 513]
        batches = [(chunk[v * 64: (v + 1) * 64], chunk[v * 64 + 1: (v + 1) * 64 + 1]) for v in range(8)]
        T.train_step(model, batches, torch.tensor(2), T.Dist())
        opt.step(step, 40)
        with torch.no_grad():
            losses.append(model(tokens[:64], tokens[1:65], torch.tensor(2)).item())
    assert all(math.isfinite(l) for l in losses)
    assert losses[-1] < math.log(50304)
