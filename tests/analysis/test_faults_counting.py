"""Analysis under the faults of issue 26: a run is identified by (track, variant, seed, config), so a copied log
or a folder given twice never counts twice; an arm never pools both tracks; a record holds its own track only;
reports name what they left out and why, never list the runner's own runner.log, and name dangling symlinks."""
import json
import os
import shutil
from pathlib import Path

import pytest

import analysis_logs as logs_for_tests
from analysis_logs import run_cli

FINALS = {"baseline": [2.9205, 2.9211, 2.9198], "backout": [2.9181, 2.9190, 2.9176]}


def curve(final):
    return lambda step: logs_for_tests.default_curve(step, 100, final)


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "runs" / "demo"
    for arm, finals in FINALS.items():
        for seed, final in enumerate(finals):
            logs_for_tests.write(root / arm / f"seed{seed}.txt", logs_for_tests.our_log_text(
                variant=arm, seed=seed, losses=curve(final), step_ms=250.0 + seed))
    return root


def compared(capsys, *argv):
    status, out, err = run_cli(capsys, "compare", *argv, "--json")
    assert status == 0, err
    result = json.loads(out)
    return {arm["variant"]: arm["n"] for arm in result["arms"]}, result["comparisons"][0]["loss_p"], result


def test_a_copied_log_counts_once_and_is_named(capsys, study):
    before, p_before, _ = compared(capsys, study)
    copy = study / "baseline" / "seed0 (copy).txt"
    shutil.copy(study / "baseline" / "seed0.txt", copy)
    after, p_after, result = compared(capsys, study)
    assert after == before == {"baseline": 3, "backout": 3} and p_after == p_before
    (named,) = [entry for entry in result["not_counted"] if "counted once" in entry["why"]]
    assert named["path"] in (str(copy), str(study / "baseline" / "seed0.txt"))


def test_a_folder_given_twice_counts_once(capsys, study, monkeypatch):
    before, p_before, _ = compared(capsys, study)
    alias = study.parent / "alias"
    alias.symlink_to(study)
    monkeypatch.chdir(study.parent)
    assert compared(capsys, "demo", study, alias, "demo/baseline")[:2] == (before, p_before)


def test_record_check_verdict_does_not_change_with_copies(capsys, study):
    argv = ["record-check", study / "backout", "--baseline", study / "baseline", "--json", "--resamples", "200"]
    _, out, _ = run_cli(capsys, *argv)
    before = json.loads(out)
    for seed in range(3):
        for folder in ("backout", "baseline"):
            shutil.copy(study / folder / f"seed{seed}.txt", study / folder / f"seed{seed}-copy.txt")
    _, out, _ = run_cli(capsys, *argv)
    after = json.loads(out)
    assert (after["n"], after["p_value"], after["time_p"], after["verdict"]) == \
        (before["n"], before["p_value"], before["time_p"], before["verdict"])
    assert sum("counted once" in entry["why"] for entry in after["not_counted"]) == 6


def test_reruns_of_one_seed_count_once_as_the_newest_finished_log(capsys, study):
    # Issue 33, case 4: same seed and config, other results (a second runs folder, a resumed copy): one run, one
    # sample. Before, each rerun counted in n (record-check went FAIL -> PASS by adding reruns of seed 0).
    rerun = logs_for_tests.write(study / "baseline" / "seed0-rerun.txt", logs_for_tests.our_log_text(
        variant="baseline", seed=0, losses=curve(2.9301), step_ms=261.0))
    os.utime(rerun, ns=(2**62, 2**62))  # the newest log of the run
    arms, _, result = compared(capsys, study)
    assert arms["baseline"] == 3
    assert result["arms"][0]["mean_val_loss"] == pytest.approx((2.9301 + 2.9211 + 2.9198) / 3, abs=1e-6)
    assert any(entry["path"].endswith("seed0.txt") and "counted once" in entry["why"]
               for entry in result["not_counted"])


