"""Helpers shared by the tests of the study runner (tests/ablations/, and those that run it end to end)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from speedrun.logformat import is_finished_line

REPO = Path(__file__).resolve().parent.parent
FAKE_TRAIN = Path(__file__).resolve().parent / "fake_train.py"


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return str(value)


def write_study(folder: Path, name: str, arms: dict[str, dict], seeds=(0, 1), flags: dict | None = None,
                script: Path = FAKE_TRAIN, extra: str = "", launcher: str = "python", nproc: int = 1) -> Path:
    """A study file for the stand-in script; returns its path."""
    lines = [f'description = "test study {name}"', f"script = {json.dumps(str(script))}",
             f'launcher = "{launcher}"', f"nproc = {nproc}", f"seeds = {toml_value(list(seeds))}", extra, "[flags]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in (flags or {}).items()]
    for arm, table in arms.items():
        lines.append(f'[arms."{arm}"]')
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path = folder / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def runner_env(starts: Path | None = None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_TRAIN_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if starts is not None:
        env["FAKE_TRAIN_STARTS"] = str(starts)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def ablations(args: list[str], cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablations", *map(str, args)], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


def start_ablations(args: list[str], cwd: Path, env: dict, output: Path) -> subprocess.Popen:
    """The runner in the background, in its own session (so a test can signal it alone)."""
    return subprocess.Popen([sys.executable, "-m", "ablations", *map(str, args)], cwd=cwd, env=env,
                            stdout=open(output, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def read_events(starts: Path) -> list[dict]:
    if not starts.exists():
        return []
    return [json.loads(line) for line in starts.read_text().splitlines() if line.strip()]


def starts_per_run(starts: Path) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for event in read_events(starts):
        if event["event"] == "start":
            key = (event["variant"], event["seed"])
            counts[key] = counts.get(key, 0) + 1
    return counts


def is_complete(log: Path) -> bool:
    lines = log.read_text().rstrip("\n").splitlines() if log.exists() else []
    return bool(lines) and is_finished_line(lines[-1])


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def step_lines(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("step:")]
