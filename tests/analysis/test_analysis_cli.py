"""The command line: summarize/compare/record-check values against independent computations, report and record
layouts, and bad input (one line, exit status 2)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

import analysis_logs as logs_for_tests
from analysis_logs import run_cli
from analysis.textfmt import pval
from analysis.upstream_records import RECORDS_TABLE
from test_analysis_stats import ARTICLE_LOSSES, ARTICLE_TIMES

REPO = Path(__file__).resolve().parents[2]


def final_curve(final, total=100):
    return lambda step: logs_for_tests.default_curve(step, total, final)


def write_arm(root, arm, finals, times_s, total=100, **options):
    for seed, (final, time_s) in enumerate(zip(finals, times_s)):
        text = logs_for_tests.our_log_text(variant=arm, seed=seed, total_steps=total, losses=final_curve(final, total),
                                           step_ms=time_s * 1000 / total, **options)
        logs_for_tests.write(Path(root) / arm / f"seed{seed}.txt", text)


@pytest.fixture
def article_runs(tmp_path):
    """The article's 22 record runs as logs, plus one unfinished run and one garbage file."""
    root = tmp_path / "record_study"
    write_arm(root, "record", ARTICLE_LOSSES, ARTICLE_TIMES)
    logs_for_tests.write(root / "record" / "seed99.txt",
                         logs_for_tests.our_log_text(variant="record", seed=99, complete=False, stop_at=40))
    (root / "record" / "garbage.txt").write_bytes(b"\x00\xff" * 50)
    return root


def test_summarize_json_matches_the_article_and_independent_computation(capsys, article_runs):
    status, out, _ = run_cli(capsys, "summarize", article_runs, "--target", "2.92", "--json")
    assert status == 0
    result = json.loads(out)
    complete = [r for r in result["runs"] if r["complete"]]
    assert len(result["runs"]) == 23 and len(complete) == 22
    unfinished = [r for r in result["runs"] if not r["complete"]]
    assert unfinished[0]["seed"] == 99 and unfinished[0]["final_step"] == 40 and unfinished[0]["steps"] == 100
    assert set(result["runs"][0]) >= {"path", "variant", "seed", "complete", "steps", "final_step",
                                      "final_val_loss", "train_time_s", "time_to_target_s", "step_to_target"}
    by_seed = {r["seed"]: r for r in complete}
    assert [by_seed[i]["final_val_loss"] for i in range(22)] == ARTICLE_LOSSES
    assert [by_seed[i]["train_time_s"] for i in range(22)] == pytest.approx(ARTICLE_TIMES, abs=1e-9)
    (group,) = result["groups"]
    assert group["variant"] == "record" and group["n"] == 22
    assert group["mean_val_loss"] == pytest.approx(np.mean(ARTICLE_LOSSES), abs=1e-12)
    assert group["std_val_loss"] == pytest.approx(np.std(ARTICLE_LOSSES, ddof=1), rel=1e-9)
    assert group["p_value"] == pytest.approx(
        scipy_stats.ttest_1samp(ARTICLE_LOSSES, 2.92, alternative="less").pvalue, rel=1e-9)
    assert group["p_value"] == pytest.approx(0.0001256, rel=1e-3)
    assert group["mean_time_s"] == pytest.approx(1384.6224, abs=1e-4)
    assert group["std_time_s"] == pytest.approx(2.5382, abs=1e-4)
    assert result["unreadable"][0]["path"].endswith("garbage.txt")


