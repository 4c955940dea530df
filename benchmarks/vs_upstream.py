"""Our step time against upstream's own script, on one GPU, in one call: the ratio the speed goals are stated in
(ours <= 0.98 of #137's step time, <= 1.00 of #18's; shared/spec/gpu-protocol.md).

    python benchmarks/vs_upstream.py --log UPSTREAM_RECORD_LOG [--steps 12] [--skip 4] [--budget 300] [--dry-run]

The user supplies an upstream record log (it begins with the script's source, then a line of 100 '='); this
repository never stores upstream code. The script is cut from the log's head and changed by the fewest exact-string
edits (each found exactly once, else a one-line refusal) so it does on one GPU the work per step ours does:
- #137 (2025-09-30, medium): world size 1 allowed; 8 accumulated 64K-token micro-batches per step, each loss scaled
  by 1/8 (what 8 GPUs averaging their gradients compute); coordinate-descent tuning as ours (off by default).
- #18 (2025-12-31, medium): FlashAttention-3 from the `kernels` package (not loadable offline) replaced by torch's
  varlen_attn with the same arguments ours passes (ours runs --attention varlen); its kernel warm-up limited to the
  steps the run meets (ours warms only the graphs its run meets). #18 already accumulates 8 // world_size.
- Both: no validation during the run, and a stop after --steps steps without the final validation. Data: synthetic
  shards under the working folder's data/fineweb10B/ with upstream's names, since upstream globs relative to its
  working folder (#137 with Path.cwd().glob): no edit.
Each script then runs alone (ours first, on the caches gpu-check filled; upstream second, after its own kernel
warm-up, which compiles it); the step time is the train_time gained from step --skip to the last over those steps,
read from the step lines both write, so ours' first steps (loading its graphs, --warmup-steps 0) are left out too.
Printed: the edit list, both absolute step times, ours / upstream, and the GPU's name.
--dry-run stops after writing the edited script (any machine, no CUDA).
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_check import (MAX_BUDGET_S, VALIDATION_TOKENS, Job, Stage, exiting_on_sigterm,  # noqa: E402
                                  run_stage, steady_step_ms)
from speedrun.logformat import SEPARATOR  # noqa: E402  (upstream's logs use the same line of 100 '=')
LAUNCHER = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1")
MICRO_BATCHES = 8  # the 8 GPUs of a record, accumulated on one
# Upstream's data names under the working folder, which both sides glob from (#137 with Path.cwd().glob).
TRAIN_GLOB, VAL_GLOB = "data/fineweb10B/fineweb_train_*.bin", "data/fineweb10B/fineweb_val_*.bin"
OURS_SHARE = 0.35  # of --budget: ours loads its compiled graphs from the caches, upstream compiles cold


class Refusal(Exception):
    """Bad input: one line for the user."""


@dataclass(frozen=True)
class Edit:
    why: str
    old: str
    new: str


def extract_script(log_text: str) -> str:
    """The script at the head of an upstream record log: everything before its first line of 100 '='."""
    lines = log_text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\r\n") == SEPARATOR:
            script = "".join(lines[:i])
            try:
                compile(script, "<upstream script>", "exec")
            except SyntaxError as problem:
                raise Refusal(f"the text before the log's first '=' line is not a Python script "
                              f"(line {problem.lineno}: {problem.msg})") from None
            return script
    raise Refusal("no line of 100 '=' in it: not an upstream record log "
                  "(script, then a line of 100 '=', then the output)")


def stop_edits(last_step_line: str, val_every_old: str, val_every_new: str, steps: int):
    """No validation during the run; a stop before step `steps`'s validation (the loop's last-step line)."""
    return [Edit("no validation during the run (the last one is skipped by the stop below)", val_every_old,
                 val_every_new),
            Edit(f"stop after {steps} steps, without the final validation", last_step_line,
                 f"{last_step_line}    if step == {steps}:  # vs_upstream: stop\n        break\n")]


def record_137_edits(steps, coordinate_descent):
    edits = [
        Edit("one GPU (world size 1)", "assert world_size == 8  # this code is designed for 8xH100",
             "assert world_size == 1  # vs_upstream: one GPU, the 8 GPUs' micro-batches accumulated"),
        Edit(f"{MICRO_BATCHES} accumulated 64K-token micro-batches per step, each loss scaled by 1/{MICRO_BATCHES}",
             "    inputs, targets = next(train_loader)\n"
             "    model(inputs, targets, get_window_size_blocks(step)).backward()\n",
             f"    for _ in range({MICRO_BATCHES}):  # vs_upstream\n"
             f"        inputs, targets = next(train_loader)\n"
             f"        (model(inputs, targets, get_window_size_blocks(step)) / {MICRO_BATCHES}).backward()\n"),
        *stop_edits("    last_step = step == train_steps\n",
                    "        125  # every how many steps to evaluate val loss? 0 for only at the end",
                    "        0  # vs_upstream: no validation during the run", steps),
    ]
    if not coordinate_descent:
        edits.append(Edit("coordinate-descent tuning off, as ours", "    True  # we allow this flag for medium track",
                          "    False  # vs_upstream: as ours"))
    return edits


def record_18_edits(steps, coordinate_descent):
    edits = [
        Edit("FlashAttention-3 (kernels) -> torch varlen_attn: no kernel hub", "from kernels import get_kernel\n",
             "from torch.nn.attention.varlen import varlen_attn  # vs_upstream: FA3 replaced, as ours\n"),
        Edit("FlashAttention-3 (kernels) -> torch varlen_attn: no kernel download",
             "flash_attn_interface = get_kernel('varunneal/flash-attention-3').flash_attn_interface\n", ""),
        Edit("FlashAttention-3 (kernels) -> torch varlen_attn: the call, as ours (speedrun/r18/attention.py)",
             "        y = flash_attn_interface.flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=seqlens, "
             "cu_seqlens_k=seqlens,\n"
             "                                                        max_seqlen_q=max_len, max_seqlen_k=max_len,\n"
             "                                                        causal=True, softmax_scale=attn_scale, "
             "window_size=(bm_size, 0))\n",
             "        y = varlen_attn(q[0], k[0], v[0], seqlens, seqlens, max_len, max_len, scale=attn_scale,\n"
             "                        window_size=(bm_size, 0))  # vs_upstream\n"),
        Edit(f"kernel warm-up of the steps the run meets (< {steps}), as ours",
             "for offset in [-1, 0, 1] if s + offset >= 0))",
             f"for offset in [-1, 0, 1] if 0 <= s + offset < {steps}))  # vs_upstream"),
        *stop_edits("    last_step = (step == train_steps)\n",
                    "    val_loss_every: int = 250  # every how many steps to evaluate val loss? 0 for only at the end",
                    "    val_loss_every: int = 0  # vs_upstream: no validation during the run", steps),
    ]
    if coordinate_descent:
        edits.append(Edit("coordinate-descent tuning on, as ours", "# torch._inductor.config.coordinate_descent_tuning",
                          "torch._inductor.config.coordinate_descent_tuning = True  # vs_upstream, as ours #"))
    return edits


@dataclass(frozen=True)
class Record:
    name: str
    marker: str  # a line only this record's script has
    ours_flags: tuple
    edits: object  # (steps, coordinate_descent) -> [Edit]
    step_optimizer: str  # the optimiser class both sides step once per training step (kernel_profile's marker)
    note: str = ""


RECORDS = (
    Record("#137", "assert world_size == 8  # this code is designed for 8xH100", (), record_137_edits, "Muon"),
    Record("#18", "get_kernel('varunneal/flash-attention-3')", ("--base", "r18", "--attention", "varlen"),
           record_18_edits, "NorMuon", note="FlashAttention-3 (kernels) replaced by torch's varlen_attn on both "
                                            "sides: ours --attention varlen, upstream edited to the same call"),
)


def identify(script: str) -> Record:
    found = [r for r in RECORDS if r.marker in script]
    if len(found) != 1:
        names = " or ".join(r.name for r in RECORDS)
        raise Refusal(f"not the script of a record this compares ({names}): "
                      + ("none" if not found else "more than one") + " of their marker lines found")
    return found[0]


def apply_edits(script: str, edits) -> str:
    """Each edit's target replaced; a target found other than exactly once is refused (the log is of another
    version of the script, so an edit would do something else than it says)."""
    for edit in edits:
        count = script.count(edit.old)
        if count != 1:
            first = edit.old.strip().splitlines()[0]
            raise Refusal(f"edit '{edit.why}': its target is found {count} times, not once: {first[:90]!r}")
        script = script.replace(edit.old, edit.new)
    return script


def render_edits(record: Record, edits) -> str:
    lines = [f"edits of upstream {record.name}'s script ({len(edits)}):"]
    for i, edit in enumerate(edits, 1):
        lines.append(f"  {i}. {edit.why}")
        lines += [f"       - {line}" for line in edit.old.rstrip("\n").splitlines()]
        lines += [f"       + {line}" for line in edit.new.rstrip("\n").splitlines()]
    return "\n".join(lines)


def make_data(work_dir: Path, steps):
    """Synthetic shards named as upstream's (TRAIN_GLOB, VAL_GLOB) under work_dir: every step's tokens and the
    kernel warm-ups', and one validation step's (ours validates at its stop)."""
    from benchmarks.synthetic_shards import make_shards
    folder = work_dir / Path(TRAIN_GLOB).parent
    folder.mkdir(parents=True, exist_ok=True)
    make_shards(folder, (steps + 12) * MICRO_BATCHES * 64 * 1024, VALIDATION_TOKENS + 2, prefix="fineweb")


def steps_run(timed_steps, profile_steps):
    """The steps each script runs: the timed ones, then, when profiling, one to open the window on a finished step
    and the profiled ones."""
    return timed_steps + (profile_steps + 1 if profile_steps else 0)


def profiled(launcher, record: Record, timed_steps, profile_steps, out: Path):
    """The launcher through benchmarks/kernel_profile.py: its window the profile_steps after the timed ones."""
    if not profile_steps:
        return list(launcher)
    return [*launcher, str(ROOT / "benchmarks" / "kernel_profile.py"), "--marker", record.step_optimizer,
            "--from-step", str(timed_steps + 1), "--steps", str(profile_steps), "--out", str(out), "--"]


def commands(record: Record, upstream_script: Path, work_dir: Path, steps, coordinate_descent, launcher=LAUNCHER,
             profile_steps=0):
    """Both command lines. With profile_steps, each runs that many steps more, plus one to open the window on a
    finished step, under kernel_profile; the step time stays that of the first `steps`."""
    run_steps = steps_run(steps, profile_steps)
    ours = [*profiled(launcher, record, steps, profile_steps, work_dir / "ours.profile.json"),
            str(ROOT / "train_gpt_medium.py"), *record.ours_flags, "--stop-after", str(run_steps),
            "--warmup-steps", "0", "--val-every", "0", "--val-tokens", str(VALIDATION_TOKENS),
            "--train-files", TRAIN_GLOB, "--val-files", VAL_GLOB, "--log-dir", str(work_dir / "ours"),
            "--run-name", "ours", "--coordinate-descent-tuning", "on" if coordinate_descent else "off"]
    return ours, [*profiled(launcher, record, steps, profile_steps, work_dir / "upstream.profile.json"),
                  str(upstream_script)]


def run_alone(name, command, work_dir: Path, timeout_s, skip, log_path=None, last=None):
    """One script alone on the GPU (gpu_check's stage runner: its own process group, killed past timeout_s); its
    step time from its log (ours) or its console (upstream's step lines). Returns (step_ms or None, why)."""
    job = Job(name, command, "console")
    [result] = run_stage(Stage(name, "alone", [job], timeout_s, timeout_s), work_dir / "consoles", cwd=work_dir)
    text = Path(log_path).read_text(errors="replace") if log_path and Path(log_path).exists() else result["console"]
    step_ms = steady_step_ms(text, skip=skip, last=last)
    if step_ms is None and not result["why"]:
        return None, "no step time in its output"
    return step_ms, result["why"]


def comparison_lines(record: Record, device, ours, upstream, goal):
    """The figures: both absolute step times and their ratio, or why one is missing."""
    (ours_ms, ours_why), (up_ms, up_why) = ours, upstream
    lines = [f"GPU: {device}", f"record: upstream {record.name}" + (f"; {record.note}" if record.note else "")]
    lines.append(f"ours:     {ours_ms:.2f} ms/step" if ours_ms else f"ours:     no figure ({ours_why})")
    lines.append(f"upstream: {up_ms:.2f} ms/step" if up_ms else f"upstream: no figure ({up_why})")
    if ours_ms and up_ms:
        ratio = ours_ms / up_ms
        lines.append(f"ours / upstream: {ratio:.4f} (goal <= {goal:.2f}: {'met' if ratio <= goal else 'not met'})")
    return lines


GOALS = {"#137": 0.98, "#18": 1.00}


def profile_lines(work_dir: Path, timed_steps, profile_steps) -> str:
    """Both sides' kernel_profile summaries side by side, or which is missing."""
    from benchmarks.kernel_profile import render
    found, missing = [], []
    for side in ("ours", "upstream"):
        path = work_dir / f"{side}.profile.json"
        if path.exists():
            found.append((side, json.loads(path.read_text())))
        else:
            missing.append(side)
    head = (f"torch.profiler over {profile_steps} steps, from within step {timed_steps + 1} to within step "
            f"{timed_steps + 1 + profile_steps} (after the timed ones; the profiler's own cost is in these figures, "
            f"on both sides):")
    lines = [head] + ([render(found)] if found else [])
    lines += [f"no profile from {side} (its console: {work_dir / 'consoles'})" for side in missing]
    return "\n".join(lines)


def edited_script(log_path: Path, steps, coordinate_descent):
    """(record, its edits, the edited script) from an upstream record log; Refusal names the log and the problem."""
    try:
        script = extract_script(log_path.read_text(errors="replace"))
        record = identify(script)
        edits = record.edits(steps, coordinate_descent)
        return record, edits, apply_edits(script, edits)
    except OSError as problem:
        raise Refusal(f"--log {log_path}: {problem.strerror or problem}") from None
    except Refusal as refusal:
        raise Refusal(f"{log_path}: {refusal}") from None


def make_parser():
    p = argparse.ArgumentParser(prog="python benchmarks/vs_upstream.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--log", type=Path, required=True, help="an upstream record log (#137 or #18)")
    p.add_argument("--steps", type=int, default=12, help="steps each script runs (its first steps)")
    p.add_argument("--skip", type=int, default=4, help="first steps left out of the mean step time")
    p.add_argument("--budget", type=float, default=300, help="seconds for both runs (ours 35%%, upstream 65%%: "
                   "its compile is cold)")
    p.add_argument("--coordinate-descent-tuning", choices=["on", "off"], default="off",
                   help="the same on both sides (off: cold compiles in minutes, not tens of minutes)")
    p.add_argument("--work-dir", type=Path, help="edited script, data, consoles (default: a temporary folder; "
                                                 "never inside the repository's tracked files)")
    p.add_argument("--results", type=Path, help="append the output here")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="after the timed steps, N more under torch.profiler on both sides "
                        "(benchmarks/kernel_profile.py): where each step's time goes, side by side")
    p.add_argument("--dry-run", action="store_true", help="extract, edit and print; run nothing")
    return p


def make_work_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise Refusal(f"--work-dir {path}: a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as problem:
        raise Refusal(f"--work-dir {path}: cannot be made ({problem.strerror or problem})") from None


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    try:
        if args.steps <= args.skip + 1 or args.skip < 1:
            raise Refusal(f"--steps {args.steps} --skip {args.skip}: need 1 <= skip and at least 2 timed steps")
        if args.profile_steps < 0:
            raise Refusal(f"--profile-steps {args.profile_steps}: at least 0")
        if not 30 <= args.budget <= MAX_BUDGET_S:  # also refuses nan
            raise Refusal(f"--budget {args.budget:g}: at least 30 seconds and at most {MAX_BUDGET_S} (a day)")
        run_steps = steps_run(args.steps, args.profile_steps)
        record, edits, edited = edited_script(args.log, run_steps, args.coordinate_descent_tuning == "on")
        if args.work_dir is not None:
            make_work_dir(args.work_dir)
    except Refusal as refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    coordinate_descent = args.coordinate_descent_tuning == "on"
    out = [render_edits(record, edits),
           f"coordinate-descent tuning: {args.coordinate_descent_tuning} on both sides"]
    if record.note:
        out.append(record.note)
    with tempfile.TemporaryDirectory() as tmp:
        work_dir = (args.work_dir or Path(tmp)).resolve()
        upstream_script = work_dir / f"upstream_{record.name.lstrip('#')}.py"
        upstream_script.write_text(edited)
        ours_cmd, upstream_cmd = commands(record, upstream_script, work_dir, args.steps, coordinate_descent,
                                          profile_steps=args.profile_steps)
        out += [f"ours:     {' '.join(shlex.quote(a) for a in ours_cmd)}",
                f"upstream: {' '.join(shlex.quote(a) for a in upstream_cmd)}  (in {work_dir})"]
        print("\n".join(out), flush=True)
        if args.dry_run:
            return 0
        import torch
        if not torch.cuda.is_available():
            print("error: comparing step times needs CUDA (--dry-run shows the edits on any machine)",
                  file=sys.stderr)
            return 2
        device = torch.cuda.get_device_name(0)
        make_data(work_dir, run_steps)
        with exiting_on_sigterm():
            ours = run_alone("ours", ours_cmd, work_dir, round(args.budget * OURS_SHARE), args.skip,
                             work_dir / "ours" / "ours.txt", last=args.steps)
            upstream = run_alone("upstream", upstream_cmd, work_dir, round(args.budget * (1 - OURS_SHARE)),
                                 args.skip, last=args.steps)
        figures = comparison_lines(record, device, ours, upstream, GOALS[record.name])
        figures.append(f"(mean step time of steps {args.skip}..{args.steps}, each script alone after its own "
                       f"kernel warm-up; torch {torch.__version__})")
        if args.profile_steps:
            figures.append(profile_lines(work_dir, args.steps, args.profile_steps))
        print("\n".join(figures))
        if args.results:
            args.results.parent.mkdir(parents=True, exist_ok=True)
            with args.results.open("a") as f:
                f.write("\n".join([f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
                                   f"command: {' '.join(shlex.quote(a) for a in sys.argv)}", *out, *figures]) + "\n")
        return 0 if ours[0] and upstream[0] and not ours[1] and not upstream[1] else 1


if __name__ == "__main__":
    sys.exit(main())
