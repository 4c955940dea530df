"""Writers of synthetic run logs for the analysis tests and benchmark, modelled on each format found in the upstream
records/ folders: this project's format (docs/log-format.md, with the embedded sources of its modules), and
upstream modded-nanogpt record logs of every era (ERAS below) plus llm.c's `main.log`. The embedded "source code"
deliberately holds lines that look like separators, a config line, step lines and a peak-memory line, as a real
script's source may."""
from __future__ import annotations

import json
import math
from pathlib import Path

SEPARATOR = "=" * 100

# Source code whose text contains log-like lines at the start of a line, inside a string.
TRICKY_CODE = f'''import json
EXAMPLE_LOG = """
{SEPARATOR}
config: {{"variant": "from_the_code", "seed": 999, "track": "small"}}
params: 1
{SEPARATOR}
step:7/7 val_loss:0.123456 train_time:7ms step_avg:1.00ms
step:7/7 scalars: {{"backout.x": 99.0}}
peak memory allocated: 1 MiB reserved: 1 MiB
"""

def log_line(step, total, loss, ms):
    return f"step:{{step}}/{{total}} val_loss:{{loss:.6f}} train_time:{{ms:.0f}}ms step_avg:{{ms/max(step, 1):.2f}}ms"

print("peak memory allocated: ...")
'''

NVIDIA_SMI = """Sat Oct  4 18:37:27 2025
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 560.35.03              Driver Version: 560.35.03      CUDA Version: 12.6     |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:19:00.0 Off |                    0 |
+-----------------------------------------------------------------------------------------+"""


def default_curve(step: int, total: int, final: float = 2.919) -> float:
    """A plausible falling validation loss from 10.8 at step 0 to exactly `final` at step `total`."""
    floor = math.exp(-6.0)
    return final + (10.8 - final) * (math.exp(-6.0 * step / max(total, 1)) - floor) / (1.0 - floor)


def _train_time(time_ms: float, unit: str) -> str:
    return f"{time_ms / 1000:.3f}s" if unit == "s" else f"{time_ms:.0f}ms"


def _step_lines(total_steps, val_every, losses, step_ms, scalars, decimals, train_loss, stop_at, time_unit="ms",
                final_validation=True):
    lines = []
    last = total_steps if stop_at is None else stop_at
    for step in range(0, last + 1):
        time_ms = step * step_ms
        avg = f"{time_ms / max(step, 1):.2f}"
        time = _train_time(time_ms, time_unit)
        if step > 0:
            loss_part = f"train_loss:{5.0:.4f} " if train_loss else ""
            lines.append(f"step:{step}/{total_steps} {loss_part}train_time:{time} step_avg:{avg}ms")
        if (step % val_every == 0 or step == total_steps) and (final_validation or step < total_steps):
            loss = losses(step) if callable(losses) else losses[step]
            lines.append(f"step:{step}/{total_steps} val_loss:{loss:.{decimals}f} train_time:{time} "
                         f"step_avg:{avg}ms")
            if scalars is not None:
                lines.append(f"step:{step}/{total_steps} scalars: {json.dumps(scalars(step))}")
    return lines


# A project module whose source, embedded in a log, holds lines that look like log lines.
TRICKY_MODULE = f'''"""A module of the training package."""
HELP = """
step:50/50 val_loss:1.000000 train_time:50ms step_avg:1.00ms
config: {{"variant": "from_a_module", "seed": 7, "track": "small"}}
{SEPARATOR}
peak memory allocated: 2 MiB reserved: 2 MiB
"""
'''


