"""Group-sequential studies under the faults of issue 36: an arm edited after its looks (the looks are stale, said
so by status and --dry-run, refused, or dropped and taken afresh with --redo-stale), and a damaged or mismatched
record refused in one line before anything is written."""

import json

import pytest

from runner_support import ablations, read_events, runner_env, write_study
from test_runner_sequential import ARMS, FLAGS, refused, state_of  # noqa: F401 (refused: a fixture)

EDITED = {"baseline": {}, "backout-L4": {"backout-layers": 2}}
SEQUENTIAL = ["--until-decided", "--max-seeds", "4"]


@pytest.mark.slow
def test_an_edited_arms_looks_are_stale_until_redone_and_looked_at_afresh(tmp_path):
    """The runner end to end (runs redone, looks retaken): one study edited twice, through status, --dry-run, run,
    --redo-stale and a fixed-n redo behind the record's back."""
    starts = tmp_path / "starts.jsonl"
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    first = ablations(["run", study, *SEQUENTIAL], tmp_path, runner_env(starts))
    assert first.returncode == 0, first.stdout + first.stderr
    old_looks = state_of(tmp_path)["looks"]["backout-L4"]
    old_look = old_looks[-1]
    assert old_look["decision"] == "worse" and old_look["n"] < 4
    assert old_look["config"]["backout_layers"] == "4" and old_look["baseline_config"]["variant"] == "baseline"

    write_study(tmp_path, "s", EDITED, flags=FLAGS)
    status = ablations(["status", study], tmp_path, runner_env())
    (shown,) = [line for line in status.stdout.splitlines() if "backout-L4: n " in line]  # the look, not the verdict
    assert "backout-L4: no claim (stale look)" in status.stdout
    assert shown.strip().startswith(f"STALE look {len(old_looks)}") and "--backout-layers 4, the study now asks 2" in shown
    as_json = json.loads(ablations(["status", study, "--json"], tmp_path, runner_env()).stdout)
    assert list(as_json["sequential"]["stale"]) == ["backout-L4"]
    listed = ablations(["run", study, *SEQUENTIAL, "--dry-run"], tmp_path, runner_env())
    assert any(line.startswith(f"sequential STALE look {len(old_looks)} backout-L4") for line in listed.stdout.splitlines())
    assert sum("--variant backout-L4" in line for line in listed.stdout.splitlines()) == 4  # open again: seeds 0-3

    redone = ablations(["run", study, *SEQUENTIAL, "--redo-stale"], tmp_path, runner_env(starts))
    assert redone.returncode == 0, redone.stdout + redone.stderr
    assert " replayed " not in redone.stdout and " dropped " in redone.stdout
    state = state_of(tmp_path)
    assert state["dropped"]["backout-L4"] == [dict(look, dropped_because=state["dropped"]["backout-L4"][0][
        "dropped_because"]) for look in old_looks]
    assert "--backout-layers 4" in state["dropped"]["backout-L4"][0]["dropped_because"]
    new_look = state["looks"]["backout-L4"][-1]
    assert new_look["config"]["backout_layers"] == "2" and new_look["n"] >= 2
    starts_of_l4 = [event["seed"] for event in read_events(starts)
                    if event["event"] == "start" and event["variant"] == "backout-L4"]
    assert starts_of_l4.count(0) == starts_of_l4.count(1) == 2  # redone with the new flags

    # a fixed-n run redoes the arm's runs with a third edit: the logs agree with the study, the looks do not
    write_study(tmp_path, "s", {"baseline": {}, "backout-L4": {"backout-layers": 3}}, flags=FLAGS)
    assert ablations(["run", study, "--seeds", "0-3", "--redo-stale"], tmp_path, runner_env()).returncode == 0
    stale = ablations(["run", study, *SEQUENTIAL], tmp_path, runner_env())
    assert stale.returncode == 2 and len(stale.stderr.strip().splitlines()) == 1, stale.stderr
    assert "sequential looks of 1 arm(s) are stale" in stale.stderr and "--backout-layers 2" in stale.stderr


@pytest.fixture
def no_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs, and no nvidia-smi process in the fast tier


