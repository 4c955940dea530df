"""benchmarks/gpu_check.py on the CPU: the plan (groups by memory, the budget split), the stage runner fed stand-in
children (results written as each stage ends, a child past its limit killed), the parsing of a child's log and
console, and the refusals. What needs CUDA (the full-size runs, the attention kernels) waits for a GPU call."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from analysis_logs import our_log_text
from benchmarks.gpu_check import (ALONE_STEPS, TRAINING_RUNS, Job, Plan, Stage, attention_check_main,
                                  attention_verdict, describe, gpu_slug, main, make_plan, pack_by_memory,
                                  read_attention_result, read_training_result, run_plan, run_stage, split_budget,
                                  steady_step_ms, training_job)
from benchmarks.synthetic_shards import make_shards

REPO = Path(__file__).resolve().parents[2]
ALL_SCRIPTS = {"train_gpt_medium.py", "train_gpt.py"}


def plan_for(budget_s, free_gib, tmp_path):
    return make_plan(budget_s, free_gib, tmp_path / "data", tmp_path / "out", scripts_present=ALL_SCRIPTS)


def test_an_h200_compiles_in_two_groups_then_times_the_bases_alone(tmp_path):
    plan = plan_for(480, 139, tmp_path)
    names = [[job.name for job in stage.jobs] for stage in plan.stages]
    assert names == [["r14 baseline", "r18 auto", "small track", "flex = dense mask", "varlen = dense mask"],
                     ["r14 record flags", "r18 flex", "r14 regional"],
                     ["r14 baseline"], ["r18 auto"], ["small track"]]
    assert [stage.phase for stage in plan.stages] == ["compile"] * 2 + ["alone"] * 3
    assert all(sum(job.memory_gib for job in stage.jobs) <= 139 for stage in plan.stages)
    assert sum(stage.timeout_s for stage in plan.stages) <= 480
    assert [what for what, _ in plan.left_out] == ["alone: r14 record flags", "alone: r18 flex", "alone: r14 regional"]
    cold, alone = plan.stages[0].jobs[0].command, plan.stages[2].jobs[0].command
    assert cold[cold.index("--stop-after") + 1] == "3" and alone[alone.index("--stop-after") + 1] == str(ALONE_STEPS)
    # coordinate-descent tuning off in every medium run (the small track has no such flag)
    medium = [job.command for stage in plan.stages for job in stage.jobs
              if any(arg.endswith("train_gpt_medium.py") for arg in job.command)]
    assert len(medium) == 7 and all(c[c.index("--coordinate-descent-tuning") + 1] == "off" for c in medium)


def test_an_h100_runs_one_r14_at_a_time_and_drops_what_the_budget_cannot_hold(tmp_path):
    plan = plan_for(480, 78, tmp_path)
    assert all(sum(job.memory_gib for job in stage.jobs) <= 78 for stage in plan.stages)
    assert all(sum("r14" in job.name for job in stage.jobs) <= 1 for stage in plan.stages)
    assert ("compile 4: r14 regional", "past the budget") in plan.left_out
    # without train_gpt.py in the checkout the small track is left out, saying why
    smaller = make_plan(480, 78, tmp_path, tmp_path, scripts_present={"train_gpt_medium.py"})
    assert ("small track", "train_gpt.py is not in this checkout") in smaller.left_out



def test_only_plans_the_named_jobs_so_a_second_call_finishes_what_the_first_left_out(tmp_path):
    # the 2026-11-30 second call: the record's flags and --compile regional, which the first call's budget left out
    plan = make_plan(230, 139.2, tmp_path / "data", tmp_path / "out", scripts_present=ALL_SCRIPTS,
                     only=["r14 record flags", "r14 regional"])
    assert [[job.name for job in stage.jobs] for stage in plan.stages] == \
        [["r14 record flags", "r14 regional"], ["r14 record flags"]]
    assert plan.left_out == [("alone: r14 regional", "past the budget")]
    # an attention check is a job too; a name not in the check is refused by the command line, not ignored
    checks = make_plan(480, 139, tmp_path, tmp_path, scripts_present=ALL_SCRIPTS, only=["varlen = dense mask"])
    assert [[job.name for job in stage.jobs] for stage in checks.stages] == [["varlen = dense mask"]]
    with pytest.raises(SystemExit) as refused:
        main(["--plan", "--free-gib", "139", "--only", "r14 basline"])
    assert refused.value.code == 2

def test_packing_keeps_order_memory_and_at_most_three_trainings():
    jobs = [Job(f"t{i}", [], "train", memory_gib=m) for i, m in enumerate([50, 60, 30, 10, 10, 200])]
    jobs.append(Job("check", [], "attention", memory_gib=5))
    groups = [[j.name for j in group] for group in pack_by_memory(jobs, 100)]
    # t4 fits t0's group by memory but would be its fourth training; a check is no training
    assert groups == [["t0", "t2", "t3", "check"], ["t1", "t4"], ["t5"]]


def test_budget_split_keeps_stages_in_order_while_they_fit_and_scales_their_limits_up():
    stages = [Stage(name, "compile", [], estimate) for name, estimate in (("a", 100), ("b", 50), ("c", 80), ("d", 20))]
    kept, left_out = split_budget(stages, 220)
    assert [s.name for s in kept] == ["a", "b", "d"] and [s.name for s in left_out] == ["c"]
    assert [s.timeout_s for s in kept] == [129, 64, 25]  # 220/170 of each estimate
    # the first stage runs even when it alone is past the budget: it gets all of it
    kept, left_out = split_budget([Stage("big", "compile", [], 300), Stage("next", "alone", [], 10)], 200)
    assert [(s.name, s.timeout_s) for s in kept] == [("big", 200)] and [s.name for s in left_out] == ["next"]


def test_step_time_from_our_and_upstream_step_lines_leaves_the_first_steps_out():
    text = "\n".join(["step:0/50 val_loss:10.8 train_time:0ms step_avg:0.00ms",
                      "step:1/50 train_time:9000ms step_avg:9000.00ms",
                      "step:2/50 train_time:9500ms step_avg:4750.00ms",
                      "step:3/50 train_time:10000ms step_avg:3333.33ms",
                      "step:4/50 train_time:10400ms step_avg:2600.00ms",
                      "step:5/50 val_loss:7.1 train_time:10850ms step_avg:2170.00ms",
                      "step:5/50 train_time:10850ms step_avg:2170.00ms"])
    assert steady_step_ms(text) == pytest.approx(850 / 2)
    assert steady_step_ms(text, skip=1) == pytest.approx(1850 / 4)
    assert steady_step_ms("step:3/50 train_time:10ms") is None and steady_step_ms("") is None


def training_log(tmp_path, name="run", env=None, config=None, **kwargs):
    path = tmp_path / f"{name}.txt"
    path.write_text(our_log_text(total_steps=12, val_every=100, step_ms=500.0, env=env, config=config,
                                 peak=(19951, 25616), **kwargs))
    return path


def test_a_training_result_reads_figures_attention_and_head(tmp_path):
    log = training_log(tmp_path, env={"r18 attention": "varlen (train_time comparable with the record's only on fa3)",
                                      "lm_head": "fp8 (e4m3 input and weight) in training; bf16 in eval"})
    job = Job("r18 auto", [], "train", str(log), tokens_per_step=131072)
    console = "V1127 [__graph_breaks] Graph break in user code\nV1127 Recompiling function forward\n" * 2
    result = read_training_result(job, 0, False, console, shared=False)
    assert result["passed"] and result["why"] == ""
    assert (result["step_ms"], result["tokens_per_s"], result["peak_mib"]) == (500.0, 262144, 19951)
    assert (result["graph_breaks"], result["recompiles"]) == (2, 2)
    assert (result["attention"], result["head"]) == ("varlen", "fp8")
    line = describe(result)
    assert line.startswith("r18 auto") and "PASS  step 500.0 ms (alone), 262,144 tokens/s, peak 19,951 MiB" in line


def test_the_r14_path_s_attention_comes_from_its_device(tmp_path):
    log = training_log(tmp_path, config={"device": "cuda", "low_precision": "bfloat16"})
    result = read_training_result(Job("r14", [], "train", str(log), 524288), 0, False, "", shared=True)
    assert result["attention"] == "flex (r14/small path)" and result["head"] == "bfloat16 matmul"
    assert "(beside others)" in describe(result)


def test_failures_say_why_in_one_line(tmp_path):
    job = Job("r14", [], "train", str(tmp_path / "missing.txt"), 524288)
    console = "Traceback\n  ...\ntorch.OutOfMemoryError: CUDA out of memory\n"
    crashed = read_training_result(job, 1, False, console, True)
    assert not crashed["passed"] and crashed["why"] == "exit status 1: torch.OutOfMemoryError: CUDA out of memory"
    killed = read_training_result(job, -15, True, "", True)
    assert killed["why"] == "past its time limit (killed)"
    unfinished = read_training_result(Job("r14", [], "train", str(training_log(tmp_path, complete=False)), 1), 0,
                                      False, "", True)
    assert not unfinished["passed"] and unfinished["why"]
    diverged = read_training_result(
        Job("r14", [], "train", str(training_log(tmp_path, "nan", losses=lambda step: float("nan"))), 1), 0, False,
        "", True)
    assert not diverged["passed"] and "not finite" in diverged["why"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the verdict of a machine without CUDA")
def test_an_attention_check_without_cuda_is_a_failed_verdict_the_runner_reads(capsys):
    assert attention_check_main("varlen") == 1
    console = capsys.readouterr().out
    result = read_attention_result(Job("varlen = dense mask", [], "attention"), 1, False, console)
    assert not result["passed"] and result["detail"] == "needs CUDA"
    assert attention_verdict("flex", [1e-3, 2e-3, 3e-3, 4e-3])["passed"]
    assert not attention_verdict("flex", [1e-3, float("nan"), 3e-3, 4e-3])["passed"]
    assert not attention_verdict("flex", [1e-3, 0.5, 3e-3, 4e-3])["passed"]


def child(code):
    return [sys.executable, "-c", code]


@pytest.mark.slow
def test_a_stage_runs_its_children_side_by_side_and_kills_the_one_past_its_limit(tmp_path):
    """Guards the runner's processes: side by side, a time limit, SIGKILL when SIGTERM is ignored."""
    source = training_log(tmp_path, "source")
    good = Job("good", child(f"import shutil, sys; shutil.copy({str(source)!r}, {str(tmp_path / 'good.txt')!r}); "
                             f"print('Graph break in user code', file=sys.stderr)"), "train",
               str(tmp_path / "good.txt"), 1000)
    bad = Job("bad", child("import sys; print('error: --base r19: no such base', file=sys.stderr); sys.exit(2)"),
              "train", str(tmp_path / "bad.txt"), 1000)
    # ignores SIGTERM: stopped by SIGKILL after the grace period
    stuck = Job("stuck", child("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"),
                "train", str(tmp_path / "stuck.txt"), 1000)
    began = time.monotonic()
    results = run_stage(Stage("compile 1", "compile", [good, bad, stuck], 5, timeout_s=15), tmp_path / "out",
                        poll_s=0.1, grace_s=1)
    assert 15 <= time.monotonic() - began < 60
    by_name = {r["run"]: r for r in results}
    assert by_name["good"]["passed"] and by_name["good"]["graph_breaks"] == 1 and by_name["good"]["shared"]
    assert by_name["bad"]["why"] == "exit status 2: error: --base r19: no such base"
    assert by_name["stuck"]["why"] == "past its time limit (killed)"
    assert (tmp_path / "out" / "compile-good.out").exists()


