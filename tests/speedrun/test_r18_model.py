"""speedrun.r18.model (record #18's model, not yet wired to a flag): the multi-token loss reduces to shifted
single-token losses, and the model trains from its real init at a tiny size."""

import pytest
import torch
import torch.nn.functional as F

from speedrun.r18.model import R18Config, R18GPT

T = 64


def tiny_model():
    torch.manual_seed(0)
    return R18GPT(R18Config(model_dim=32, num_heads=2, head_dim=16, vocab_size=200, block_size=8, max_seq_len=T))


def batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 200, (T + 1,), generator=g)
    return tokens[:-1], tokens[1:], torch.tensor([0, 20, 45, T], dtype=torch.int32)


def test_multi_token_loss_is_weighted_shifted_cross_entropy():
    model, (inputs, targets, cu) = tiny_model(), batch()
    with torch.no_grad():  # a non-zero head so the logits differ per token
        model.lm_head.weight.normal_()
    x = torch.randn(1, T, 32)
    z = 23 * torch.sigmoid((x[0] @ model.lm_head.weight.T + 5) / 7.5)
    next_token = F.cross_entropy(z, targets, reduction="sum")
    torch.testing.assert_close(model.head_loss(x, targets, torch.tensor([1.0])), next_token)
    torch.testing.assert_close(model.head_loss(x, targets, torch.tensor([1.0, 0.0, 0.0])), next_token)
    # weight on the second target only: token t scored on target t+1; the last token has none
    second = F.cross_entropy(z[:-1], targets[1:], reduction="sum")
    torch.testing.assert_close(model.head_loss(x, targets, torch.tensor([0.0, 1.0])), second)
    torch.testing.assert_close(model.head_loss(x, targets, torch.tensor([1.0, 0.5])), next_token + 0.5 * second)


@pytest.mark.slow
def test_tiny_model_learns_from_its_init():
    """Guards: 30 Adam steps on one batch lower the tiny r18 model's loss below 80% of its start (it can learn)."""
    model, (inputs, targets, cu) = tiny_model(), batch()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(30):
        loss = model(inputs, targets, cu, torch.tensor([1.0]), 1, 3, T)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.8 * first
