"""The runner with the real training script: `./run.sh` as the README says (the demo study), and under --until-decided."""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from conftest import write_token_shard
from runner_support import REPO, ablations, is_complete, runner_env, start_ablations, wait_for, write_study

SCRIPT = REPO / "train_gpt_medium.py"
DEMO_SHARDS = sorted((REPO / "data" / "demo").glob("demo_*_*.bin"))


@pytest.mark.slow
def test_bad_flag_for_the_training_script_is_refused(tmp_path):
    """Guards: the runner refuses an arm flag that the real train_gpt_medium.py lacks, in one line, writing nothing."""
    study = write_study(tmp_path, "bad", {"baseline": {}, "odd": {"backout-layerz": 11}}, script=SCRIPT)
    result = ablations(["run", study], tmp_path, runner_env())
    assert result.returncode == 2 and "has no flag --backout-layerz" in result.stderr
    assert not (tmp_path / "runs").exists()


def copy_of_the_tree(tmp_path: Path) -> tuple[Path, dict]:
    """A copy of the checkout (so tests leave its runs/ alone) and an environment in which run.sh uses the
    interpreter running the tests as it is (it has every dependency)."""
    tree = tmp_path / "tree"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "logs", "__pycache__",
                                                              "fineweb10B", ".pytest_cache"))
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_VENV", "CUDA_VISIBLE_DEVICES")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return tree, env


@pytest.mark.slow
def test_main_job_on_a_gpu_node_with_fineweb_runs_the_record_study(tmp_path):
    """With GPUs (a stand-in nvidia-smi listing two) and FineWeb shards, `./run.sh` starts the record study with
    one GPU slice per run; the test stops it once the first run has started."""
    tree, env = copy_of_the_tree(tmp_path)
    fineweb = tree / "data" / "fineweb10B"
    fineweb.mkdir(parents=True)
    # The record study's 30 train shards: present, so nothing is fetched; well-formed, as the runner checks them
    # before launching (the val shard holds one validation's 10,485,760 tokens).
    write_token_shard(fineweb / "fineweb_val_000000.bin", np.zeros(10_485_762, dtype=np.uint16))
    for index in range(1, 31):
        write_token_shard(fineweb / f"fineweb_train_{index:06d}.bin", [50256, 1, 2])
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 (UUID: a)'\necho 'GPU 1: NVIDIA H100 (UUID: b)'\n")
    os.chmod(tools / "nvidia-smi", 0o755)
    env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
    output = tmp_path / "run.out"
    with open(output, "w") as out:
        job = subprocess.Popen(["./run.sh"], cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        wait_for(lambda: " start " in output.read_text(), 60, "the first run to start")
    finally:
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=60)
    text = output.read_text()
    assert text.splitlines()[0].startswith("run.sh: main job: the record study (2 CUDA GPU(s), FineWeb shards")
    assert "2 GPU(s) per run, GPUs 0,1" in text
    assert "record start    baseline/seed0 [1/10]" in text and "(GPUs 0,1)" in text
    assert "got SIGTERM" in text


