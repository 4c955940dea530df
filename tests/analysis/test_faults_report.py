"""Analysis under the faults of issue 36: `report --arms` naming an arm without logs refused, whatever bears a log's
name and is no file (a folder, a FIFO) named as unreadable, a variant name holding `|` or a line break kept to one
table cell and one line, and a full disk named with the file it could not write."""
import os

import pytest

import analysis_logs as logs_for_tests
from analysis_logs import run_cli
from conftest import full_tmpfs


@pytest.fixture
def study(tmp_path):
    return logs_for_tests.write_study(tmp_path / "runs" / "s", {"baseline": [{}, {}], "other": [{}, {}]})


def test_report_refuses_arms_without_logs(capsys, study):
    status, out, err = run_cli(capsys, "report", study, "--target", "2.92", "--arms", "baseline,nosuch")
    assert status == 2 and err.splitlines() == [
        f"error: --arms: no run logs of nosuch in {study} (arms with logs: baseline, other)"], err
    assert not (study / "report.md").exists()


def test_a_folder_or_fifo_named_like_a_log_is_named_and_a_variant_name_stays_one_cell(capsys, study):
    (study / "other" / "seed7.txt").mkdir()
    os.mkfifo(study / "other" / "seed8.txt")
    odd = "a|b\n# injected"
    logs_for_tests.write(study / "odd" / "seed0.txt", logs_for_tests.our_log_text(variant=odd, seed=0))
    status, out, err = run_cli(capsys, "summarize", study)
    assert status == 0, err
    assert "a|b\\n# injected" in out and "\n# injected" not in out
    unreadable = {entry["path"]: entry["problem"] for entry in _summary_json(capsys, study)["unreadable"]}
    assert unreadable[str(study / "other" / "seed7.txt")] == "a folder, not a log file"
    assert unreadable[str(study / "other" / "seed8.txt")] == "a FIFO, not a log file"


def _summary_json(capsys, study):
    import json

    status, out, err = run_cli(capsys, "summarize", study, "--json")
    assert status == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_report_keeps_a_variant_name_to_one_line_and_one_cell(capsys, study):
    """The Markdown report (plots: slow): a `|` escaped in its table, a line break never starts a heading."""
    logs_for_tests.write(study / "odd" / "seed0.txt", logs_for_tests.our_log_text(variant="a|b\n# injected", seed=0))
    status, _, err = run_cli(capsys, "report", study, "--target", "2.92")
    assert status == 0, err
    report = (study / "report.md").read_text()
    assert "\n# injected" not in report and [line for line in report.splitlines() if line.startswith("# ")] == [
        "# Study report: s"]
    assert "| a\\|b\\n# injected | 1 |" in report


@pytest.fixture
def full_mount(tmp_path):
    yield from full_tmpfs(tmp_path / "full")


@pytest.mark.slow
def test_a_full_disk_during_a_report_names_the_file(capsys, study, full_mount):
    """Mounts a full tmpfs (the `mount` command): no faster way to get ENOSPC from a write."""
    status, _, err = run_cli(capsys, "report", study, "--target", "2.92", "--out", full_mount / "report.md")
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {full_mount}/report") and err.rstrip().endswith(": No space left on device")
    assert sorted(path.name for path in full_mount.iterdir()) == ["filler"]  # no temporary file left