def our_log_text(variant="baseline", seed=0, total_steps=100, val_every=25, losses=None, step_ms=250.0,
                 scalars=None, config=None, env=None, complete=True, stop_at=None, code=TRICKY_CODE,
                 peak=(56812, 60000), track="medium", modules=None, final_validation=True) -> str:
    """A log in this project's format. `losses`: step -> loss (callable or dict over the validation steps);
    `scalars`: step -> dict or None; `stop_at`: the last step written (a run killed early); `complete`: whether
    the final peak-memory line is there; `modules`: {"speedrun/NAME.py": source} embedded after the script, each
    under its `==> speedrun/NAME.py <==` header; `final_validation`: whether the last step is validated."""
    losses = losses or (lambda step: default_curve(step, total_steps))
    full_config = {"track": track, "variant": variant, "seed": seed, "world_size": 8,
                   "num_iterations": total_steps, **(config or {})}
    env_lines = ["Running Python 3.12.7", "Running PyTorch 2.13.0 compiled for CUDA 12.6", NVIDIA_SMI,
                 f"config: {json.dumps(full_config)}"]
    env_lines += [f"{key}: {value}" for key, value in (env or {}).items()]
    sources = [code.rstrip("\n")]
    for name, source in (modules or {}).items():
        sources += [f"==> {name} <==", source.rstrip("\n")]
    lines = [*sources, SEPARATOR, *env_lines, SEPARATOR]
    lines += _step_lines(total_steps, val_every, losses, step_ms, scalars, 6, False, stop_at,
                         final_validation=final_validation)
    if complete:
        lines.append(f"peak memory allocated: {peak[0]} MiB reserved: {peak[1]} MiB")
    return "\n".join(lines) + "\n"


# Upstream record log eras, as found in the upstream records/ folders:
# - "2024-early": Oct-Dec 2024 (every log of 18 record folders): 4-decimal val_loss, train_loss on the step lines
#   (until early December), three separator lines, and no peak-memory line: the log ends at its final validation.
# - "2024": late 2024 / early 2025: the same lines, ending `peak memory consumption: N MiB`.
# - "2025": 2025-2026: the script (and its kernel files) embedded at the top, 6-decimal val_loss, two separators,
#   ending `peak memory allocated: A MiB reserved: R MiB`.
# - "seconds": logs that write train_time in seconds (`train_time:739.639s`), 5-decimal val_loss.
ERAS = ("2024-early", "2024", "2025", "seconds")


def upstream_log_text(total_steps=100, val_every=25, losses=None, step_ms=150.0, era="2025", complete=True,
                      stop_at=None, final_validation=True, target=3.28) -> str:
    """An upstream record log of `era` (see ERAS). `target` sets the default final loss just below it (3.279 for
    the small track, 2.919 for the medium track)."""
    losses = losses or (lambda step: default_curve(step, total_steps, final=target - 0.001))
    old = era.startswith("2024")
    lines = [TRICKY_CODE.rstrip("\n"), SEPARATOR, "Running Python 3.12.7 (main, Jan  4 2025)",
             "Running PyTorch 2.6.0 compiled for CUDA 12.6", NVIDIA_SMI, ""]
    if old:
        lines += [SEPARATOR, "Training dataloader files: ['data/fineweb10B/fineweb_train_000001.bin']"]
    lines.append(SEPARATOR)
    decimals = 4 if old else (5 if era == "seconds" else 6)
    lines += _step_lines(total_steps, val_every, losses, step_ms, None, decimals, old, stop_at,
                         time_unit="s" if era == "seconds" else "ms", final_validation=final_validation)
    if complete and era != "2024-early":
        lines.append("peak memory consumption: 31563 MiB" if old
                     else "peak memory allocated: 56812 MiB reserved: 60010 MiB")
    return "\n".join(lines) + "\n"


def llmc_log_text(total_steps=100, val_every=25, final=3.2722) -> str:
    """llm.c's `main.log`: `s:STEP tel:LOSS` validation and `s:STEP trl:LOSS lr:.. norm:..` training lines."""
    lines = []
    for step in range(total_steps + 1):
        if step % val_every == 0 or step == total_steps:
            lines.append(f"s:{step} tel:{default_curve(step, total_steps, final):.4f}")
        if step < total_steps:
            lines.append(f"s:{step} trl:{5.0:.4f} lr:0.000600 norm:0.25")
    return "\n".join(lines) + "\n"


def run_cli(capsys, *argv):
    """`python -m analysis ARGV` in this process: (exit status, stdout, stderr)."""
    from analysis.cli import main  # here, not at the top: the benchmark imports the writers without the package

    try:
        status = main([str(a) for a in argv])
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err


def write(path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def write_study(root, arms: dict, **common) -> Path:
    """runs/<study>/<arm>/seed<k>.txt for arms = {arm: [per-seed keyword dicts for our_log_text]}."""
    root = Path(root)
    for arm, seeds in arms.items():
        for seed, options in enumerate(seeds):
            write(root / arm / f"seed{seed}.txt", our_log_text(variant=arm, seed=seed, **{**common, **options}))
    return root
