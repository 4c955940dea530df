"""Qualify a CUDA node and time each base, in one call of about 8 minutes (shared/spec/gpu-protocol.md).

    python benchmarks/gpu_check.py [--budget 480] [--results FILE] [--out-dir DIR]      (./run.sh gpu-check)
    python benchmarks/gpu_check.py --plan [--free-gib 139] [--budget 480]              (any machine: the plan only)

Stages, in this order, each with its own time limit (its share of --budget; a child past it is killed) and its
results appended to --results as it ends, so a call killed midway keeps what finished:
1. compile: the training runs cold, side by side as the GPU's free memory allows (torch.cuda.mem_get_info against
   each run's need: r14 ~57 GB by upstream's record log, r18 ~20 GB at its early batch size, the small track
   ~33 GB), a few full-size steps on synthetic shards, world size 1, coordinate-descent tuning off (a cold compile
   with it takes tens of minutes); FlexAttention and torch's varlen against the dense mask (forward and the
   gradients of q, k, v) run beside the first group. A job needing more than the free memory is left out, named.
   Runs: r14 baseline, r14 record flags (backout 11, 5550 steps), r14 --compile regional, r18 (attention auto, and
   flex), the small track (FP8 head).
2. alone: each run again with the GPU to itself, on the caches stage 1 filled, bases first, as many as the budget
   holds: its step time (train_time between two step lines past the first few), tokens/s and peak memory.
Per run: pass/fail (exit 0, a complete log, a finite validation loss below ln(vocab) = the untrained model's),
step time, tokens/s, peak memory, graph breaks and recompiles (TORCH_LOGS), the attention and head that ran.
Exit status: 0 all passed, 1 something failed, 2 bad input or no CUDA.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.logs import LogUnreadable, parse_log  # noqa: E402
from speedrun.logformat import parse_step_line  # noqa: E402

# What each base needs of the GPU and of the clock. Memory (GiB, peak allocated): r14 from upstream #137's record
# log, r18 and the small track measured on 2026-11-27; each process adds its CUDA context (CONTEXT_GIB).
# cold_s: measured on an H200 beside one other process on 2026-11-27 (r14 ~125 s for 3 steps and a validation,
# r18 ~140 s, the small track ~130 s; all with --warmup-steps 0, as here). warm_s: an estimate (the compile caches
# hit; ALONE_STEPS steps of ~2 s for r14 at 8 x 64K tokens on one GPU remain), never a measurement; split_budget
# gives each stage at least its figure.
BASES = {
    "r14": dict(memory_gib=57, cold_s=125, warm_s=60),
    "r18": dict(memory_gib=20, cold_s=140, warm_s=60),
    "small": dict(memory_gib=33, cold_s=130, warm_s=55),
}
CONTEXT_GIB = 1
# What a figure given on the command line may be: more is a slip of the keyboard, not a plan.
MAX_BUDGET_S = 24 * 3600
MAX_FREE_GIB = 1024  # more than any one GPU has
ATTENTION_MEMORY_GIB = 4
ATTENTION_S = 60  # FlexAttention's compile and two small kernels: an estimate
R14_TOKENS_PER_STEP = 8 * 64 * 1024
R18_EARLY_TOKENS_PER_STEP = 131072  # #18's first twelfth (steps < 392): the steps a check times
SMALL_TOKENS_PER_STEP = 8 * 48 * 1024
UNTRAINED_LOSS = math.log(50257)
# One validation step of the medium track (8 x its 4 x 64K-token sequence): the pass criterion, not a figure.
VALIDATION_TOKENS = 8 * 4 * 64 * 1024
# No kernel warm-up in either stage (--warmup-steps 0): the cold stage is for compiling, and alone the first
# SKIPPED_STEPS steps (which load the compiled graphs from the caches) are left out of the step time.
COMPILE_STEPS, ALONE_STEPS, SKIPPED_STEPS = 3, 10, 3


@dataclass(frozen=True)
class TrainingRun:
    name: str
    base: str
    script: str
    flags: tuple
    tokens_per_step: int  # of the steps a check times


# In this order: stage 1's groups fill from the front, stage 2 times the runs alone in it while the budget holds.


TRAINING_RUNS = (
    TrainingRun("r14 baseline", "r14", "train_gpt_medium.py", (), R14_TOKENS_PER_STEP),
    TrainingRun("r18 auto", "r18", "train_gpt_medium.py", ("--base", "r18"), R18_EARLY_TOKENS_PER_STEP),
    TrainingRun("small track", "small", "train_gpt.py", (), SMALL_TOKENS_PER_STEP),
    TrainingRun("r14 record flags", "r14", "train_gpt_medium.py",
                ("--backout-layers", "11", "--num-iterations", "5550"), R14_TOKENS_PER_STEP),
    TrainingRun("r18 flex", "r18", "train_gpt_medium.py", ("--base", "r18", "--attention", "flex"),
                R18_EARLY_TOKENS_PER_STEP),
    TrainingRun("r14 regional", "r14", "train_gpt_medium.py", ("--compile", "regional"), R14_TOKENS_PER_STEP),
)
ATTENTION_CHECKS = ("flex", "varlen")


@dataclass
class Job:
    """One child process: a training run or an attention check."""
    name: str
    command: list
    kind: str  # "train" (judged by its log), "attention" (its verdict line) or "console" (its exit status)
    log_path: str | None = None
    tokens_per_step: int = 0
    memory_gib: float = 0.0


@dataclass
class Stage:
    name: str
    phase: str  # "compile" (cold, side by side) or "alone" (warm, the GPU to itself)
    jobs: list
    estimate_s: float
    timeout_s: float = 0.0


@dataclass
class Plan:
    stages: list
    left_out: list = field(default_factory=list)  # (what, why)
    free_gib: float = 0.0
    budget_s: float = 0.0


# ---------------------------------------------------------------------------------------------------------------
# Planning (no GPU needed)

def training_job(run: TrainingRun, steps, data_dir: Path, out_dir: Path, suffix, launcher, extra_flags=()) -> Job:
    """The run's child: its first `steps` steps on the shards in data_dir, its log in out_dir (extra_flags last, so
    they override: a CPU rehearsal's --preset tiny)."""
    run_name = f"{re.sub(r'[^A-Za-z0-9]+', '-', run.name).strip('-')}-{suffix}"
    flags = list(run.flags) + ["--stop-after", str(steps), "--warmup-steps", "0",
                               "--val-every", "0", "--val-tokens", str(VALIDATION_TOKENS),
                               "--train-files", str(data_dir / "synthetic_train_*.bin"),
                               "--val-files", str(data_dir / "synthetic_val_*.bin"),
                               "--log-dir", str(out_dir), "--run-name", run_name]
    if run.script == "train_gpt_medium.py":
        flags += ["--coordinate-descent-tuning", "off"]
    command = [*launcher, str(ROOT / run.script), *flags, *extra_flags]
    return Job(run.name, command, "train", str(out_dir / f"{run_name}.txt"), run.tokens_per_step,
               BASES[run.base]["memory_gib"] + CONTEXT_GIB)