@pytest.mark.slow
@pytest.mark.skipif(not DEMO_SHARDS, reason="the bundled demo shards (data/demo/demo_*.bin) are not in this tree yet")
def test_main_job_without_gpu_runs_the_demo_and_its_report(tmp_path):
    """`./run.sh` on a machine with no GPU: the demo study, its report and its result on the terminal. The copy's
    demo is cut to 12 steps: this checks the wiring; benchmarks/results/ holds the full demo's time and losses.
    Also guards the runner with the real training script: a 2-arm study of train_gpt_medium.py runs to complete logs
    of the right arm and seed, each validation shown as progress (merged from a tiny study of its own: the demo
    already launches that study's kind of runs)."""
    tree, env = copy_of_the_tree(tmp_path)
    demo = tree / "ablations" / "demo.toml"
    demo.write_text(demo.read_text().replace("num-iterations = 100", "num-iterations = 12"))
    result = subprocess.run(["./run.sh"], cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    first = result.stdout.splitlines()[0]
    if shutil.which("nvidia-smi") is None:
        assert first.startswith("run.sh: main job: the demo study") and "no CUDA GPU" in first
    logs = sorted((tree / "runs" / "demo").rglob("seed*.txt"))
    assert {(log.parent.name, log.name) for log in logs} == {
        (arm, f"seed{seed}.txt") for arm in ("baseline", "backout-L4") for seed in (0, 1, 2)}
    assert all(is_complete(log) for log in logs)
    for log in logs:
        text = log.read_text()
        assert f'"variant": "{log.parent.name}"' in text and f'"seed": {int(log.stem[4:])}' in text
        assert "step:12/12 val_loss:" in text
    assert "6 runs: 6 done (6 by this runner), 0 failed" in result.stdout
    assert result.stdout.count(" val_loss ") >= 6  # progress shows each run's validation
    assert (tree / "runs" / "demo" / "runner.log").read_text().count(" done ") >= 6
    if importlib.util.find_spec("analysis") is not None:
        assert "python -m analysis report" in result.stdout
        report = (tree / "runs" / "demo" / "report.md").read_text()
        assert "baseline" in report and "backout-L4" in report
        assert "result of runs/demo (target val loss 6.5; 6 complete runs of 6 logs)" in result.stdout
        assert "backout-L4: final loss" in result.stdout and "report: runs/demo/report.md" in result.stdout
    else:
        assert "report   skipped: the analysis package is not available" in result.stdout


def test_every_bundled_study_passes_the_training_scripts_own_checks(tmp_path):
    """The study files and the script's flags (and its checks of flag combinations) must not drift apart."""
    from ablations.study import available_studies, check_flags, load_study

    checkpoint = tmp_path / "base.pt"
    checkpoint.write_bytes(b"only its existence is checked before launch")
    for path in available_studies():
        if path.stem == "backout-multi-skip":  # needs a finished sweep; its arms are covered by test_runner_orders
            continue
        # the DLO studies continue from a checkpoint another study writes
        needs_checkpoint = "base_checkpoint" in tomllib.loads(path.read_text()).get("vars", {})
        overrides = {"base_checkpoint": str(checkpoint)} if needs_checkpoint else None
        study = load_study(path.stem, overrides, runs_dir=tmp_path / "runs")
        check_flags(study, study.runs(tmp_path / "runs"), tmp_path / "runs")


@pytest.mark.slow
@pytest.mark.skipif(not DEMO_SHARDS, reason="the bundled demo shards (data/demo/demo_*.bin) are not in this tree yet")
def test_demo_until_decided_stops_the_backout_arm_early_and_a_kill_keeps_its_looks(tmp_path):
    """The CPU demo study (tiny preset, bundled demo data) under --until-decided, with real training runs cut to 10
    steps: the runner is killed (SIGKILL) once the first look is recorded, run again, and decides the backout arm
    before its maximum of 6 seeds, keeping the look it had taken."""
    demo = (REPO / "ablations" / "demo.toml").read_text()
    demo = demo.replace("num-iterations = 100", "num-iterations = 10").replace("val-every = 10", "val-every = 0")
    demo = demo.replace('preset = "tiny"', f'preset = "tiny"\ntrain-files = "{REPO}/data/demo/demo_train_*.bin"\n'
                                           f'val-files = "{REPO}/data/demo/demo_val_*.bin"')
    study = tmp_path / "demo.toml"
    study.write_text(demo)
    command = ["run", study, "--until-decided", "--max-seeds", "6", "--gpus", "0", "--parallel", "2"]
    runner = start_ablations(command, tmp_path, runner_env(), tmp_path / "first.out")
    record = tmp_path / "runs" / "demo" / "sequential.json"
    try:
        wait_for(record.exists, 600, "the first look", interval=0.2)
    finally:
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(30)
    first = json.loads(record.read_text())["looks"]["backout-L4"]
    assert [look["n"] for look in first] == [3]  # the first look at three seeds (analysis/sequential.py)
    again = ablations(command, tmp_path, runner_env(), timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    looks = json.loads(record.read_text())["looks"]["backout-L4"]
    assert looks[0] == first[0] and sum(" replayed " in line for line in again.stdout.splitlines()) == 1
    assert looks[-1]["decision"] == "better" and looks[-1]["n"] < 6 and looks[-1]["adjusted_p"] < 0.01
    # neither arm got a seed past the deciding look
    logs = {(log.parent.name, int(log.stem[4:])) for log in (tmp_path / "runs" / "demo").glob("*/seed?.txt")}
    assert logs == {(arm, seed) for arm in ("baseline", "backout-L4") for seed in range(looks[-1]["n"])}
