"""What one optimiser step costs, measured at full size on CPU under fake tensors (no memory, no compute): for r14
(train_gpt_medium.py), r18 (--base r18) and the small track (train_gpt.py), a baseline or any study arm's flags.

    python benchmarks/step_cost.py                       # the three baselines and every bundled study arm
    python benchmarks/step_cost.py --track r18 -- --backout-layers 11    # one configuration
    python benchmarks/step_cost.py --studies record,r18-laurel           # some studies' arms
    python benchmarks/step_cost.py --write-docs docs/step-cost.md        # the table of every bundled arm
    python benchmarks/step_cost.py --track small --at 0 --world-size 1 --compiled   # + the compiled step's peak
    python benchmarks/upstream_step.py RECORD_LOG_OR_SCRIPT   # beside upstream's own script (#137, #18, #21)

Per optimiser step of one rank at the record's world size (8) it reports: parameters and the persistent bytes the
optimisers add (their state); FLOPs of forward, backward and optimiser step (torch's FLOP formulas per aten op, the
attention counted from its mask: flex's block mask at the step's window schedule on r14 and the small track, the
varlen window on r18, with no document boundaries - an upper bound, as documents cut the window further); the bytes
saved for the backward (one micro-batch's activations); the peak of live bytes at world size 1 and 8 (every storage
the step creates, freed when its last tensor goes: what the caching allocator's "allocated" counts, without its
rounding, for eager execution: a compiled step fuses temporaries away); bytes each rank sends (ring algorithms:
an all-reduce of N bytes sends 2(W-1)/W N) and the collectives per kind; the aten operations per kind (eager: a
compiled step launches fewer, fused kernels); and an H100 lower bound: the largest of FLOPs at dense bf16 peak,
the step's minimal HBM traffic at HBM bandwidth and the bytes sent at NVLink bandwidth.

The step measured is the one at --at (a fraction of the schedule, default 0.5: windows and, on r18, the batch size
of mid-run; r18 measures an odd step, where its Adams step too). Forward and backward run 1 micro-batch at world
size 8 and 2 at world size 1 (the second has the first's gradients live, as the other six would); FLOPs and
operation counts are scaled to the rank's 8 / world size micro-batches.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import operator
import sys
import weakref
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Callable
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torch.utils.flop_counter import flop_registry  # noqa: E402

from ablations.study import load_script  # noqa: E402
from speedrun.data import VIRTUAL_RANKS  # noqa: E402
from speedrun.distributed import Dist  # noqa: E402
from speedrun.errors import UsageError  # noqa: E402

H100_DENSE_BF16_FLOPS = 989.4e12  # H100 SXM, dense bf16 tensor-core FLOP/s
H100_HBM_BYTES_PER_S = 3.35e12  # H100 SXM HBM3
H100_NVLINK_BYTES_PER_S = 450e9  # NVLink 4 per GPU, one direction (900 GB/s both ways)
RECORD_WORLD_SIZE = 8
MIB = 2 ** 20

TRACKS = {"r14": ("train_gpt_medium.py", []), "r18": ("train_gpt_medium.py", ["--base", "r18"]),
          "small": ("train_gpt.py", [])}

# Collective -> (how its tensor argument's bytes relate to the payload, bytes a rank sends per payload byte on a
# ring of W ranks).
RING_SEND = {"all_reduce": lambda w: 2 * (w - 1) / w, "reduce_scatter_tensor": lambda w: (w - 1) / w,
             "reduce_scatter": lambda w: (w - 1) / w, "all_gather_into_tensor": lambda w: (w - 1) / w,
             "all_gather": lambda w: (w - 1) / w, "reduce": lambda w: (w - 1) / w, "broadcast": lambda w: (w - 1) / w}


# ----- the meter: FLOPs, operations and live bytes of every aten op ---------------------------------------------

class StepMeter(TorchDispatchMode):
    """Counts each aten op (by phase: forward, backward - inside an autograd node -, optimizer), its FLOPs (torch's
    formulas) and the live bytes of every storage, with their peak."""

    # Ops that create no kernel launch: views and metadata.
    NOT_LAUNCHED = {"detach", "view", "_unsafe_view", "t", "transpose", "permute", "expand", "select", "slice",
                    "unsqueeze", "squeeze", "split", "chunk", "unbind", "as_strided", "alias", "lift_fresh",
                    "split_with_sizes", "unflatten", "_reshape_alias", "view_as", "reshape", "flatten", "narrow",
                    "diagonal", "unfold"}

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.flops, self.ops = Counter(), Counter()
        self.live = self.peak = 0
        self.sizes = {}
        self.tracking = True

    @contextlib.contextmanager
    def untracked(self):
        """Storages made meanwhile are not counted (a trace's fake values, which its graphs keep as metadata)."""
        self.tracking = False
        try:
            yield
        finally:
            self.tracking = True

    def own(self, tensors):
        """Starts counting storages that exist already (parameters, buffers, inputs)."""
        for t in tensors:
            self._track(t)
        self.peak = max(self.peak, self.live)

    def _track(self, t):
        if not isinstance(t, torch.Tensor):
            return
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.sizes:
            return
        self.sizes[key] = storage.nbytes()
        self.live += self.sizes[key]
        weakref.finalize(storage, self._free, key)

    def _free(self, key):
        self.live -= self.sizes.pop(key, 0)

    def current_phase(self):
        return "backward" if torch._C._current_autograd_node() is not None else self.phase

    def add(self, name, flops=0):
        phase = self.current_phase()
        self.ops[(phase, name)] += 1
        self.flops[phase] += flops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        name = packet.__name__.rstrip("_") if packet.__module__ == "torch._ops.aten" else str(packet)
        flops = 0
        if packet in flop_registry:
            flops = flop_registry[packet](*args, **kwargs, out_val=out)
        elif str(packet) in CUSTOM_FLOPS:
            flops = CUSTOM_FLOPS[str(packet)](args)
        launched = name in CUSTOM_FLOPS or packet.__module__ == "torch._ops.aten"  # prim.device etc.: metadata
        if launched and name not in self.NOT_LAUNCHED and not func.is_view:
            self.add(name, flops)
        if self.tracking:
            for t in tree_flatten(out)[0]:
                self._track(t)
        self.peak = max(self.peak, self.live)
        return out


def _fp8_head_flops(args):
    x, w = args[:2]
    return 2 * x.shape[0] * x.shape[1] * w.shape[0]


def _fp8_head_backward_flops(args):
    grad_out, x_f8 = args[:2]
    return 4 * grad_out.shape[0] * grad_out.shape[1] * x_f8.shape[1]


# The small track's FP8 head is one opaque custom op each way (torch's formulas do not see inside); and the
# matrix-vector product, which torch's counter has no formula for (DLO's routers: a [T, D] @ [D] per layer).
CUSTOM_FLOPS = {"speedrun.fp8_head_matmul": _fp8_head_flops,
                "speedrun.fp8_head_matmul_backward": _fp8_head_backward_flops,
                "aten.mv": lambda args: 2 * args[0].numel()}

_METER: StepMeter | None = None  # the meter of the step being measured (the attention stand-in reports to it)


# ----- attention: a stand-in with the kernel's saved tensors, counted from the mask -------------------------------

def block_mask_pairs(seq_len, block_size, window_blocks):
    """(query, key) pairs FlexAttention computes for a causal sliding window of whole blocks: query block i reads
    key blocks i - window + 1 .. i, each fully (partial blocks are computed, then masked)."""
    blocks = seq_len // block_size
    return sum(min(window_blocks, i + 1) for i in range(blocks)) * block_size * block_size


def varlen_pairs(seq_len, window_tokens):
    """(query, key) pairs of a varlen kernel with a look-back of window_tokens: token t reads t - window .. t."""
    full = max(0, seq_len - window_tokens - 1)
    ramp = seq_len - full
    return ramp * (ramp + 1) // 2 + full * (window_tokens + 1)


class CostedAttention(torch.autograd.Function):
    """Attention's shapes, saved tensors (q, k, v, output and the fp32 log-sum-exp, as flash kernels keep) and
    FLOPs (4 per pair and head dim forward; 10 backward: the scores recomputed, torch's convention), no values."""

    @staticmethod
    def forward(ctx, q, k, v, pairs_x_heads_x_dim):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.work = pairs_x_heads_x_dim
        _METER.add("attention", 4 * pairs_x_heads_x_dim)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, _, _ = ctx.saved_tensors
        _METER.add("attention_backward", 10 * ctx.work)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


@contextlib.contextmanager
def costed_attention(model, block_size, long_blocks):
    """r14 and the small track: speedrun.layers.attend replaced by the stand-in, the model's masks by two markers
    naming the long and the short window (the short one is half the long one, at least one block)."""
    import speedrun.layers as layers
    marks = {}

    def masks(input_seq, window_blocks):
        long_mark, short_mark = torch.empty(0), torch.empty(0)
        marks[id(long_mark)], marks[id(short_mark)] = long_blocks, max(long_blocks // 2, 1)
        return long_mark, short_mark

    def attend(q, k, v, mask, scale):  # q [B, H, T, D]
        B, H, T, D = q.shape
        return CostedAttention.apply(q, k, v, B * H * D * block_mask_pairs(T, block_size, marks[id(mask)]))

    with mock.patch.object(layers, "attend", attend), mock.patch.object(model, "masks", masks):
        yield


@contextlib.contextmanager
def costed_varlen():
    """r18: an attention implementation named "costed" beside the real ones."""
    import speedrun.r18.attention as r18_attention

    def varlen(q, k, v, cu_seqlens, max_len, window, scale):  # q [T, H, D]
        T, H, D = q.shape
        return CostedAttention.apply(q, k, v, H * D * varlen_pairs(T, window))

    with mock.patch.dict(r18_attention.IMPLEMENTATIONS, costed=varlen):
        yield


# ----- collectives: recorded, not run ------------------------------------------------------------------------------

class _Done:
    def wait(self):
        return None

    def get_future(self):
        done = torch.futures.Future()
        done.set_result(None)
        return done


@contextlib.contextmanager
def recorded_collectives(world_size, sent):
    """torch.distributed as rank 0 of `world_size` ranks on NCCL: each collective's bytes per rank added to `sent`
    (a Counter by kind, with "<kind> calls"), nothing communicated."""
    def recorder(kind):
        def collective(first, second=None, *args, **kwargs):
            if kind in ("reduce_scatter", "all_gather"):  # (output, input list) / (output list, input)
                tensors = second if kind == "reduce_scatter" else first
                payload = sum(t.numel() * t.element_size() for t in tensors)
            elif kind in ("reduce_scatter_tensor",):
                payload = second.numel() * second.element_size()
            else:
                payload = first.numel() * first.element_size()
            sent[kind] += RING_SEND[kind](world_size) * payload
            sent[f"{kind} calls"] += 1
            return _Done()
        return collective

    patches = {kind: recorder(kind) for kind in RING_SEND}
    patches.update(is_initialized=lambda: True, get_rank=lambda *a, **k: 0,
                   get_world_size=lambda *a, **k: world_size, get_backend=lambda *a, **k: "nccl",
                   new_group=lambda *a, **k: None, barrier=lambda *a, **k: None,
                   init_process_group=lambda *a, **k: None, destroy_process_group=lambda *a, **k: None)
    with contextlib.ExitStack() as stack:
        for name, value in patches.items():
            stack.enter_context(mock.patch.object(dist, name, value))
        yield


# ----- one step ------------------------------------------------------------------------------------------------------

@dataclass
class StepCost:
    track: str
    flags: list
    world_size: int
    micro_batches: int  # this rank's per step
    tokens: int  # per micro-batch
    params: int = 0
    param_bytes: int = 0
    optimizer_state_bytes: int = 0
    flops: dict = field(default_factory=dict)  # forward / backward / optimizer, this rank
    saved_bytes: int = 0  # one micro-batch's tensors saved for the backward
    peak_bytes: int = 0  # eager
    head_fusable_bytes: int = 0  # saved by the eager head's softcap chain beyond one vocabulary-wide tensor
    sent_bytes: float = 0.0
    sent_by_kind: dict = field(default_factory=dict)  # collective -> bytes this rank sends
    collectives: dict = field(default_factory=dict)
    ops: dict = field(default_factory=dict)  # "phase op" -> count per step

    @property
    def fused_head_peak_bytes(self):
        """The peak with the head's softcap chain fused, as compiled: the eager peak less head_fusable_bytes."""
        return self.peak_bytes - self.head_fusable_bytes

    @property
    def total_flops(self):
        return sum(self.flops.values())

    def hbm_bytes(self):
        """The least HBM traffic of a step: parameters read by each micro-batch's forward and backward, saved
        activations written and read back once each, gradients written, optimiser state and parameters read and
        written once."""
        return (2 * self.micro_batches * self.param_bytes + 2 * self.micro_batches * self.saved_bytes
                + self.param_bytes + 2 * (self.optimizer_state_bytes + self.param_bytes))

    def lower_bound_ms(self):
        return 1e3 * max(self.total_flops / H100_DENSE_BF16_FLOPS, self.hbm_bytes() / H100_HBM_BYTES_PER_S,
                         self.sent_bytes / H100_NVLINK_BYTES_PER_S)


_SCRIPTS = {}


def script_module(name):
    if name not in _SCRIPTS:
        _SCRIPTS[name] = load_script(ROOT / name)
    return _SCRIPTS[name]


def resolve(track, flags):
    """The script and its resolved args. A checkpoint a run starts from is never read (the cost does not depend on
    the weights): --init-from names this file, which exists, wherever the arm's checkpoint is not written yet."""
    script, base = TRACKS[track]
    flags = list(flags)
    if "--init-from" in flags[:-1]:
        flags[flags.index("--init-from") + 1] = __file__
    return script_module(script), script_module(script).resolve_args(base + flags)


_MEASURED = {}


def measure(track, flags=(), world_size=RECORD_WORLD_SIZE, at=0.5, micro_batches=None, compiled=False):
    """measure_once, remembered: arms of several studies share their flags, each arm its track's baseline."""
    key = (track, tuple(flags), world_size, at, micro_batches, compiled)
    if key not in _MEASURED:
        _MEASURED[key] = measure_once(track, flags, world_size, at, micro_batches, compiled)
    return _MEASURED[key]


def measure_once(track, flags=(), world_size=RECORD_WORLD_SIZE, at=0.5, micro_batches=None, compiled=False):
    """The StepCost of one rank at `world_size` for the track's run with `flags` (a UsageError for flags its
    script refuses), at the step `at` of the way through the schedule. `compiled`: each micro-batch runs as the
    forward and backward graphs AOTAutograd partitions for inductor (compiled_micro_batch), so the saved and peak
    bytes are the compiled program's (its FLOPs and operations are the traced graphs', not comparable to eager's)."""
    module, args = resolve(track, flags)
    accum = VIRTUAL_RANKS // world_size
    run_batches = micro_batches or min(accum, 2 if world_size == 1 else 1)
    sent = Counter()
    meter = StepMeter()
    global _METER
    _METER = meter
    with FakeTensorMode(), recorded_collectives(world_size, sent), meter:
        cost = _measured_step(setup_step(module, args, track, at), track, world_size, run_batches, meter, compiled)
    _METER = None
    scale = accum / run_batches
    cost = replace(cost, track=track, flags=list(flags), world_size=world_size, micro_batches=accum,
                   peak_bytes=meter.peak, sent_bytes=sum(v for k, v in sent.items() if not k.endswith("calls")),
                   sent_by_kind={k: v for k, v in sorted(sent.items()) if not k.endswith("calls")},
                   collectives={k: int(v) for k, v in sorted(sent.items()) if k.endswith("calls")},
                   flops={phase: int(meter.flops[phase] * (scale if phase != "optimizer" else 1))
                          for phase in ("forward", "backward", "optimizer")},
                   ops={f"{phase} {name}": int(n * (scale if phase != "optimizer" else 1))
                        for (phase, name), n in sorted(meter.ops.items())})
    return cost


@contextlib.contextmanager
def saved_for_backward(param_storages, vocab_width, saved):
    """Records the storages autograd saves (parameters and buffers excluded: they exist anyway) in `saved`: storage
    -> (bytes, whether the tensor is as wide as the vocabulary: the head's logits and their softcap chain)."""
    def pack(t):
        key = t.untyped_storage()._cdata
        if key not in param_storages:
            saved[key] = (t.untyped_storage().nbytes(), t.ndim > 0 and t.shape[-1] == vocab_width)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def _model_figures(model, meter):
    params, buffers = list(model.parameters()), list(model.buffers())
    meter.own(params + buffers)
    return (sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params),
            {t.untyped_storage()._cdata for t in params + buffers})


def _micro_batches(meter, param_storages, vocab_width, run_one, count, loss_divisor=VIRTUAL_RANKS):
    """Forward and backward of `count` micro-batches; returns the largest micro-batch's saved bytes and the bytes
    a fused head would not save: every vocabulary-wide saved tensor but the largest (a compiled step fuses the
    softcap and the cross-entropy around the logits; eager keeps each link of that chain)."""
    most = fusable = 0
    for _ in range(count):
        saved = {}
        meter.phase = "forward"
        with saved_for_backward(param_storages, vocab_width, saved):
            loss = run_one()
        vocab_wide = [n for n, wide in saved.values() if wide]
        most = max(most, sum(n for n, _ in saved.values()))
        fusable = max(fusable, sum(vocab_wide) - max(vocab_wide, default=0))
        (loss / loss_divisor if loss_divisor != 1 else loss).backward()
    return most, fusable


@dataclass
class Setup:
    """What a measured step needs of a track: its model (bf16 as on CUDA), the forward's tensor inputs and further
    arguments, the attention stand-in, and its optimisers (world_size -> (step(), the gradient reducer or None))."""
    model: torch.nn.Module
    tensors: list
    extra_args: tuple
    attention: Callable
    optimizers: Callable
    tokens: int
    vocab_width: int


def _track_setup(module, args, track, at):
    """r14 and the small track: the script's Track (model, optimisers, window schedule), as run_training builds it
    on CUDA (bf16, the FP8 head where the track has one)."""
    spec = module.SMALL if track == "small" else module.MEDIUM
    cfg = spec.model_config(args)
    T = args.train_seq_len
    model = spec.model_class(cfg, max_seq_len=max(T, args.val_seq_len))
    model.cast_low_precision(torch.bfloat16)
    if hasattr(model, "fp8_head"):
        model.fp8_head = True  # as on an H100
    step = int(at * args.num_iterations)
    long_blocks = spec.window_blocks_at(step, args.num_iterations, cfg)

    def optimizers(world_size):
        opt = spec.optimizers(model, 0, world_size, fused_adam=True, ns_dtype=torch.bfloat16, compile_muon=False)
        if getattr(opt, "snoo", None) is not None:
            opt.snoo.calls = step  # as in a run: its outer step fires only at every `every`-th step, not this one
        return (lambda: opt.step(step, args.num_iterations)), opt.reducer

    tensors = [torch.zeros(T, dtype=torch.int64), torch.zeros(T, dtype=torch.int64), torch.tensor(long_blocks)]
    return Setup(model, tensors, (), lambda: costed_attention(model, cfg.block_size, long_blocks), optimizers, T,
                 model.lm_head_w.shape[0])


def _r18_setup(module, args, track, at):
    """--base r18: its model, schedule (batch size, windows, multi-token weights) and three optimisers."""
    from speedrun.r18.data import MAX_DOC_TOKENS, cu_seqlens_length, sequence_tokens
    from speedrun.r18.model import R18GPT
    from speedrun.r18.optim import R18Optimizers
    from speedrun.r18.train import r18_config, r18_schedule
    schedule = r18_schedule(args)
    step = int(at * args.num_iterations) | 1  # odd: the Adams step too
    model = R18GPT(r18_config(args), studies=args).cast_low_precision(torch.bfloat16)
    model.split_embed = step > schedule.split_step
    T = sequence_tokens(schedule.batch_size(step))

    def optimizers(world_size):
        opts = R18Optimizers(model, schedule, compiled=False)
        return (lambda: opts.step(step)), None

    tensors = [torch.zeros(T, dtype=torch.int32), torch.zeros(T, dtype=torch.int64),
               torch.zeros(cu_seqlens_length(T), dtype=torch.int32), torch.tensor(schedule.mtp_weights(step))]
    extra = (*schedule.windows(step), min(MAX_DOC_TOKENS, T), "costed")
    return Setup(model, tensors, extra, costed_varlen, optimizers, T, model.lm_head.weight.shape[0])


def setup_step(module, args, track, at):
    return (_r18_setup if getattr(args, "base", "r14") == "r18" else _track_setup)(module, args, track, at)


def _measured_step(setup, track, world_size, run_batches, meter, compiled=False):
    model = setup.model
    params, param_bytes, param_storages = _model_figures(model, meter)
    meter.own(setup.tensors)
    run_one = lambda: model(*setup.tensors, *setup.extra_args)  # noqa: E731
    if compiled:
        with meter.untracked():
            run_one = compiled_micro_batch(setup)
    start = meter.live
    opt_step, reducer = setup.optimizers(world_size)  # after `start`: the state made up front counts
    if reducer is not None:
        reducer.arm()
    # The step's work only: building the model and the optimisers' state is no part of it.
    meter.ops.clear(), meter.flops.clear()
    with setup.attention():
        saved, fusable = _micro_batches(meter, param_storages, setup.vocab_width, run_one, run_batches)
    if reducer is not None:
        reducer.finish_backward()
    meter.phase = "optimizer"
    opt_step()
    return StepCost(track, [], world_size, 0, setup.tokens, params=params, param_bytes=param_bytes,
                    optimizer_state_bytes=meter.live - start, saved_bytes=saved, head_fusable_bytes=fusable)


def _fused_nodes(graph):
    """The nodes of a partitioned graph whose values inductor computes inside their consumers' kernels instead of
    storing them, by its own rules for a GPU: a pointwise op (or a constant) all of whose users, through views, are
    pointwise ops or reductions, unless several users read it and its fused expression is large (more than
    realize_opcount_threshold ops, 30) or reads more than realize_reads_threshold (4) stored values - inductor stores
    such a reused value once rather than recompute it in each reader."""
    from torch._inductor import config
    opcount_limit = config.realize_opcount_threshold or config._realize_opcount_threshold_default

    def pointwise(node):
        return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and (
            torch.Tag.pointwise in node.target.tags or not node.all_input_nodes)

    def fuses_in(user):
        if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
            return False
        if user.target.is_view:
            return all(fuses_in(u) for u in user.users)
        return torch.Tag.pointwise in user.target.tags or torch.Tag.reduction in user.target.tags

    fused, reads, opcount = set(), {}, {}
    for node in graph.nodes:  # topological: a node's inputs are settled before it
        if not pointwise(node):
            continue
        reads[node] = set().union(*[reads[i] if i in fused else {i} for i in node.all_input_nodes])
        opcount[node] = 1 + sum(opcount[i] for i in node.all_input_nodes if i in fused)
        reused_large = len(node.users) > 1 and (opcount[node] > opcount_limit
                                                or len(reads[node]) > config.realize_reads_threshold)
        if node.users and all(fuses_in(u) for u in node.users) and not reused_large:
            fused.add(node)
    return fused


def _kernel(target):
    """What the GPU runs for a graph node: a custom op's own body, op by op (its fake implementation, which tracing
    uses, makes its outputs only, not the buffers inside such as the FP8 head's casts); else the op itself."""
    from torch._library.custom_ops import OPDEFS
    if isinstance(target, torch._ops.OpOverload) and target._schema.name in OPDEFS:
        return OPDEFS[target._schema.name]._init_fn
    return target


def _run_as_traced(graph_module, _):
    """A partitioned graph run op by op under the meter as inductor's code runs it: its inputs (the backward's saved
    tensors) dropped on entry (the boxed calling convention), each value freed after its last use, and the values
    inductor fuses away (_fused_nodes) computed untracked, so the live bytes rise and fall with the compiled
    program's buffers - the backward's transients, such as the head's logit gradient, where the graph stores them."""
    graph = graph_module.graph
    fused = _fused_nodes(graph)
    freed_after = {}
    last_user = {}
    for node in graph.nodes:
        for value in node.all_input_nodes:
            last_user[value] = node
    for value, node in last_user.items():
        freed_after.setdefault(node, []).append(value)

    def run(args):
        inputs = list(reversed(args))
        args.clear()
        values = {}
        for node in graph.nodes:
            if node.op == "placeholder":
                values[node] = inputs.pop()
            elif node.op == "output":
                return torch.fx.node.map_arg(node.args[0], values.__getitem__)
            elif node.op == "get_attr":  # a constant the trace lifted onto the graph module
                values[node] = operator.attrgetter(node.target)(graph_module)
            else:
                call_args, call_kwargs = torch.fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
                with _METER.untracked() if node in fused else contextlib.nullcontext():
                    values[node] = _kernel(node.target)(*call_args, **call_kwargs)
            for value in freed_after.get(node, ()):
                del values[value]
    run._boxed_call = True
    return run


def compiled_micro_batch(setup):
    """A micro-batch's loss as torch.compile's program: the forward traced by AOTAutograd with inductor's
    decompositions and partitioned by inductor's own partition function (its joint-graph passes, then the min-cut
    that picks what the forward saves), both graphs run by _run_as_traced; traced here by a first forward and
    backward whose gradients are dropped. Called with the meter not tracking (the trace's values are no part of
    the step)."""
    from functorch.compile import aot_function
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table
    named = list(setup.model.named_parameters()) + list(setup.model.named_buffers())

    def loss(*values):
        state, tensors = values[:len(named)], values[len(named):]
        return torch.func.functional_call(setup.model, {n: v for (n, _), v in zip(named, state)},
                                          (*tensors, *setup.extra_args))

    compiled = aot_function(loss, fw_compiler=_run_as_traced, bw_compiler=_run_as_traced, partition_fn=partition_fn,
                            decompositions=select_decomp_table())

    def run():
        return compiled(*[t for _, t in named], *setup.tensors)

    with setup.attention():
        run().backward()
    for p in setup.model.parameters():
        p.grad = None
    return run


# ----- the counts a change to the baseline must not move -------------------------------------------------------------

# The reduced size the reference is stored at: each track's full architecture (layer count and pattern) at the tiny
# preset's widths and sequence lengths.
REDUCED_FLAGS = {"r14": ["--preset", "tiny", "--num-layers", "16"], "r18": ["--preset", "tiny"],
                 "small": ["--preset", "tiny"]}


def counts(cost: StepCost):
    """The figures of a StepCost that the reference holds: every count and byte total, the ops per kind."""
    figures = dict(params=cost.params, param_bytes=cost.param_bytes, optimizer_state_bytes=cost.optimizer_state_bytes,
                   saved_bytes=cost.saved_bytes, peak_bytes=cost.peak_bytes, head_fusable_bytes=cost.head_fusable_bytes,
                   sent_bytes=round(cost.sent_bytes),
                   **{f"{phase} flops": n for phase, n in cost.flops.items()}, **cost.collectives)
    return dict(figures, ops=dict(cost.ops))


def count_differences(reference, now):
    """One line per figure or operation kind that differs ("forward mul: 54 -> 55"), operations first."""
    ops_ref, ops_now = reference.get("ops", {}), now.get("ops", {})
    lines = [f"{op}: {ops_ref.get(op, 0)} -> {ops_now.get(op, 0)}" for op in sorted(set(ops_ref) | set(ops_now))
             if ops_ref.get(op, 0) != ops_now.get(op, 0)]
    figures = (set(reference) | set(now)) - {"ops"}
    return lines + [f"{name}: {reference.get(name)} -> {now.get(name)}" for name in sorted(figures)
                    if reference.get(name) != now.get(name)]


def reduced_counts():
    """{track: counts} of the three baselines at the reduced size, world size 8."""
    return {track: counts(measure(track, flags)) for track, flags in REDUCED_FLAGS.items()}


# ----- arms, tables ------------------------------------------------------------------------------------------------

def bundled_arms(studies=None):
    """[(study, arm, track, flags, baseline flags)] of every bundled study (or those named), in file order."""
    from ablations.errors import StudyError
    from ablations.study import available_studies, load_study
    out = []
    names = studies or [p.stem for p in available_studies()]
    for name in names:
        try:
            study = load_study(name)
        except StudyError as e:  # e.g. arms generated from another study's results, not run here
            out.append((name, "-", None, str(e), None))
            continue
        for arm in study.arms:
            out.append((name, arm) + arm_track(study, arm) + (baseline_flags(study, arm),))
    return out


def arm_track(study, arm):
    """(track, flags) of one study arm: its script and base, its flags without the runner's own."""
    argv = study.argv(arm, 0, Path("runs"))
    if Path(study.script).name == "train_gpt.py":
        return "small", argv
    if "--base" in argv:
        i = argv.index("--base")
        base, argv = argv[i + 1], argv[:i] + argv[i + 2:]
        return base, argv
    return "r14", argv


def baseline_flags(study, arm):
    """The flags an arm is compared with: its study's `baseline` arm's when the study has one on the arm's track
    (same preset, schedule and checkpoint), else none (the track's record)."""
    track = arm_track(study, arm)[0]
    if "baseline" in study.arms and arm_track(study, "baseline")[0] == track:
        return arm_track(study, "baseline")[1]
    return []


def study_cost_lines(study, arms, at=0.5):
    """`python -m ablations run STUDY --dry-run`'s cost lines: each arm's cost per step at the study's world size,
    against its baseline (baseline_flags); none for a script other than the two training scripts (a test's
    stand-in)."""
    if Path(study.script).resolve() not in {(ROOT / name).resolve() for name, _ in TRACKS.values()}:
        return []
    lines = []
    for arm in arms:
        track, flags = arm_track(study, arm)
        try:
            cost = measure(track, flags, study.nproc, at)
            base = measure(track, baseline_flags(study, arm), study.nproc, at)
            lines.append(f"cost     {arm}: {cost_line(cost, base)}")
        except UsageError as e:
            lines.append(f"cost     {arm}: refused: {e}")
    return lines


def relative(cost: StepCost, base: StepCost):
    """(+x% FLOPs, +y MiB peak at this world size, +z parameters) against the baseline."""
    return (100 * (cost.total_flops / base.total_flops - 1), (cost.peak_bytes - base.peak_bytes) / MIB,
            cost.params - base.params)


def cost_line(cost: StepCost, base: StepCost | None = None, peak_one: int | None = None):
    tf = lambda n: f"{n / 1e12:.2f}"  # noqa: E731
    line = (f"params {cost.params / 1e6:.1f}M, state {cost.optimizer_state_bytes / MIB:,.0f} MiB, TFLOP fwd/bwd/opt "
            f"{tf(cost.flops['forward'])}/{tf(cost.flops['backward'])}/{tf(cost.flops['optimizer'])}, saved "
            f"{cost.saved_bytes / MIB:,.0f} MiB, peak {cost.peak_bytes / MIB:,.0f} MiB eager, "
            f"{cost.fused_head_peak_bytes / MIB:,.0f} head fused, at {cost.world_size}"
            + (f" ({peak_one / MIB:,.0f} at 1)" if peak_one is not None else "")
            + f", sent {cost.sent_bytes / MIB:,.0f} MiB, H100 >= {cost.lower_bound_ms():.1f} ms")
    if base is not None:
        flops, mib, params = relative(cost, base)
        line += f"; vs baseline {flops:+.2f}% FLOPs, {mib:+,.0f} MiB, {params:+,} params"
    return line


TABLE_HEAD = ("| study | arm | track | params | +params | TFLOP/step | +FLOPs | saved MiB | peak MiB | +MiB | sent MiB "
              "| H100 >= ms |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def table_row(study, arm, cost, base):
    flops, mib, params = relative(cost, base)
    return (f"| {study} | {arm} | {cost.track} | {cost.params / 1e6:.1f}M | {params:+,} | "
            f"{cost.total_flops / 1e12:.1f} | {flops:+.2f}% | {cost.saved_bytes / MIB:,.0f} | "
            f"{cost.peak_bytes / MIB:,.0f} | {mib:+,.0f} | {cost.sent_bytes / MIB:,.0f} | "
            f"{cost.lower_bound_ms():.1f} |")


def baseline(track, world_size=RECORD_WORLD_SIZE, at=0.5):
    return measure(track, (), world_size, at)


def markdown_table(arms, at=0.5):
    """The baselines at world size 8 and 1, then every arm at 8 against its baseline (baseline_flags)."""
    rows = ["| baseline | world size | params | TFLOP/step | saved MiB | peak MiB | sent MiB | H100 >= ms |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for track in TRACKS:
        for world_size in (RECORD_WORLD_SIZE, 1):
            cost = baseline(track, world_size, at)
            rows.append(f"| {track} | {world_size} | {cost.params / 1e6:.1f}M | {cost.total_flops / 1e12:.1f} | "
                        f"{cost.saved_bytes / MIB:,.0f} | {cost.peak_bytes / MIB:,.0f} | "
                        f"{cost.sent_bytes / MIB:,.0f} | {cost.lower_bound_ms():.1f} |")
    rows += ["", TABLE_HEAD]
    for study, arm, track, flags, base_flags in arms:
        if track is None:
            rows.append(f"| {study} | {arm} | not measured: {flags} | | | | | | | | | |")
            continue
        try:
            rows.append(table_row(study, arm, measure(track, flags, RECORD_WORLD_SIZE, at),
                                  measure(track, base_flags, RECORD_WORLD_SIZE, at)))
        except UsageError as e:
            rows.append(f"| {study} | {arm} | refused: {e} | | | | | | | | | |")
    return "\n".join(rows)


DOC_HEAD = """# What each study arm costs per step

Generated by `python benchmarks/step_cost.py --write-docs docs/step-cost.md` (do not edit by hand): every bundled
study arm's cost per optimiser step, at full size, measured on CPU under fake tensors (benchmarks/step_cost.py
says how). Per rank at world size 8 (the record's); the baselines also at world size 1; `+` columns against the
arm's study's `baseline` arm (the track's record when it has none) at world size 8. Measured at the middle of each
schedule ({at}). TFLOP/step: forward, backward and optimiser of one rank. H100 >= ms: a lower bound, the largest
of FLOPs at {flops:.0f} TFLOP/s (dense bf16), the step's least HBM traffic at {hbm:.2f} TB/s and the bytes sent at
{nvlink:.0f} GB/s (NVLink, one direction). Saved and peak MiB are eager's: a compiled step saves less and fuses its
pointwise chains (`--track T --compiled` gives its saved bytes and peak, the backward's transients included;
benchmarks/results/2026-11-28_cpu_step-cost.txt checks that peak against the GPU's).
FLOPs are those of matrix products and attention (torch's FLOP formulas, and the matrix-vector product): pointwise
work (norms, activations, the optimisers' element-wise updates) is not counted, so an arm that adds only pointwise
work shows +0.00%.

DLO's sparse arms (`dlo-sparsity` > 0) cost what their dense arm costs per training step, truly: in training every
token goes through every MLP and the router's gate scales its output (soft gating, or hard gating's zeroed gates,
still computed), so no MLP work is skipped; their routers add a matrix-vector product per layer (under 0.01%, shown
+0.00%). Skipping is real only in evaluation, where the active tokens are gathered and only they go through the MLP:
each run reports that forward's FLOPs relative to the dense model at every validation (`dlo.flops_rel`), which this
table (a training step) does not show.

"""


def add_at_flag(parser):
    """--at: where in the schedule the measured step is (both this command and upstream_step's)."""
    def fraction(text):
        value = float(text)
        if not 0 <= value <= 1:  # also refuses nan
            raise argparse.ArgumentTypeError(f"{text}: a fraction of the schedule, 0..1")
        return value
    parser.add_argument("--at", type=fraction, default=0.5,
                        help="where in the schedule the step is, 0..1 (default 0.5)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--track", choices=sorted(TRACKS), help="one configuration of this track (flags after --)")
    p.add_argument("--studies", help="comma-separated bundled studies (default: all)")
    add_at_flag(p)
    p.add_argument("--world-size", type=int, default=RECORD_WORLD_SIZE, choices=[1, 2, 4, 8])
    p.add_argument("--json", action="store_true", help="with --track: the full figures as JSON")
    p.add_argument("--compiled", action="store_true",
                   help="with --track: also the compiled step's saved bytes and peak (inductor's partition and "
                        "fusion rules, run under fake tensors: measure_once's `compiled`)")
    p.add_argument("--write-docs", metavar="PATH", help="write the markdown table of every bundled arm there")
    p.add_argument("--write-reference", metavar="PATH",
                   help="write the baselines' counts at the reduced size there "
                        "(tests/fixtures/step_cost_reference.json)")
    p.add_argument("flags", nargs="*", help="the training script's flags (after --)")
    a = p.parse_args(argv)
    try:
        if a.write_reference:
            Path(a.write_reference).write_text(json.dumps(reduced_counts(), indent=1, sort_keys=True) + "\n")
            return 0
        if a.track:
            cost = measure(a.track, a.flags, a.world_size, a.at)
            if a.json:
                print(json.dumps(dict(asdict(cost), lower_bound_ms=cost.lower_bound_ms()), indent=1))
            else:
                print(f"{a.track} {' '.join(a.flags)}: {cost_line(cost, baseline(a.track, a.world_size, a.at))}")
            if a.compiled:
                compiled = measure(a.track, a.flags, a.world_size, a.at, compiled=True)
                floor = 2 * compiled.param_bytes + compiled.optimizer_state_bytes + compiled.saved_bytes
                print(f"compiled: saved {compiled.saved_bytes / MIB:,.0f} MiB per micro-batch; peak "
                      f"{compiled.peak_bytes / MIB:,.0f} MiB at {a.world_size} ({floor / MIB:,.0f} of it parameters, "
                      f"their gradients, optimiser state and saved; the rest transients)")
            return 0
        arms = bundled_arms(a.studies.split(",") if a.studies else None)
        table = markdown_table(arms, a.at)
        if a.write_docs:
            head = DOC_HEAD.format(at=a.at, flops=H100_DENSE_BF16_FLOPS / 1e12, hbm=H100_HBM_BYTES_PER_S / 1e12,
                                   nvlink=H100_NVLINK_BYTES_PER_S / 1e9)
            Path(a.write_docs).write_text(head + table + "\n")
        print(table)
    except UsageError as e:
        print(f"step_cost: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