def attention_job(which) -> Job:
    return Job(f"{which} = dense mask", [sys.executable, str(Path(__file__).resolve()), "--attention-check", which],
               "attention", memory_gib=ATTENTION_MEMORY_GIB + CONTEXT_GIB)


# Cold compiles side by side share the CPU (16 cores on the lent machines): at most this many trainings at once.
MAX_TRAININGS_SIDE_BY_SIDE = 3


def pack_by_memory(jobs, free_gib, max_trainings=MAX_TRAININGS_SIDE_BY_SIDE):
    """Groups of jobs to run side by side, in order, each group's memory within free_gib and at most max_trainings
    training jobs: a job joins the first group it fits (first fit keeps the bases' order); a job bigger than
    free_gib runs in a group of its own."""
    groups = []
    for job in jobs:
        for group in groups:
            trainings = sum(j.kind == "train" for j in group) + (job.kind == "train")
            if sum(j.memory_gib for j in group) + job.memory_gib <= free_gib and trainings <= max_trainings:
                group.append(job)
                break
        else:
            groups.append([job])
    return groups


def split_budget(stages, budget_s):
    """The stages (in priority order, which is also their order of running) that fit budget_s by their estimates,
    with their time limits: each kept stage's estimate, scaled up to fill the budget when there is room. The first
    stage is kept even when it alone is past the budget (it gets all of it). Returns (kept, left out)."""
    kept, left_out, total = [], [], 0.0
    for stage in stages:
        if total + stage.estimate_s <= budget_s or not kept:
            kept.append(stage)
            total += stage.estimate_s
        else:
            left_out.append(stage)
    scale = budget_s / total if total else 1.0  # no stage at all: nothing to scale
    for stage in kept:
        stage.timeout_s = math.floor(stage.estimate_s * scale)
    return kept, left_out


