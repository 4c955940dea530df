"""--init-schedule: a run started from a checkpoint restarts the learning-rate / window schedules, or continues
them from the checkpoint's position in its own schedule. CPU, tiny preset."""
from argparse import Namespace

import pytest

import train_gpt_medium as T
from analysis.logs import parse_log
from speedrun.schedule import run_schedule_origin, schedule_clock, schedule_origin
from speedrun.optimizers import lr_factor

CFG = T.ModelConfig(block_size=16, max_window_tokens=48)


def test_restart_is_the_runs_own_schedule():
    clock = schedule_clock(None, 8)
    assert [clock(t) for t in (0, 3, 8)] == [(0, 8), (3, 8), (8, 8)]


def test_continue_covers_the_rest_of_the_checkpoints_schedule():
    # Checkpoint at step 12 of 20; a run of 8 steps covers the remaining 8 schedule steps one for one ...
    clock = schedule_clock([12, 20], 8)
    assert [clock(t) for t in (0, 1, 8)] == [(12, 20), (13, 20), (20, 20)]
    # ... a run of 4 steps covers them two at a time, and a run of 16 half a step at a time.
    assert [schedule_clock([12, 20], 4)(t) for t in (0, 1, 4)] == [(12, 20), (14, 20), (20, 20)]
    assert schedule_clock([12, 20], 16)(1) == (12.5, 20)
    # The track's schedules read at the first step are the checkpoint's: window and learning rate.
    assert T.window_blocks_at(*clock(0), CFG) == T.window_blocks_at(12, 20, CFG)
    assert lr_factor(*clock(0)) == lr_factor(12, 20) < 1
    # A finished checkpoint stays at its schedule's end: the lowest learning rate, the full window.
    finished = schedule_clock([20, 20], 5)
    assert all(finished(t) == (20, 20) for t in range(6))
    assert lr_factor(*finished(3)) == pytest.approx(0.01)


def test_schedule_origin_reads_the_checkpoint():
    state = dict(step=12, config=dict(num_iterations=20))
    assert schedule_origin("continue", state, "c.pt") == [12, 20]
    assert schedule_origin("restart", state, "c.pt") is None
    assert schedule_origin("continue", None, "c.pt") is None


@pytest.mark.parametrize("state,needle", [
    (dict(model={}), "c.pt: checkpoint records no schedule position"),
    (dict(step=30, config=dict(num_iterations=20)), "c.pt: checkpoint step 30 is outside its schedule of 20"),
])
def test_a_checkpoint_without_a_usable_position_is_refused(state, needle):
    with pytest.raises(T.UsageError, match=needle):
        schedule_origin("continue", state, "c.pt")


def test_a_resumed_run_keeps_the_schedule_it_started_with():
    started = Namespace(init_schedule="continue", init_from="c.pt", num_iterations=8)
    origin = run_schedule_origin(started, dict(step=12, config=dict(num_iterations=20)), None)
    assert origin == [12, 20] and schedule_clock(origin, 8)(1) == (13, 20)
    # --resume cannot take --init-from: the origin comes from the resumed run's own config (its checkpoint).
    resumed = Namespace(init_schedule="restart", init_from=None, num_iterations=8)
    origin = run_schedule_origin(resumed, None, dict(config=dict(init_schedule_origin=[12, 20])))
    assert origin == [12, 20] and schedule_clock(origin, 8)(5) == (17, 20)


def test_init_schedule_needs_init_from(tiny_data_args, capsys):
    assert T.main(tiny_data_args + ["--init-schedule", "continue"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --init-schedule needs --init-from\n"


def val_losses(path):
    return parse_log(path).val_losses


@pytest.mark.slow
def test_continued_run_starts_where_the_checkpoint_stopped(tiny_data_args, tmp_path):
    """Guards: --init-schedule continue from a real run's checkpoint repeats its last val loss; restart moves far."""
    small = tiny_data_args + ["--train-seq-len", "32", "--val-seq-len", "64", "--val-tokens", "512",
                              "--log-dir", str(tmp_path)]
    # A finished 6-step run (its schedule ends in the learning-rate cooldown, at the full window).
    assert T.main(small + ["--run-name", "base", "--num-iterations", "6", "--val-every", "0",
                           "--save-final-checkpoint"]) == 0
    checkpoint_loss = val_losses(tmp_path / "base.txt")[-1]
    for schedule in ("continue", "restart"):
        assert T.main(small + ["--run-name", schedule, "--init-from", str(tmp_path / "base.pt"), "--init-schedule",
                               schedule, "--num-iterations", "6", "--stop-after", "2", "--val-every", "2"]) == 0
    cont, restart = val_losses(tmp_path / "continue.txt"), val_losses(tmp_path / "restart.txt")
    # Step 0: the continued run validates at the checkpoint's window, so it reproduces its last validation.
    assert cont[0] == checkpoint_loss
    # After two steps: continuing at the end of the cooldown barely moves the loss; restarting at the full learning
    # rate (and the one-block window) moves it far.
    assert abs(restart[1] - checkpoint_loss) > 10 * abs(cont[1] - checkpoint_loss)
