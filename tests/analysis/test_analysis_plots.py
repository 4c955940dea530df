"""Plots come from the data (inspected on the figure objects), are written as PNG files; the resource table."""
from pathlib import Path

import numpy as np
import pytest

import analysis_logs as logs_for_tests
from analysis import plots
from analysis.cli import main
from analysis.logs import group_runs, load_runs
from analysis.studies import mean_distance_to_output, render_resource_table, resource_rows, selection_order, \
    skip_layers


def lines_with(axes, gid):
    return [line for line in axes.get_lines() if line.get_gid() == gid]


def arm_logs(root, arm, seeds, final, config=None, env=None, scalars=None, total=100):
    for seed in range(seeds):
        text = logs_for_tests.our_log_text(
            variant=arm, seed=seed, total_steps=total, config=config, env=env,
            losses=lambda step, seed=seed: logs_for_tests.default_curve(step, total, final + 0.001 * seed),
            step_ms=200.0 + seed, scalars=scalars)
        logs_for_tests.write(Path(root) / arm / f"seed{seed}.txt", text)


@pytest.fixture
def sweep(tmp_path):
    """baseline (3 seeds), single-layer arms L3 (2), L11 (3), multi-layer arms in two selection orders."""
    root = tmp_path / "study"
    arm_logs(root, "baseline", 3, 2.921, scalars=lambda s: {"backout.x": 1.0})
    for layer, seeds, final in ((3, 2, 2.9205), (11, 3, 2.918)):
        arm_logs(root, f"L{layer}", seeds, final,
                 scalars=lambda s, layer=layer: {"backout.x": 1 - s / 500, f"backout.L{layer}": -s / (40 * layer)})
    for order, layer_lists in (("btw", ([11, 10], [11, 10, 8])), ("late", ([14, 13], [14, 13, 12]))):
        for layers in layer_lists:
            arm_logs(root, f"{order}-{len(layers)}", 2, 2.919 + 0.0002 * len(layers),
                     config={"backout_layers": layers, "selection_order": order},
                     scalars=lambda s, layers=layers: {f"backout.L{k}": -k / 100 for k in layers})
    runs, _ = load_runs([root])
    return group_runs(runs)


@pytest.mark.slow
def test_val_loss_plot_draws_every_run_and_each_arm_mean(sweep):
    """Guards: the val-loss figure's lines are each run's data and each arm's mean, by step and by time."""
    figure = plots.val_loss_figure(sweep, "step", target=2.92)
    full, zoom = figure.axes
    runs = [run for members in sweep.values() for run in members]
    for axes in (full, zoom):
        assert len(lines_with(axes, "run")) == len(runs)
        assert len(lines_with(axes, "mean")) == len(sweep)
        assert len(lines_with(axes, "target")) == 1
    for line, run in zip(lines_with(full, "run"), runs):
        assert list(line.get_xdata()) == run.val_steps and list(line.get_ydata()) == run.val_losses
    baseline_mean = lines_with(full, "mean")[0]
    expected = np.mean([r.val_losses for r in sweep["baseline"]], axis=0)
    assert np.allclose(baseline_mean.get_ydata(), expected)
    assert zoom.get_xlim()[0] >= 80 - 1e-9  # the zoom shows the last 20% only
    time_figure = plots.val_loss_figure(sweep, "time")
    first = lines_with(time_figure.axes[0], "run")[0]
    assert list(first.get_xdata()) == [t / 1000 for t in runs[0].val_times_ms]


def test_scalar_plot_per_run_and_mean_per_arm(sweep):
    groups = {k: sweep[k] for k in ("L3", "L11")}
    figure = plots.scalars_figure(groups, ["backout.*"])
    (axes,) = figure.axes
    # L3 runs log backout.x and backout.L3, L11 runs backout.x and backout.L11: 2 series per run
    assert len(lines_with(axes, "run")) == 2 * (2 + 3)
    means = {line.get_label().split(" (")[0]: line for line in lines_with(axes, "mean")}
    assert set(means) == {"L3: backout.x", "L3: backout.L3", "L11: backout.x", "L11: backout.L11"}
    expected = [np.mean([values["backout.L11"] for step, values in run.scalars if step == s]) for s in
                sweep["L11"][0].val_steps for run in sweep["L11"][:1]]
    assert np.allclose(means["L11: backout.L11"].get_ydata(), expected)
    only_x = plots.scalars_figure({"L11": sweep["L11"]}, ["backout.x"])
    assert [line.get_label() for line in lines_with(only_x.axes[0], "mean")] == ["backout.x (mean of 3)"]
    with pytest.raises(ValueError, match="no logged scalars"):
        plots.scalars_figure(groups, ["laurel.*"])


def test_final_lambdas_by_layer(sweep):
    runs = [run for members in sweep.values() for run in members]
    figure = plots.lambda_by_layer_figure(runs)
    (axes,) = figure.axes
    (points,) = [c for c in axes.collections if c.get_gid() == "points"]
    expected = [(int(name.split("L")[1]), value) for run in runs for name, value in run.final_scalars.items()
                if name.startswith("backout.L")]
    assert sorted(map(tuple, points.get_offsets().tolist())) == sorted(expected)
    (mean,) = lines_with(axes, "mean")
    layers = sorted({layer for layer, _ in expected})
    assert list(mean.get_xdata()) == layers
    assert np.allclose(mean.get_ydata(), [np.mean([v for k, v in expected if k == layer]) for layer in layers])


