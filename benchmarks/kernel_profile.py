"""Where a training script's step time goes: a torch.profiler window over a few of its steps, from the outside, so
ours and upstream's own script are measured by the same code (shared/spec/gpu-protocol.md: "where we are slower, a
torch.profiler summary of the top kernels says why").

    python -m torch.distributed.run --standalone --nproc_per_node=1 benchmarks/kernel_profile.py \\
        --from-step 13 --steps 4 --out PROFILE.json -- SCRIPT [ITS ARGS...]

A training step is counted at each step of the optimiser class named by --marker (default Muon: both medium bases and
upstream's #137 and #18 step one Muon per training step, whatever their other optimisers do), through torch's global
optimiser hook, so neither script is edited for it. The window opens at the --from-step-th such step and closes --steps
steps later, the device synchronised at both ends. Written to --out (JSON): wall ms per step, kernel time per step
by kind, kernels launched per step, and the top kernels; `render` prints two of them side by side.
"""
from __future__ import annotations

import argparse
import json
import re
import runpy
import sys
import time
from pathlib import Path

# Kinds of kernel, by name (first match wins). Names are the libraries' own (cuBLAS's nvjet/sm90 gemms, Triton's
# generated names, NCCL, the copy engine), so a kind is a reading aid, not a measurement of its own.
KERNEL_KINDS = (
    ("matmul (cuBLAS/CUTLASS)", r"gemm|nvjet|cutlass|xmma|sm90_|sm80_|wgmma"),
    ("attention (flex/varlen/sdpa)", r"flex|attn|attention|fmha|flash"),
    ("NCCL", r"nccl"),
    ("Triton fused (inductor)", r"^triton_"),  # before copy/fill: a fused cast is named triton_..._to_copy_0
    ("copy/fill", r"memcpy|memset|copy|fill"),
)
OTHER_KIND = "other"
TOP_KERNELS = 15


def kernel_kind(name: str) -> str:
    for kind, pattern in KERNEL_KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return OTHER_KIND


def summarise(kernels, wall_s: float, steps: int, top=TOP_KERNELS, source="CUDA kernels") -> dict:
    """kernels: (name, device microseconds) of every kernel the window ran. Per step: wall, kernel time (all and by
    kind), launches; and the top kernels by time. source: what the entries are."""
    by_kind, by_name, total_us = {}, {}, 0.0
    for name, us in kernels:
        total_us += us
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + us
        count, time_us = by_name.get(name, (0, 0.0))
        by_name[name] = (count + 1, time_us + us)
    per_step = 1000.0 * steps  # microseconds -> ms per step
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return dict(source=source, steps=steps, wall_ms=1000.0 * wall_s / steps, kernel_ms=total_us / per_step,
                launches=len(kernels) / steps,
                kinds={kind: us / per_step for kind, us in sorted(by_kind.items(), key=lambda item: -item[1])},
                top=[dict(name=name, calls=count / steps, ms=us / per_step) for name, (count, us) in ranked])


def render(named_profiles) -> str:
    """(label, summary) pairs side by side: the per-step figures, then each one's top kernels."""
    labels = [label for label, _ in named_profiles]
    profiles = [profile for _, profile in named_profiles]
    width = max(12, *(len(label) + 2 for label in labels))

    def row(title, values):
        return f"  {title:34}" + "".join(f"{value:>{width}}" for value in values)
    counts = ", ".join(f"{profile['steps']} steps of {profile['source']}" for profile in profiles)
    lines = [f"per step, the mean over {counts}:",
             row("", labels),
             row("wall ms", [f"{p['wall_ms']:.1f}" for p in profiles]),
             row("kernel ms (streams summed)", [f"{p['kernel_ms']:.1f}" for p in profiles]),
             row("idle ms (wall - kernels)", [f"{p['wall_ms'] - p['kernel_ms']:.1f}" for p in profiles]),
             row("kernels launched", [f"{p['launches']:.0f}" for p in profiles])]
    kinds = [kind for kind, _ in KERNEL_KINDS] + [OTHER_KIND]
    lines += [row(f"{kind} ms", [f"{p['kinds'].get(kind, 0.0):.1f}" for p in profiles]) for kind in kinds]
    for label, profile in named_profiles:
        lines.append(f"top kernels of {label} (ms per step, calls per step):")
        lines += [f"  {k['ms']:9.2f} {k['calls']:7.1f}  {k['name'][:110]}" for k in profile["top"]]
    return "\n".join(lines)


