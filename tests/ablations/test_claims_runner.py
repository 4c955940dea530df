"""Issue 33 in the study runner: `run STUDY --arms A --report` checks every arm's staleness, so the logs of an arm
edited since they were made are left out of the report and terminal summary, named, never shown as the result."""

import pytest

from runner_support import ablations, runner_env, write_study

FLAGS = {"num-iterations": 6, "val-every": 3}


@pytest.mark.slow
def test_report_for_some_arms_leaves_out_the_stale_runs_of_the_others(tmp_path):
    """Case 7: only the runner knows which flags the study asks now; no analysis-only test sees this."""
    study = write_study(tmp_path, "s", {"baseline": {}, "backout": {"backout-layers": 4}}, seeds=[0, 1], flags=FLAGS)
    assert ablations(["run", study], tmp_path, runner_env()).returncode == 0
    write_study(tmp_path, "s", {"baseline": {}, "backout": {"backout-layers": 3}}, seeds=[0, 1], flags=FLAGS)
    result = ablations(["run", study, "--arms", "baseline", "--report"], tmp_path, runner_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = (tmp_path / "runs" / "s" / "report.md").read_text()
    arms = report.split("## Arms")[1].split("##")[0]
    assert "| baseline |" in arms and "| backout |" not in arms
    assert "backout/seed0.txt`: stale" in report and "backout/seed1.txt`: stale" in report
    assert "| backout |" not in result.stdout and "not counted: runs/s/backout/seed0.txt: stale" in result.stdout


@pytest.mark.slow
def test_a_sequential_study_names_its_family_and_exploratory_arms_say_so(tmp_path):
    """Case 1 and 3 end to end: the `decided` line, the report and the terminal summary give the family (or that the
    arms are exploratory) and one sequential verdict per arm, with no fixed-sample "real difference"."""
    arms = {"baseline": {}, "backout-L4": {"backout-layers": 4}, "backout-L3": {"backout-layers": 3}}
    study = write_study(tmp_path, "s", arms, flags=FLAGS, extra="family = false")
    result = ablations(["run", study, "--until-decided", "--max-seeds", "4", "--report"], tmp_path, runner_env(),
                       timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    decided = next(line for line in result.stdout.splitlines() if " decided " in line)
    assert "arms exploratory (study key family = false)" in decided and "backout-L4: worse after" in decided
    report = (tmp_path / "runs" / "s" / "report.md").read_text()
    assert "claims NOT family-controlled" in report and "| backout-L4 | worse |" in report
    assert "sequential p" in result.stdout and "a real difference at the" not in result.stdout.replace(
        "a real difference at family-wise alpha", "")
    write_study(tmp_path, "s", arms, flags=FLAGS)  # family = true: another design, refused on the recorded looks
    again = ablations(["run", study, "--until-decided", "--max-seeds", "4"], tmp_path, runner_env())
    assert again.returncode == 2 and "family" in again.stderr
