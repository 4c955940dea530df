"""Figures (matplotlib, headless). Each builder returns a Figure, so tests can inspect what is drawn, and
`save_figure` writes it as PNG atomically. Lines carry a gid saying what they are: "run" (one run, thin), "mean"
(an arm's or a series' mean), "target", "baseline"; so the number of "run" lines equals the number of runs drawn.
Bands are the mean plus and minus one sample standard deviation across runs."""
from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
from matplotlib.figure import Figure  # noqa: E402

import numpy as np  # noqa: E402

from . import studies  # noqa: E402
from .atomic import write_atomically  # noqa: E402
from .stats import mean_std  # noqa: E402

_PALETTE = matplotlib.colormaps["tab10"]
_WIDE_PALETTE = matplotlib.colormaps["tab20"]
# With more series than colours, each further round of colours gets its own line style, then the same styles
# with markers: 20 x 4 x 3 = 240 distinct series.
_LINE_STYLES = ("-", "--", ":", "-.")
_MARKERS = (None, "o", "^")
# Above this many entries the legend goes outside the axes, in columns of at most _LEGEND_ROWS entries.
_LEGEND_INSIDE_MAX = 10
_LEGEND_ROWS = 32


def _color(index: int):
    return _PALETTE(index % _PALETTE.N)