def test_reruns_of_a_seed_never_turn_a_record_check_into_a_pass(capsys, tmp_path):
    """Issue 33, case 4: a failing claim stays failing however often seed 0 is rerun, and `record` packages it once."""
    folder = tmp_path / "claim"
    finals = [2.9195, 2.9190, 2.9215]
    for seed, final in enumerate(finals):
        logs_for_tests.write(folder / f"seed{seed}.txt", logs_for_tests.our_log_text(
            variant="claim", seed=seed, losses=curve(final)))
    argv = ["record-check", folder, "--json", "--resamples", "200"]
    before = json.loads(run_cli(capsys, *argv)[1])
    for copy in range(3):
        logs_for_tests.write(tmp_path / f"other-runs{copy}" / "claim" / "seed0.txt", logs_for_tests.our_log_text(
            variant="claim", seed=0, losses=curve(2.9190 - copy / 10000), step_ms=251.0 + copy))
    status, out, _ = run_cli(capsys, *argv[:2], tmp_path, *argv[2:])
    after = json.loads(out)
    assert before["verdict"] == "fail" and status == 1 and after["verdict"] == "fail"
    assert after["n"] == 3 and sum("counted once" in entry["why"] for entry in after["not_counted"]) == 3
    status, out, err = run_cli(capsys, "record", tmp_path, "--track", "medium", "--name", "X",
                               "--records-root", tmp_path / "records")
    assert status == 0, err
    assert len(list(Path(out.strip()).glob("*.txt"))) == 3
    readme = (Path(out.strip()) / "README.md").read_text()
    assert "3 complete runs" in readme and readme.count("counted once") == 3  # the reruns named


def test_an_arm_never_pools_both_tracks(capsys, tmp_path):
    folder = tmp_path / "mixed"
    for track in ("small", "medium"):
        for seed in range(2):
            logs_for_tests.write(folder / f"{track}{seed}.txt", logs_for_tests.our_log_text(
                variant="baseline", seed=seed, track=track, losses=curve(2.9 + seed / 100)))
    for command in (["compare", folder, "--baseline", "baseline"], ["summarize", folder, "--target", "3"],
                    ["report", folder, "--target", "3"]):
        status, _, err = run_cli(capsys, *command)
        assert status == 2 and len(err.strip().splitlines()) == 1, err
        assert "arm 'baseline' holds runs of both tracks" in err and "small" in err and "medium" in err
    assert not (folder / "report.md").exists()


def test_record_refuses_logs_of_the_other_track(capsys, tmp_path):
    folder = tmp_path / "small-runs"
    for seed in range(2):
        logs_for_tests.write(folder / "claim" / f"seed{seed}.txt", logs_for_tests.our_log_text(
            variant="claim", seed=seed, track="small", losses=curve(3.27)))
    status, _, err = run_cli(capsys, "record", folder, "--track", "medium", "--name", "X",
                             "--records-root", tmp_path / "records")
    assert status == 2 and "is a small-track run, not a medium-track one" in err
    assert not (tmp_path / "records").exists()


@pytest.mark.slow
def test_report_names_duplicates_and_dangling_links_but_not_its_runner_log(capsys, study):
    """Guards: `analysis report` names a copied log and a dangling symlink, counts the copy once, skips runner.log."""
    (study / "runner.log").write_text("2026-11-24 10:00:00 demo begin    ablations/demo.toml - demo\n")
    shutil.copy(study / "backout" / "seed1.txt", study / "backout" / "seed1 (copy).txt")
    (study / "backout" / "seed9.txt").symlink_to(study / "gone" / "seed9.txt")
    status, out, err = run_cli(capsys, "report", study, "--target", "2.92")
    assert status == 0, err
    report = (study / "report.md").read_text()
    unreadable = report.split("## Unreadable files")[1].split("##")[0]
    assert "runner.log" not in report
    assert "backout/seed9.txt" in unreadable and "dangling symlink" in unreadable
    duplicates = report.split("## Duplicate logs")[1].split("##")[0]
    assert "backout/seed1 (copy).txt" in duplicates and "backout/seed1.txt" in duplicates
    assert "| backout | 3 |" in report  # three complete runs, not four


@pytest.mark.slow
def test_report_with_arms_leaves_out_a_renamed_arm(capsys, study):
    """Guards: `report --arms` leaves a renamed arm's old logs out of the arms table and lists them apart."""
    shutil.move(study / "backout", study / "backout-old")  # the arm renamed in the study: its logs stay behind
    for seed in range(3):
        logs_for_tests.write(study / "backout-new" / f"seed{seed}.txt", logs_for_tests.our_log_text(
            variant="backout-new", seed=seed, total_steps=200, losses=curve(2.91)))
    status, _, err = run_cli(capsys, "report", study, "--target", "2.92", "--arms", "baseline,backout-new")
    assert status == 0, err
    report = (study / "report.md").read_text()
    arms_table = report.split("## Arms")[1].split("##")[0]
    assert "backout-new" in arms_table and "| backout |" not in arms_table
    left_out = report.split("## Logs of arms the study no longer has")[1]
    assert "backout-old/seed0.txt" in left_out
