"""Plots, report and compare at the scale of the real record corpus (issue 14, class 5): many arms, runs of
different lengths, arms with no finished run, counts in one style per column, and the wording when no arm beats
the baseline; plot --out into a folder that does not exist."""
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

import analysis_logs as logs_for_tests
from analysis_logs import run_cli
from analysis import plots
from analysis.compare import compare_arms, render_compare
from analysis.logs import group_runs, load_runs
from analysis.textfmt import integer_like


def write_arm(root, arm, seeds, final, total=100, env=None):
    for seed in range(seeds):
        text = logs_for_tests.our_log_text(
            variant=arm, seed=seed, total_steps=total, env=env,
            losses=lambda step, seed=seed: logs_for_tests.default_curve(step, total, final + 0.001 * seed))
        logs_for_tests.write(Path(root) / arm / f"seed{seed}.txt", text)


def mean_lines(axes):
    return [line for line in axes.get_lines() if line.get_gid() == "mean"]


@pytest.fixture(scope="module")
def many_arms(tmp_path_factory):
    """95 arms of one run each, as `plot --by folder` over the upstream track_1_short folder gives."""
    root = tmp_path_factory.mktemp("many")
    for index in range(95):
        write_arm(root, f"2026-{index:02d}_SomeLongRecordName", 1, 3.27 + index / 1e4)
    runs, _ = load_runs([root], jobs=1)
    return group_runs(runs)


@pytest.mark.slow
def test_95_arms_get_95_distinct_styles_and_a_legend_inside_the_figure(many_arms):
    """Guards: 95 arms drawn get 95 distinct styles and a rendered legend inside the figure, right of the axes."""
    figure = plots.val_loss_figure(many_arms, "step", target=3.28)
    styles = {(tuple(line.get_color()), line.get_linestyle(), line.get_marker()) for line in mean_lines(figure.axes[0])}
    assert len(mean_lines(figure.axes[0])) == 95 and len(styles) == 95
    FigureCanvasAgg(figure).draw()
    legend = figure.legends[0]
    box, page = legend.get_window_extent(), figure.bbox
    assert box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1 and box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1
    for axes in figure.axes:  # the legend covers no curves: it lies right of every axes
        assert box.x0 >= axes.get_window_extent().x1
    assert len(legend.get_texts()) == 96  # 95 arms and the target


def test_a_few_arms_keep_the_legend_inside_the_axes(many_arms):
    nine = dict(list(many_arms.items())[:9])
    figure = plots.val_loss_figure(nine, "step", target=3.28)  # 9 arms and the target: 10 entries
    assert not figure.legends and len(figure.axes[0].get_legend().get_texts()) == 10
    assert len({line.get_color() for line in mean_lines(figure.axes[0])}) == 9


def test_zoom_panel_follows_the_late_data_of_runs_of_different_lengths(tmp_path):
    write_arm(tmp_path, "short", 2, 3.30, total=1000)
    write_arm(tmp_path, "long", 2, 3.27, total=5000)
    runs, _ = load_runs([tmp_path], jobs=1)
    groups = group_runs(runs)
    zoom = plots.val_loss_figure(groups, "step").axes[1]
    low_x, high_x = zoom.get_xlim()
    assert low_x <= 800 and high_x >= 5000  # the short run's last 20% is inside the x-range
    late = [loss for run in runs for step, loss in zip(run.val_steps, run.val_losses)
            if step >= 0.8 * run.total_steps]
    low_y, high_y = zoom.get_ylim()
    assert low_y <= min(late) and high_y >= max(late)
    assert (high_y - low_y) <= 1.2 * (max(late) - min(late))  # no blank band above or below the data


@pytest.mark.slow
def test_report_lists_arms_without_a_finished_run_and_shows_counts_in_one_style(capsys, tmp_path):
    """Guards: `analysis report` lists an arm with no finished run and prints parameter counts as integers."""
    root = tmp_path / "study"
    write_arm(root, "baseline", 2, 2.921, env={"params": 31352})
    write_arm(root, "wide", 2, 2.919, env={"params": 31160})
    logs_for_tests.write(root / "crashed" / "seed0.txt",
                         logs_for_tests.our_log_text(variant="crashed", complete=False, stop_at=40))
    (root / "wide" / "seed1.txt").write_text(
        (root / "wide" / "seed1.txt").read_text().replace("params: 31160", "params: 31161"))
    status, _, _ = run_cli(capsys, "report", root, "--target", "2.92")
    text = (root / "report.md").read_text()
    arm_rows = [line for line in text.split("## Arms")[1].split("## Comparisons")[0].splitlines()
                if line.startswith("| crashed")]
    assert status == 0 and len(arm_rows) == 1 and arm_rows[0].startswith("| crashed | 0 | 0 | 1 | - |")
    assert "31,160" in text and "e+04" not in text  # mean of 31160 and 31161 is rounded, not 3.116e+04
    assert integer_like(31160.5) == "31,160" and integer_like(999.5) == "999.5" and integer_like("x") == "x"


def test_compare_calls_no_arm_best_when_every_arm_is_worse(tmp_path):
    write_arm(tmp_path, "baseline", 3, 2.915)
    write_arm(tmp_path, "worse", 3, 2.918)
    write_arm(tmp_path, "worst", 3, 2.925)
    runs, _ = load_runs([tmp_path], jobs=1)
    groups = group_runs(runs)
    result = compare_arms({"baseline": groups["baseline"], "worse": groups["worse"], "worst": groups["worst"]},
                          "baseline")
    text = render_compare(result)
    assert "no arm has a lower final val loss than 'baseline'" in text and "the closest, 'worse'" in text
    assert "picked after seeing the results" not in text.split("final val loss")[-1].split("train time")[0]
    assert "best" not in text


def test_plot_out_into_a_missing_folder_is_refused_and_creates_nothing(capsys, tmp_path):
    write_arm(tmp_path / "study", "baseline", 2, 2.92)
    out = tmp_path / "no" / "such" / "plot.png"
    status, _, err = run_cli(capsys, "plot", "val-loss-step", tmp_path / "study", "--out", out)
    assert status == 2 and f"--out: folder {out.parent} does not exist" in err and not (tmp_path / "no").exists()
    status, _, err = run_cli(capsys, "report", tmp_path / "study", "--out", out)
    assert status == 2 and "does not exist" in err and not (tmp_path / "no").exists()


def test_seconds_and_milliseconds_logs_of_one_run_agree(tmp_path):
    """A time in seconds and one in milliseconds of the same run give the same train time and time to target."""
    seconds = logs_for_tests.write(tmp_path / "s" / "a.txt", logs_for_tests.upstream_log_text(era="seconds"))
    millis = logs_for_tests.write(tmp_path / "m" / "a.txt", logs_for_tests.upstream_log_text(era="2025"))
    runs, _ = load_runs([seconds, millis], jobs=1)
    assert runs[0].train_time_s == pytest.approx(runs[1].train_time_s)
    assert np.allclose(runs[0].val_times_ms, runs[1].val_times_ms)
