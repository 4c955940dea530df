"""benchmarks/vs_upstream.py on the CPU with stand-in record logs of upstream's shape (a script, a line of 100 '=',
its output): written here, since the repository never stores upstream code. The stand-in #137 script holds the
lines the edits target and runs on the CPU once edited, so the edits' effect (8 micro-batches a step, no validation,
the stop) is checked by running it. The real #137 and #18 logs were checked by hand
(benchmarks/results/2026-11-27_cpu_vs-upstream-edit-lists.txt)."""
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.vs_upstream import RECORDS, TRAIN_GLOB, VAL_GLOB, comparison_lines, main, make_data, run_alone

SEPARATOR = "=" * 100
REPO = Path(__file__).resolve().parents[2]

STAND_IN_137 = '''import os
import time

world_size = int(os.environ.get("WORLD_SIZE", "1"))
assert world_size == 8  # this code is designed for 8xH100
coordinate_descent_tuning = (
    True  # we allow this flag for medium track
)


class Hyperparameters:
    num_iterations = 50
    val_loss_every = (
        125  # every how many steps to evaluate val loss? 0 for only at the end
    )


class Loss:
    def __truediv__(self, n):
        scales.append(n)
        return self

    def backward(self):
        pass


def model(inputs, targets, window):
    micro_batches.append(inputs)
    return Loss()


def get_window_size_blocks(step):
    return 1


args = Hyperparameters()
micro_batches, scales = [], []
train_loader = iter([(i, i) for i in range(10000)])
t0 = time.perf_counter()
train_steps = args.num_iterations
for step in range(train_steps + 1):
    last_step = step == train_steps
    if last_step or (args.val_loss_every > 0 and step % args.val_loss_every == 0):
        print(f"step:{step}/{train_steps} val_loss:10.8 train_time:0ms step_avg:0.00ms")
    if last_step:
        break
    inputs, targets = next(train_loader)
    model(inputs, targets, get_window_size_blocks(step)).backward()
    time.sleep(0.02)
    print(f"micro_batches:{len(micro_batches)} scales:{set(scales)}")  # what the edits did, beside the step line
    print(f"step:{step + 1}/{train_steps} train_time:{1000 * (time.perf_counter() - t0):.0f}ms step_avg:0.00ms")
'''

STAND_IN_18 = '''# torch._inductor.config.coordinate_descent_tuning = True # banned
from kernels import get_kernel

flash_attn_interface = get_kernel('varunneal/flash-attention-3').flash_attn_interface


def attend(q, k, v, seqlens, max_len, attn_scale, bm_size):
        y = flash_attn_interface.flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=seqlens, cu_seqlens_k=seqlens,
                                                        max_seqlen_q=max_len, max_seqlen_k=max_len,
                                                        causal=True, softmax_scale=attn_scale, window_size=(bm_size, 0))
        return y


class Hyperparameters:
    val_loss_every: int = 250  # every how many steps to evaluate val loss? 0 for only at the end


transition_steps = [0, 392]
warmup_steps = sorted(set(s + offset for s in transition_steps for offset in [-1, 0, 1] if s + offset >= 0))
train_steps = 4740
for step in range(train_steps + 1):
    last_step = (step == train_steps)
'''


def stand_in_log(tmp_path, script, name="record.txt"):
    path = tmp_path / name
    path.write_text(script + SEPARATOR + "\nRunning PyTorch 2.8.0\n" + SEPARATOR + "\nstep:0/50 val_loss:10.8 "
                    "train_time:0ms step_avg:0.25ms\npeak memory allocated: 1 MiB reserved: 2 MiB\n")
    return path


