"""Per-step profile of a few training steps: optimiser-step time and exposed communication (time in collectives
not overlapped by compute), from a torch.profiler trace. Used by benchmarks/gpu_medium.py through the training
scripts' --profile-steps."""

import json
import time
from contextlib import contextmanager

import torch
from torch.autograd import DeviceType

# Substrings of the profiler's event names for collectives: NCCL kernels on CUDA, gloo's work and c10d's ops on CPU.
COLLECTIVE_NAMES = ("nccl", "gloo:", "c10d::")


def merged(intervals):
    """Sorted, non-overlapping union of (start, end) intervals."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def exposed_time(communication, compute):
    """Length of the union of `communication` intervals not covered by any `compute` interval."""
    total, cover = 0.0, merged(compute)
    for start, end in merged(communication):
        covered = sum(max(0.0, min(end, c_end) - max(start, c_start)) for c_start, c_end in cover)
        total += (end - start) - covered
    return total


def trace_intervals(events, on_cuda):
    """(communication, compute) intervals in microseconds: on CUDA the device kernels, on CPU the operators."""
    comm, compute = [], []
    for e in events:
        on_device = e.device_type == DeviceType.CUDA
        if on_device != on_cuda or (not on_cuda and not (e.name.startswith("aten::") or
                                                         any(m in e.name for m in COLLECTIVE_NAMES))):
            continue
        span = (e.time_range.start, e.time_range.end)
        (comm if any(m in e.name.lower() for m in COLLECTIVE_NAMES) else compute).append(span)
    return comm, compute


class StepProfiler:
    """Profiles training steps first_step.. (to the end of the run): the whole steps through torch.profiler, and
    each optimiser step between two CUDA events on the compute stream (on CPU: the host clock). Waits for gradient
    averages still in flight count in the optimiser's time, as they delay it. No host sync inside the steps."""

    def __init__(self, first_step, device):
        self.first_step, self.on_cuda = first_step, device.type == "cuda"
        self.profile, self.optimizer_spans, self.steps = None, [], 0

    def begin_step(self, step):
        if step == self.first_step:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.on_cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profile = torch.profiler.profile(activities=activities)
            self.profile.__enter__()
        if self.profile is not None:
            self.steps += 1

    @contextmanager
    def optimizer(self):
        if self.profile is None:
            yield
            return
        if self.on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start, end = time.perf_counter(), None
            yield
            end = time.perf_counter()
        self.optimizer_spans.append((start, end))

    def summary(self):
        """{'steps', 'optimizer_ms', 'exposed_comm_ms', 'comm_ms'}: per-step means over the profiled steps."""
        if self.on_cuda:
            torch.cuda.synchronize()
            opt_ms = [s.elapsed_time(e) for s, e in self.optimizer_spans]
        else:
            opt_ms = [1000 * (e - s) for s, e in self.optimizer_spans]
        self.profile.__exit__(None, None, None)
        comm, compute = trace_intervals(self.profile.events(), self.on_cuda)
        n = max(self.steps, 1)
        return dict(steps=self.steps, optimizer_ms=sum(opt_ms) / max(len(opt_ms), 1),
                    exposed_comm_ms=exposed_time(comm, compute) / 1000 / n,
                    comm_ms=sum(e - s for s, e in merged(comm)) / 1000 / n)

    def finish(self, path=None):
        """Stops the profiler; writes the summary as JSON to path (rank 0's), if given."""
        summary = self.summary()
        if path is not None:
            path.write_text(json.dumps(summary) + "\n")