def test_summarize_time_to_target_and_group_statistics_of_reaching_runs(capsys, tmp_path):
    # Validations every 25 of 100 steps, 0.1 s per step; hand-made curves around 2.92.
    curves = {0: {0: 9.0, 25: 3.5, 50: 3.0, 75: 2.90, 100: 2.85},   # crosses between 50 and 75: 4/5 of the way
              1: {0: 9.0, 25: 3.5, 50: 2.95, 75: 2.93, 100: 2.92},  # reaches it exactly at the last validation
              2: {0: 9.0, 25: 3.5, 50: 3.0, 75: 2.95, 100: 2.93}}   # never reaches it
    for seed, losses in curves.items():
        logs_for_tests.write(tmp_path / "arm" / f"seed{seed}.txt",
                             logs_for_tests.our_log_text(variant="arm", seed=seed, losses=losses, step_ms=100.0))
    status, out, _ = run_cli(capsys, "summarize", tmp_path, "--target", "2.92", "--json")
    result = json.loads(out)
    runs = {r["seed"]: r for r in result["runs"]}
    assert runs[0]["step_to_target"] == pytest.approx(70.0) and runs[0]["time_to_target_s"] == pytest.approx(7.0)
    assert runs[1]["step_to_target"] == pytest.approx(100.0) and runs[1]["time_to_target_s"] == pytest.approx(10.0)
    assert runs[2]["step_to_target"] is None and runs[2]["time_to_target_s"] is None
    (group,) = result["groups"]
    assert group["n"] == 3 and group["n_reached_target"] == 2
    assert group["mean_time_to_target_s"] == pytest.approx(8.5)
    assert group["std_time_to_target_s"] == pytest.approx(np.std([7.0, 10.0], ddof=1))
    assert group["mean_val_loss"] == pytest.approx(np.mean([2.85, 2.92, 2.93]))


def test_summarize_table_lists_unfinished_and_unreadable(capsys, article_runs):
    status, out, _ = run_cli(capsys, "summarize", article_runs, "--target", "2.92")
    assert status == 0
    assert "UNFINISHED" in out and "unreadable:" in out and "garbage.txt" in out
    assert "2.9194" in out and "0.00069" in out and "0.0001256" in out


def test_summarize_reads_upstream_and_our_logs_together(capsys, tmp_path):
    logs_for_tests.write(tmp_path / "2024_Old" / "a.txt", logs_for_tests.upstream_log_text(era="2024"))
    logs_for_tests.write(tmp_path / "2025_New" / "b.txt", logs_for_tests.upstream_log_text(era="2025"))
    write_arm(tmp_path / "ours", "baseline", [2.919, 2.921], [1390.0, 1392.0])
    status, out, _ = run_cli(capsys, "summarize", tmp_path / "2024_Old", tmp_path / "2025_New", tmp_path / "ours",
                             "--target", "3.28", "--json")
    groups = {g["variant"]: g for g in json.loads(out)["groups"]}
    assert set(groups) == {"2024_Old", "2025_New", "baseline"}
    assert groups["2024_Old"]["mean_val_loss"] == pytest.approx(3.279) and groups["2024_Old"]["std_val_loss"] is None


def study(tmp_path):
    root = tmp_path / "sweep"
    rng = np.random.default_rng(5)
    finals = {"baseline": 2.9200, "L3": 2.9199, "L11": 2.9185, "L14": 2.9210}
    for arm, center in finals.items():
        losses = list(np.round(center + rng.normal(0, 0.0006, 4), 6))
        times = list(np.round(1390 + rng.normal(0, 2, 4), 3))
        write_arm(root, arm, losses, times, config={"backout_layers": [] if arm == "baseline" else [int(arm[1:])]},
                  scalars=lambda step, arm=arm: {"backout.x": 1 - step / 500} |
                  ({} if arm == "baseline" else {f"backout.{arm}": -step / 300}))
    return root


