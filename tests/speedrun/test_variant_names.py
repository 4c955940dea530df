"""A run without --variant names itself from its study flags; --variant overrides; only the flagless run is
"baseline"; the arms of every bundled study get distinct names."""
import pytest

import train_gpt_medium as tgm
from conftest import bundled_medium_studies


def variant(argv):
    return tgm.resolve_args(argv).variant


@pytest.mark.parametrize("argv, name", [
    ([], "baseline"),
    (["--seed", "3", "--num-iterations", "100"], "baseline"),  # run flags are no study flags
    (["--backout-layers", "11"], "backout-L11"),
    (["--backout-layers", "11", "10", "embed", "--backout-transform", "tanh-linear"],
     "backout-L11+L10+embed-tanh-linear"),
    (["--backout-layers", "11", "--backout-x-init", "0.8", "--backout-skip-init", "-0.28", "--backout-freeze"],
     "backout-L11-x0.8-skip-0.28-frozen"),
    (["--backout-layers", "3", "--backout-mode", "subtract"], "backout-L3-subtract"),  # its default lambda 0.5
    (["--laurel", "rw+lr+pa"], "laurel-rw+lr+pa-r32-k3"),
    (["--laurel", "rw"], "laurel-rw"),
    (["--laurel", "pa", "--laurel-pa-h", "lowrank-shared", "--laurel-layers", "5,1", "--laurel-k", "2"],
     "laurel-pa-r32-k2-h-lowrank-shared-L1+L5"),
    (["--laurel", "rw", "--laurel-rw-scale", "1", "--laurel-where", "block"], "laurel-rw-rw-scale1-where-block"),
    (["--rolling-skip", "--laurel", "lr", "--laurel-zero-factor", "down"],
     "rolling-skip_laurel-lr-r32-zero-factor-down"),
    (["--num-layers", "18"], "layers18"),
    (["--compile", "regional"], "compile-regional"),  # a speed arm: its step times must not pool with baseline's
    (["--compile", "on", "--backout-layers", "11"], "backout-L11"),
])
def test_default_name_comes_from_the_non_default_study_flags(argv, name):
    assert variant(argv) == name


def test_spelled_out_defaults_name_the_same_run():
    assert variant(["--laurel", "rw+lr+pa", "--laurel-rank", "32", "--laurel-k", "3"]) == variant(
        ["--laurel", "rw+lr+pa"])
    assert variant(["--backout-layers", "11", "--backout-mode", "sum", "--backout-x-init", "1"]) == "backout-L11"


def test_variant_flag_overrides_the_derived_name():
    assert variant(["--laurel", "rw", "--variant", "mine"]) == "mine"
    assert variant(["--variant", "baseline", "--backout-layers", "11"]) == "baseline"


def test_groups_without_a_namer_are_named_generically_from_their_flags(tmp_path):
    """DLO has no namer of its own: its flags as given, in parser order, name the run."""
    checkpoint = tmp_path / "base.pt"
    checkpoint.write_bytes(b"")  # resolve_args only checks that it exists
    argv = ["--preset", "tiny", "--init-from", str(checkpoint), "--dlo-groups", "2", "--dlo-init", "slerp",
            "--dlo-sparsity", "0.25", "--dlo-layer-lr"]
    assert variant(argv) == "dlo-groups2-init-slerp-sparsity0.25-layer-lr"


@pytest.mark.parametrize("study", bundled_medium_studies(), ids=lambda s: s.name)
def test_hand_started_arms_of_a_bundled_study_do_not_pool(study, tmp_path):
    """Every arm, started by hand without --variant, gets a name no other arm of its study has."""
    for base in ("record", "r18-record"):  # the DLO studies' checkpoints, so their arms resolve
        (tmp_path / base / "baseline").mkdir(parents=True)
        for seed in study.seeds:
            (tmp_path / base / "baseline" / f"seed{seed}.pt").write_bytes(b"")
    names = {}
    for arm in study.arms:
        argv = study.argv(arm, study.seeds[0], tmp_path)
        names.setdefault(variant(argv), []).append(arm)
    pooled = {name: arms for name, arms in names.items() if len(arms) > 1}
    assert not pooled


def test_a_switch_named_as_its_study_names_the_run_once(monkeypatch):
    """A study without a namer whose switch is its own name (--embed-mix of study embed-mix) was named
    embed-mix-embed-mix."""
    import speedrun.variants as variants
    from speedrun.study import Flag
    switch = Flag("--embed-mix", "x", resume=True, kind=bool, options=dict(action="store_true"))
    study = type("StudyStandIn", (), dict(name="embed-mix", flags=(switch,), variant_name=None))
    monkeypatch.setattr(variants, "OFFERED_STUDIES", (study,))
    given = variants.given_study_flags({"embed_mix": True})
    assert variants.default_variant(given, config=None) == "embed-mix"
    assert variants.flag_piece("rolling", "--rolling-skip", True) == "skip"  # a switch of another name stays
