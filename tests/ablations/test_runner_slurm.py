"""The generated Slurm batch script: its directives, and what its tasks do when run (with stand-in Slurm tools)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from runner_support import ablations, is_complete, runner_env, starts_per_run, write_study

ARMS = {"baseline": {}, "backout": {"backout-layers": [11]}}
FLAGS = {"num-iterations": 6, "val-every": 3}


def generate(tmp_path, study, *options):
    result = ablations(["slurm", study, *options], tmp_path, runner_env())
    assert result.returncode == 0, result.stderr
    path = Path(re.search(r"wrote (\S+):", result.stdout).group(1))
    return (tmp_path / path if not path.is_absolute() else path), result.stdout


def directives(text: str) -> list[str]:
    return [line[len("#SBATCH "):] for line in text.splitlines() if line.startswith("#SBATCH ")]


def run_task(tmp_path, script: Path, task: int, env: dict) -> subprocess.CompletedProcess:
    env = {**env, "SLURM_ARRAY_TASK_ID": str(task), "SLURM_JOB_NODELIST": "gpu[17-18]", "SLURM_JOB_NUM_NODES": "2"}
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_single_node_job_array(tmp_path):
    """Guards: the generated sbatch script's directives, and bash running one array task starts its run once only."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS, extra='time_limit = "00:40:00"')
    script, message = generate(tmp_path, study, "--partition", "h100", "--max-parallel", "3", "--sbatch=--qos=high")
    assert script == tmp_path / "runs" / "s" / "slurm.sbatch" and "4 array tasks" in message
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    lines = directives(text)
    assert "--array=0-3%3" in lines and "--nodes=1" in lines and "--ntasks-per-node=1" in lines
    assert "--gres=gpu:1" in lines and "--time=00:40:00" in lines and "--partition=h100" in lines
    assert "--qos=high" in lines and "--job-name=s" in lines
    assert f"--output={tmp_path / 'runs' / 's' / 'slurm'}/%A_%a.out" in lines
    assert (tmp_path / "runs" / "s" / "slurm").is_dir()  # Slurm will not create it
    assert "runs=(baseline:0 backout:0 baseline:1 backout:1)" in text
    assert "srun" not in text and "rdzv" not in text
    assert f"cd {tmp_path}" in text

    # Each task runs its own (arm, seed) through run-one; a task whose run is complete starts nothing.
    starts = tmp_path / "starts.jsonl"
    env = runner_env(starts)
    for task in (2, 2):
        result = run_task(tmp_path, script, task, env)
        assert result.returncode == 0, result.stdout + result.stderr
    assert is_complete(tmp_path / "runs" / "s" / "baseline" / "seed1.txt")
    assert starts_per_run(starts) == {("baseline", 1): 1}
    assert len(list((tmp_path / "runs").rglob("seed*.txt"))) == 1


@pytest.mark.slow
def test_multi_node_runs_use_a_torchrun_rendezvous_on_the_first_node(tmp_path):
    """Guards: a multi-node array task (bash, stand-in scontrol/srun) starts torchrun per node at the head's rdzv."""
    study = write_study(tmp_path, "wide", ARMS, flags=FLAGS, launcher="torchrun", nproc=8, seeds=[0],
                       extra='[vars]\nckpt = "none"')
    script, _ = generate(tmp_path, study, "--gpus-per-node", "4", "--set", "ckpt=elsewhere", "--rdzv-port", "29555")
    text = script.read_text()
    lines = directives(text)
    assert "--nodes=2" in lines and "--gres=gpu:4" in lines and "--exclusive" in lines
    assert "--array=0-1" in lines
    assert 'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in text
    assert '--rdzv-endpoint "$head_node:29555"' in text and '--nnodes "$SLURM_JOB_NUM_NODES"' in text
    assert "--set=ckpt=elsewhere" in text

    # Run task 1 with stand-in scontrol and srun: srun must start torchrun once per node with the rendezvous.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && printf 'gpu17\\ngpu18\\n'\n")
    (bin_dir / "srun").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path}/srun-args\n")
    for tool in ("scontrol", "srun"):
        os.chmod(bin_dir / tool, 0o755)
    env = runner_env()
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    result = run_task(tmp_path, script, 1, env)
    args = (tmp_path / "srun-args").read_text().splitlines()
    assert args[:3] == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    torchrun = args[args.index("torch.distributed.run") + 1:]
    assert torchrun[:5] == ["--nnodes=2", "--nproc_per_node=4", "--rdzv-backend=c10d",
                            "--rdzv-endpoint=gpu17:29555", "--rdzv-id=wide-backout-seed0"]
    assert torchrun[-8:] == ["--seed", "0", "--variant", "backout", "--log-dir",
                             str(tmp_path / "runs" / "wide" / "backout"), "--run-name", "seed0"]
    # The stand-in srun wrote no log, so the task reports the run as failed (and a resubmission redoes it).
    assert result.returncode == 1 and "backout/seed0 exited without finishing its log" in result.stdout


@pytest.mark.slow
def test_runs_that_do_not_fill_whole_nodes_are_refused(tmp_path):
    """Guards: `ablations slurm` refuses runs that do not fill whole nodes (exit 2), writing nothing."""
    study = write_study(tmp_path, "odd", ARMS, flags=FLAGS, launcher="torchrun", nproc=8)
    result = ablations(["slurm", study, "--gpus-per-node", "3"], tmp_path, runner_env())
    assert result.returncode == 2 and "--gpus-per-node" in result.stderr
    assert not (tmp_path / "runs").exists()
