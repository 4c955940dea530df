"""Every parameter a study flag adds trains: for every arm of the bundled medium-track studies and a set of flag
combinations that covers every study flag and value, at tiny size from the real init, each added parameter gets a
non-zero gradient within the first real training steps.

"Added" is read off the model, not listed by hand: parameters the flagless model of the same size lacks, the part
of a widened parameter beyond the baseline's shape, and the study's slices of the scalar vector. Stacked matrices
(one product per leading index) and scalar-vector entries are checked one by one, so a single dead gamma or
product fails.

Why three backward passes: at the real init the lm head, every attention output and every MLP output projection
are zero, so the first backward reaches only the head; the second reaches everything the residual stream feeds
(and a product's zero factor); the third everything behind a factor that was zero at the first (the other
factor of a low-rank product, gamma next to it, a matrix behind a zero lambda)."""
import pytest
import torch

import train_gpt_medium as tgm
from conftest import bundled_medium_studies, synthetic_tokens
from speedrun.backout import BACKOUT_MODES, BACKOUT_TRANSFORMS
from speedrun.laurel import LAUREL_CHOICES, LAUREL_VARIANTS
from speedrun.model import TRACK_SCALARS
from speedrun.studies import STUDIES
from speedrun.variants import given_study_flags

BACKWARD_PASSES = 3
SIZE = ["--preset", "tiny", "--num-layers", "16"]  # the studies' layer indices exist at 16 layers

# Flag sets beyond the bundled arms, so that every study flag and every value it takes is exercised (the coverage
# test below fails when a new flag or value is in none of them and in no arm).
FLAG_SETS = [
    ["--laurel", "rw", "--laurel-rw-form", "sigmoid", "--laurel-rw-scale", "1"],
    ["--laurel", "rw", "--laurel-rw-form", "single"],
    ["--laurel", "rw+pa", "--laurel-rw-form", "vector", "--laurel-where", "both", "--laurel-k", "4"],
    ["--laurel", "pa", "--laurel-pa-h", "lowrank", "--laurel-where", "attn", "--laurel-rank", "4"],
    ["--laurel", "rw+lr+pa", "--laurel-pa-h", "lowrank-shared", "--laurel-zero-factor", "down",
     "--laurel-factor-init", "xavier", "--laurel-layers", "2,7,12"],
    ["--laurel", "rw+lr", "--laurel-where", "block", "--laurel-rank", "8"],
    ["--backout-layers", "3,embed,new-embed", "--backout-mode", "subtract", "--backout-transform", "tanh"],
    ["--backout-layers", "4,embed", "--backout-mode", "concat-mlp", "--backout-concat-dim", "8",
     "--backout-mlp-ratio", "1.5", "--backout-transform", "relu-linear"],
    ["--backout-layers", "new-embed,9", "--backout-mode", "concat-head", "--backout-transform", "tanh-linear"],
    ["--backout-layers", "5,2", "--backout-transform", "relu", "--backout-norm-after-sum", "--backout-fixed-x"],
    ["--backout-layers", "6", "--backout-freeze", "--backout-x-init", "0.5", "--backout-skip-init", "0.2"],
    ["--backout-layers", "7,3", "--backout-transform", "detach", "--rolling-skip", "--laurel", "rw+lr+pa"],
]


def bundled_arms():
    """(id, argv) of every arm of the medium-track studies that can start without a checkpoint (DLO arms expand
    one: part of the DLO tests; the multi-skip orders are plain backout sums, as in FLAG_SETS)."""
    out = []
    for study in bundled_medium_studies():
        for arm in study.arms:
            argv = study.argv(arm, study.seeds[0], runs_dir=None)
            if "--init-from" not in argv:
                out.append((f"{study.name}:{arm}", argv))
    return out


def distinct_configs(cases):
    """The cases with distinct model configurations (many arms differ only in run flags)."""
    seen, out = set(), []
    for case_id, argv in cases:
        key = repr(tgm.model_config(tgm.resolve_args(SIZE + argv)))
        if key not in seen:
            seen.add(key)
            out.append(pytest.param(argv, id=case_id))
    return out


CASES = [(" ".join(f), f) for f in FLAG_SETS] + bundled_arms()


def build(argv):
    args = tgm.resolve_args(SIZE + argv)
    torch.manual_seed(0)
    return tgm.GPT(tgm.model_config(args), max_seq_len=128)


