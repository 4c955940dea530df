"""Reading every log format of the upstream records (issue 14, classes 1-4): which runs are finished, which formats
are read or named as unsupported, how runs without config line are grouped, and what a diverged run or a log
without its final validation does to the statistics and the record check."""
import json
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

import analysis_logs as logs_for_tests
from analysis_logs import run_cli
from analysis.logs import code_section, load_runs, parse_log
from analysis.record import split_sources


def write_upstream(folder, count=3, finals=(3.2771, 3.2779, 3.2768, 3.2775, 3.2781), **options):
    for index in range(count):
        final = finals[index % len(finals)]
        text = logs_for_tests.upstream_log_text(
            losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final), **options)
        logs_for_tests.write(Path(folder) / f"run{index}.txt", text)
    return Path(folder)


# ----------------------------------------------------------------------------------------------- class 1 and 2

@pytest.mark.parametrize("era", logs_for_tests.ERAS)
def test_a_finished_log_of_every_upstream_era_is_complete_with_its_loss_and_time(tmp_path, era):
    path = logs_for_tests.write(tmp_path / "rec" / "a.txt", logs_for_tests.upstream_log_text(era=era, step_ms=150.0))
    run = parse_log(path)
    assert run.complete and run.problem is None and run.upstream
    decimals = 4 if era.startswith("2024") else (5 if era == "seconds" else 6)
    assert run.final_val_loss == round(3.279, decimals) and run.final_step == run.total_steps == 100
    assert run.train_time_s == pytest.approx(15.0)  # 100 steps of 150 ms, whether written in ms or in seconds
    assert run.val_steps == [0, 25, 50, 75, 100] and run.val_times_ms[1] == pytest.approx(25 * 150.0)


def test_2024_logs_without_peak_memory_line_enter_summarize_and_record_check(capsys, tmp_path):
    folder = write_upstream(tmp_path / "track_1_short" / "2024-11-10_UNetDoubleLr", count=5, era="2024-early")
    status, out, _ = run_cli(capsys, "summarize", folder, "--json")  # target 3.28 from the track_1_short folder
    result = json.loads(out)
    assert status == 0 and result["target"] == 3.28
    assert all(run["complete"] for run in result["runs"]) and result["groups"][0]["n"] == 5
    losses = [3.2771, 3.2779, 3.2768, 3.2775, 3.2781]
    assert result["groups"][0]["p_value"] == pytest.approx(
        scipy_stats.ttest_1samp(losses, 3.28, alternative="less").pvalue)
    status, out, _ = run_cli(capsys, "record-check", folder, "--resamples", "200")
    assert "runs: 5" in out and "no complete runs" not in out and status in (0, 1)


def test_this_projects_log_still_needs_its_peak_memory_line(tmp_path):
    path = logs_for_tests.write(tmp_path / "a" / "seed0.txt", logs_for_tests.our_log_text(complete=False))
    run = parse_log(path)
    assert not run.complete and run.final_step == run.total_steps and run.val_steps[-1] == 100
    assert "no peak-memory line" in run.problem


@pytest.mark.parametrize("writer", [
    lambda: logs_for_tests.our_log_text(final_validation=False),  # peak line present, last validation missing
    lambda: logs_for_tests.upstream_log_text(era="2025", final_validation=False, complete=False),
    lambda: logs_for_tests.upstream_log_text(era="2024-early", final_validation=False),
])
def test_a_log_without_its_final_validation_is_flagged_not_summarised(capsys, tmp_path, writer):
    path = logs_for_tests.write(tmp_path / "arm" / "seed0.txt", writer())
    run = parse_log(path)
    assert not run.complete and run.final_step == 100 and run.val_steps[-1] == 75
    assert run.problem == "no final validation: the log stops after its last training step"
    status, out, _ = run_cli(capsys, "summarize", tmp_path, "--target", "3.28")
    assert status == 0 and "UNFINISHED" in out and "no final validation" in out


def test_a_log_stopped_mid_training_says_where(tmp_path):
    path = logs_for_tests.write(tmp_path / "a.txt", logs_for_tests.upstream_log_text(stop_at=60, complete=False))
    assert parse_log(path).problem == "stopped at step 60/100"