@pytest.mark.usefixtures("no_gpus")
def test_a_damaged_sequential_record_is_refused_in_one_line(tmp_path, refused):
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    record = tmp_path / "runs" / "s" / "sequential.json"
    record.parent.mkdir(parents=True)
    look = {"look": 1, "n": 2, "n_baseline": 2, "fraction": 0.5, "boundary": 2.8, "nominal_p": 0.005,
            "estimate": 0.03, "z": 9.0, "p": 1e-6, "repeated_ci": [0.02, 0.04], "decision": None, "adjusted_p": None}
    design = {"alpha": 0.01, "max_seeds": 4, "max_factor": 1.0, "batch": 1, "claim": "vs-baseline",
              "baseline": "baseline", "target": None, "arms": ["backout-L4"]}
    record.write_text(json.dumps({"design": design, "looks": {"backout-L4": [look]}}))
    line = refused(study, *SEQUENTIAL)
    assert "look 1 of backout-L4: decision None is not one of continue" in line and "move it aside" in line
    assert not (tmp_path / "runs" / "s" / "runner.log").exists()


@pytest.mark.usefixtures("no_gpus")
def test_a_record_of_another_design_is_refused_before_the_begin_line(tmp_path, refused):
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    record = tmp_path / "runs" / "s" / "sequential.json"
    record.parent.mkdir(parents=True)
    design = {"alpha": 0.05, "max_seeds": 4, "max_factor": 1.0, "batch": 1, "claim": "vs-baseline",
              "baseline": "baseline", "target": None, "arms": ["backout-L4"]}
    record.write_text(json.dumps({"design": design, "looks": {"backout-L4": []}}))
    assert "records looks of another design (alpha 0.05, now 0.01)" in refused(study, *SEQUENTIAL)
    assert not (tmp_path / "runs" / "s" / "runner.log").exists()


def test_a_stale_look_is_no_claim_in_the_verdict_line():
    """Issue 36 with issue 33's family: status's verdict line never claims from a stale look, and the arm enters the
    Holm family as not yet looked at (here that costs the other arm its claim: 2 x 0.006 > alpha 0.01)."""
    from ablations.sequential_study import describe_state

    def look(adjusted):
        return {"look": 2, "n": 3, "n_baseline": 3, "fraction": 0.75, "boundary": 3.0, "nominal_p": 0.003,
                "estimate": -0.03, "z": -4.0, "p": 1e-4, "repeated_ci": [-0.05, -0.01], "decision": "better",
                "adjusted_p": adjusted}

    design = {"alpha": 0.01, "max_seeds": 4, "max_factor": 1.0, "batch": 1, "claim": "vs-baseline",
              "baseline": "baseline", "target": None, "arms": ["edited", "kept"], "family": True, "family_size": 2}
    state = {"design": design, "looks": {"edited": [look(0.001)], "kept": [look(0.006)]}}
    assert describe_state(state)[-1].endswith("edited: better after 3 seeds, sequential p 0.001, family p 0.002; "
                                              "kept: better after 3 seeds, sequential p 0.006, family p 0.006")
    lines = describe_state(state, {"edited": "edited's runs were made with --backout-layers 4"})
    assert lines[1].startswith("STALE look 2 edited")
    assert lines[-1].endswith("edited: no claim (stale look); kept: no claim (better) after 3 seeds, sequential p "
                              "0.006, family p 0.012")


def test_a_diverged_look_is_a_record_this_runner_wrote(tmp_path):
    """Issue 33's "diverged" look (estimate nan, boundary inf) passes issue 36's check of a recorded look on resume."""
    from ablations.sequential_study import _save_state, read_state
    from analysis.sequential import Design, take_look

    look = take_look(Design(alpha=0.01, max_seeds=4, batch=1), [], [2.90, float("nan"), 2.91], [2.90, 2.91, 2.92])
    record = tmp_path / "sequential.json"
    design = {"alpha": 0.01, "max_seeds": 4, "batch": 1, "claim": "vs-baseline", "baseline": "baseline",
              "target": None, "arms": ["exploded"], "family": True, "family_size": 1}
    _save_state(record, {"design": design, "looks": {"exploded": [look]}})
    assert read_state(record)["looks"]["exploded"][0]["decision"] == "diverged"