def job_names():
    """What --only may name: the training runs, then the attention checks, as the plan names them."""
    return [r.name for r in TRAINING_RUNS] + [attention_job(which).name for which in ATTENTION_CHECKS]


def make_plan(budget_s, free_gib, data_dir: Path, out_dir: Path, scripts_present=None,
              launcher=(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"),
              only=None) -> Plan:
    """Stage 1: the cold runs and the attention checks, side by side in groups that fit free_gib; stage 2: each
    run alone (bases first). Fitted to budget_s in that order of priority. `only` (job names): these jobs alone,
    for a second call that finishes what a first one left out."""
    present = scripts_present if scripts_present is not None else {p.name for p in ROOT.glob("train_gpt*.py")}
    chosen = [r for r in TRAINING_RUNS if only is None or r.name in only]
    left_out = [(r.name, f"{r.script} is not in this checkout") for r in chosen if r.script not in present]
    jobs = [training_job(r, COMPILE_STEPS, data_dir, out_dir, "cold", launcher) for r in chosen
            if r.script in present] + [job for job in map(attention_job, ATTENTION_CHECKS)
                                       if only is None or job.name in only]
    # A job bigger than the free memory would only run out of it (cold and alone): left out, saying so.
    left_out += [(job.name, f"needs ~{job.memory_gib:g} GiB, more than the {gib_text(free_gib)} GiB free")
                 for job in jobs if job.memory_gib > free_gib]
    jobs = [job for job in jobs if job.memory_gib <= free_gib]
    runs = [r for r in TRAINING_RUNS if r.name in {job.name for job in jobs}]
    groups = pack_by_memory(jobs, free_gib)
    estimate = {r.name: BASES[r.base] for r in runs}
    compile_stages = [Stage(f"compile {i + 1}: " + ", ".join(j.name for j in group), "compile", group,
                            max(estimate[j.name]["cold_s"] if j.kind == "train" else ATTENTION_S for j in group))
                      for i, group in enumerate(groups)]
    alone = [Stage(f"alone: {r.name}", "alone", [training_job(r, ALONE_STEPS, data_dir, out_dir, "alone", launcher)],
                   estimate[r.name]["warm_s"]) for r in runs]
    kept, dropped = split_budget(compile_stages + alone, budget_s)
    left_out += [(s.name, "past the budget") for s in dropped]
    return Plan(kept, left_out, free_gib, budget_s)


def gib_text(gib: float) -> str:
    """GiB to one decimal, rounded down: 19.96 GiB free is never shown as the 20 a 20 GiB job needs."""
    return f"{math.floor(gib * 10) / 10:g}"


def render_plan(plan: Plan) -> str:
    stages = f"{len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''}"
    lines = [f"plan: {stages} in {plan.budget_s:.0f} s, {gib_text(plan.free_gib)} GiB free on the GPU (jobs side by "
             f"side within it); coordinate-descent tuning off"]
    for stage in plan.stages:
        memory = sum(j.memory_gib for j in stage.jobs)
        lines.append(f"  {stage.name}  [{stage.phase}, limit {stage.timeout_s:.0f} s, ~{memory:.0f} GiB]")
        lines += [f"      {' '.join(shlex.quote(str(a)) for a in job.command)}" for job in stage.jobs]
    lines += [f"  not run: {what} ({why})" for what, why in plan.left_out]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Reading a child's output (no GPU needed)

def steady_step_ms(text, skip=SKIPPED_STEPS, last=None):
    """Mean step time (ms) from `step:S/N ... train_time:Tms` lines (ours and upstream's): the train_time gained
    from step `skip` to the last step (or to step `last`) over those steps, so the first steps' compiles (or cache
    loads) and allocations are left out, and any profiled steps after `last`. None when fewer than two such steps
    are there."""
    times = {line.step: line.train_time_ms for line in map(parse_step_line, text.splitlines()) if line is not None}
    steps = sorted(s for s in times if s >= skip and (last is None or s <= last))
    if len(steps) < 2:
        return None
    return (times[steps[-1]] - times[steps[0]]) / (steps[-1] - steps[0])


def count_graph_breaks(console):
    return len(re.findall(r"Graph break", console))


def count_recompiles(console):
    return len(re.findall(r"Recompiling function", console))


def attention_and_head(log_text, config):
    """(attention, head) as the log says: r18 writes `r18 attention: X`, the small track `lm_head: ...`; the path r14
    and the small track share has one attention per device (FlexAttention on CUDA, SDPA on CPU: train_gpt_medium.py's
    --attention help)."""
    # the last match: the log begins with the scripts' source, where such text may stand in a docstring
    attention = re.findall(r"^r18 attention: (\w+)", log_text, re.MULTILINE)
    head = re.findall(r"^lm_head: (.+)$", log_text, re.MULTILINE)
    if attention:
        attention = attention[-1]
    else:
        attention = f"{'flex' if config.get('device') == 'cuda' else 'sdpa'} (r14/small path)"
    if head:
        return attention, head[-1].split(" (")[0]
    # no lm_head line: the head runs in the model's dtype (the r14 path logs it; r18 is always cast to bf16)
    dtype = config.get("low_precision")
    return attention, f"{'bfloat16' if dtype in (None, 'auto') else dtype} matmul"


def last_error_line(console):
    lines = [line.strip() for line in console.splitlines() if line.strip()]
    return next((line for line in reversed(lines) if line.startswith("error:") or "Error" in line),
                lines[-1] if lines else "no output")


def read_training_result(job: Job, returncode, timed_out, console, shared) -> dict:
    """The figures of one finished (or killed) training child from its console output and log."""
    result = dict(run=job.name, kind="train", passed=False, shared=shared, step_ms=None, tokens_per_s=None,
                  peak_mib=None, graph_breaks=count_graph_breaks(console), recompiles=count_recompiles(console),
                  attention=None, head=None, val_loss=None, why="")
    log_text = Path(job.log_path).read_text(errors="replace") if job.log_path and Path(job.log_path).exists() else ""
    if log_text:
        try:
            run = parse_log(job.log_path)
        except LogUnreadable as problem:
            run = None
            result["why"] = f"log unreadable: {problem}"
        if run is not None:
            result["attention"], result["head"] = attention_and_head(log_text, run.config)
            result["peak_mib"] = run.peak_allocated_mib
            result["val_loss"] = run.val_losses[-1] if run.val_losses else None
            result["step_ms"] = steady_step_ms(log_text)
            if result["step_ms"]:
                result["tokens_per_s"] = round(job.tokens_per_step / (result["step_ms"] / 1000))
            loss = result["val_loss"]
            if returncode == 0 and run.complete and loss is not None and math.isfinite(loss) and loss < UNTRAINED_LOSS:
                result["passed"] = True
            elif not result["why"]:
                result["why"] = (run.problem or (f"validation loss {loss} not finite and below ln(vocab)"
                                                 if loss is not None else "no validation line"))
    if timed_out or returncode != 0:
        result["passed"] = False
    if timed_out:
        result["why"] = "past its time limit (killed)"
    elif returncode != 0:
        result["why"] = f"exit status {returncode}: {last_error_line(console)[:200]}"
    elif not log_text and not result["why"]:
        result["why"] = "no log written"
    return result


def read_attention_result(job: Job, returncode, timed_out, console) -> dict:
    """An attention child prints one line `attention-check: {json}`."""
    result = dict(run=job.name, kind="attention", passed=False, why="")
    found = re.search(r"^attention-check: (\{.*\})$", console, re.MULTILINE)
    if timed_out:
        result["why"] = "past its time limit (killed)"
    elif found:
        result.update(json.loads(found.group(1)))
    else:
        result["why"] = f"exit status {returncode}: {last_error_line(console)[:200]}"
    return result


def describe(result) -> str:
    """One line per result, for the console and the results file."""
    status = "PASS" if result["passed"] else "FAIL"
    if result["kind"] == "attention":
        detail = result.get("detail") or result["why"]
        return f"{result['run']:24} {status}  {detail}"

    def figure(key, fmt):
        return "-" if result.get(key) is None else format(result[key], fmt)
    where = "beside others" if result["shared"] else "alone"
    text = (f"{result['run']:24} {status}  step {figure('step_ms', '.1f')} ms ({where}), "
            f"{figure('tokens_per_s', ',')} tokens/s, peak {figure('peak_mib', ',.0f')} MiB, "
            f"{result['graph_breaks']} graph breaks, {result['recompiles']} recompiles, "
            f"attention {result['attention'] or '-'}, head {result['head'] or '-'}, val {figure('val_loss', '.4f')}")
    return text + (f"; {result['why']}" if result["why"] else "")


# ---------------------------------------------------------------------------------------------------------------
# Running stages

def stop_process_group(process, grace_s=10):
    """SIGTERM to the child's process group (torchrun and its worker), SIGKILL if it is still there after grace_s."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 30)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def read_console_result(job: Job, returncode, timed_out, console) -> dict:
    """A child judged by its exit alone; its console kept for the caller to read."""
    why = ("past its time limit (killed)" if timed_out else
           f"exit status {returncode}: {last_error_line(console)[:200]}" if returncode != 0 else "")
    return dict(run=job.name, kind="console", passed=not why, why=why, console=console)


def run_stage(stage: Stage, out_dir: Path, env=None, poll_s=1.0, cwd=ROOT, grace_s=10) -> list:
    """Starts every job of the stage side by side, each in its own process group with its console in a file,
    waits on these named processes only until all end or the stage's limit passes (then stops the rest), and
    returns one result per job."""
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if env is None else env, TORCH_LOGS="graph_breaks,recompiles")
    started = []
    for job in stage.jobs:
        console_path = out_dir / (re.sub(r"[^A-Za-z0-9]+", "-", f"{stage.phase}-{job.name}").strip("-") + ".out")
        console = console_path.open("w")
        process = subprocess.Popen(job.command, cwd=cwd, env=env, stdout=console, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        started.append((job, process, console, console_path))
    deadline = time.monotonic() + stage.timeout_s
    timed_out = set()
    try:
        while any(p.poll() is None for _, p, _, _ in started) and time.monotonic() < deadline:
            time.sleep(poll_s)
    finally:  # past the limit, or this process told to stop (exiting_on_sigterm): no child outlives the stage
        for job, process, _, _ in started:
            if process.poll() is None:
                timed_out.add(job.name)
                stop_process_group(process, grace_s)
    results = []
    for job, process, console, console_path in started:
        console.close()
        text = console_path.read_text(errors="replace")
        returncode, killed = process.returncode, job.name in timed_out
        if job.kind == "attention":
            results.append(read_attention_result(job, returncode, killed, text))
        elif job.kind == "console":
            results.append(read_console_result(job, returncode, killed, text))
        else:
            results.append(read_training_result(job, returncode, killed, text, shared=len(stage.jobs) > 1))
        results[-1].update(stage=stage.name, phase=stage.phase)
    return results


@contextlib.contextmanager
def exiting_on_sigterm():
    """Within: SIGTERM (a driver's `timeout`) exits through Python, so run_stage stops its children on the way out
    (they run in process groups of their own, which the signal does not reach). The previous handler comes back
    after: a caller in the same process (a test) keeps its own."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def append_results(path: Path, stage: Stage, results, elapsed_s):
    """The stage's lines, written and flushed before the next stage starts."""
    with path.open("a") as f:
        f.write(f"\n== {stage.name} ({stage.phase}, limit {stage.timeout_s:.0f} s, took {elapsed_s:.0f} s)\n")
        for result in results:
            f.write(describe(result) + "\n")
            f.write("json: " + json.dumps(result, sort_keys=True) + "\n")


def run_plan(plan: Plan, results_path: Path, out_dir: Path, env=None, report=print) -> list:
    everything = []
    for stage in plan.stages:
        report(f"gpu-check: {stage.name} (limit {stage.timeout_s:.0f} s) ...")
        began = time.monotonic()
        results = run_stage(stage, out_dir, env)
        append_results(results_path, stage, results, time.monotonic() - began)
        for result in results:
            report("  " + describe(result))
        everything += results
    return everything


def summary(results) -> str:
    failed = [r["run"] for r in results if not r["passed"]]
    return (f"{len(results) - len(failed)} of {len(results)} passed"
            + (f"; failed: {', '.join(failed)} (a failure is a result: record it)" if failed else ""))


# ---------------------------------------------------------------------------------------------------------------
# The attention checks (run in a child, on CUDA)

# bf16 kernels against fp32 on the dense mask: bf16 keeps 8 bits of mantissa, so differences of a few 1e-3 of the
# largest value are rounding; a wrong mask gives differences of the order of the values themselves.
ATTENTION_TOLERANCE = 2e-2


def relative_errors(candidate, reference):
    return [((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(candidate, reference)]


def outputs_and_grads(attention, inputs, upstream_grad, dtype):
    """attention's output and the gradients of its inputs, for inputs cast to dtype."""
    leaves = [t.to(dtype).requires_grad_() for t in inputs]
    out = attention(*leaves)
    out.backward(upstream_grad.to(dtype))
    return [out] + [t.grad for t in leaves]


def attention_verdict(name, errors) -> dict:
    detail = ", ".join(f"{what} {err:.1e}" for what, err in zip(("out", "dq", "dk", "dv"), errors))
    passed = all(math.isfinite(e) and e < ATTENTION_TOLERANCE for e in errors)
    return dict(passed=passed, detail=f"max |diff| / max |dense| (bf16 vs fp32): {detail} "
                                      f"(tolerance {ATTENTION_TOLERANCE:g})", name=name)


def flex_check(device="cuda") -> dict:
    """The r14 path's FlexAttention with its block masks against SDPA on the dense mask."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from speedrun.data import BOS_TOKEN
    from speedrun.layers import attend, dense_window_mask, flex_block_masks

    seq_len, block, window_blocks = 8192, 128, 7
    g = torch.Generator(device=device).manual_seed(0)
    seq = torch.randint(0, 50257, (seq_len,), device=device, generator=g)
    seq[torch.rand(seq_len, device=device, generator=g) < 2e-3] = BOS_TOKEN
    seq[0] = BOS_TOKEN
    q, k, v, upstream_grad = (torch.randn(1, 8, seq_len, 128, device=device, generator=g) for _ in range(4))
    window = torch.tensor(window_blocks, device=device)
    block_mask = flex_block_masks(seq, [window], block)[0]
    flex = outputs_and_grads(lambda *x: torch.compile(flex_attention)(*x, block_mask=block_mask, scale=0.12),
                             (q, k, v), upstream_grad, torch.bfloat16)
    dense_mask = dense_window_mask(seq, window, block)
    dense = outputs_and_grads(lambda *x: attend(*x, dense_mask, 0.12), (q, k, v), upstream_grad, torch.float32)
    return attention_verdict("flex", relative_errors(flex, dense))


def varlen_check(device="cuda") -> dict:
    """r18's torch varlen attention (documents, a token window) against SDPA on the same dense mask."""
    import torch

    from speedrun.r18.attention import resolve_attention, varlen_attend

    resolve_attention("varlen", device)  # loads it; a UsageError names why it cannot run
    seq_len, heads, dim, window = 8192, 8, 128, 1000
    g = torch.Generator(device=device).manual_seed(0)
    cuts = torch.sort(torch.randint(1, seq_len, (7,), device=device, generator=g)).values
    cu_seqlens = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), seq_len)]).to(torch.int32)
    q, k, v, upstream_grad = (torch.randn(seq_len, heads, dim, device=device, generator=g) for _ in range(4))
    max_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    scale = dim ** -0.5

    def attention(name):
        return lambda *x: varlen_attend(name, *x, cu_seqlens, max_len, window, scale)
    varlen = outputs_and_grads(attention("varlen"), (q, k, v), upstream_grad, torch.bfloat16)
    dense = outputs_and_grads(attention("sdpa"), (q, k, v), upstream_grad, torch.float32)
    return attention_verdict("varlen", relative_errors(varlen, dense))