def test_llmc_main_log_is_named_unsupported_never_skipped(capsys, tmp_path):
    record = tmp_path / "2024-10-13_llmc"
    logs_for_tests.write(record / "main.log", logs_for_tests.llmc_log_text())
    status, _, err = run_cli(capsys, "summarize", record, "--target", "3.28")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "main.log: unsupported format: llm.c log" in err and "no *.txt" not in err
    write_upstream(tmp_path / "2024-11-10_UNetDoubleLr", era="2024-early")
    status, out, _ = run_cli(capsys, "summarize", tmp_path, "--target", "3.28")
    assert status == 0 and "unreadable:" in out and "main.log: unsupported format: llm.c log" in out


def test_step_lines_of_an_unknown_shape_are_an_unsupported_format(tmp_path):
    text = logs_for_tests.upstream_log_text().replace("train_time:", "elapsed:")
    runs, unreadable = load_runs([logs_for_tests.write(tmp_path / "a.txt", text)])
    assert runs == [] and unreadable[0].problem.startswith("unsupported format: its `step:` lines")


def test_a_text_file_that_is_no_log_is_named_unsupported(tmp_path):
    (tmp_path / "notes.txt").write_text("original timing: 1380 s\n")
    _, unreadable = load_runs([tmp_path])
    assert unreadable[0].problem.startswith("unsupported format: no line of 100 '='")


# ----------------------------------------------------------------------------------------------- embedded sources

def test_embedded_module_sources_with_log_like_lines_are_skipped(tmp_path):
    modules = {"speedrun/model.py": logs_for_tests.TRICKY_MODULE, "speedrun/data.py": "import numpy\n"}
    text = logs_for_tests.our_log_text(variant="backout", seed=3, track="small", modules=modules)
    run = parse_log(logs_for_tests.write(tmp_path / "arm" / "seed3.txt", text))
    assert run.complete and run.variant == "backout" and run.seed == 3 and run.config["track"] == "small"
    assert run.final_step == 100 and run.val_steps == [0, 25, 50, 75, 100]  # none of the module's step:50/50
    script, sources = split_sources(code_section(text.encode()))
    assert script.rstrip("\n") == logs_for_tests.TRICKY_CODE.rstrip("\n")
    assert list(sources) == list(modules) and sources["speedrun/model.py"] == logs_for_tests.TRICKY_MODULE


def test_record_packages_the_script_and_its_embedded_modules(capsys, tmp_path):
    modules = {"speedrun/model.py": logs_for_tests.TRICKY_MODULE}
    for seed in range(2):
        logs_for_tests.write(tmp_path / "runs" / "a" / f"seed{seed}.txt",
                             logs_for_tests.our_log_text(variant="a", seed=seed, modules=modules))
    status, out, _ = run_cli(capsys, "record", tmp_path / "runs", "--track", "medium", "--name", "X",
                             "--date", "2026-11-23", "--records-root", tmp_path / "records")
    folder = Path(out.strip())
    assert status == 0 and (folder / "speedrun" / "model.py").read_text() == logs_for_tests.TRICKY_MODULE
    assert "==> speedrun" not in (folder / "train_gpt_medium.py").read_text()


# ----------------------------------------------------------------------------------------------- class 3

def test_same_named_folders_of_different_records_never_pool(capsys, tmp_path):
    root = tmp_path / "track_1_short"
    write_upstream(root / "2026-02-16_FlattenForward" / "baseline", count=2, era="2025")
    write_upstream(root / "2026-03-22_VarlenMaxDocs" / "baseline", count=3, era="2025")
    write_upstream(root / "2024-12-04_ValueEmbed", count=2, era="2024-early")
    status, out, _ = run_cli(capsys, "summarize", root, "--json")
    groups = {g["variant"]: g["n"] for g in json.loads(out)["groups"]}
    assert status == 0 and groups == {"2024-12-04_ValueEmbed": 2, "2026-02-16_FlattenForward/baseline": 2,
                                      "2026-03-22_VarlenMaxDocs/baseline": 3}
    # Given as two PATHs, both folders are named `baseline` relative to themselves: keyed by their paths instead.
    first, second = root / "2026-02-16_FlattenForward" / "baseline", root / "2026-03-22_VarlenMaxDocs" / "baseline"
    runs, _ = load_runs([first, second])
    assert {run.variant for run in runs} == {first.as_posix(), second.as_posix()}
    # A record folder given on its own is its own arm.
    runs, _ = load_runs([root / "2024-12-04_ValueEmbed"])
    assert {run.variant for run in runs} == {"2024-12-04_ValueEmbed"}