def _series_style(index: int, count: int) -> dict:
    """Colour and line style of series `index` of `count`: tab10 up to 10 series, tab20 beyond, with a new line
    style (then marker) for each round of 20 colours, so no two series of one figure look the same."""
    if count <= _PALETTE.N:
        return {"color": _PALETTE(index), "linestyle": "-"}
    round_ = index // _WIDE_PALETTE.N
    style = {"color": _WIDE_PALETTE(index % _WIDE_PALETTE.N), "linestyle": _LINE_STYLES[round_ % len(_LINE_STYLES)]}
    marker = _MARKERS[(round_ // len(_LINE_STYLES)) % len(_MARKERS)]
    if marker:
        style.update(marker=marker, markevery=0.1, markersize=4)
    return style


def _place_legend(figure: Figure, axes) -> None:
    """A legend inside the axes for a few entries; for many, outside on the right of the figure, in as many
    columns as needed, with the figure widened to hold them, so it never covers the curves or leaves the figure."""
    handles, labels = axes.get_legend_handles_labels()
    if len(labels) <= _LEGEND_INSIDE_MAX:
        axes.legend(fontsize="small")
        return
    columns = -(-len(labels) // _LEGEND_ROWS)
    longest = max(len(label) for label in labels)
    width, height = figure.get_size_inches()
    figure.set_size_inches(width + columns * (0.6 + 0.055 * longest), max(height, 0.16 * min(len(labels),
                                                                                             _LEGEND_ROWS) + 1))
    figure.legend(handles, labels, loc="outside right upper", ncols=columns, fontsize="x-small")


def _new_axes(title: str, xlabel: str, ylabel: str, size=(8, 5)):
    figure = Figure(figsize=size, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    return figure, axes


def save_figure(figure: Figure, path) -> Path:
    """Write `figure` as PNG to `path`; a partial image never has the final name."""
    return write_atomically(path, lambda stream: figure.savefig(stream, format="png", dpi=110))


def _mean_band(series):
    """series: list of {x: y} per run -> (xs, mean, std) over the x values any run has (std 0 with one run)."""
    xs = sorted(set().union(*[s.keys() for s in series])) if series else []
    means, stds = [], []
    for x in xs:
        mean, std = mean_std([s[x] for s in series if x in s])
        means.append(mean)
        stds.append(std or 0.0)
    return np.array(xs, dtype=float), np.array(means, dtype=float), np.array(stds, dtype=float)


def _loss_limits(groups, target, x: str, start_fraction: float):
    """(x limits, y limits) of the part of training from `start_fraction` of each run's own end on: the x-range
    holds every run's late part (shorter runs included), the y-range the losses of those parts; (None, None)
    without data."""
    starts, ends, late = [], [], []
    for runs in groups.values():
        for run in runs:
            xs = run.val_steps if x == "step" else [t / 1000.0 for t in run.val_times_ms]
            points = [(position, loss) for position, loss in zip(xs, run.val_losses) if np.isfinite(loss)]
            if not points:
                continue
            start = start_fraction * points[-1][0]
            starts.append(start)
            ends.append(points[-1][0])
            late += [loss for position, loss in points if position >= start]
    if not late:
        return None, None
    start, end = min(starts), max(ends)
    low, high = min(late), max(late)
    if target is not None and start_fraction < 0.5:
        low, high = min(low, target), max(high, target)
    margin = 0.05 * (high - low) or 0.005
    return (start, end), (low - margin, high + margin)


def val_loss_figure(groups: dict, x: str = "step", target: float | None = None) -> Figure:
    """Validation loss against step (x="step") or train time in seconds (x="time"): each run thin, each arm's
    mean thick with its band. Left: from 20% of training on; right: the last 20%, zoomed."""
    xlabel = "step" if x == "step" else "train time (s)"
    figure = Figure(figsize=(13, 5), layout="constrained")
    full, zoom = figure.subplots(1, 2)
    for axes, title, start in ((full, f"validation loss against {xlabel}", 0.2),
                               (zoom, "last 20% of training", 0.8)):
        axes.set_title(title)
        axes.set_xlabel(xlabel)
        axes.set_ylabel("validation loss")
        axes.grid(True, alpha=0.3)
        for index, (name, runs) in enumerate(groups.items()):
            style = _series_style(index, len(groups))
            color = style["color"]
            for run in runs:
                xs = run.val_steps if x == "step" else [t / 1000.0 for t in run.val_times_ms]
                axes.plot(xs, run.val_losses, color=color, linewidth=0.6, alpha=0.35, gid="run")
            steps, mean, std = _mean_band([dict(zip(r.val_steps, r.val_losses)) for r in runs])
            if x == "time":
                steps = _mean_band([dict(zip(r.val_steps, r.val_times_ms)) for r in runs])[1] / 1000.0
            axes.plot(steps, mean, **style, linewidth=2.0, label=f"{name} (n={len(runs)})", gid="mean")
            axes.fill_between(steps, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)
        if target is not None:
            axes.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target:g}",
                         gid="target")
        x_limits, y_limits = _loss_limits(groups, target, x, start)
        if y_limits:
            axes.set_ylim(*y_limits)
            if start > 0.5 and x_limits[1] > x_limits[0]:
                axes.set_xlim(*x_limits)
    _place_legend(figure, full)
    return figure


def scalar_names(runs, patterns=None) -> list[str]:
    names = sorted({name for run in runs for _, values in run.scalars for name in values})
    if patterns:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    return names


def scalars_figure(groups: dict, patterns=None) -> Figure:
    """Each learned scalar against step: every run thin, the mean over each arm's runs thick (the article's
    lambda plot). One colour per (arm, scalar) series."""
    names = scalar_names([run for runs in groups.values() for run in runs], patterns)
    if not names:
        raise ValueError("no logged scalars" + (f" match {', '.join(patterns)}" if patterns else ""))
    figure, axes = _new_axes("learned scalars against step", "step", "value")
    series_index = 0
    for arm, runs in groups.items():
        for name in names:
            series = []
            style = _series_style(series_index, len(groups) * len(names))
            color = style["color"]
            for run in runs:
                points = {step: float(values[name]) for step, values in run.scalars
                          if isinstance(values.get(name), (int, float))}
                if points:
                    steps = sorted(points)
                    axes.plot(steps, [points[s] for s in steps], color=color, linewidth=0.6, alpha=0.35, gid="run")
                    series.append(points)
            if not series:
                continue
            steps, mean, _ = _mean_band(series)
            label = name if len(groups) == 1 else f"{arm}: {name}"
            axes.plot(steps, mean, **style, linewidth=2.0, label=f"{label} (mean of {len(series)})", gid="mean")
            series_index += 1
    _place_legend(figure, axes)
    return figure


def final_layer_values(runs, prefix: str = "backout.") -> list[tuple[int, float]]:
    """(layer, value) of every `<prefix>L<k>` scalar in each run's last scalars line."""
    pattern = re.compile(re.escape(prefix) + r"L(\d+)$")
    points = []
    for run in runs:
        for name, value in run.final_scalars.items():
            match = pattern.match(name)
            if match and isinstance(value, (int, float)):
                points.append((int(match.group(1)), float(value)))
    return points


def lambda_by_layer_figure(runs, prefix: str = "backout.") -> Figure:
    """Final learned lambda of each skipped layer, every run as a point, the mean per layer with its std."""
    points = final_layer_values(runs, prefix)
    if not points:
        raise ValueError(f"no final scalars named {prefix}L<k> in these runs")
    figure, axes = _new_axes(f"final {prefix}L<k> lambdas by layer (all runs)", "layer", "final lambda")
    layers = np.array([p[0] for p in points])
    values = np.array([p[1] for p in points])
    axes.scatter(layers, values, s=14, alpha=0.5, color=_color(0), gid="points")
    unique = sorted(set(layers.tolist()))
    stats = [mean_std(values[layers == layer]) for layer in unique]
    bars = axes.errorbar(unique, [s[0] for s in stats], yerr=[s[1] or 0.0 for s in stats], fmt="o-",
                         color="black", capsize=3, label="mean ± std")
    bars.lines[0].set_gid("mean")
    axes.axhline(0.0, color="grey", linewidth=0.8)
    axes.set_xticks(unique)
    axes.legend(fontsize="small")
    return figure


def _arm_stats(runs):
    return mean_std([r.final_val_loss for r in runs])


def _baseline_band(axes, groups, baseline):
    if baseline in groups:
        mean, std = _arm_stats(groups[baseline])
        if mean is not None:
            axes.axhline(mean, color="black", linestyle="--", linewidth=1, gid="baseline",
                         label=f"{baseline} (n={len(groups[baseline])})")
            if std:
                axes.axhspan(mean - std, mean + std, color="grey", alpha=0.15, linewidth=0)


def loss_by_layer_figure(groups: dict, baseline: str | None = "baseline") -> Figure:
    """Layer sweep: mean final loss of each single-layer arm against its layer, error bars = sample std."""
    points = []
    for name, runs in groups.items():
        layers = studies.skip_layers(name, runs)
        if name != baseline and layers and len(layers) == 1:
            mean, std = _arm_stats(runs)
            points.append((layers[0], mean, std or 0.0))
    if not points:
        raise ValueError("no single-layer arms (names like L11 or config key backout_layers)")
    points.sort()
    figure, axes = _new_axes("final loss by skipped layer", "layer skipped to the output", "final validation loss")
    bars = axes.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points], fmt="o-",
                         capsize=3, color=_color(0), label="mean ± std over seeds")
    bars.lines[0].set_gid("mean")
    _baseline_band(axes, groups, baseline)
    axes.set_xticks([p[0] for p in points])
    axes.legend(fontsize="small")
    return figure