def test_layer_sweep_plot_has_one_point_per_single_layer_arm(sweep):
    figure = plots.loss_by_layer_figure(sweep)
    (axes,) = figure.axes
    (line,) = lines_with(axes, "mean")
    assert list(line.get_xdata()) == [3, 11]
    assert np.allclose(line.get_ydata(), [np.mean([r.final_val_loss for r in sweep[a]]) for a in ("L3", "L11")])
    assert len(lines_with(axes, "baseline")) == 1


def test_multi_layer_plots_by_order_and_distance(sweep):
    figure = plots.loss_vs_num_layers_figure(sweep)
    (axes,) = figure.axes
    orders = {bars.get_label(): bars.lines[0] for bars in axes.containers}
    assert set(orders) == {"btw", "late"}  # the single-layer arms L3 and L11 belong to no selection order
    assert list(orders["btw"].get_xdata()) == [2, 3]
    assert np.allclose(orders["late"].get_ydata(),
                       [np.mean([r.final_val_loss for r in sweep[f"late-{n}"]]) for n in (2, 3)])
    distance = plots.loss_vs_distance_figure(sweep)
    (points,) = [c for c in distance.axes[0].collections if c.get_gid() == "arms"]
    offsets = {round(x, 6) for x in points.get_offsets()[:, 0]}
    assert {round(np.mean([15 - k for k in ks]), 6) for ks in ([11, 10], [14, 13, 12])} <= offsets


def test_study_facts_from_config_and_names(sweep):
    assert skip_layers("L11", []) == [11] and skip_layers("L3-L11", []) == [3, 11]
    assert skip_layers("baseline", sweep["baseline"]) is None
    assert skip_layers("whatever", sweep["btw-3"]) == [11, 10, 8]
    assert selection_order("btw-3", []) == "btw" and selection_order("late_to_early_n4", []) == "late_to_early"
    assert selection_order("x", sweep["late-2"]) == "late"
    assert mean_distance_to_output([15, 11], 16) == 2.0


def test_save_figure_writes_a_png_atomically(tmp_path, sweep):
    path = plots.save_figure(plots.loss_by_layer_figure(sweep), tmp_path / "deep" / "plot.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    assert [p.name for p in path.parent.iterdir()] == ["plot.png"]


def test_resource_table_reads_config_env_and_scalars(tmp_path):
    root = tmp_path / "laurel"
    arm_logs(root, "baseline", 2, 2.921, env={"params": 454496336})
    arm_logs(root, "rw", 2, 2.919, env={"params": 454496368, "added_params": 32})
    # the training scripts' own form: per-variant JSON, then the total
    arm_logs(root, "lr", 1, 2.918, env={"params": 455544912, "added_params": '{"laurel": 1048576} total 1048576'})
    arm_logs(root, "dlo30", 1, 2.93, config={"params": 500000000}, scalars=lambda s: {"dlo.effective_flops": 0.7})
    runs, _ = load_runs([root])
    groups = group_runs(runs)
    rows = {r["variant"]: r for r in resource_rows(groups, "baseline")}
    assert rows["rw"]["params"] == 454496368 and rows["rw"]["added_params"] == 32
    assert rows["lr"]["added_params"] == 1048576
    assert rows["baseline"]["added_params"] is None and rows["dlo30"]["effective_flops"] == 0.7
    assert rows["rw"]["loss_diff"] == pytest.approx(np.mean([2.919, 2.920]) - np.mean([2.921, 2.922]))
    assert rows["rw"]["step_time_ms"] == pytest.approx(np.mean([200.0, 201.0]))
    assert rows["rw"]["peak_allocated_mib"] == 56812
    text = render_resource_table(groups, "baseline")
    assert "| rw | 2 | 454,496,368 | 32 |" in text and "| baseline | 2 | 454,496,336 | - |" in text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["val-loss-step", "val-loss-time", "scalars", "lambda-by-layer", "loss-by-layer",
                                  "loss-vs-num-layers", "loss-vs-distance"])
def test_plot_command_writes_each_kind(tmp_path, sweep, kind, capsys):
    """Guards: `analysis plot` renders every kind of plot to a real PNG file."""
    study = next(iter(sweep.values()))[0].path.parents[1]
    out = tmp_path / "plots" / f"{kind}.png"
    out.parent.mkdir(exist_ok=True)
    assert main(["plot", kind, str(study), "--out", str(out), "--target", "2.92"]) == 0
    assert out.read_bytes().startswith(b"\x89PNG") and out.stat().st_size > 5000


def test_plot_resource_table_to_stdout_and_file(tmp_path, sweep, capsys):
    study = next(iter(sweep.values()))[0].path.parents[1]
    assert main(["plot", "resource-table", str(study)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| arm | n | params |") and "| L11 | 3 |" in printed
    out = tmp_path / "table.md"
    assert main(["plot", "resource-table", str(study), "--out", str(out)]) == 0
    assert out.read_text().strip() == printed.strip()


def test_report_of_a_multi_layer_arm_without_a_selection_order(tmp_path, capsys):
    # the demo's shape: one arm skipping layers 10 and 11, named without an order ("backout", no selection_order)
    root = tmp_path / "study"
    arm_logs(root, "baseline", 2, 2.921)
    arm_logs(root, "backout", 2, 2.919, config={"backout_layers": "10,11"})
    assert main(["report", str(root), "--target", "2.92"]) == 0
    text = (root / "report.md").read_text()
    assert "report_loss_vs_distance.png" in text  # the arm still has its distance plot
    assert "report_loss_vs_num_layers.png" not in text  # no selection order: nothing to draw by order
    assert capsys.readouterr().out.strip() == str(root / "report.md")