class StepWindow:
    """The global optimiser hook: counts the marker's steps, opens the profiler at the from_step-th and closes it
    `steps` later, then writes the summary."""

    def __init__(self, marker, start, steps, out: Path):
        self.marker, self.start, self.steps, self.out = marker, start, steps, out
        self.count, self.profile, self.began = 0, None, None

    def __call__(self, optimizer, args, kwargs):
        if type(optimizer).__name__ != self.marker:
            return
        self.count += 1
        if self.count == self.start:
            self.open()
        elif self.count == self.start + self.steps:
            self.close()

    def abandon(self):
        """A window still open when the script ends is stopped unwritten (left running, the profiler crashes the
        interpreter's exit)."""
        if self.profile is not None and self.count < self.start + self.steps:
            self.profile.stop()
            self.profile = None

    def open(self):
        import torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        self.profile = torch.profiler.profile(activities=activities)
        self.profile.start()
        self.began = time.perf_counter()

    def close(self):
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - self.began
        self.profile.stop()
        device = torch.autograd.DeviceType.CUDA if torch.cuda.is_available() else None
        # On CPU there are no kernels: the window's top-level operators stand in, so a rehearsal shows the format.
        kernels = [(e.name, e.device_time_total if device is not None else e.cpu_time_total)
                   for e in self.profile.events()
                   if (e.device_type == device if device is not None else e.cpu_parent is None)]
        self.out.parent.mkdir(parents=True, exist_ok=True)
        source = "CUDA kernels" if device is not None else "CPU top-level operators (no GPU: a rehearsal)"
        self.out.write_text(json.dumps(summarise(kernels, wall_s, self.steps, source=source), indent=1) + "\n")
        print(f"kernel_profile: {self.steps} steps profiled -> {self.out}", flush=True)


def make_parser():
    p = argparse.ArgumentParser(prog="benchmarks/kernel_profile.py", description=__doc__.split("\n\n")[0])
    # not --start: torchrun's parser reads every abbreviation, and takes that one for its --start-method
    p.add_argument("--from-step", type=int, required=True, help="open the window at this step of the marker "
                                                                "(1 = the first)")
    p.add_argument("--steps", type=int, default=4, help="steps in the window")
    p.add_argument("--marker", default="Muon", help="the optimiser class stepped once per training step")
    p.add_argument("--out", type=Path, required=True, help="the summary (JSON)")
    p.add_argument("script", help="the training script, then its arguments (after --)")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    return p


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    if args.from_step < 1 or args.steps < 1:
        print(f"error: --from-step {args.from_step} --steps {args.steps}: both at least 1", file=sys.stderr)
        return 2
    if not Path(args.script).is_file():
        print(f"error: no such script: {args.script}", file=sys.stderr)
        return 2
    from torch.optim.optimizer import register_optimizer_step_post_hook
    window = StepWindow(args.marker, args.from_step, args.steps, args.out)
    register_optimizer_step_post_hook(window)
    sys.argv = [args.script, *args.script_args]
    sys.path.insert(0, str(Path(args.script).resolve().parent))
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as ended:  # the script's own exit: its status stands unless the window is short
        if ended.code not in (None, 0):
            raise
    finally:
        window.abandon()
    if window.count < args.from_step + args.steps:
        print(f"error: the script stepped {args.marker} {window.count} times, the window needs "
              f"{args.from_step + args.steps}: no profile written", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
