"""Reading run logs as they grow: completeness, step progress, time formatting and remaining-time estimates."""

from ablations.progress import StepClock, duration
from ablations.runstate import LogFollower, RunPaths, keep_aside, log_is_complete

SEP = "=" * 100
HEADER = f"step:99/99 val_loss:1.0 train_time:1ms step_avg:1.00ms\n{SEP}\nconfig: {{}}\n{SEP}\n"


def test_complete_only_when_the_log_is_a_finished_run(tmp_path):
    """The runner's "done" is analysis's "finished" (analysis/logs.py: log_problem): missing, empty, stopped, or a
    peak-memory line without the final validation before it are not done."""
    log = tmp_path / "seed0.txt"
    assert not log_is_complete(log)
    log.write_text("")
    assert not log_is_complete(log)
    log.write_text(HEADER + "step:1/2 train_time:1ms step_avg:1.00ms\n")
    assert not log_is_complete(log)
    log.write_text(HEADER + "peak memory allocated: 1 MiB reserved: 2 MiB\n\n")
    assert not log_is_complete(log)
    log.write_text(HEADER + "step:2/2 val_loss:3.0 train_time:2ms step_avg:1.00ms\n"
                   "peak memory allocated: 1 MiB reserved: 2 MiB\n\n")
    assert log_is_complete(log)
    log.write_text(HEADER + "step:2/2 val_loss:3.0 train_time:2ms step_avg:1.00ms\n"
                   "peak memory allocated: 1 MiB reserved: 2 MiB\nstep:3/3 train_time:1ms\n")
    assert not log_is_complete(log)


def test_follower_reads_steps_after_the_header_only(tmp_path):
    log = tmp_path / "seed0.txt"
    follower = LogFollower(log)
    assert follower.poll() == []
    # A step line inside the source code part (before the two separators) is not progress.
    log.write_text(HEADER + "step:0/10 val_loss:10.500000 train_time:0ms step_avg:0.00ms\nstep:1/10 train")
    updates = follower.poll()
    assert [(u.step, u.is_val, u.val_loss) for u in updates] == [(0, True, 10.5)]
    with open(log, "a") as f:
        f.write("_time:5ms step_avg:5.00ms\nstep:1/10 scalars: {\"a\": 1}\nstep:2/10 train_time:9ms step_avg:4.50ms\n")
    updates = follower.poll()
    assert [(u.step, u.total, u.is_val) for u in updates] == [(1, 10, False), (2, 10, False)]
    assert follower.progress.val_loss == 10.5 and follower.progress.val_step == 0
    # The log is replaced (kept aside, run restarted): the follower starts over.
    log.write_text(HEADER + "step:1/10 train_time:5ms step_avg:5.00ms\n")
    assert [u.step for u in follower.poll()] == [1]


def test_keep_aside_never_overwrites(tmp_path):
    paths = RunPaths(tmp_path, "seed1")
    for content in ("first", "second"):
        paths.log.write_text(content)
        kept = keep_aside(paths)
        assert kept is not None and not paths.log.exists()
    assert sorted(p.read_text() for p in paths.kept_aside()) == ["first", "second"]
    assert keep_aside(paths) is None


def test_duration_and_eta():
    assert [duration(s) for s in (None, 5, 65, 3725)] == ["?", "5s", "1m05s", "1h02m"]
    clock = StepClock(started=0.0)
    assert clock.eta(100.0, 10, 110) is None  # start-up time before the first step does not count
    assert clock.eta(120.0, 20, 110) == 180.0  # 10 steps in 20 s, 90 to go


def test_failure_reason_is_the_scripts_error_line_not_torchruns_footer(tmp_path):
    from ablations.runner import _last_attempt, _likely_reason

    out = tmp_path / "seed0.out"
    out.write_text("==== 2026-01-01 00:00:00 python -m torch.distributed.run ... first attempt\n"
                   "error: --val-files: no files match 'old/*.bin'\n"
                   "==== 2026-01-01 00:10:00 python -m torch.distributed.run ... second attempt\n"
                   "W1122 torch.distributed.run: Setting OMP_NUM_THREADS\n"
                   "error: --train-files: no files match 'data/fineweb10B/fineweb_train_*.bin'\n"
                   "Traceback (most recent call last):\n"
                   "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                   "============================================================\n"
                   "[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 2 (pid: 1)\n"
                   "============================================================\n")
    lines = _last_attempt(out)
    assert lines[0].startswith("W1122") and lines[-1].startswith("=====")
    assert _likely_reason(lines) == "error: --train-files: no files match 'data/fineweb10B/fineweb_train_*.bin'"
    assert _likely_reason(["Traceback (most recent call last):", '  File "x.py", line 1',
                           "ValueError: bad shape", "=" * 60]) == "ValueError: bad shape"
    assert _likely_reason(["starting", "step 3 of 10", "-" * 60]) == "step 3 of 10"
