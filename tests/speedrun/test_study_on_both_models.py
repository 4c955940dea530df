"""A study written as one module (here, in the test: a Study with a one-scalar ModelPart) runs on --base r18 and on
#14 through the ModelPart hooks, with no edit of speedrun/r18/ or speedrun/model.py; a study that refuses r18 in
its own declaration (Study.on_r18), or whose part needs a hook #18's model has no place for, is refused in one
line. CPU, tiny preset; the new study joins the registry the test passes in (no module is patched)."""

from types import SimpleNamespace

import pytest
import torch

import train_gpt_medium as T
from speedrun.errors import UsageError
from speedrun.model import model_config_from_args
from speedrun.r18.studies import check_r18_studies
from speedrun.studies import STUDIES
from speedrun.study import Flag, ModelPart, Study
from test_r18_studies import loss_and_grads, model_of

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: thread overhead dominates


class HeadScale(ModelPart):
    """The head reads (1 + s) * its input, s one learned scalar (0 at init), reserved as `head_scale`."""

    def __init__(self, model, cfg):
        super().__init__()
        model.add_scalars("head_scale", torch.zeros(1))

    def head_input(self, model, head_in, outputs, x_embed, input_seq):
        return head_in * (1 + model.scalar_slice("head_scale")[0]).type_as(head_in)

    def block_input(self, model, i, x, outputs, x_embed):
        if i == 0:  # kept for the tests: x_embed, the embedding the residual started from, is layer 0's input
            self.layer0_input_and_embed = (x.detach(), x_embed.detach())
        return x

    def named_scalars(self, model):
        return {"head-scale.s": model.scalar_slice("head_scale")[0].item()}


def new_study(name="head-scale", **declared):
    """The hyphenated study (its scalar slice named with `_`), with what the keywords declare."""
    return Study(name=name, title=name, description=None,
                 flags=(Flag(f"--{name}", "the head reads (1 + s) x its input", resume=True, kind=bool,
                             options=dict(action="store_true")),),
                 resolve=lambda config, pattern: {},
                 model_config=lambda model_cfg, config: dict(head_scale=True) if config.head_scale else {},
                 model_fields=(("head_scale", bool, False),), **{"model_part": HeadScale, **declared})


def registry(**declared):
    """The bundled studies and the new one (new_study's keywords): the registry a run would pass in."""
    return STUDIES + (new_study(**declared),)


def r18_config_with_the_study(on=True):
    """The tiny r18 run config (resolved before the study is registered) with the new study's flag."""
    return SimpleNamespace(**vars(T.resolve_args(["--preset", "tiny", "--base", "r18"])), head_scale=on)


def assert_logged_as_stored(model):
    """A part's scalar is logged under the same name and at the same precision on every base (r18 rounded it to 6
    decimals, #14 did not)."""
    with torch.no_grad():
        model.scalar_slice("head_scale").fill_(1 / 3)
    assert model.named_scalars()["head-scale.s"] == torch.tensor(1 / 3).item()


def test_a_new_study_runs_on_r18_through_the_hooks():
    config, studies = r18_config_with_the_study(), registry()
    check_r18_studies(config, studies)  # declares nothing: runs
    model = model_of(config, studies)
    loss, _ = loss_and_grads(model)
    assert torch.isfinite(loss) and model.scalar_grad("head_scale").abs().item() > 0
    assert model.added_params() == {"head-scale": 1}  # once, under the study's name
    assert model.named_scalars()["head-scale.s"] == 0.0
    assert torch.equal(*model.study["head-scale"].layer0_input_and_embed)
    assert_logged_as_stored(model)


def test_a_new_study_runs_on_r14_through_the_hooks():
    args = SimpleNamespace(**vars(T.resolve_args(["--preset", "tiny"])), head_scale=True)
    cfg = model_config_from_args(T.PRESETS["tiny"], args, registry())  # the model config made from the registry
    torch.manual_seed(0)
    model = T.GPT(cfg, max_seq_len=64)
    with torch.no_grad():  # the zero lm head would pass no gradient to the head's input
        model.lm_head_w.normal_()
    g = torch.Generator().manual_seed(1)
    inputs, targets = torch.randint(0, 2000, (2, 64), generator=g)
    model(inputs, targets, torch.tensor(2)).backward()
    assert model.scalar_grad("head_scale").abs().item() > 0
    assert model.added_params() == {"head-scale": 1}
    assert model.named_scalars()["head-scale.s"] == 0.0
    assert torch.equal(*model.study["head-scale"].layer0_input_and_embed)
    assert_logged_as_stored(model)


class WidensTheMLP(HeadScale):
    def mlp_extra(self, model, i, outputs, x_embed, input_seq):
        return None


@pytest.mark.parametrize("declared,message", [
    (dict(on_r18=lambda config: "--head-scale: not on --base r18 (the test says so)"),
     "^--head-scale: not on --base r18 \\(the test says so\\)$"),
    (dict(model_part=WidensTheMLP), "^--head-scale: not on --base r18 \\(its part's mlp_extra widens an MLP's input"),
    # an r18 part of its own is what r18 checks and builds
    (dict(model_part=WidensTheMLP, r18_model_part=HeadScale), None),
])
def test_a_study_is_refused_on_r18_by_its_own_declaration_in_one_line(declared, message):
    config, off, studies = r18_config_with_the_study(), r18_config_with_the_study(on=False), registry(**declared)
    if message is None:
        check_r18_studies(config, studies)
        return
    with pytest.raises(UsageError, match=message) as refused:
        check_r18_studies(config, studies)
    assert "\n" not in str(refused.value)
    check_r18_studies(off, studies)  # off: nothing to refuse


def test_the_guides_training_helper_trains_the_base_the_flags_name(shard_dir):
    """study_training.trained_steps (the guide's test pattern) on --base r18 trains #18's model: it trained #14's."""
    from speedrun.r18.model import R18GPT
    from study_training import trained_steps
    argv = ["--preset", "tiny", "--base", "r18", "--gated-skip-layer", "2"]
    model = next(trained_steps(T, argv, str(shard_dir / "syn_train_*.bin"), steps=1))
    assert isinstance(model, R18GPT) and model.scalar_grad("gated_skip").abs().sum() > 0
