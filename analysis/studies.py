"""What the study plots and tables need to know about an arm: which layers it skips to the output, its layer
selection order, and resource figures (parameters, memory, step time, effective FLOPs) read from the logs.

Where the facts come from (first found wins):
- skipped layers: config key `backout_layers` (or `backout_layer`, `skip_layers`): an int, a list of ints or a
  string like "3,11"; else every `L<k>` token in the arm name (`L11`, `L3-L11`).
- selection order (multi-layer skips): config key `selection_order` (or `backout_order`); else the arm name
  before a '-' or '_' and its trailing layer count (`btw-5` -> `btw`, `late_to_early_n3` -> `late_to_early`);
  arms without one (`L11`) are not part of a selection order.
- layer count: config key `num_layers` (default 16, the medium model).
- parameters: config or `key: value` line `params` (or `num_params`, `total_params`, `n_params`); added parameters:
  `added_params` (a number, or the training scripts' `{"variant": n, ...} total N`, read as N); effective FLOPs:
  `effective_flops` (or `flops_per_token`), else the last `scalars:` entry whose name contains "flops".
"""
from __future__ import annotations

import re

import numpy as np

from speedrun.logformat import ADDED_PARAMS_PREFIX, parse_added_params

from .stats import mean_std
from .textfmt import integer_like, num, table

LAYER_KEYS = ("backout_layers", "backout_layer", "skip_layers")
ORDER_KEYS = ("selection_order", "backout_order")
PARAM_KEYS = ("params", "num_params", "total_params", "n_params")
ADDED_PARAM_KEYS = ("added_params",)
FLOPS_KEYS = ("effective_flops", "flops_per_token")
DEFAULT_NUM_LAYERS = 16

_LAYER_TOKEN = re.compile(r"(?<![A-Za-z0-9])L(\d+)(?![0-9])")
_TRAILING_COUNT = re.compile(r"^(.+?)[-_](?:n|N|k)?(\d+)$")


def _as_layer_list(value) -> list[int] | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        try:
            return [int(v) for v in value]
        except (TypeError, ValueError):
            return None
    if isinstance(value, str):
        found = re.findall(r"-?\d+", value)
        return [int(v) for v in found] or None
    return None


def skip_layers(name: str, runs) -> list[int] | None:
    for run in runs:
        layers = _as_layer_list(run.setting(*LAYER_KEYS))
        if layers:
            return layers
    found = [int(k) for k in _LAYER_TOKEN.findall(name)]
    return found or None


def selection_order(name: str, runs) -> str | None:
    for run in runs:
        order = run.setting(*ORDER_KEYS)
        if order not in (None, ""):
            return str(order)
    match = _TRAILING_COUNT.match(name)
    return match.group(1) if match else None


def layer_count(runs) -> int:
    for run in runs:
        value = run.setting("num_layers")
        try:
            return int(value)
        except (TypeError, ValueError):
            continue
    return DEFAULT_NUM_LAYERS


def mean_distance_to_output(layers, num_layers: int) -> float:
    """Mean distance of the skipped layers to the output latents: the last layer (num_layers-1) is at 0."""
    return float(np.mean([num_layers - 1 - layer for layer in layers]))


def numeric_mean(values):
    """The mean of the values that read as numbers; the first value as text when none do; None when empty."""
    numbers = []
    for value in values:
        try:
            numbers.append(float(value))
        except (TypeError, ValueError):
            continue
    if numbers:
        return float(np.mean(numbers))
    present = [v for v in values if v is not None]
    return present[0] if present else None


def added_params(run):
    """The run's added parameter count: the `total N` of the training scripts' line (read by speedrun.logformat's
    parser), else the value as given."""
    value = run.setting(*ADDED_PARAM_KEYS)
    parsed = parse_added_params(ADDED_PARAMS_PREFIX + value) if isinstance(value, str) else None
    return parsed[1] if parsed else value


def effective_flops(run):
    value = run.setting(*FLOPS_KEYS)
    if value is not None:
        return value
    for name in sorted(run.final_scalars):
        if "flops" in name.lower():
            return run.final_scalars[name]
    return None


def resource_rows(groups: dict, baseline: str | None = None) -> list[dict]:
    """One row per arm: parameters, added parameters, final loss, its difference from the baseline arm, peak
    memory, step time and effective FLOPs; values the logs do not hold are None."""
    base_mean = mean_std([r.final_val_loss for r in groups[baseline]])[0] if baseline in groups else None
    rows = []
    for name, runs in groups.items():
        mean_loss, std_loss = mean_std([r.final_val_loss for r in runs])
        rows.append({
            "variant": name, "n": len(runs),
            "params": numeric_mean([r.setting(*PARAM_KEYS) for r in runs]),
            "added_params": numeric_mean([added_params(r) for r in runs]),
            "mean_val_loss": mean_loss, "std_val_loss": std_loss,
            "loss_diff": None if base_mean is None or mean_loss is None or name == baseline
            else mean_loss - base_mean,
            "peak_allocated_mib": numeric_mean([r.peak_allocated_mib for r in runs]),
            "step_time_ms": numeric_mean([r.step_time_ms for r in runs]),
            "effective_flops": numeric_mean([effective_flops(r) for r in runs]),
        })
    return rows


def render_resource_table(groups: dict, baseline: str | None = None, markdown: bool = True) -> str:
    rows = resource_rows(groups, baseline)
    return table(
        ["arm", "n", "params", "added params", "final loss", "std", "diff vs baseline", "peak memory MiB",
         "step time ms", "effective FLOPs"],
        [[r["variant"], r["n"], integer_like(r["params"]), integer_like(r["added_params"]),
          num(r["mean_val_loss"]), num(r["std_val_loss"], 5), num(r["loss_diff"], 4, signed=True),
          integer_like(r["peak_allocated_mib"]), num(r["step_time_ms"], 2), integer_like(r["effective_flops"])]
         for r in rows], markdown)
