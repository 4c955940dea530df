"""Layer selection orders for multi-layer skips, and ranking a finished layer sweep."""

import importlib.util
import json
import tomllib
from pathlib import Path

import pytest

from ablations.errors import StudyError
from ablations.layer_orders import generate_arms, layer_selections, rank_layers
from ablations.study import STUDY_DIR, load_study
from runner_support import FAKE_TRAIN, ablations, runner_env, write_study

# Final losses of a 15-layer sweep chosen so that the ranking starts 11, 10, 8, 4, 9 and ends 6, 14, 7, 2, 1
# (the examples the article gives for N=5).
SWEEP = {11: 2.9150, 10: 2.9155, 8: 2.9160, 4: 2.9165, 9: 2.9170, 12: 2.9175, 13: 2.9180, 0: 2.9185, 3: 2.9190,
         5: 2.9195, 6: 2.9200, 14: 2.9205, 7: 2.9210, 2: 2.9215, 1: 2.9300}


def summary_of(losses: dict[int, float]) -> dict:
    return {"runs": [], "groups": [{"variant": f"L{layer}", "n": 1, "mean_val_loss": loss}
                                   for layer, loss in losses.items()] + [{"variant": "baseline", "mean_val_loss": 3}]}


def test_rank_layers_orders_by_mean_final_loss():
    ranked = rank_layers(summary_of(SWEEP), {f"L{layer}": layer for layer in range(15)})
    assert ranked[:5] == [11, 10, 8, 4, 9]
    assert ranked[::-1][:5] == [1, 2, 7, 14, 6]
    with pytest.raises(StudyError, match="layer\\(s\\) 3"):
        rank_layers(summary_of({k: v for k, v in SWEEP.items() if k != 3}), {f"L{i}": i for i in range(15)})


def test_the_five_orders():
    ranked = rank_layers(summary_of(SWEEP), {f"L{layer}": layer for layer in range(15)})
    chosen = layer_selections(["best-to-worst", "worst-to-best", "early-to-late", "late-to-early", "random"], 15,
                              range(2, 14), 2025, ranked)
    assert chosen["best-to-worst", 2] == [11, 10] and chosen["best-to-worst", 5] == [11, 10, 8, 4, 9]
    assert chosen["worst-to-best", 2] == [1, 2] and chosen["worst-to-best", 5] == [1, 2, 7, 14, 6]
    assert chosen["early-to-late", 3] == [0, 1, 2] and chosen["late-to-early", 3] == [14, 13, 12]
    for n in range(2, 14):
        picked = chosen["random", n]
        assert len(picked) == n == len(set(picked)) and all(0 <= layer < 15 for layer in picked)
    again = layer_selections(["random"], 15, range(2, 14), 2025, None)
    other = layer_selections(["random"], 15, range(2, 14), 2026, None)
    assert all(again["random", n] == chosen["random", n] for n in range(2, 14))  # a fixed seed, reproducible
    assert any(other["random", n] != chosen["random", n] for n in range(2, 14))
    with pytest.raises(StudyError, match="needs the ranking"):
        layer_selections(["best-to-worst"], 15, range(2, 3), 0, None)


def test_generated_arm_names_and_flags():
    spec = {"kind": "layer-orders", "flag": "backout-layers", "layers": 4, "min_count": 2, "max_count": 3,
            "orders": ["late-to-early"]}
    arms = generate_arms(spec, None, Path("runs"), "x.toml")
    assert arms == {"late-to-early-n02": {"backout-layers": "3,2"}, "late-to-early-n03": {"backout-layers": "3,2,1"}}
    with pytest.raises(StudyError, match="requires_results"):
        generate_arms({**spec, "orders": ["best-to-worst"]}, None, Path("runs"), "x.toml")
    with pytest.raises(StudyError, match="unknown order 'sideways'"):
        generate_arms({**spec, "orders": ["sideways"]}, None, Path("runs"), "x.toml")


def test_bundled_multi_skip_study_covers_the_article():
    with open(STUDY_DIR / "backout-multi-skip.toml", "rb") as f:
        spec = tomllib.load(f)
    assert spec["requires_results"] == "backout-layer-sweep"
    assert set(spec["generate"]["orders"]) == {"best-to-worst", "worst-to-best", "early-to-late", "late-to-early",
                                               "random"}
    assert (spec["generate"]["min_count"], spec["generate"]["max_count"], spec["generate"]["layers"]) == (2, 13, 15)
    static = generate_arms({**spec["generate"], "orders": ["early-to-late", "late-to-early", "random"]}, None,
                           Path("runs"), "x")
    assert len(static) == 3 * 12


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("analysis") is None,
                    reason="the analysis package (python -m analysis summarize) is not in this tree yet")
def test_multi_skip_arms_from_a_finished_sweep(tmp_path):
    """Guards: a layer-orders study is refused until its sweep has run, then orders its arms by the sweep's logs."""
    sweep_arms = {f"L{layer}": {"backout-layers": layer} for layer in range(4)}
    sweep = write_study(tmp_path, "sweep", {"baseline": {}, **sweep_arms}, seeds=[0],
                        flags={"num-iterations": 4, "val-every": 2})
    multi = tmp_path / "multi.toml"
    multi.write_text(f'description = "m"\nscript = {json.dumps(str(FAKE_TRAIN))}\n'
                     f'launcher = "python"\nseeds = [0]\nrequires_results = {json.dumps(str(sweep))}\n'
                     '[generate]\nkind = "layer-orders"\nflag = "backout-layers"\nlayers = 4\nmin_count = 2\n'
                     'max_count = 3\norders = ["best-to-worst", "worst-to-best"]\n')
    refused = ablations(["run", multi, "--dry-run"], tmp_path, runner_env())
    assert refused.returncode == 2 and "needs finished results" in refused.stderr
    assert ablations(["run", sweep], tmp_path, runner_env()).returncode == 0
    study = load_study(str(multi), runs_dir=tmp_path / "runs")
    # The stand-in's final loss grows with (7 * layer) % 5: layers 0, 3, 1, 2 from best to worst.
    assert study.argv("best-to-worst-n03", 0, Path("runs")) == ["--backout-layers", "0,3,1"]
    assert study.argv("worst-to-best-n02", 0, Path("runs")) == ["--backout-layers", "2,1"]