ATTENTION_CHECK_FUNCTIONS = {"flex": flex_check, "varlen": varlen_check}


def attention_check_main(which) -> int:
    import torch
    try:
        verdict = (ATTENTION_CHECK_FUNCTIONS[which]() if torch.cuda.is_available()
                   else dict(passed=False, detail="needs CUDA", name=which))
    except Exception as problem:  # a failing kernel is the check's result, not a crash of the checker
        verdict = dict(passed=False, detail=f"{type(problem).__name__}: {problem}"[:300], name=which)
    print("attention-check: " + json.dumps(verdict), flush=True)
    return 0 if verdict["passed"] else 1


# ---------------------------------------------------------------------------------------------------------------

def make_parser():
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=480, help="seconds for every stage together")
    parser.add_argument("--results", type=Path, help="append each stage's results here as it ends "
                        "(default: benchmarks/results/<date>_<gpu>_gpu-check.txt)")
    parser.add_argument("--out-dir", type=Path, help="children's consoles and logs (default: a temporary folder)")
    parser.add_argument("--plan", action="store_true", help="print the stages and their limits, run nothing")
    parser.add_argument("--free-gib", type=float, help="GPU memory to plan with (default: torch.cuda.mem_get_info)")
    parser.add_argument("--only", action="append", choices=job_names(), metavar="JOB",
                        help="run only this job (repeatable; default every one): " + ", ".join(job_names()))
    parser.add_argument("--attention-check", choices=ATTENTION_CHECKS, help=argparse.SUPPRESS)
    return parser