def dry_run(capsys, log, tmp_path, *flags):
    code = main(["--log", str(log), "--dry-run", "--work-dir", str(tmp_path / "work"), "--steps", "8", "--skip", "2",
                 *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_137_stand_in_gets_five_edits_and_the_same_coordinate_descent_setting_as_ours(tmp_path, capsys):
    code, out, err = dry_run(capsys, stand_in_log(tmp_path, STAND_IN_137), tmp_path)
    assert code == 0 and err == ""
    assert out.startswith("edits of upstream #137's script (5):")
    assert "  2. 8 accumulated 64K-token micro-batches per step, each loss scaled by 1/8" in out
    assert "coordinate-descent tuning: off on both sides" in out
    ours = next(line for line in out.splitlines() if line.startswith("ours:"))
    assert "--coordinate-descent-tuning off" in ours and "--stop-after 8" in ours and "--base" not in ours
    assert "coordinate_descent_tuning = (\n    False" in (tmp_path / "work" / "upstream_137.py").read_text()
    # on leaves #137's line alone
    code, out, _ = dry_run(capsys, stand_in_log(tmp_path, STAND_IN_137), tmp_path, "--coordinate-descent-tuning", "on")
    assert code == 0 and "(4):" in out.splitlines()[0] and "--coordinate-descent-tuning on" in out



def test_profiled_steps_come_after_the_timed_ones_on_both_sides_through_the_same_wrapper(tmp_path, capsys):
    code, out, err = dry_run(capsys, stand_in_log(tmp_path, STAND_IN_137), tmp_path, "--profile-steps", "3")
    assert code == 0 and err == ""
    window = "kernel_profile.py --marker Muon --from-step 9 --steps 3 --out "
    ours, upstream = (next(line for line in out.splitlines() if line.startswith(side)) for side in ("ours:", "upstream:"))
    assert window in ours and "--stop-after 12" in ours and window in upstream
    # 8 timed steps, one to open the window on a finished step, 3 profiled: both stop after 12
    assert "    if step == 12:  # vs_upstream: stop" in (tmp_path / "work" / "upstream_137.py").read_text()
    code, _, err = dry_run(capsys, stand_in_log(tmp_path, STAND_IN_137), tmp_path, "--profile-steps", "-1")
    assert code == 2 and err == "error: --profile-steps -1: at least 0\n"

@pytest.mark.slow
def test_the_edited_137_stand_in_does_one_step_as_eight_scaled_micro_batches_and_stops_without_validation(
        tmp_path, capsys):
    """Guards what the edits do (run, not read): 8 micro-batches / 8 a step, no validation, the stop."""
    dry_run(capsys, stand_in_log(tmp_path, STAND_IN_137), tmp_path)
    run = subprocess.run([sys.executable, str(tmp_path / "work" / "upstream_137.py")], capture_output=True,
                         text=True, timeout=120, cwd=tmp_path, env={"WORLD_SIZE": "1", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "val_loss" not in run.stdout and len(lines) == 2 * 8
    assert lines[-2:] == ["micro_batches:64 scales:{8}", lines[-1]] and lines[-1].startswith("step:8/50 ")


def test_the_18_stand_in_gets_torch_varlen_on_both_sides_and_says_so(tmp_path, capsys):
    code, out, err = dry_run(capsys, stand_in_log(tmp_path, STAND_IN_18), tmp_path)
    assert code == 0 and err == "" and out.startswith("edits of upstream #18's script (6):")
    assert "FlashAttention-3 (kernels) replaced by torch's varlen_attn on both sides" in out
    assert "--base r18 --attention varlen" in out
    edited = (tmp_path / "work" / "upstream_18.py").read_text()
    assert "get_kernel" not in edited and "flash_attn" not in edited
    assert "y = varlen_attn(q[0], k[0], v[0], seqlens, seqlens, max_len, max_len, scale=attn_scale," in edited
    assert "if 0 <= s + offset < 8))" in edited and "    if step == 8:" in edited
    compile(edited, "edited", "exec")


@pytest.mark.parametrize("change, message", [
    (lambda s: s.replace("    inputs, targets = next(train_loader)\n", "    inputs, targets = next(loader)\n"),
     "edit '8 accumulated 64K-token micro-batches per step, each loss scaled by 1/8': its target is found 0 times"),
    (lambda s: s + "    last_step = step == train_steps\n",
     "edit 'stop after 8 steps, without the final validation': its target is found 2 times, not once"),
    (lambda s: s.replace("assert world_size == 8  # this code is designed for 8xH100", "pass"),
     "not the script of a record this compares (#137 or #18): none of their marker lines found"),
    (lambda s: s + "x = (\n", "the text before the log's first '=' line is not a Python script"),
])
def test_a_script_the_edits_do_not_fit_is_refused_in_one_line(tmp_path, capsys, change, message):
    log = stand_in_log(tmp_path, change(STAND_IN_137))
    code, out, err = dry_run(capsys, log, tmp_path)
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"error: {log}: {message}")


def test_a_log_without_the_separator_or_a_file_is_refused(tmp_path, capsys):
    text_only = tmp_path / "notes.txt"
    text_only.write_text("print('hello')\n")
    code, _, err = dry_run(capsys, text_only, tmp_path)
    assert code == 2 and err == f"error: {text_only}: no line of 100 '=' in it: not an upstream record log " \
                                f"(script, then a line of 100 '=', then the output)\n"
    code, _, err = dry_run(capsys, tmp_path / "missing.txt", tmp_path)
    assert code == 2 and err.startswith(f"error: --log {tmp_path / 'missing.txt'}: No such file")
    code, _, err = dry_run(capsys, text_only, tmp_path, "--steps", "2")
    assert code == 2 and err.startswith("error: --steps 2 --skip 2: need")


@pytest.mark.parametrize("budget", ["nan", "inf", "1e308", "29"])
def test_a_budget_that_is_not_a_number_of_seconds_is_refused_in_one_line(tmp_path, capsys, budget):
    """Issue 43: --budget nan passed the `< 30` check and raised at round()."""
    code, out, err = dry_run(capsys, stand_in_log(tmp_path, STAND_IN_137), tmp_path, "--budget", budget)
    assert code == 2 and out == "" and err.startswith(f"error: --budget {float(budget):g}: at least 30 seconds")
    assert err.count("\n") == 1


def test_a_work_dir_naming_a_file_is_refused_in_one_line(tmp_path, capsys):
    """Issue 43: FileExistsError's traceback."""
    log = stand_in_log(tmp_path, STAND_IN_137)
    taken = tmp_path / "taken"
    taken.write_text("")
    code, out, err = dry_run(capsys, log, tmp_path, "--work-dir", str(taken))
    assert code == 2 and out == "" and err == f"error: --work-dir {taken}: a file, not a folder\n"
    code, out, err = dry_run(capsys, log, tmp_path, "--work-dir", str(taken / "below"))
    assert code == 2 and out == "" and err == f"error: --work-dir {taken / 'below'}: cannot be made (Not a directory)\n"


@pytest.mark.slow
def test_a_script_run_alone_gives_its_step_time_from_its_step_lines(tmp_path, capsys):
    """Guards the timing of a script run alone (its console's step lines, a failure's last line)."""
    dry_run(capsys, stand_in_log(tmp_path, STAND_IN_137), tmp_path)
    work = tmp_path / "work"
    step_ms, why = run_alone("upstream", [sys.executable, str(work / "upstream_137.py")], work, 60, skip=2)
    assert why == "" and 15 < step_ms < 500  # 20 ms of sleep per step
    assert (work / "consoles" / "alone-upstream.out").read_text().count("step:") == 8
    step_ms, why = run_alone("broken", [sys.executable, "-c", "raise SystemExit('boom')"], work, 60, skip=2)
    assert step_ms is None and why == "exit status 1: boom"
    # the shards both sides glob, relative to the working folder, with upstream's names
    make_data(work, 2)
    assert [len(list(work.glob(pattern))) for pattern in (TRAIN_GLOB, VAL_GLOB)] == [1, 1]


def test_the_comparison_gives_both_times_the_ratio_and_the_goal():
    record = next(r for r in RECORDS if r.name == "#137")
    lines = comparison_lines(record, "NVIDIA H200", (490.0, ""), (500.0, ""), 0.98)
    assert lines == ["GPU: NVIDIA H200", "record: upstream #137", "ours:     490.00 ms/step",
                     "upstream: 500.00 ms/step", "ours / upstream: 0.9800 (goal <= 0.98: met)"]
    lines = comparison_lines(record, "NVIDIA H100", (None, "past its time limit (killed)"), (500.0, ""), 0.98)
    assert lines[2] == "ours:     no figure (past its time limit (killed))" and len(lines) == 4


@pytest.mark.slow
def test_the_prepared_device_script_rehearses_on_the_cpu(tmp_path):
    """Guards benchmarks/gpu_window.sh's dry run end to end (its arguments, both children, the budgets it passes)."""
    log = stand_in_log(tmp_path, STAND_IN_137)
    env = {"PATH": "/usr/bin:/bin", "PY": sys.executable, "OUT": str(tmp_path / "out"), "FREE_GIB": "78",
           "GPU_CHECK_BUDGET": "400"}
    script = str(REPO / "benchmarks" / "gpu_window.sh")
    run = subprocess.run([script, str(log), "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("plan: 3 stages in 400 s, 78 GiB free on the GPU")
    assert "edits of upstream #137's script (5):" in run.stdout and "--budget" not in run.stderr
    refused = subprocess.run([script, str(tmp_path / "missing.txt")], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and refused.stderr.startswith("gpu_window.sh: no such upstream record log")
    refused = subprocess.run([script, str(log), "--now"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "unknown option --now" in refused.stderr
