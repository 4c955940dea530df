"""Arms generated from layer selection orders: the article's multi-layer skips (shared/seeds/003).

For N layers to skip from, each order picks N of the layers 0..L-1:
  best-to-worst / worst-to-best  by the final validation loss each layer reached alone in a finished layer sweep
                                 (mean over its complete runs, from `python -m analysis summarize --json`)
  early-to-late / late-to-early  by position in the forward pass
  random                         N layers drawn without replacement, from a generator with a fixed seed
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from .errors import StudyError

ORDERS = ("best-to-worst", "worst-to-best", "early-to-late", "late-to-early", "random")
GENERATE_KEYS = {"kind", "flag", "layers", "min_count", "max_count", "orders", "random_seed"}
RESULT_ORDERS = {"best-to-worst", "worst-to-best"}


def layer_selections(orders: list[str], layers: int, counts: range, random_seed: int,
                     ranked: list[int] | None) -> dict[tuple[str, int], list[int]]:
    """(order, N) -> the N layers chosen. `ranked` lists the layers best first (needed by the result orders)."""
    rng = random.Random(random_seed)
    chosen = {}
    for order in orders:
        if order in RESULT_ORDERS and ranked is None:
            raise StudyError(f"order {order!r} needs the ranking of a finished layer sweep")
        sequence = {"best-to-worst": ranked, "worst-to-best": ranked[::-1] if ranked else None,
                    "early-to-late": list(range(layers)), "late-to-early": list(range(layers))[::-1]}.get(order)
        for n in counts:
            chosen[order, n] = rng.sample(range(layers), n) if order == "random" else sequence[:n]
    return chosen


def rank_layers(summary: dict, arm_layers: dict[str, int]) -> list[int]:
    """Layers sorted by the mean final validation loss of their sweep arm (lowest first; ties by layer index)."""
    losses = {}
    for group in summary.get("groups", []):
        layer = arm_layers.get(group.get("variant"))
        loss = group.get("mean_val_loss")
        if layer is not None and isinstance(loss, (int, float)):
            losses[layer] = float(loss)
    missing = sorted(set(arm_layers.values()) - set(losses))
    if missing:
        raise StudyError(f"the layer sweep has no complete result for layer(s) {', '.join(map(str, missing))}")
    return sorted(losses, key=lambda layer: (losses[layer], layer))


def sweep_summary(sweep_dir: Path, target: float) -> dict:
    """The analysis package's summary of a finished sweep (its command line is the interface between the parts)."""
    command = [sys.executable, "-m", "analysis", "summarize", str(sweep_dir), "--target", str(target), "--json"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as e:
        raise StudyError(f"cannot run the analysis package: {e}") from None
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no message"])[-1]
        raise StudyError(f"`python -m analysis summarize {sweep_dir}` failed: {detail}")
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise StudyError(f"`python -m analysis summarize {sweep_dir} --json` printed no JSON") from None


def generate_arms(spec: dict, sweep, runs_dir: Path, where: str) -> dict[str, dict]:
    """Arm name -> flag table for a study's [generate] table. `sweep` is the study its requires_results names, as
    ablations.study loaded it (None when there is none): the result orders rank that sweep's layers."""
    where = f"{where}: [generate]"
    unknown = sorted(set(spec) - GENERATE_KEYS)
    if unknown:
        raise StudyError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(GENERATE_KEYS))})")
    if spec.get("kind") != "layer-orders":
        raise StudyError(f"{where}: kind must be 'layer-orders'")
    try:
        flag = str(spec["flag"])
        layers = int(spec["layers"])
        counts = range(int(spec.get("min_count", 1)), int(spec.get("max_count", layers)) + 1)
        random_seed = int(spec.get("random_seed", 0))
    except KeyError as e:
        raise StudyError(f"{where}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError):
        raise StudyError(f"{where}: layers, min_count, max_count and random_seed must be integers") from None
    if not counts or counts.start < 1 or counts.stop - 1 > layers:
        raise StudyError(f"{where}: need 1 <= min_count <= max_count <= layers")
    orders = list(spec.get("orders", ORDERS))
    bad = [order for order in orders if order not in ORDERS]
    if bad:
        raise StudyError(f"{where}: unknown order {bad[0]!r} (orders: {', '.join(ORDERS)})")

    ranked = None
    if RESULT_ORDERS & set(orders):
        if sweep is None:
            raise StudyError(f"{where}: orders {', '.join(sorted(RESULT_ORDERS))} need requires_results naming the sweep")
        ranked = ranked_sweep_layers(sweep, flag, runs_dir)
    chosen = layer_selections(orders, layers, counts, random_seed, ranked)
    return {f"{order}-n{n:02d}": {flag: ",".join(map(str, picked))} for (order, n), picked in chosen.items()}


def ranked_sweep_layers(sweep, flag: str, runs_dir: Path) -> list[int]:
    arm_layers = {}
    for arm, table in sweep.arms.items():
        try:
            arm_layers[arm] = int(table[flag])
        except (KeyError, TypeError, ValueError):
            continue  # reference arms (e.g. the baseline) do not rank a layer
    if not arm_layers:
        raise StudyError(f"study {sweep.name!r} has no arm with a single --{flag} layer to rank")
    return rank_layers(sweep_summary(Path(runs_dir) / sweep.name, sweep.target), arm_layers)