def gpu_slug(name):
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-")


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    if args.attention_check:
        return attention_check_main(args.attention_check)
    if not 60 <= args.budget <= MAX_BUDGET_S:  # also refuses nan
        print(f"error: --budget {args.budget:g}: at least 60 seconds and at most {MAX_BUDGET_S} (a day)",
              file=sys.stderr)
        return 2
    if args.free_gib is not None and not 0 < args.free_gib <= MAX_FREE_GIB:
        print(f"error: --free-gib {args.free_gib:g}: must be positive and at most {MAX_FREE_GIB} (GiB of one GPU)",
              file=sys.stderr)
        return 2
    import torch
    cuda = torch.cuda.is_available()
    if not cuda and not args.plan:
        print(f"error: gpu-check needs CUDA and this torch {torch.__version__} sees no CUDA device "
              f"(--plan shows what it would run)", file=sys.stderr)
        return 2
    if args.free_gib is None and not cuda:
        print("error: --plan without a CUDA device needs --free-gib (the GPU memory to plan with)", file=sys.stderr)
        return 2
    free_gib = args.free_gib if args.free_gib is not None else torch.cuda.mem_get_info()[0] / 2**30
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = (args.out_dir or Path(tmp) / "out").resolve()
        data_dir = out_dir / "data"
        plan = make_plan(args.budget, free_gib, data_dir, out_dir, only=args.only)
        if not plan.stages:
            smallest = CONTEXT_GIB + min(ATTENTION_MEMORY_GIB, *(base["memory_gib"] for base in BASES.values()))
            where = f"--free-gib {args.free_gib:g}" if args.free_gib is not None else \
                f"{gib_text(free_gib)} GiB free on the GPU"
            print(f"error: {where}: no job of the check fits in it (the smallest needs ~{smallest:g} GiB)",
                  file=sys.stderr)
            return 2
        print(render_plan(plan), flush=True)
        if args.plan:
            return 0
        from benchmarks.synthetic_shards import make_shards
        data_dir.mkdir(parents=True, exist_ok=True)
        # enough for 12 steps of r14 (8 x 64K tokens) and the one validation step, and a little more
        make_shards(data_dir, (ALONE_STEPS + 4) * R14_TOKENS_PER_STEP, VALIDATION_TOKENS + 2)
        device = torch.cuda.get_device_name(0)
        results_path = args.results or (ROOT / "benchmarks/results" /
                                        f"{datetime.date.today().isoformat()}_{gpu_slug(device)}_gpu-check.txt")
        results_path.parent.mkdir(parents=True, exist_ok=True)
        with results_path.open("a") as f:
            f.write(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}\n"
                    f"device: {device}, torch {torch.__version__}, {gib_text(free_gib)} GiB free at the start\n"
                    f"command: {' '.join(shlex.quote(a) for a in sys.argv)}\n"
                    f"coordinate-descent tuning: off in every run\n{render_plan(plan)}\n")
        with exiting_on_sigterm():
            results = run_plan(plan, results_path, out_dir, report=lambda line: print(line, flush=True))
        line = summary(results)
        with results_path.open("a") as f:
            f.write(f"\n{line}\n")
        print(line)
        print(f"gpu-check: results in {results_path}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