@pytest.mark.slow
def test_each_stage_s_results_are_in_the_file_before_the_next_stage_starts(tmp_path):
    """Guards that a stage's results are written before the next starts (a call killed midway keeps them)."""
    results_path = tmp_path / "results.txt"
    source = training_log(tmp_path, "source")
    first = Job("first", child(f"import shutil; shutil.copy({str(source)!r}, {str(tmp_path / 'first.txt')!r})"),
                "train", str(tmp_path / "first.txt"), 1000)
    # the second stage's child passes only when it finds the first stage's result line already written
    second = Job("second", child(f"import re, shutil, sys; text = open({str(results_path)!r}).read(); "
                                 f"re.search('^first +PASS', text, re.M) or sys.exit(3); "
                                 f"shutil.copy({str(source)!r}, {str(tmp_path / 'second.txt')!r})"),
                 "train", str(tmp_path / "second.txt"), 1000)
    plan = Plan([Stage("compile 1", "compile", [first], 5, 30), Stage("alone: first", "alone", [second], 5, 30)])
    lines = []
    results = run_plan(plan, results_path, tmp_path / "out", report=lines.append)
    assert [r["passed"] for r in results] == [True, True], results
    text = results_path.read_text()
    assert text.index("== compile 1") < text.index("first ") < text.index("== alone: first")
    stored = [json.loads(line[len("json: "):]) for line in text.splitlines() if line.startswith("json: ")]
    assert [(r["run"], r["phase"], r["shared"]) for r in stored] == [("first", "compile", False),
                                                                     ("second", "alone", False)]
    assert lines[0] == "gpu-check: compile 1 (limit 30 s) ..."