def added_units(model, baseline):
    """{unit name: (parameter name, index)} of everything the study flags add to the baseline of the same size."""
    base_shapes = {name: p.shape for name, p in baseline.named_parameters()}
    units = {}
    for key, (a, b) in model.scalar_layout.items():
        if key not in TRACK_SCALARS:
            units.update({f"scalars[{key}][{i}]": ("scalars", slice(a + i, a + i + 1)) for i in range(b - a)})
    for name, p in model.named_parameters():
        old = base_shapes.get(name)
        if name == "scalars" or old == p.shape:
            continue
        region = (slice(None),) * p.ndim
        grown = [d for d in range(p.ndim) if old is not None and len(old) == p.ndim and p.shape[d] != old[d]]
        if len(grown) == 1 and p.shape[grown[0]] > old[grown[0]]:  # widened: only the new part is added
            region = tuple(slice(old[d], None) if d == grown[0] else slice(None) for d in range(p.ndim))
        if p.ndim >= 3:  # a stack of matrices: each one on its own
            for i in range(p.shape[0])[region[0]]:
                units[f"{name}[{i}]"] = (name, (i,) + region[1:])
        else:
            units[name] = (name, region)
    return units


def never_trained(argv):
    model, baseline = build(argv), build([])
    units = added_units(model, baseline)
    # flags that add nothing (a frozen backout, the baseline arms) have nothing to check
    study_added = any(n for variant, n in model.added_params().items() if variant != "layers")
    assert bool(units) == (study_added or model.cfg.num_layers != baseline.cfg.num_layers)
    params = dict(model.named_parameters())
    opt = tgm.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    tokens = torch.from_numpy(synthetic_tokens(BACKWARD_PASSES * 64 + 1, 7).astype("int64"))
    dead = set(units)
    for step in range(BACKWARD_PASSES):
        chunk = tokens[step * 64: step * 64 + 65]
        tgm.train_step(model, [(chunk[:-1], chunk[1:])], torch.tensor(2), tgm.Dist())
        dead = {u for u in dead if params[units[u][0]].grad is None
                or not params[units[u][0]].grad[units[u][1]].any()}
        opt.step(step, 40)
    return sorted(dead)


# The tiny model is dominated by thread overhead on a shared 2-core machine.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
@pytest.mark.parametrize("argv", distinct_configs(CASES))
def test_every_added_parameter_gets_a_gradient(argv):
    """Guards: every parameter a medium study arm or flag set adds gets a non-zero gradient in 3 real training steps."""
    assert never_trained(argv) == []


@pytest.mark.slow
def test_the_old_dead_low_rank_pa_init_is_caught(monkeypatch):
    """The check itself: gamma = 0 next to B = 0 (the init before the fix) reports every gamma, A and B."""
    from speedrun.laurel import LaurelResiduals
    original = LaurelResiduals.scalar_inits
    monkeypatch.setattr(LaurelResiduals, "scalar_inits",
                        lambda self, dim: {k: torch.zeros_like(v) for k, v in original(self, dim).items()})
    dead = never_trained(["--laurel", "rw+lr+pa", "--laurel-rank", "4"])
    model = build(["--laurel", "rw+lr+pa", "--laurel-rank", "4"])
    products = model.study["laurel"].up.size(0)
    assert len([u for u in dead if u.startswith("scalars[laurel.gamma]")]) == products
    assert {f"study.laurel.{f}[{i}]" for f in ("up", "down") for i in range(products)} <= set(dead)


def test_every_study_flag_and_value_is_exercised():
    """Every backout and LAuReL flag is given in some case, and every value of a flag with a fixed set of values
    is what some case resolves to."""
    parser = tgm.make_arg_parser()
    given, resolved = set(), set()
    choices = dict(LAUREL_CHOICES, laurel=LAUREL_VARIANTS, backout_mode=BACKOUT_MODES,
                   backout_transform=BACKOUT_TRANSFORMS)
    for _, argv in CASES:
        given |= {flag for _, flag, _ in given_study_flags(vars(parser.parse_args(SIZE + argv)))}
        args = tgm.resolve_args(SIZE + argv)
        resolved |= {(name, getattr(args, name)) for name in choices}
    study_flags = {flag.name for study in STUDIES if study.name in ("backout", "rolling", "laurel", "gated-skip")
                   for flag in study.flags}
    assert study_flags - given == set()
    assert {(name, v) for name, values in choices.items() for v in values} - resolved == set()
