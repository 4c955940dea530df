"""Study flags on --base r18 (speedrun/r18/studies.py states the rule): each accepted flag builds, runs forward and
backward at a tiny size from its init, equals the record's loss there where the study starts as the identity,
counts its parameters, trains them in the stated optimiser groups; what a study refuses there is one line."""

import gc
import weakref

import pytest
import torch

import train_gpt_medium as T
from speedrun.errors import UsageError
from speedrun.r18.model import R18Config, R18GPT
from speedrun.r18.optim import R18Optimizers
from speedrun.r18.schedule import R18Schedule
from speedrun.r18.studies import STUDY_MATRIX_LABEL

SEQ = 64
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: thread overhead dominates


def run_config(*flags):
    return T.resolve_args(["--preset", "tiny", "--base", "r18", *flags])


def model_of(config, registry=None):
    torch.manual_seed(0)
    model = R18GPT(R18Config(model_dim=config.model_dim, num_heads=config.num_heads, head_dim=config.head_dim,
                             vocab_size=200, block_size=8, max_seq_len=SEQ), studies=config, registry=registry)
    # The record zeroes the attention output and MLP projections (every block the identity at init, so every
    # backout source the same direction): random ones make the backouts differ.
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkvo_w.copy_(torch.randn(block.attn.qkvo_w.shape, generator=g) * 0.05)
            block.mlp.c_proj.copy_(torch.randn(block.mlp.c_proj.shape, generator=g) * 0.05)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g))
    return model


def loss_and_grads(model):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 200, (SEQ + 1,), generator=g)
    cu = torch.tensor([0, 20, 45, SEQ], dtype=torch.int32)
    loss = model(tokens[:-1], tokens[1:], cu, torch.tensor([1.0]), 1, 3, SEQ)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]


@pytest.fixture(scope="module")
def record_loss():
    return loss_and_grads(model_of(run_config()))[0]


# (flags, the loss at init: "record" = the record's bit for bit, "differs" = not the record's)
AT_INIT = [
    (["--backout-layers", "11", "--backout-mode", "subtract"], "record"),  # the record's own backout, as a study
    (["--backout-layers", "none"], "differs"),
    (["--backout-layers", "10,embed"], "differs"),
    (["--backout-layers", "9", "--backout-mode", "subtract", "--backout-freeze"], "differs"),
    (["--laurel", "rw"], "record"),
    (["--laurel", "lr", "--laurel-where", "both"], "record"),
    (["--laurel", "rw+pa", "--laurel-where", "block"], "record"),
    (["--laurel", "rw+lr+pa"], "record"),
    (["--laurel", "rw", "--backout-layers", "11", "--backout-mode", "subtract"], "record"),
    (["--rolling-skip"], "record"),  # a = 0, b = 1: the plain hand-over
    (["--gated-skip-layer", "3"], "differs"),  # the gate starts at 0.018
    (["--rolling-skip", "--laurel", "rw", "--gated-skip-layer", "9"], "differs"),
]


@pytest.mark.parametrize("flags,expected", AT_INIT, ids=[" ".join(f) for f, _ in AT_INIT])
def test_each_accepted_study_flag_runs_forward_and_backward_from_its_init(flags, expected, record_loss):
    loss, grads = loss_and_grads(model_of(run_config(*flags)))
    assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads)
    if expected == "record":
        assert torch.equal(loss, record_loss)
    else:
        assert not torch.equal(loss, record_loss)


@pytest.mark.parametrize("flags", [["--rolling-skip"], ["--gated-skip-layer", "3"]])
def test_studies_of_the_generic_hooks_train_their_scalars_on_r18(flags):
    """Rolling and gated skip declare nothing for r18: its block_input and head_input hooks run them there."""
    model = model_of(run_config(*flags))
    loss_and_grads(model)
    assert model.study_scalars.grad is not None and (model.study_scalars.grad != 0).all()


def test_no_backout_equals_a_sum_backout_whose_sources_start_at_zero():
    none, _ = loss_and_grads(model_of(run_config("--backout-layers", "none")))
    zero_sum, _ = loss_and_grads(model_of(run_config("--backout-layers", "3")))  # x_lambda 1, lambda 0
    assert torch.equal(none, zero_sum)


