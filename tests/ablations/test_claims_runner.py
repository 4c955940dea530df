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


def test_one_runner_per_sequential_study_and_a_dead_runner_leaves_no_lock(tmp_path):
    """Case 8: two runners of one sequential study both proceeded, each with its own design. The second now refuses
    in one line; the kernel frees the lock of a runner that is gone (here: its fd closed)."""
    import os

    from ablations.errors import StudyError
    from ablations.sequential_study import hold_study_lock

    held = hold_study_lock(tmp_path / "s")
    with pytest.raises(StudyError, match="another runner runs the sequential study .* starts nothing"):
        hold_study_lock(tmp_path / "s")
    os.close(held)
    os.close(hold_study_lock(tmp_path / "s"))


def test_every_seed_log_of_an_arm_is_checked_for_staleness_not_only_the_study_seeds(tmp_path):
    """Case 5: seeds outside the study's `seeds` made with old flags were pooled by `run --report`."""
    from ablations.cli import logged_runs
    from ablations.study import load_study

    study_file = write_study(tmp_path, "s", {"baseline": {}, "backout": {"backout-layers": 4}}, seeds=[0, 1],
                             flags=FLAGS)
    for seed in (0, 7, 11):
        (tmp_path / "runs" / "s" / "backout").mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / "s" / "backout" / f"seed{seed}.txt").write_text("")
    (tmp_path / "runs" / "s" / "backout" / "seed7.unfinished-1.txt").write_text("")
    study = load_study(str(study_file), {}, None, tmp_path / "runs")
    assert [(run.arm, run.seed) for run in logged_runs(study, tmp_path / "runs")] == [
        ("backout", 0), ("backout", 7), ("backout", 11)]


@pytest.fixture
def status_of(tmp_path, monkeypatch, capsys):
    """`python -m ablations status STUDY` in this process: (exit status, stdout + stderr)."""
    from ablations.cli import main
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")

    def run(study):
        code = main(["status", str(study)])
        out, err = capsys.readouterr()
        return code, out + err
    return run


DESIGN = {"alpha": 0.01, "max_seeds": 4, "max_factor": 1.0, "batch": 1, "claim": "vs-baseline", "baseline": "baseline",
          "target": None, "arms": ["backout"], "family": True, "family_size": 1,
          "rule": "t-calibrated power spending (rho 3), Holm family"}


@pytest.mark.parametrize("edit, why", [
    ({"arms": ["backout-L4"]}, "arms ['backout-L4'], now ['backout']"),
    ({"alpha": 0.05}, "alpha 0.05, now 0.01"),
    ({"claim": "below-targett"}, "claim 'below-targett' is not one of vs-baseline, below-target")])
def test_status_refuses_the_record_the_runner_refuses(tmp_path, status_of, edit, why):
    """Issue 43: a renamed arm was a KeyError traceback in status; an unknown claim or another alpha were shown
    unflagged while `run` refused them."""
    import json
    study = write_study(tmp_path, "s", {"baseline": {}, "backout": {"backout-layers": 4}}, flags=FLAGS)
    record = tmp_path / "runs" / "s" / "sequential.json"
    record.parent.mkdir(parents=True)
    design = DESIGN | edit
    record.write_text(json.dumps({"design": design, "looks": {arm: [] for arm in design["arms"]}}))
    code, out = status_of(study)
    assert code == 0 and "Traceback" not in out
    (line,) = [line for line in out.splitlines() if line.startswith("sequential (")]
    assert "cannot be shown" in line and why in line


