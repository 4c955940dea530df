"""One optimiser step of an upstream record's own script, measured by step_cost's meter under fake tensors on CPU:
the counts `python benchmarks/upstream_step.py RECORD_LOG_OR_SCRIPT` sets beside ours (records #137 and
#18 of the medium track, #21 of the small track; benchmarks/results/2026-11-28_cpu_step-cost.txt, stop 41).

The script comes from a record log the user supplies (vs_upstream.extract_script) or is the script itself; this
repository never stores upstream code. It runs in two pieces, in a module of its own, as rank 0 of 8:
- its head, up to the line a record names (definitions, model, optimisers; before its compile and warm-up);
- its training step's lines (the loop body a record names, after any loop line the step reads) at the step `at` of
  the way through its schedule, its forward-and-backward line wrapped (the one edit of its lines) so that the saved
  tensors are counted and the optimiser phase begins after.
What fake tensors and a CPU need is patched around its lines: torch.compile returns what it is given (the step runs
eagerly, as ours is measured), CUDA calls are no-ops (tensors stay on the CPU, all fake), Module.bfloat16 casts fake
parameters in place, collectives are recorded (step_cost.recorded_collectives), the logs go to a temporary folder,
nvidia-smi answers nothing, imports of CUDA-only kernels (Triton, the kernels hub) are stubs. Each record then names
the few replacements that remain (RecordStep.prepare): its attention kernel by step_cost's stand-in counted from the
window it asks for, its Triton kernels by the same products in torch, its schedule's device tensors by numbers.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import textwrap
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file: the project's packages
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

from benchmarks import step_cost
from benchmarks.step_cost import (RECORD_WORLD_SIZE, CostedAttention, StepCost, StepMeter, _fp8_head_backward_flops,
                                  _fp8_head_flops, _micro_batches, block_mask_pairs, recorded_collectives,
                                  varlen_pairs)
from benchmarks.vs_upstream import Refusal, extract_script
from speedrun.logformat import SEPARATOR


@dataclass(frozen=True)
class RecordStep:
    """Where a record's script is cut and what stands in for its kernels.
    marker: a line only this record's script has; head_end: the head runs up to this text (excluded);
    step_begin, step_end: the training step's lines lie between them (begin included, end excluded);
    forward_backward: the step's line that runs the forward and backward, as `<loss expression>.backward()`;
    prepare(namespace, step): the replacements made after the head (attention, schedule tensors);
    step_at(namespace, at): the step measured, as step_cost chooses ours; batch(namespace, step): the tensors its
    loader would give; ours: the (track, flags) of our script it is set beside;
    stubs: modules the head imports that cannot load here (CUDA-only kernels), as {name: module};
    loop_lines: lines of its loop outside the step that the step reads (run first, as found);
    custom_flops: FLOP formulas of its custom operators, by name (as step_cost.CUSTOM_FLOPS)."""
    name: str
    marker: str
    head_end: str
    step_begin: str
    step_end: str
    forward_backward: str
    prepare: Callable
    step_at: Callable
    batch: Callable
    ours: tuple
    stubs: Callable = dict
    loop_lines: tuple = ()
    custom_flops: dict = field(default_factory=dict)


def _marked_mask(blocks):
    """A block mask's stand-in: only the window, in blocks (at least one)."""
    return ("window_blocks", max(int(blocks), 1))


def _flex_standin(block_size):
    def flex_attention(q, k, v, block_mask, scale=None, **_):  # q [B, H, T, D]
        B, H, T, D = q.shape
        return CostedAttention.apply(q, k, v, B * H * D * block_mask_pairs(T, block_size, block_mask[1]))
    return flex_attention