def test_variant_names_and_added_params_as_on_r14():
    cases = {("--backout-layers", "10,embed"): ("backout-L10+embed", {"backout": 3}),
             ("--backout-layers", "none"): ("backout-none", {"backout": 0}),
             ("--laurel", "rw", "--laurel-where", "both"): ("laurel-rw-where-both", {"laurel": 16 * 2 * 2}),
             ("--laurel", "lr"): ("laurel-lr-r32", {"laurel": 16 * 2 * 32 * 64}),
             ("--rolling-skip",): ("rolling-skip", {"rolling": 2 * 13}),
             ("--gated-skip-layer", "3"): ("gated-skip-L3", {"gated-skip": 1})}
    for flags, (variant, added) in cases.items():
        config = run_config(*flags)
        assert (config.variant, model_of(config).added_params()) == (variant, added)
    assert run_config().variant == "baseline" and model_of(run_config()).added_params() == {}


def test_added_parameters_join_the_groups_the_rule_states():
    model = model_of(run_config("--laurel", "rw+lr", "--backout-layers", "10"))
    opts = R18Optimizers(model, R18Schedule())
    scalar_group = [p for g in opts.scalar_adam.param_groups for p in g["params"]]
    assert any(p is model.study_scalars for p in scalar_group) and model.study_scalars.lr_mul == 5.0
    laurel = model.study["laurel"]
    study_groups = [g["params"] for g in opts.muon.param_groups if g["params"][0].label == STUDY_MATRIX_LABEL]
    assert [[p.shape for p in group] for group in study_groups] == [[laurel.down.shape], [laurel.up.shape]]
    loss_and_grads(model)
    before = [p.detach().clone() for p in (laurel.down, laurel.up, model.study_scalars)]
    opts.step(1)  # an odd step: NorMuon and both Adams
    assert all(not torch.equal(a, b) for a, b in zip(before, (laurel.down, laurel.up, model.study_scalars)))


@pytest.mark.parametrize("flags,message", [
    (["--dlo-groups", "2"], "--dlo-groups needs --init-from CHECKPOINT"),  # DLO runs on r18 (test_r18_dlo.py)
    (["--dlo-groups", "2", "--laurel", "rw"], "--dlo-groups cannot be combined with --laurel"),
    (["--dlo-groups", "2", "--backout-layers", "10"], "--dlo-groups cannot be combined with --backout-layers"),
    (["--backout-layers", "11", "--backout-mode", "concat-head"], "--backout-mode concat-head: on --base r18 only"),
    (["--backout-layers", "11", "--backout-transform", "tanh"], "--backout-transform tanh: on --base r18"),
    (["--backout-layers", "new-embed"], "--backout-layers new-embed: not on --base r18"),
    (["--backout-layers", "none", "--backout-mode", "subtract"], "--backout-mode has no backout to set"),
    (["--num-layers", "6"], "--num-layers 6: --base r18 has the record's 16 layers"),
    (["--backout-layers", "15"], "layer 15 is the last layer"),
])
def test_refused_in_one_line(flags, message):
    with pytest.raises(UsageError, match=message):
        run_config(*flags)


def test_backout_none_is_refused_on_r14():
    with pytest.raises(UsageError, match="only --base r18 has a backout of its own"):
        T.resolve_args(["--preset", "tiny", "--backout-layers", "none"])


@pytest.mark.parametrize("flags, alive", [
    ((), {2, 4, 6, 11, 15}),  # the skips' sources, the record's backout layer, and the last layer's (x itself)
    (("--rolling-skip",), set(range(16))),  # a part's hooks may read any layer's output
])
def test_an_eager_forward_holds_only_the_layer_outputs_its_hooks_can_read(flags, alive):
    """Without study parts the r18 forward keeps the record's few layer outputs, not all 16 (an eager validation at
    the record's 262k-token sequences holds 512 MiB per layer output)."""
    model = model_of(run_config(*flags)).eval()
    outputs = []
    for block in model.blocks:
        block.register_forward_hook(lambda module, args, out: outputs.append(weakref.ref(out)))
    alive_at_head = []
    head_loss = model.head_loss

    def spying_head_loss(*args):
        gc.collect()
        alive_at_head.append({i for i, ref in enumerate(outputs) if ref() is not None})
        return head_loss(*args)

    model.head_loss = spying_head_loss
    with torch.no_grad():
        tokens = torch.randint(0, 200, (SEQ + 1,), generator=torch.Generator().manual_seed(1))
        model(tokens[:-1], tokens[1:], torch.tensor([0, SEQ], dtype=torch.int32),
              torch.tensor([1.0]), 1, 3, SEQ)
    assert alive_at_head == [alive]