def test_compare_welch_with_holm_and_bh_and_the_selection_warning(capsys, tmp_path):
    root = study(tmp_path)
    status, out, _ = run_cli(capsys, "compare", root, "--json")
    assert status == 0
    result = json.loads(out)
    assert result["baseline"] == "baseline"
    assert [c["variant"] for c in result["comparisons"]] == ["L3", "L11", "L14"]  # natural order
    from analysis.logs import load_runs
    runs, _ = load_runs([root])
    loss = {arm: [r.final_val_loss for r in runs if r.variant == arm] for arm in ("baseline", "L3", "L11", "L14")}
    raw = []
    for comparison in result["comparisons"]:
        test = scipy_stats.ttest_ind(loss[comparison["variant"]], loss["baseline"], equal_var=False)
        interval = test.confidence_interval(0.99)
        assert comparison["loss_p"] == pytest.approx(test.pvalue)
        assert comparison["loss_ci"] == pytest.approx([interval.low, interval.high])
        arm_mean = np.mean(loss[comparison["variant"]])
        assert comparison["loss_diff"] == pytest.approx(arm_mean - np.mean(loss["baseline"]))
        raw.append(test.pvalue)
    m = len(raw)
    order = np.argsort(raw)
    holm_by_hand = np.maximum.accumulate([min(1, (m - k) * raw[i]) for k, i in enumerate(order)])
    assert [result["comparisons"][i]["loss_p_holm"] for i in order] == pytest.approx(list(holm_by_hand))
    assert [c["loss_p_bh"] for c in result["comparisons"]] == pytest.approx(
        list(scipy_stats.false_discovery_control(raw)))
    assert any("L11" in w and "picked after seeing the results" in w for w in result["warnings"])
    # naming one arm after the fact keeps the family and the warning (issue 40, case 6)
    status, out, _ = run_cli(capsys, "compare", root, "--arms", "baseline,L11")
    assert status == 0 and "picked after seeing the results" in out and "L11" in out and "99% CI" in out
    assert "family of 3 arms against baseline (1 shown)" in out and "L3" not in out


def test_compare_by_folder_of_the_same_variant(capsys, tmp_path):
    for folder, times in (("h100", [1390.0, 1391.0, 1392.0]), ("h200", [1380.0, 1381.0, 1382.5])):
        for seed, (final, time_s) in enumerate(zip([2.919, 2.920, 2.921], times)):
            logs_for_tests.write(tmp_path / folder / f"seed{seed}.txt", logs_for_tests.our_log_text(
                variant="same", seed=seed, losses=final_curve(final), step_ms=time_s * 10))
    status, out, _ = run_cli(capsys, "compare", tmp_path / "h100", tmp_path / "h200", "--by", "folder", "--json")
    assert status == 0
    (comparison,) = json.loads(out)["comparisons"]
    assert (comparison["baseline"], comparison["variant"]) == ("h100", "h200")  # the first PATH's arm is the baseline
    assert comparison["time_diff"] == pytest.approx(np.mean([1380.0, 1381.0, 1382.5]) - 1391.0)
    assert comparison["loss_diff"] == pytest.approx(0.0, abs=1e-12)
    status, _, err = run_cli(capsys, "compare", tmp_path)  # by variant there is one arm only
    assert "only one arm" in one_line_error(status, err)


def test_record_check_pass_fail_bootstrap_and_runs_needed(capsys, tmp_path):
    write_arm(tmp_path / "cand", "record", ARTICLE_LOSSES, ARTICLE_TIMES)
    write_arm(tmp_path / "base", "baseline", [2.9191, 2.9185, 2.9195, 2.9188, 2.9196],
              [1393.1, 1393.5, 1392.8, 1393.3, 1393.1])
    # The article's runs (mean 1384.7 s) against medium record #12 (23.28 minutes = 1396.8 s), the record of its day.
    argv = ["record-check", tmp_path / "cand", "--baseline", tmp_path / "base", "--resamples", "500", "--json",
            "--against", "12"]
    status, out, _ = run_cli(capsys, *argv)
    result = json.loads(out)
    assert status == 0 and result["verdict"] == "pass" and result["target"] == 2.92  # from the config's track
    assert result["record"]["number"] == 12 and result["record_ok"] is True
    assert result["record_diff_s"] == pytest.approx(np.mean(ARTICLE_TIMES) - 23.28 * 60)
    assert result["p_value"] == pytest.approx(scipy_stats.ttest_1samp(ARTICLE_LOSSES, 2.92, alternative="less").pvalue)
    base_times = [1393.1, 1393.5, 1392.8, 1393.3, 1393.1]
    assert result["time_p"] == pytest.approx(
        scipy_stats.ttest_ind(ARTICLE_TIMES, base_times, equal_var=False, alternative="less").pvalue, rel=1e-6)
    assert result["bootstrap"]["runs"] == 22 and 0.8 < result["bootstrap"]["pass_chance"] <= 1
    assert 2 <= result["runs_needed"] <= 22
    # Same candidate against a faster baseline: the time rule fails, exit status 1.
    write_arm(tmp_path / "fast", "fast", [2.919] * 3, [1370.0, 1371.0, 1372.0])
    status, out, _ = run_cli(capsys, "record-check", tmp_path / "cand", "--baseline", tmp_path / "fast",
                             "--resamples", "200", "--max-runs", "5", "--against", "12")
    assert status == 1 and "FAIL" in out and "verdict: FAIL" in out
    base_losses = [2.9191, 2.9185, 2.9195, 2.9188, 2.9196]
    passes = scipy_stats.ttest_1samp(base_losses, 2.92, alternative="less").pvalue < 0.01
    status, out, _ = run_cli(capsys, "record-check", tmp_path / "base", "--resamples", "200", "--runs", "40",
                             "--against", "12")
    assert status == (0 if passes else 1) and "fresh batch of 40 runs" in out and "not checked" in out


