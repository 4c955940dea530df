"""records/upstream_records.csv and what reads it (issue 14, class 6): the table's facts, record-check against the
current record of the log's track or record N, and every target taken from the track when --target is not given."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest

import analysis_logs as logs_for_tests
from analysis_logs import run_cli
from analysis.upstream_records import RECORDS_TABLE, RecordsTableError, find_record, load_records


def write_claim(root, track, finals, times_s, variant="claim"):
    for seed, (final, time_s) in enumerate(zip(finals, times_s)):
        text = logs_for_tests.our_log_text(
            variant=variant, seed=seed, track=track, step_ms=time_s * 10,
            losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final))
        logs_for_tests.write(Path(root) / variant / f"seed{seed}.txt", text)
    return Path(root)


SMALL_FINALS = [3.2771, 3.2779, 3.2768, 3.2775, 3.2781, 3.2770]
MEDIUM_FINALS = [2.9171, 2.9179, 2.9168, 2.9175, 2.9181, 2.9170]


def test_the_table_is_plain_csv_with_both_tracks_in_readme_order():
    with RECORDS_TABLE.open(newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    for track in ("small", "medium"):
        numbers = [int(r["number"]) for r in rows if r["track"] == track]
        assert numbers[0] == 1 and numbers == sorted(numbers)  # re-timings repeat a number, never go back
    assert {r["track"] for r in rows} == {"small", "medium"}
    records = load_records()
    assert all(r.record_time_s > 0 and r.record_time for r in records)
    # record_time_s follows from the README's text: "N minutes" or "N hours"
    for record in records:
        value, unit = record.record_time.rstrip("*").split()
        assert record.record_time_s == pytest.approx(float(value) * (3600 if unit == "hours" else 60), abs=0.05)
    # Every stated p-value names the record page it was read from, inside that record's folder.
    for record in records:
        if record.p_value is not None or record.mean_val_loss is not None:
            folder = "track_1_short" if record.track == "small" else "track_2_medium"
            assert record.stats_source.startswith(f"records/{folder}/")
            assert record.stats_source.lower().endswith("readme.md")


def test_find_record_current_numbered_and_retimed():
    records = load_records()
    current = find_record(records, "small")
    assert current.number == max(r.number for r in records if r.track == "small")
    assert find_record(records, "medium").number == max(r.number for r in records if r.track == "medium")
    retimings = [r for r in records if r.track == "small" and r.number == 21]
    assert len(retimings) > 1 and find_record(records, "small", 21) == retimings[-1]
    with pytest.raises(RecordsTableError, match="no record #999"):
        find_record(records, "small", 999)


@pytest.mark.parametrize("track,finals,target", [("small", SMALL_FINALS, 3.28), ("medium", MEDIUM_FINALS, 2.92)])
def test_record_check_against_the_current_record_of_the_logs_track(capsys, tmp_path, track, finals, target):
    current = find_record(load_records(), track)
    fast = [current.record_time_s - 3.0 + 0.1 * i for i in range(len(finals))]
    root = write_claim(tmp_path / "fast", track, finals, fast)
    status, out, _ = run_cli(capsys, "record-check", root, "--resamples", "200", "--json")
    result = json.loads(out)
    assert status == 0 and result["target"] == target and result["record"]["number"] == current.number
    assert result["record_diff_s"] == pytest.approx(np.mean(fast) - current.record_time_s, abs=1e-6)
    status, out, _ = run_cli(capsys, "record-check", root, "--resamples", "200")
    assert f"record #{current.number} of the {track} track" in out and "beats it by 2.75 s" in out
    slow = write_claim(tmp_path / "slow", track, finals, [current.record_time_s + 5.0] * len(finals))
    status, out, _ = run_cli(capsys, "record-check", slow, "--resamples", "200")
    assert status == 1 and "misses it by 5.00 s" in out and "verdict: FAIL" in out


def test_against_picks_another_record_and_bad_numbers_or_tables_are_one_line_errors(capsys, tmp_path):
    root = write_claim(tmp_path, "medium", MEDIUM_FINALS, [1390.0] * 6)
    status, out, _ = run_cli(capsys, "record-check", root, "--against", "12", "--resamples", "200", "--json")
    assert status == 0 and json.loads(out)["record"]["record_time"] == "23.28 minutes"
    status, _, err = run_cli(capsys, "record-check", root, "--against", "999")
    assert status == 2 and len(err.strip().splitlines()) == 1 and "no record #999 in the medium track" in err
    broken = tmp_path / "broken.csv"
    broken.write_text("track,number\nmedium,1\n")
    status, _, err = run_cli(capsys, "record-check", root, "--records", broken)
    assert status == 2 and "missing column(s)" in err and "Traceback" not in err
    bad_row = tmp_path / "bad_row.csv"
    lines = RECORDS_TABLE.read_text().splitlines()
    bad_row.write_text("\n".join([lines[0], lines[1].replace("2700.0", "forty")]) + "\n")
    status, _, err = run_cli(capsys, "record-check", root, "--records", bad_row, "--track", "small")
    assert status == 2 and "line 2" in err


def test_logs_without_a_track_are_checked_without_a_record_unless_given_one(capsys, tmp_path):
    folder = tmp_path / "somewhere"
    for index, final in enumerate(SMALL_FINALS):
        logs_for_tests.write(folder / f"r{index}.txt", logs_for_tests.upstream_log_text(
            losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final)))
    status, _, err = run_cli(capsys, "record-check", folder)
    assert status == 2 and "--target is needed" in err
    status, out, _ = run_cli(capsys, "record-check", folder, "--target", "3.28", "--resamples", "200")
    assert "current record: not checked (the logs name no track: give --track)" in out
    status, out, _ = run_cli(capsys, "record-check", folder, "--track", "small", "--resamples", "200", "--json")
    assert json.loads(out)["target"] == 3.28 and json.loads(out)["record"]["track"] == "small"


@pytest.mark.slow
def test_every_command_needing_a_target_takes_the_small_tracks_3_28(capsys, tmp_path):
    """Guards: summarize, record-check, report, plot and record all take 3.28 as the small track's target."""
    root = write_claim(tmp_path / "study", "small", SMALL_FINALS, [80.0] * 6)
    write_claim(root, "small", SMALL_FINALS, [81.0] * 6, variant="baseline")
    status, out, _ = run_cli(capsys, "summarize", root, "--json")
    assert status == 0 and json.loads(out)["target"] == 3.28
    status, out, _ = run_cli(capsys, "record-check", root / "claim", "--resamples", "200", "--json")
    assert json.loads(out)["target"] == 3.28
    status, out, _ = run_cli(capsys, "report", root)
    assert status == 0 and "target validation loss 3.28" in (root / "report.md").read_text()
    figure_out = tmp_path / "curve.png"
    status, _, _ = run_cli(capsys, "plot", "val-loss-step", root, "--out", figure_out)
    assert status == 0 and figure_out.read_bytes().startswith(b"\x89PNG")
    status, out, _ = run_cli(capsys, "record", root, "--variant", "claim", "--track", "small", "--name", "S",
                             "--date", "2026-11-23", "--records-root", tmp_path / "records")
    assert status == 0 and "target validation loss 3.28" in (Path(out.strip()) / "README.md").read_text()


def test_upstream_records_folders_name_their_track(capsys, tmp_path):
    for track_folder, final in (("track_1_short", 3.2775), ("track_2_medium", 2.9175)):
        for seed in range(3):
            logs_for_tests.write(tmp_path / "records" / track_folder / "rec" / f"{seed}.txt",
                                 logs_for_tests.upstream_log_text(
                                     losses=lambda step: logs_for_tests.default_curve(step, 100, final + seed / 1e4)))
    for track_folder, target in (("track_1_short", 3.28), ("track_2_medium", 2.92)):
        status, out, _ = run_cli(capsys, "summarize", tmp_path / "records" / track_folder, "--json")
        assert status == 0 and json.loads(out)["target"] == target
    status, _, err = run_cli(capsys, "summarize", tmp_path / "records")  # two tracks: no single target
    assert status == 2 and "--target is needed" in err