def test_results_files_are_named_by_the_gpu_as_the_protocol_asks():
    assert [gpu_slug(name) for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3")] == ["h200", "h100-80gb-hbm3"]


def test_plan_mode_runs_on_a_cpu_and_bad_input_is_one_line(capsys):
    assert main(["--plan", "--free-gib", "139"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: 5 stages in 480 s, 139 GiB free") and "coordinate-descent tuning off" in out
    refusals = [(["--budget", "10"], "error: --budget 10: at least 60 seconds"),
                (["--plan", "--free-gib", "0"], "error: --free-gib 0: must be positive")]
    if not torch.cuda.is_available():
        refusals += [(["--plan"], "error: --plan without a CUDA device needs --free-gib"),
                     ([], "error: gpu-check needs CUDA")]
    for argv, message in refusals:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and len(err.splitlines()) == 1



@pytest.mark.parametrize("argv, message", [
    (["--budget", "nan"], "error: --budget nan: at least 60 seconds and at most 86400 (a day)"),
    (["--budget", "inf"], "error: --budget inf: at least 60 seconds and at most 86400 (a day)"),
    (["--budget", "1e308"], "error: --budget 1e+308: at least 60 seconds and at most 86400 (a day)"),
    (["--free-gib", "nan"], "error: --free-gib nan: must be positive and at most 1024 (GiB of one GPU)"),
    (["--free-gib", "inf"], "error: --free-gib inf: must be positive and at most 1024 (GiB of one GPU)"),
    (["--free-gib", "3"], "error: --free-gib 3: no job of the check fits in it (the smallest needs ~5 GiB)"),
])
def test_non_finite_and_absurd_plan_figures_are_refused_in_one_line(capsys, argv, message):
    """Issue 43: nan and inf budgets raised ValueError / OverflowError, nan GiB was planned with."""
    assert main(["--plan", "--free-gib", "139", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == message + "\n"


def test_a_run_bigger_than_the_free_memory_is_left_out_and_the_free_memory_never_rounded_up(tmp_path, capsys):
    """Issue 43: 19.9 GiB free was shown as "20 GiB" and the ~58 GiB r14 runs planned in it without a word."""
    assert main(["--plan", "--free-gib", "19.9"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: 1 stage in 480 s, 19.9 GiB free on the GPU")
    assert "  not run: r14 baseline (needs ~58 GiB, more than the 19.9 GiB free)" in out
    assert "  not run: r18 auto (needs ~21 GiB, more than the 19.9 GiB free)" in out
    plan = plan_for(480, 19.9, tmp_path)
    assert [job.name for stage in plan.stages for job in stage.jobs] == ["flex = dense mask", "varlen = dense mask"]
    assert all(sum(job.memory_gib for job in stage.jobs) <= 19.9 for stage in plan.stages)
    assert main(["--plan", "--free-gib", "139.99"]) == 0
    assert capsys.readouterr().out.startswith("plan: 5 stages in 480 s, 139.9 GiB free")


@pytest.mark.slow
def test_real_tiny_trainings_side_by_side_are_read_as_a_gpu_call_reads_them(tmp_path):
    """Guards the reading of real logs and consoles (what the stand-ins imitate) of all three bases' runs."""
    (tmp_path / "data").mkdir()
    make_shards(tmp_path / "data", 300_000, 1024 + 2)  # r18 batches whole documents (~1000 tokens each)
    tiny = ("--preset", "tiny", "--val-tokens", "1024")
    jobs = [training_job(run, 5, tmp_path / "data", tmp_path / "out", "cpu", (sys.executable,), tiny)
            for run in TRAINING_RUNS if run.name in ("r14 baseline", "r18 auto", "small track")]
    results = {r["run"]: r for r in run_stage(Stage("rehearsal", "compile", jobs, 0, timeout_s=600),
                                                 tmp_path / "out")}
    for name, attention, head in (("r14 baseline", "sdpa (r14/small path)", "float32 matmul"),
                                  ("r18 auto", "sdpa", "bfloat16 matmul"),
                                  ("small track", "sdpa (r14/small path)", "float32 matmul")):
        result = results[name]
        assert result["passed"], result
        assert (result["attention"], result["head"]) == (attention, head)
        assert result["step_ms"] > 0 and result["tokens_per_s"] > 0 and result["shared"]
        assert (result["graph_breaks"], result["recompiles"]) == (0, 0)  # eager on the CPU


@pytest.mark.slow
def test_a_call_writes_its_header_each_stage_and_the_summary(tmp_path, monkeypatch, capsys):
    """Guards main()'s run path (header, shards, stages, summary) with the GPU and the plan stood in for."""
    import benchmarks.gpu_check as gpu_check
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (139 * 2**30, 140 * 2**30))
    source = training_log(tmp_path, "source")
    planned = []

    def stand_in_plan(budget_s, free_gib, data_dir, out_dir, only):
        planned.append((budget_s, free_gib, data_dir.exists(), only))
        job = Job("r14 baseline", child(f"import shutil; shutil.copy({str(source)!r}, {str(out_dir / 'r14.txt')!r})"),
                  "train", str(out_dir / "r14.txt"), 524288)
        return Plan([Stage("alone: r14 baseline", "alone", [job], 60, 60)], [("alone: r18 auto", "past the budget")],
                    free_gib, budget_s)
    monkeypatch.setattr(gpu_check, "make_plan", stand_in_plan)
    results = tmp_path / "results.txt"
    handler = signal.getsignal(signal.SIGTERM)
    assert main(["--budget", "300", "--results", str(results), "--out-dir", str(tmp_path / "out"),
                 "--only", "r14 baseline"]) == 0
    assert signal.getsignal(signal.SIGTERM) is handler  # a caller in the process keeps its own (this test's pytest)
    assert planned == [(300, 139, False, ["r14 baseline"])]  # the plan comes before the shards; --only reaches it
    assert sorted(p.name for p in (tmp_path / "out" / "data").iterdir()) == ["synthetic_train_000001.bin",
                                                                             "synthetic_val_000000.bin"]
    text = results.read_text()
    assert "device: NVIDIA H200, torch " in text and "139 GiB free at the start" in text
    assert "coordinate-descent tuning: off in every run" in text
    assert "not run: alone: r18 auto (past the budget)" in text
    assert text.index("== alone: r14 baseline") < text.index("r14 baseline             PASS") < text.index(
        "1 of 1 passed")
    assert capsys.readouterr().out.rstrip().endswith(f"gpu-check: results in {results}")


@pytest.mark.slow
def test_a_checker_told_to_stop_stops_its_children_first(tmp_path):
    """Guards that a driver's `timeout` (SIGTERM) leaves no child holding the GPU for the next step."""
    pid_file = tmp_path / "grandchild.pid"
    grandchild = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    checker = subprocess.Popen([sys.executable, "-c", f"""
import sys; sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from benchmarks.gpu_check import Job, Stage, exiting_on_sigterm, run_stage
job = Job("stuck", [sys.executable, "-c", {grandchild!r}], "console")
with exiting_on_sigterm():
    run_stage(Stage("stage", "alone", [job], 300, 300), Path({str(tmp_path / 'out')!r}), poll_s=0.1, grace_s=2)
"""])
    began = time.monotonic()
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() - began < 60 and checker.poll() is None
        time.sleep(0.1)
    checker.send_signal(signal.SIGTERM)
    assert checker.wait(timeout=60) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