def one_line_error(status, err):
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: "), err  # the project's one form for bad input, argparse's errors included
    return err


ROOT = ["--records-root", "{tmp}/records"]


@pytest.mark.parametrize("argv,needle", [
    (["summarize", "{tmp}/missing", "--target", "2.92"], "not found"),
    (["summarize", "{tmp}", "--target", "-1"], "--target"),
    (["summarize", "{tmp}", "--target", "abc"], "--target"),
    (["summarize", "{tmp}/empty_dir", "--target", "2.92"], "no *.txt"),
    (["summarize", "{tmp}/junk", "--target", "2.92"], "no run logs"),
    (["summarize", "{tmp}/upstream"], "--target"),
    (["compare", "{tmp}/study/baseline"], "only one arm"),
    (["compare", "{tmp}/study", "--baseline", "nope"], "--baseline"),
    (["compare", "{tmp}/study", "--arms", "baseline,zzz"], "--arms"),
    (["compare", "{tmp}/study", "--confidence", "1.5"], "--confidence"),
    (["record-check", "{tmp}/study"], "several variants"),
    (["record-check", "{tmp}/study/other", "--baseline", "{tmp}/nothing"], "--baseline path not found"),
    (["record-check", "{tmp}/study/other", "--runs", "1"], "--runs"),
    (["plot", "val-loss-step", "{tmp}/study"], "--out"),
    (["plot", "lambda-by-layer", "{tmp}/study", "--out", "{tmp}/x.png"], "lambda-by-layer"),
    (["plot", "bogus", "{tmp}/study", "--out", "{tmp}/x.png"], "KIND"),
    (["report", "{tmp}/study/baseline/seed0.txt"], "not a folder"),
    (["report", "{tmp}/upstream"], "--target"),
    (["record", "{tmp}/study", "--track", "medium", "--name", "X", "--date", "2025-13-01", *ROOT], "--date"),
    (["record", "{tmp}/study", "--track", "medium", "--name", "a b", *ROOT], "--name"),
    (["record", "{tmp}/study", "--track", "large", "--name", "X", *ROOT], "--track"),
    (["record", "{tmp}/study", "--track", "medium", "--name", "X", *ROOT], "several variants"),
    (["record", "{tmp}/unfinished", "--track", "medium", "--name", "X", *ROOT], "no complete runs"),
    ([], "COMMAND"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, needle):
    write_arm(tmp_path / "study", "baseline", [2.92, 2.921], [10.0, 11.0])
    write_arm(tmp_path / "study", "other", [2.91, 2.912], [10.0, 11.0])
    logs_for_tests.write(tmp_path / "unfinished" / "a" / "seed0.txt",
                         logs_for_tests.our_log_text(complete=False, stop_at=10))
    logs_for_tests.write(tmp_path / "upstream" / "rec" / "a.txt", logs_for_tests.upstream_log_text())
    (tmp_path / "empty_dir").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_bytes(b"\x00")
    status, _, err = run_cli(capsys, *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert needle in one_line_error(status, err)
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "records").exists()


@pytest.mark.slow
def test_unwritable_output_is_one_line(capsys, tmp_path):
    """Guards: `plot --out` onto a path that is a folder fails in one line naming that path."""
    write_arm(tmp_path / "s", "baseline", [2.92, 2.921], [10.0, 11.0])
    (tmp_path / "taken.png").mkdir()  # a folder where the PNG should go
    status, _, err = run_cli(capsys, "plot", "val-loss-step", tmp_path / "s", "--out", tmp_path / "taken.png")
    assert "taken.png" in one_line_error(status, err)


def test_compare_warns_about_single_run_arms(capsys, tmp_path):
    write_arm(tmp_path / "s", "baseline", [2.920, 2.921, 2.9195], [10.0, 11.0, 10.5])
    write_arm(tmp_path / "s", "lucky", [2.9150], [10.0])
    status, out, _ = run_cli(capsys, "compare", tmp_path / "s", "--json")
    result = json.loads(out)
    (comparison,) = result["comparisons"]
    assert comparison["loss_diff"] == pytest.approx(2.915 - np.mean([2.920, 2.921, 2.9195]))
    assert comparison["loss_p"] is None and comparison["loss_ci"] is None and comparison["loss_p_holm"] is None
    (warning,) = result["warnings"]
    assert "'lucky' has 1 complete run" in warning and f"{np.std([2.920, 2.921, 2.9195], ddof=1):.5f}" in warning


@pytest.mark.slow
def test_python_dash_m_entry_point_and_its_error_line(tmp_path):
    """Guards: `python -m analysis` as a process: exit 2, empty stdout, one stderr line for a missing path."""
    done = subprocess.run([sys.executable, "-m", "analysis", "summarize", str(tmp_path / "nope"), "--target", "2.92"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"error: PATH not found: {tmp_path / 'nope'}"


@pytest.mark.slow
def test_report_of_a_study_folder(capsys, tmp_path):
    """Guards: `analysis report` writes every section and real PNG plots, and its comparisons equal `compare`'s."""
    root = study(tmp_path)
    logs_for_tests.write(root / "L3" / "seed9.txt", logs_for_tests.our_log_text(variant="L3", seed=9, complete=False,
                                                                                  stop_at=30))
    (root / "L3" / "broken.txt").write_bytes(b"")
    status, out, _ = run_cli(capsys, "report", root)
    assert status == 0
    report = root / "report.md"
    assert out.strip() == str(report)
    text = report.read_text()
    for heading in ("## Arms", "## Comparisons", "## Parameters, memory, step time, effective FLOPs", "## Plots",
                    "## Unfinished runs", "## Unreadable files"):
        assert heading in text
    assert "L3/seed9.txt" in text and "broken.txt" in text and "empty file" in text
    assert "p Holm" in text and "picked after seeing the results" in text
    images = [line.split("](")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert {"report_val_loss_step.png", "report_val_loss_time.png", "report_lambda_by_layer.png",
            "report_loss_by_layer.png", "report_scalars_0.png"} <= set(images)
    for image in images:
        data = (root / image).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 5000
    compare_status, compare_out, _ = run_cli(capsys, "compare", root, "--markdown")
    counted = "\n".join(line for line in compare_out.splitlines() if not line.startswith("not counted: "))
    arm_table, comparisons = counted.strip().split("\n\n", 1)
    assert compare_status == 0 and comparisons in text  # the same numbers as `compare`
    assert arm_table not in text  # shown once, in the report's own arm table
    assert not list(root.glob(".*.tmp"))


@pytest.mark.slow
def test_record_packages_complete_runs_with_a_recomputable_readme(capsys, tmp_path):
    """Guards: `analysis record` packages a record folder whose README's snippet, run in python, recomputes its p."""
    write_arm(tmp_path / "runs" / "rec", "record", ARTICLE_LOSSES[:6], ARTICLE_TIMES[:6])
    logs_for_tests.write(tmp_path / "runs" / "rec" / "record" / "seed7.txt",
                         logs_for_tests.our_log_text(variant="record", seed=7, complete=False, stop_at=20))
    argv = ["record", tmp_path / "runs" / "rec", "--track", "medium", "--name", "Backout", "--date", "2025-10-05",
            "--records-root", tmp_path / "records"]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    folder = tmp_path / "records" / "track_2_medium" / "2025-10-05_Backout"
    assert out.strip() == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"seed{i}.txt" for i in range(6)] + ["README.md", "train_gpt_medium.py"])
    for i in range(6):
        assert (folder / f"seed{i}.txt").read_bytes() == (tmp_path / "runs/rec/record" / f"seed{i}.txt").read_bytes()
    assert (folder / "train_gpt_medium.py").read_text() == logs_for_tests.TRICKY_CODE
    readme = (folder / "README.md").read_text()
    expected_p = scipy_stats.ttest_1samp(ARTICLE_LOSSES[:6], 2.92, alternative="less").pvalue
    assert f"p = {pval(expected_p)}" in readme and "sample standard deviation" in readme
    assert "6 complete runs" in readme and "1 unfinished run(s)" in readme
    assert f"{np.mean(ARTICLE_LOSSES[:6]):.6f}" in readme and f"{np.std(ARTICLE_LOSSES[:6], ddof=1):.6f}" in readme
    snippet = readme.split("```python\n")[1].split("```")[0]
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True)
    assert done.returncode == 0
    assert float(done.stdout.strip().splitlines()[-1].split("p = ")[1]) == pytest.approx(expected_p, rel=1e-12)
    # Refuses to overwrite, with one line.
    status, _, err = run_cli(capsys, *argv)
    assert "already exists" in one_line_error(status, err)
    # Medium-track logs are never packaged as a small-track record (issue 26); small-track logs go to track_1_short.
    status, _, err = run_cli(capsys, *argv[:3], "small", *argv[4:])
    assert "seed0.txt is a medium-track run, not a small-track one" in one_line_error(status, err)
    write_arm(tmp_path / "runs" / "small", "record", ARTICLE_LOSSES[:3], ARTICLE_TIMES[:3], track="small")
    status, out, _ = run_cli(capsys, "record", tmp_path / "runs" / "small", "--track", "small", *argv[4:])
    assert status == 0 and (tmp_path / "records" / "track_1_short" / "2025-10-05_Backout" / "train_gpt.py").exists()


def test_record_check_holds_r18_runs_to_record_18_and_says_when_their_time_is_not_comparable(capsys, tmp_path):
    r18 = {"base": "r18", "attention": "sdpa"}
    write_arm(tmp_path / "r18", "baseline", [2.9161, 2.9163, 2.9160], [1040.0, 1041.0, 1039.5], config=r18)
    # A later record in the table: runs on --base r18 are still held to #18 unless --against says otherwise.
    table = tmp_path / "records.csv"
    later = "medium,19,2026-02-01,16.0 minutes,960.0,A later record,,,,,,,"
    table.write_text(RECORDS_TABLE.read_text() + later + "\n")
    status, out, _ = run_cli(capsys, "record-check", tmp_path / "r18", "--records", table, "--resamples", "200")
    assert "faster than record #18 of the medium track (17.35 minutes = 1041 s, 2025-12-31" in out
    assert "its mean loss 2.9166 over 2 runs" in out
    assert "ran --base r18 with attention sdpa, not fa3: its train_time is comparable with upstream's only" in out
    status, out, _ = run_cli(capsys, "record-check", tmp_path / "r18", "--records", table, "--resamples", "200",
                             "--against", "19", "--json")
    assert json.loads(out)["record"]["number"] == 19
