"""The study runner under the faults of issue 43: a sequential record whose arm the study no longer has, a decided
study's dry run, --seeds that --until-decided cannot obey or that no script takes, a leftover temporary record, a
look whose log was deleted, a zip that is no torch checkpoint. In-process: the sequential studies train with the
stand-in script called as a function (no process starts)."""

import json
import sys
import zipfile
from pathlib import Path

import pytest

import fake_train
from ablations import sequential_study
from ablations.cli import main
from ablations.runstate import checkpoint_damage, log_is_complete, run_paths
from ablations.study import runner_flags
from runner_support import write_study
from test_runner_sequential import refused  # noqa: F401 (a fixture)

# The stand-in's final loss is 0.001 * seed plus 0.03 for backout layer 4: backout-L4 is decided worse at the first
# look (3 seeds of the 4).
ARMS = {"baseline": {}, "backout-L4": {"backout-layers": 4}}
FLAGS = {"num-iterations": 10, "val-every": 5}
SEQUENTIAL = ["--until-decided", "--max-seeds", "4"]


@pytest.fixture
def in_process(tmp_path, monkeypatch, capsys):
    """`python -m ablations ARGS` in this process from tmp_path, the sequential runner's batches trained by the
    stand-in script called in-process: returns (exit status, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPUs, and no nvidia-smi process

    def train_in_process(study, runs, options, reporter):
        for run in runs:
            if not log_is_complete(run_paths(options.runs_dir, run.study, run.arm, run.seed).log):
                monkeypatch.setattr(sys, "argv", ["fake_train.py", *run.flags, *runner_flags(run, options.runs_dir)])
                fake_train.main()
        return 0

    monkeypatch.setattr(sequential_study, "run_study", train_in_process)

    def run(*args):
        try:
            code = main([str(arg) for arg in args])
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err
        return code, out, err

    return run


@pytest.fixture
def decided(tmp_path, in_process):
    """A sequential study whose one tested arm was decided at its first look, after seeds 0-2 of both arms."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    code, out, err = in_process("run", study, *SEQUENTIAL)
    assert code == 0, out + err
    (look,) = json.loads((tmp_path / "runs/s/sequential.json").read_text())["looks"]["backout-L4"]
    assert look["decision"] == "worse" and look["n"] == 3
    return study


def test_status_of_a_sequential_study_whose_recorded_arm_was_renamed_names_the_record(tmp_path, decided,
                                                                                        in_process):
    """Issue 43: status raised KeyError: 'backout-L4'; it now says what `run` says of the record, and still shows
    the runs."""
    write_study(tmp_path, "s", {"baseline": {}, "backout-L5": {"backout-layers": 4}}, flags=FLAGS)
    code, out, err = in_process("run", decided, *SEQUENTIAL)
    assert code == 2
    refusal = err.strip().removeprefix("error: ")
    assert "records looks of another design (arms ['backout-L4'], now ['backout-L5'])" in refusal
    for shown in (("status", decided), ("status", decided, "--json")):
        code, out, err = in_process(*shown)
        assert code == 0 and err == "", err
        if "--json" in shown:
            assert json.loads(out)["sequential"] == {"problem": refusal}
        else:
            assert out.splitlines()[-1] == f"sequential (runs/s/sequential.json): cannot be shown: {refusal}"
            assert out.splitlines()[1].split() == ["baseline", "done:", "seed0", "seed1"]
    write_study(tmp_path, "s", {"backout-L4": {"backout-layers": 4}, "other": {}}, flags=FLAGS)  # baseline removed
    code, out, err = in_process("status", decided)
    assert code == 0 and "cannot be shown:" in out and "records looks of another design (arms" in out


def test_a_dry_run_of_a_decided_study_lists_nothing_to_do(decided, in_process):
    code, out, err = in_process("run", decided, *SEQUENTIAL, "--dry-run")
    assert code == 0, err
    listed = [line for line in out.splitlines() if not line.startswith("sequential ")]
    assert listed and all(line.startswith("done ") for line in listed), out  # baseline/seed3 is no longer "todo"
    code, out, _ = in_process("run", decided, *SEQUENTIAL)  # as the real run, which starts nothing
    assert code == 0 and " start " not in out


def test_a_decided_look_whose_log_was_deleted_is_stale_in_status_dry_run_and_run(tmp_path, decided, in_process):
    deleted = Path("runs/s/backout-L4/seed1.txt")  # as the runner names it: under the relative --runs-dir
    (tmp_path / deleted).unlink()
    code, out, _ = in_process("status", decided)
    assert code == 0
    (look,) = [line for line in out.splitlines() if "backout-L4: n " in line]
    assert look.strip().startswith("STALE look 1 backout-L4") and f"{deleted}, which is missing now" in look, out
    assert "backout-L4: no claim (stale look)" in out
    code, out, _ = in_process("run", decided, *SEQUENTIAL, "--dry-run")
    assert code == 0 and any(line.startswith("sequential STALE look 1 backout-L4") for line in out.splitlines())
    todo = [line for line in out.splitlines() if line.startswith("todo ")]
    assert [line.split("--run-name ")[1] for line in todo] == ["seed1", "seed3", "seed3"], out
    code, _, err = in_process("run", decided, *SEQUENTIAL)
    assert code == 2 and "sequential looks of 1 arm(s) are stale" in err and f"{deleted}, which is missing now" in err
    code, out, err = in_process("run", decided, *SEQUENTIAL, "--redo-stale")
    assert code == 0, out + err
    assert log_is_complete(tmp_path / deleted) and " dropped " in out


def test_a_leftover_temporary_sequential_record_is_cleared_by_the_next_run(tmp_path, decided, in_process):
    leftover = tmp_path / "runs/s/.sequential.json.x1y2z3.tmp"
    leftover.write_text('{"design": ')  # a SIGKILL between the write and the rename
    code, _, _ = in_process("run", decided, *SEQUENTIAL, "--dry-run")
    assert code == 0 and leftover.exists()  # a dry run changes nothing
    code, _, err = in_process("run", decided, *SEQUENTIAL)
    assert code == 0, err
    assert not leftover.exists()


def test_seeds_with_until_decided_are_refused_in_one_line(tmp_path, refused):
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    assert refused(study, *SEQUENTIAL, "--seeds", "0-2") == \
        "error: --until-decided chooses the seeds itself (0, 1, ... in batches, up to --max-seeds): leave out --seeds"
    keyed = write_study(tmp_path, "k", ARMS, flags=FLAGS, extra="until_decided = true")
    assert refused(keyed, "--seeds", "0-2").startswith("error: --until-decided chooses the seeds itself")


def test_a_negative_seed_is_blamed_on_the_seeds_option(tmp_path, refused):
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    assert refused(study, "--seeds", "-1") == "error: --seeds -1: seed -1 is negative; seeds are 0 or more"
    assert refused(study, "--seeds", "0,-3").startswith("error: --seeds 0,-3: seed -3 is negative")


def test_a_zip_that_is_no_torch_checkpoint_is_damaged(tmp_path):
    """Issue 43: a valid zip left as seedK.pt was resumed from (and the run failed until --no-resume)."""
    other_zip = tmp_path / "seed0.pt"
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    assert checkpoint_damage(other_zip) == "a zip file but not torch.save's: no data.pkl in it"
    import torch

    saved = tmp_path / "saved.pt"
    torch.save({"step": 1}, saved)
    assert checkpoint_damage(saved) is None