def multi_layer_points(groups: dict, baseline: str | None = "baseline") -> list[dict]:
    """Arms that skip layers, with their selection order, layer count, mean distance to the output and loss."""
    points = []
    for name, runs in groups.items():
        layers = studies.skip_layers(name, runs)
        if name == baseline or not layers:
            continue
        mean, std = _arm_stats(runs)
        points.append({"variant": name, "order": studies.selection_order(name, runs),
                       "count": len(layers), "layers": layers, "mean": mean, "std": std or 0.0,
                       "distance": studies.mean_distance_to_output(layers, studies.layer_count(runs))})
    return points


def loss_vs_num_layers_figure(groups: dict, baseline: str | None = "baseline") -> Figure:
    """Final loss against the number of skipped layers, one line per selection order, plus the mean over orders."""
    points = [p for p in multi_layer_points(groups, baseline) if p["order"] is not None]
    if not points:
        raise ValueError("no arms with a layer selection order (config selection_order, or names like btw-5)")
    figure, axes = _new_axes("final loss by number of skipped layers", "number of skipped layers",
                             "final validation loss")
    orders = list(dict.fromkeys(p["order"] for p in points))
    for index, order in enumerate(orders):
        mine = sorted((p for p in points if p["order"] == order), key=lambda p: p["count"])
        bars = axes.errorbar([p["count"] for p in mine], [p["mean"] for p in mine], yerr=[p["std"] for p in mine],
                             fmt="o-", capsize=3, color=_color(index), label=order)
        bars.lines[0].set_gid("order")
    counts = sorted({p["count"] for p in points})
    overall = [mean_std([p["mean"] for p in points if p["count"] == c])[0] for c in counts]
    axes.plot(counts, overall, color="black", linestyle="--", linewidth=1.5, label="mean over orders", gid="mean")
    _baseline_band(axes, groups, baseline)
    axes.legend(fontsize="small")
    return figure


def loss_vs_distance_figure(groups: dict, baseline: str | None = "baseline") -> Figure:
    """Final loss of each arm against the mean distance of its skipped layers to the output (last layer = 0)."""
    points = multi_layer_points(groups, baseline)
    if not points:
        raise ValueError("no arms with skipped layers")
    figure, axes = _new_axes("final loss by mean distance of the skipped layers to the output",
                             "mean distance to the output (layers)", "final validation loss")
    axes.scatter([p["distance"] for p in points], [p["mean"] for p in points], color=_color(0), gid="arms")
    _baseline_band(axes, groups, baseline)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(fontsize="small")
    return figure
