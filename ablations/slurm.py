"""A Slurm batch script for a study: a job array with one task per (arm, seed).

Each task calls `python -m ablations run-one STUDY ARM SEED`, which applies the same rules as the local runner (a
complete log is left alone, an unfinished one is kept aside and its run restarted or resumed, a run another process
holds is left to it) and launches one torchrun on its node, or, for runs wider than a node, one torchrun per node
through srun with a c10d rendezvous on the job's first node.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from pathlib import Path

from .errors import StudyError
from .study import Run, Study


@dataclasses.dataclass
class SlurmOptions:
    gpus_per_node: int = 8
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    max_parallel: int | None = None
    cpus_per_task: int | None = None
    rdzv_port: int = 29500
    extra: list[str] = dataclasses.field(default_factory=list)  # further #SBATCH lines, e.g. "--qos=high"


def nodes_for(study: Study, options: SlurmOptions) -> int:
    if study.nproc <= options.gpus_per_node:
        return 1
    if study.nproc % options.gpus_per_node:
        raise StudyError(f"study {study.name}: {study.nproc} processes per run do not fill whole nodes of "
                         f"{options.gpus_per_node} GPUs (--gpus-per-node)")
    return study.nproc // options.gpus_per_node


def batch_script(study: Study, runs: list[Run], runs_dir: Path, options: SlurmOptions,
                 run_one_args: list[str]) -> str:
    """The text of the batch script. run_one_args: options every task passes on (e.g. --set, --no-resume)."""
    if not runs:
        raise StudyError(f"study {study.name}: no runs to put in a job array")
    nodes = nodes_for(study, options)
    gpus_here = min(study.nproc, options.gpus_per_node)
    runs_dir = Path(runs_dir).resolve()
    study_dir = runs_dir / study.name
    time_limit = options.time_limit or study.time_limit or "01:00:00"
    array = f"0-{len(runs) - 1}" + (f"%{options.max_parallel}" if options.max_parallel else "")
    header = [
        "#!/bin/bash",
        f"# Study {study.name}: {study.description}",
        f"# Written by `python -m ablations slurm {study.name}` on {time.strftime('%Y-%m-%d %H:%M')}.",
        "# One array task per (arm, seed); a task whose run is complete exits at once, so the script can be",
        "# submitted again after failures or time-outs. Follow progress with `python -m ablations status "
        f"{study.name}`.",
        f"#SBATCH --job-name={study.name}",
        f"#SBATCH --array={array}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gres=gpu:{gpus_here}",
        f"#SBATCH --time={time_limit}",
        f"#SBATCH --output={study_dir / 'slurm'}/%A_%a.out",
    ]
    if nodes > 1:
        header.append("#SBATCH --exclusive")
    if options.cpus_per_task:
        header.append(f"#SBATCH --cpus-per-task={options.cpus_per_task}")
    if options.partition:
        header.append(f"#SBATCH --partition={options.partition}")
    if options.account:
        header.append(f"#SBATCH --account={options.account}")
    header += [f"#SBATCH {line}" for line in options.extra]

    entries = " ".join(f"{run.arm}:{run.seed}" for run in runs)
    python = shlex.quote(sys.executable)
    run_one = [f"{python} -m ablations run-one {shlex.quote(str(study.path))} \"$arm\" \"$seed\"",
               f"--runs-dir {shlex.quote(str(runs_dir))}", *map(shlex.quote, run_one_args)]
    body = [
        "",
        "set -euo pipefail",
        # Relative paths in the study's flags (data globs) mean what they meant where the script was written.
        f"cd {shlex.quote(str(Path.cwd()))}",
        f"runs=({entries})",
        'entry=${runs[$SLURM_ARRAY_TASK_ID]}',
        'arm=${entry%:*}',
        'seed=${entry##*:}',
    ]
    if nodes > 1:
        body += [
            "# The first node of the allocation hosts the torchrun rendezvous.",
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"exec {' '.join(run_one)} --nnodes \"$SLURM_JOB_NUM_NODES\" "
            f"--rdzv-endpoint \"$head_node:{options.rdzv_port}\"",
        ]
    else:
        body.append(f"exec {' '.join(run_one)}")
    return "\n".join(header + body) + "\n"


def write_batch_script(path: Path, text: str, output_dir: Path) -> None:
    """Atomic write; the folder for the tasks' output files is made too (Slurm does not create it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