def test_runs_that_planned_different_step_counts_are_warned_about(capsys, tmp_path):
    arm = tmp_path / "track_1_short" / "rec"
    write_upstream(arm, count=3)
    logs_for_tests.write(arm / "longer.txt", logs_for_tests.upstream_log_text(total_steps=120))
    status, out, _ = run_cli(capsys, "summarize", arm, "--json")
    warnings = json.loads(out)["warnings"]
    assert status == 0 and len(warnings) == 1 and "3 of 4 planned 100" in warnings[0] and "longer.txt" in warnings[0]
    write_upstream(tmp_path / "track_1_short" / "other", count=2)
    status, out, _ = run_cli(capsys, "compare", tmp_path / "track_1_short", "--baseline", "other")
    assert status == 0 and "WARNING: arm 'rec' pools runs that planned different step counts" in out
    status, out, _ = run_cli(capsys, "summarize", tmp_path / "track_1_short" / "other")
    assert status == 0 and "warning:" not in out


# ----------------------------------------------------------------------------------------------- class 4

def write_with_divergence(folder, finals, track="medium"):
    for seed, final in enumerate(finals):
        losses = (lambda step, final=final: logs_for_tests.default_curve(step, 100, final)) if final == final \
            else (lambda step: float("nan") if step == 100 else 4.0)
        logs_for_tests.write(Path(folder) / "claim" / f"seed{seed}.txt",
                             logs_for_tests.our_log_text(variant="claim", seed=seed, losses=losses, track=track))


def test_a_diverged_run_counts_is_shown_and_fails_the_record_check(capsys, tmp_path):
    good = [2.9181, 2.9185, 2.9179, 2.9183, 2.9180]
    write_with_divergence(tmp_path, good + [float("nan")])
    status, out, _ = run_cli(capsys, "summarize", tmp_path, "--json")
    result = json.loads(out)
    group = result["groups"][0]
    assert group["n"] == 6 and group["n_diverged"] == 1 and group["p_value"] is None
    assert group["mean_val_loss"] == pytest.approx(sum(good) / 5)
    assert sum(run["diverged"] for run in result["runs"]) == 1
    status, out, _ = run_cli(capsys, "summarize", tmp_path)
    assert "DIVERGED" in out and "6 (1 diverged)" in out
    status, out, _ = run_cli(capsys, "record-check", tmp_path, "--against", "2", "--resamples", "200")
    assert status == 1 and "runs: 6 (1 diverged" in out and "verdict: FAIL" in out
    assert "1 of 6 runs diverged" in out
    # The same five runs without the diverged one pass.
    (tmp_path / "claim" / "seed5.txt").unlink()
    status, out, _ = run_cli(capsys, "record-check", tmp_path, "--against", "2", "--resamples", "200")
    assert status == 0 and "runs: 5  " in out and "verdict: PASS" in out


@pytest.mark.parametrize("argv", [["record-check", "{dir}", "--target", "2.92"], ["compare", "{dir}"],
                                  ["plot", "resource-table", "{dir}"]])
def test_with_no_finished_run_the_error_says_why(capsys, tmp_path, argv):
    logs_for_tests.write(tmp_path / "arm" / "seed0.txt", logs_for_tests.our_log_text(final_validation=False))
    status, _, err = run_cli(capsys, *[arg.format(dir=tmp_path) for arg in argv])
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "no complete runs among 1 run log(s)" in err and "seed0.txt: no final validation" in err


def test_a_run_told_to_stop_early_is_finished_at_its_stop_step(tmp_path):
    """`--stop-after S` (the GPU smoke runs, the benchmark) validates at S and closes the log there."""
    text = logs_for_tests.our_log_text(config={"stop_after": 30}, stop_at=30, val_every=10)
    run = parse_log(logs_for_tests.write(tmp_path / "a.txt", text))
    assert run.complete and run.total_steps == 100 and run.final_step == 30 and run.val_steps[-1] == 30
    text = logs_for_tests.our_log_text(config={"stop_after": 30}, stop_at=30, val_every=25)
    run = parse_log(logs_for_tests.write(tmp_path / "b.txt", text))
    assert not run.complete and run.problem == "no final validation: the log stops after its last training step"
    text = logs_for_tests.our_log_text(config={"stop_after": 60}, stop_at=30, val_every=10, complete=False)
    assert parse_log(logs_for_tests.write(tmp_path / "c.txt", text)).problem == "stopped at step 30/60"