@pytest.mark.slow
def test_the_runs_of_a_sequential_study_carry_it_into_a_copy_without_its_record(tmp_path):
    """Issue 40 case 2: runs copied without sequential.json, the study folder gone, got fixed-sample claims. Each
    run the runner makes for a sequential study names the study and its design's digest in its log (the digest the
    record holds), so the copy makes no claim; runs of a fixed study name every arm of it instead."""
    import json
    import shutil
    import subprocess
    import sys

    from runner_support import REPO

    arms = {"baseline": {}, "backout-L4": {"backout-layers": 4}}
    study = write_study(tmp_path, "s", arms, flags=FLAGS)
    result = ablations(["run", study, "--until-decided", "--max-seeds", "3"], tmp_path, runner_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = tmp_path / "runs" / "s"
    record = json.loads((folder / "sequential.json").read_text())
    digest = record["design_digest"]
    assert record["study"] == "s"
    logs = sorted(folder.glob("*/seed*.txt"))
    assert logs and all(f'study: {{"design_digest": "{digest}", "study": "s"}}' in log.read_text()
                        for log in logs)
    for arm in arms:
        shutil.copytree(folder / arm, tmp_path / "copy" / arm)
    shutil.rmtree(folder)
    compare = subprocess.run([sys.executable, "-m", "analysis", "compare", str(tmp_path / "copy")], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert compare.returncode == 2 and compare.stdout == "", compare.stdout + compare.stderr
    assert "no claim: these runs were made by sequential study s whose record (sequential.json) is not with them" \
        in compare.stderr
    fixed = write_study(tmp_path, "f", arms, seeds=[0], flags=FLAGS)
    assert ablations(["run", fixed], tmp_path, runner_env()).returncode == 0
    # a fixed study's runs name every arm of it instead (its Holm family), as run-one's do
    fixed_line = 'study: {"arms": ["baseline", "backout-L4"], "study": "f"}'
    assert fixed_line in (tmp_path / "runs" / "f" / "baseline" / "seed0.txt").read_text()
    assert ablations(["run-one", fixed, "backout-L4", "1"], tmp_path, runner_env()).returncode == 0
    assert fixed_line in (tmp_path / "runs" / "f" / "backout-L4" / "seed1.txt").read_text()


@pytest.mark.slow
def test_a_study_started_afresh_under_another_design_refuses_the_runs_of_the_first(tmp_path):
    """The record moved aside (the runner's own advice to start afresh) and the study run with other settings: the
    runner counted the runs made and looked at under the first design, and every analysis command then refused
    their claims. It now refuses in one line and starts nothing; the same settings resume the runs as before."""
    arms = {"baseline": {}, "backout-L4": {"backout-layers": 4}}
    study = write_study(tmp_path, "s", arms, flags=FLAGS)
    assert ablations(["run", study, "--until-decided", "--max-seeds", "3"], tmp_path, runner_env(),
                     timeout=300).returncode == 0
    record = tmp_path / "runs" / "s" / "sequential.json"
    record.rename(record.with_name("sequential.aside.json"))
    again = ablations(["run", study, "--until-decided", "--max-seeds", "4"], tmp_path, runner_env())
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1, again.stdout + again.stderr
    assert "was made for sequential study s under design" in again.stderr and "start afresh" in again.stderr
    assert not record.exists() and " start " not in again.stdout
    same = ablations(["run", study, "--until-decided", "--max-seeds", "3"], tmp_path, runner_env(), timeout=300)
    assert same.returncode == 0, same.stdout + same.stderr


def test_a_second_runner_is_refused_for_the_runner_not_for_its_runs(tmp_path, monkeypatch, capsys):
    """Audit of case 8: a second runner with another --max-seeds read the first one's new runs (made under the
    first's design) before taking the lock, and was refused with "move the runs aside to start afresh", advice that
    loses the first runner's work. The lock now comes before the record and the runs are read."""
    import os

    import analysis_logs
    from ablations.cli import main
    from ablations.sequential_study import hold_study_lock
    from speedrun.logformat import study_value

    monkeypatch.chdir(tmp_path)
    study = write_study(tmp_path, "s", {"baseline": {}, "backout": {"backout-layers": 4}}, flags=FLAGS,
                        extra="until_decided = true")
    first_design = study_value("s", design_digest="0123456789abcdef")  # the first runner's, as its runs carry it
    analysis_logs.write(tmp_path / "runs" / "s" / "baseline" / "seed0.txt", analysis_logs.our_log_text(
        variant="baseline", seed=0, env={"study": first_design}))
    held = hold_study_lock(tmp_path / "runs" / "s")
    try:
        code = main(["run", str(study), "--max-seeds", "4", "--launcher", "python", "--gpus", "0"])
    finally:
        os.close(held)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "another runner runs the sequential study" in err and "move the runs aside" not in err


def study_with_a_log_without_config_line(tmp_path):
    import analysis_logs

    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)
    (tmp_path / "runs" / "s").mkdir(parents=True)
    (tmp_path / "runs" / "s" / "runner.log").write_text("")
    text = analysis_logs.our_log_text(variant="baseline", seed=0)
    analysis_logs.write(tmp_path / "runs" / "s" / "baseline" / "seed0.txt",
                        "".join(line for line in text.splitlines(True) if not line.startswith("config: ")))
    return study


def test_status_names_a_log_that_contradicts_itself_with_its_reason(tmp_path, status_of):
    """Audit of case 8: such a log (here: no config line) was "to do" in status, its reason named nowhere."""
    code, out = status_of(study_with_a_log_without_config_line(tmp_path))
    assert code == 0 and "to do: seed0 (not a run: no config line, yet it sits in a study folder" in out, out


@pytest.mark.slow
def test_run_names_a_log_that_contradicts_itself_with_its_reason(tmp_path):
    """Audit of case 8: `run` set such a log aside as an "unfinished log" and reran the seed without saying why; the
    note is written only where the runner launches a run (a process), so no in-process test sees it."""
    study = study_with_a_log_without_config_line(tmp_path)
    result = ablations(["run", study, "--launcher", "python", "--gpus", "0"], tmp_path, runner_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert ".txt, not a run: no config line" in result.stdout and "unfinished log kept aside" not in result.stdout