def _replace_flex_attention(ns):
    """FlexAttention (blocks of 128) and its block masks -> the stand-in, counted from the long and the short window
    (half the long one) its forward asks for: #137's and small #21's attention alike."""
    ns["flex_attention"] = _flex_standin(128)
    ns["GPT"].create_blockmasks = lambda self, input_seq, window_blocks: (_marked_mask(window_blocks),
                                                                         _marked_mask(window_blocks // 2))


def _prepare_137(ns, step):
    """#137: its FlexAttention (_replace_flex_attention); the window's pinned CUDA tensor -> its number of blocks;
    the Snoo outer optimiser at the step's place in its k-step cycle."""
    _replace_flex_attention(ns)
    ns["get_window_size_blocks_helper"] = lambda window_size: window_size // 128
    ns["outer_optim"].current_step = step


def _one_sequence(tokens):
    """(inputs, targets) of `tokens` tokens as upstream's loaders give them: int32 inputs, int64 targets."""
    targets = torch.zeros(tokens, dtype=torch.int64)
    return targets.to(torch.int32), targets


class _Anything(types.ModuleType):
    """A stand-in module whose every attribute is a decorator that returns what it decorates (triton.jit,
    triton.autotune(...)) and is callable and indexable itself (tl.constexpr annotations, kernel[grid])."""

    def __getattr__(self, name):
        if name.startswith("__"):  # the import system's questions (__path__, __spec__): a plain module
            raise AttributeError(name)
        return _Permissive()


class _Permissive:
    def __call__(self, *args, **kwargs):
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else _Permissive()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Permissive()

    def __getitem__(self, key):
        if isinstance(key, int):  # not a sequence: iteration stops at once
            raise IndexError(key)
        return _Permissive()


def _stubs_18():
    """#18 imports Triton (its NorMuon's symmetric-matmul kernels, replaced in _prepare_18) and the `kernels` hub
    (FlashAttention-3, replaced by the varlen stand-in)."""
    kernels = types.ModuleType("kernels")
    kernels.get_kernel = lambda name: types.SimpleNamespace(
        flash_attn_interface=types.SimpleNamespace(flash_attn_varlen_func=_flash_varlen_standin))
    triton = _Anything("triton")
    triton.__version__ = "stand-in"
    triton.language = _Anything("triton.language")
    return {"triton": triton, "triton.language": triton.language, "kernels": kernels}


def _flash_varlen_standin(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale,
                          window_size):  # q [T, H, D]
    T, H, D = q.shape
    return CostedAttention.apply(q, k, v, H * D * varlen_pairs(T, window_size[0]))


def _prepare_18(ns, step):
    """#18: its Triton kernels -> the same products in torch (X X^T; beta A + alpha A A); the schedule advanced to
    the step (windows, YaRN, multi-token weights, batch size) and the embedding split as at that step."""
    ns["XXT"] = lambda A, out: torch.matmul(A, A.mT, out=out)
    ns["ba_plus_cAA"] = lambda A, alpha, beta, out: (torch.baddbmm if A.ndim > 2 else torch.addmm)(
        A, A, A, beta=beta, alpha=alpha, out=out)
    manager = ns["training_manager"]
    manager.advance_schedule(step)
    ns["model"].split_embed = step > manager.split_step


def _batch_18(ns, step):
    inputs, targets = _one_sequence(ns["get_bs"](step) // (ns["grad_accum_steps"] * ns["world_size"]))
    tokens = len(inputs)  # its loader's document boundaries: a fixed length, from the tokens
    docs = torch.zeros(ns["next_multiple_of_n"](tokens // 300, n=128), dtype=torch.int32)
    return inputs, targets, docs


class _Sender:
    """Its train loader's .send(args) -> the batch (upstream changes the batch size through it)."""

    def __init__(self, batch):
        self.batch = batch

    def send(self, _):
        return self.batch

    def __next__(self):
        return self.batch


def _prepare_small_21(ns, step):
    """Small-track #21 (re-timed 2025-02-01): as #137 (its FlexAttention, the window's pinned tensor), its loop's
    step count named."""
    _replace_flex_attention(ns)
    ns["window_size_blocks"] = lambda window_size: window_size // 128
    ns["train_steps"] = ns["args"].num_iterations


# Where the records' scripts are cut: each one's training step lies between the same two lines; #137 and small #21
# (one lineage of upstream's script) end their head at the same compile line.
STEP_BEGIN_LINE = "    # --------------- TRAINING SECTION -----------------\n"
STEP_END_LINE = "    # logging\n"
COMPILE_LINE = "model: nn.Module = torch.compile(model, dynamic=False)\n"

RECORD_STEPS = (
    RecordStep("#137", "assert world_size == 8  # this code is designed for 8xH100",
               head_end=COMPILE_LINE, step_begin=STEP_BEGIN_LINE, step_end=STEP_END_LINE,
               forward_backward="model(inputs, targets, get_window_size_blocks(step)).backward()",
               prepare=_prepare_137, step_at=lambda ns, at: int(at * ns["args"].num_iterations),
               batch=lambda ns, step: _one_sequence(ns["args"].train_seq_len), ours=("r14", ())),
    RecordStep("#18", "get_kernel('varunneal/flash-attention-3')",
               head_end="########################################\n#            Warmup kernels",
               step_begin=STEP_BEGIN_LINE, step_end=STEP_END_LINE,
               forward_backward="(model(inputs, targets, cum_seqlens, training_manager.get_forward_args()) "
                                "/ grad_accum_steps).backward()",
               prepare=_prepare_18, step_at=lambda ns, at: int(at * ns["args"].num_iterations) | 1,
               batch=_batch_18, ours=("r18", ()), stubs=_stubs_18),
    RecordStep("small #21", "use_fp8=True, x_s=2.0, w_s=2.0**9, grad_s=2.0**19",
               head_end=COMPILE_LINE, step_begin=STEP_BEGIN_LINE, step_end=STEP_END_LINE,
               forward_backward="model(inputs, targets, window_size_blocks(window_size)).backward()",
               prepare=_prepare_small_21, step_at=lambda ns, at: int(at * ns["args"].num_iterations),
               batch=lambda ns, step: _one_sequence(ns["args"].seq_len), ours=("small", ()),
               loop_lines=("    window_size = next_multiple_of_n(1728 * step / train_steps, n=128)\n",),
               custom_flops={"nanogpt.mm": _fp8_head_flops, "nanogpt.mm_backward": _fp8_head_backward_flops}),
)


def read_script(path: Path) -> str:
    """The script of a record log (vs_upstream.extract_script) or, for a file with no line of 100 '=', the file."""
    try:
        text = path.read_text(errors="replace")
    except OSError as problem:
        raise Refusal(f"{path}: {problem.strerror or problem}") from None
    if any(line.rstrip("\r\n") == SEPARATOR for line in text.splitlines()):
        return extract_script(text)
    try:
        compile(text, str(path), "exec")
    except SyntaxError as problem:
        raise Refusal(f"{path}: neither a record log nor a Python script (line {problem.lineno}: {problem.msg})")
    return text


def identify(script: str, records=RECORD_STEPS) -> RecordStep:
    found = [r for r in records if r.marker in script]
    if len(found) != 1:
        raise Refusal(f"not the script of a record this measures ({' or '.join(r.name for r in records)}): "
                      + ("none" if not found else "more than one") + " of their marker lines found")
    return found[0]


def _one_piece(script, text, what):
    count = script.count(text)
    if count != 1:
        raise Refusal(f"{what}: found {count} times, not once: {text.strip()[:90]!r} (another version of the script)")
    return script.index(text)


def split_script(script: str, record: RecordStep):
    """(head, the training step's lines dedented with the forward-and-backward line wrapped)."""
    head = script[:_one_piece(script, record.head_end, "where the head ends")]
    begin = _one_piece(script, record.step_begin, "where the training step begins")
    end = script.index(record.step_end, begin) if record.step_end in script[begin:] else -1
    if end < 0:
        raise Refusal(f"where the training step ends: not found after its beginning: {record.step_end.strip()!r}")
    step = textwrap.dedent(script[begin:end])
    suffix = ".backward()"
    loss = record.forward_backward[:-len(suffix)]
    _one_piece(step, record.forward_backward, "the forward-and-backward line")
    for line in record.loop_lines:
        _one_piece(script, line, "a line of its loop the step reads")
    before = "".join(textwrap.dedent(line) for line in record.loop_lines)
    return head, before + step.replace(record.forward_backward, f"_step_cost_forward_backward(lambda: {loss})")


class OnTheCpu(TorchFunctionMode):
    """Tensors the script asks for on CUDA made on the CPU (this torch may have no CUDA to fake them on)."""

    @staticmethod
    def _cpu(value):
        is_cuda = (isinstance(value, str) and value.startswith("cuda")) or (
            isinstance(value, torch.device) and value.type == "cuda")
        return torch.device("cpu") if is_cuda else value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs:
            kwargs["device"] = self._cpu(kwargs["device"])
        if getattr(func, "__name__", "") == "to":
            args = tuple(self._cpu(a) for a in args)
        return func(*args, **kwargs)


def _bfloat16_in_place(module):
    """Module.bfloat16 for fake parameters, whose tensors Module._apply cannot swap: each one's data replaced."""
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            t.data = t.data.bfloat16()
    return module


@contextlib.contextmanager
def cpu_and_fake_patches(world_size, script):
    """What the script's own lines need on a CPU under fake tensors: no compiler, no CUDA calls, the launcher's
    environment of rank 0, a working folder for its logs, itself as sys.argv[0] (it logs its own source), an empty
    nvidia-smi."""
    def no_compile(fn=None, **_):
        return fn if fn is not None else (lambda f: f)

    env = {"RANK": "0", "WORLD_SIZE": str(world_size), "LOCAL_RANK": "0", "RUN_ID": "0"}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        stack.enter_context(contextlib.chdir(tmp))
        (Path(tmp) / "upstream_record.py").write_text(script)
        stack.enter_context(mock.patch.object(sys, "argv", [str(Path(tmp) / "upstream_record.py")]))
        stack.enter_context(mock.patch.dict(os.environ, env))
        for target, name, value in [
                (torch, "compile", no_compile), (torch.cuda, "is_available", lambda: True),
                (torch.cuda, "set_device", lambda *a, **k: None), (torch.cuda, "synchronize", lambda *a, **k: None),
                (torch.nn.Module, "cuda", lambda self, *a, **k: self), (torch.Tensor, "cuda", lambda t, *a, **k: t),
                (torch.nn.Module, "bfloat16", _bfloat16_in_place),
                (subprocess, "run", lambda *a, **k: types.SimpleNamespace(stdout="", stderr="", returncode=0))]:
            stack.enter_context(mock.patch.object(target, name, value))
        stack.enter_context(contextlib.redirect_stdout(open(os.devnull, "w")))  # it prints its log's name
        stack.enter_context(OnTheCpu())
        yield


def measure_record(script: str, record: RecordStep, at=0.5, world_size=RECORD_WORLD_SIZE) -> StepCost:
    """The StepCost of rank 0's step of the record's script, counted as step_cost.measure counts ours."""
    head, step_lines = split_script(script, record)
    module = types.ModuleType("_upstream_record")
    ns = module.__dict__
    sent, meter = Counter(), StepMeter()
    step_cost._METER = meter
    sys.modules[module.__name__] = module  # its dataclasses look their module up
    fake = FakeTensorMode()  # before the stubs: it imports torch's compiler, which asks the real Triton
    try:
        with (mock.patch.dict(sys.modules, record.stubs()),
              mock.patch.dict(step_cost.CUSTOM_FLOPS, record.custom_flops),
              cpu_and_fake_patches(world_size, script), fake, recorded_collectives(world_size, sent), meter):
            exec(compile(head, f"<upstream {record.name} head>", "exec"), ns)
            step = record.step_at(ns, at)
            record.prepare(ns, step)
            model = ns["model"]
            params, buffers = list(model.parameters()), list(model.buffers())
            batch = record.batch(ns, step)
            ns.update(step=step, train_loader=_Sender(batch))
            storages = {t.untyped_storage()._cdata for t in params + buffers}
            vocab_width = next(p.shape[0] for name, p in model.named_parameters() if "lm_head" in name)
            figures = {}

            def forward_backward(run_one):
                saved, fusable = _micro_batches(meter, storages, vocab_width, run_one, 1, loss_divisor=1)
                figures.update(saved=saved, fusable=fusable)
                meter.phase = "optimizer"

            ns["_step_cost_forward_backward"] = forward_backward
            meter.ops.clear(), meter.flops.clear(), sent.clear()
            meter.phase = "forward"
            meter.peak = meter.live
            exec(compile(step_lines, f"<upstream {record.name} step>", "exec"), ns)
            # What lives after the step beyond the model, its gradients (if the step keeps them) and its input: the
            # optimisers' state, made up front (Snoo's outer copy) or at the first step, as step_cost counts ours.
            kept = storages | {t.untyped_storage()._cdata for t in batch} | {
                p.grad.untyped_storage()._cdata for p in params if p.grad is not None}
            state = meter.live - sum(meter.sizes.get(key, 0) for key in kept)
    finally:
        sys.modules.pop(module.__name__, None)
        step_cost._METER = None
    return StepCost(record.name, [], world_size, 1, len(batch[0]), params=sum(p.numel() for p in params),
                    param_bytes=sum(p.numel() * p.element_size() for p in params), optimizer_state_bytes=state,
                    flops={phase: int(meter.flops[phase]) for phase in ("forward", "backward", "optimizer")},
                    saved_bytes=figures["saved"], peak_bytes=meter.peak, head_fusable_bytes=figures["fusable"],
                    sent_bytes=sum(v for k, v in sent.items() if not k.endswith("calls")),
                   sent_by_kind={k: v for k, v in sorted(sent.items()) if not k.endswith("calls")},
                    collectives={k: int(v) for k, v in sorted(sent.items()) if k.endswith("calls")},
                    ops={f"{phase} {name}": n for (phase, name), n in sorted(meter.ops.items())})


def _ratio(ours, upstream):
    if upstream == 0:
        return "  -  " if ours == 0 else "  inf"
    return f"{ours / upstream:.3f}" + (" (equal)" if ours == upstream else "")


def side_by_side(ours: StepCost, upstream: StepCost, name: str):
    """Lines: each figure ours / upstream, the bytes sent per collective, the operation kinds whose counts differ
    (by phase: where in the step)."""
    mib = lambda n: f"{n / 2 ** 20:,.1f} MiB"  # noqa: E731
    rows = [("params", ours.params, upstream.params, str), ("param bytes", ours.param_bytes, upstream.param_bytes, mib)]
    rows += [(f"{phase} FLOPs", ours.flops[phase], upstream.flops[phase], lambda n: f"{n / 1e12:.4f} T")
             for phase in ("forward", "backward", "optimizer")]
    rows += [("saved for backward", ours.saved_bytes, upstream.saved_bytes, mib),
             ("sent per rank", ours.sent_bytes, upstream.sent_bytes, mib),
             ("optimiser state", ours.optimizer_state_bytes, upstream.optimizer_state_bytes, mib),
             ("peak (eager)", ours.peak_bytes, upstream.peak_bytes, mib)]
    lines = [f"{'figure':22} {'ours':>22} {'upstream ' + name:>22}  ours/upstream"]
    lines += [f"{label:22} {fmt(a):>22} {fmt(b):>22}  {_ratio(a, b)}" for label, a, b, fmt in rows]
    lines.append("bytes sent per collective (this rank; calls):")
    for kind in sorted(set(ours.sent_by_kind) | set(upstream.sent_by_kind)):
        a, b = ours.sent_by_kind.get(kind, 0), upstream.sent_by_kind.get(kind, 0)
        calls = f"{ours.collectives.get(kind + ' calls', 0)} / {upstream.collectives.get(kind + ' calls', 0)}"
        lines.append(f"  {kind:22} {mib(a):>22} {mib(b):>22}  calls {calls}")
    differ = [(op, ours.ops.get(op, 0), upstream.ops.get(op, 0)) for op in sorted(set(ours.ops) | set(upstream.ops))
              if ours.ops.get(op, 0) != upstream.ops.get(op, 0)]
    lines.append(f"operation kinds whose counts differ ({len(differ)} of {len(set(ours.ops) | set(upstream.ops))}; "
                 f"phase op: ours / upstream):")
    lines += [f"  {op:40} {a:6} / {b}" for op, a, b in differ]
    return lines


def compare(path: Path, at=0.5, records=RECORD_STEPS):
    """The side-by-side lines of a record log or script against our script's matching configuration."""
    script = read_script(path)
    record = identify(script, records)
    upstream = measure_record(script, record, at)
    ours = step_cost.measure(*record.ours, RECORD_WORLD_SIZE, at)
    track, flags = record.ours
    head = (f"upstream {record.name} ({path.name}) against ours (--track {track} {' '.join(flags)}) at --at {at}: "
            f"one optimiser step of rank 0 of {RECORD_WORLD_SIZE}, eager, under fake tensors")
    return [head] + side_by_side(ours, upstream, record.name)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("record", metavar="RECORD_LOG_OR_SCRIPT", type=Path,
                   help="upstream's record log (#137, #18 or #21) or its script, never stored here")
    step_cost.add_at_flag(p)
    a = p.parse_args(argv)
    try:
        print("\n".join(compare(a.record, a.at)))
    except Refusal as refusal:
        print(f"upstream_step: {refusal}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
