"""`train_gpt_medium.py --base r18`: what record #18 supplies to the run loop every base shares
(speedrun.training.run_training, with its run log, checkpoints and resume): R18Run, its model, NorMuon + odd-step
Adam, BOS-aligned batches and schedules.

Sizes: the full preset is the record (16 x 1024, 4700 + 40 steps, 131k -> 524k tokens per step, validation in
sequences of --val-seq-len); a smaller preset keeps the record's 16 layers with its own width, and its step is
8 x --train-seq-len tokens at the end of the batch ramp (131k/524k of that at the start, as the record).
The studies add to its model by the rule of speedrun.r18.studies, through the ModelPart hooks as on #14.
--init-from loads a checkpoint's model weights (unless a study part loads it: DLO's routers expand it).

--compile on (auto: on CUDA) compiles the whole model as the record does (fullgraph, dynamic=False) for training
and validation; --compile off runs it eager. The compiled model is specialised on the batch size, both windows,
the number of MTP weights and whether the embedding is untied: the schedule says which of these the run meets
(compiled_graphs), the kernel warm-up compiles each of them before the clock starts and the state is restored
after it, and one more compile fails the run instead of falling back to eager. --compile regional is refused:
r18 averages its gradients in the optimisers, so compiling by region buys nothing here."""

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from speedrun.data import VIRTUAL_RANKS, find_shards
from speedrun.errors import UsageError
from speedrun.r18.attention import kernel_history, resolve_attention
from speedrun.r18.data import MAX_DOC_TOKENS, BosAlignedStream, ValidationStream
from speedrun.r18.model import R18Config, R18GPT
from speedrun.r18.optim import R18Optimizers
from speedrun.r18.schedule import R18Schedule
from speedrun.training import BaseRun, configure_inductor, run_training, validates_at

RECORD_STEPS = 4740
RECORD_EXTENSION = 40
RECORD_FINAL_STEP_TOKENS = 524288


def r18_schedule(args):
    """The record's schedule over --num-iterations steps (the last 40/4740 of them the extension)."""
    N = args.num_iterations
    extension = N * RECORD_EXTENSION // RECORD_STEPS
    step_tokens = VIRTUAL_RANKS * args.train_seq_len if args.preset != "full" else RECORD_FINAL_STEP_TOKENS
    record = R18Schedule()
    scale = lambda tokens: tokens * step_tokens // RECORD_FINAL_STEP_TOKENS  # noqa: E731
    return R18Schedule(num_scheduled_iterations=N - extension, num_extension_iterations=extension,
                       batch_sizes=tuple(map(scale, record.batch_sizes)),
                       extension_batch_size=scale(record.extension_batch_size))


def r18_config(args):
    if args.num_heads * args.head_dim != args.model_dim:
        raise UsageError(f"--base r18 needs --num-heads x --head-dim == --model-dim "
                         f"({args.num_heads} x {args.head_dim} != {args.model_dim})")
    return R18Config(model_dim=args.model_dim, num_heads=args.num_heads, head_dim=args.head_dim,
                     block_size=args.block_size, max_seq_len=max(args.val_seq_len, args.train_seq_len * 8))


class Windows:
    """The long/short windows and the YaRN re-scaling of the rotary tables as the long window grows (only up to
    yarn_max_window_blocks, as the record)."""

    def __init__(self, model, schedule):
        self.model, self.schedule = model, schedule
        model.yarn.reset()
        self.short, self.long = schedule.windows(0)

    def advance(self, step):
        short, long = self.schedule.windows(step)
        if long != self.long and long <= self.schedule.yarn_max_window_blocks:
            self.model.yarn.apply(self.long, long)
        self.short, self.long = short, long


def validation_windows(schedule, step, num_iterations):
    """(short, long) windows of the validation before `step`: the last one's long window is the record's wider
    one."""
    short, long = schedule.windows(step)
    return short, schedule.validation_window_blocks if step == num_iterations else long


def training_loss(model, batch, mtp, windows, attention, proc):
    inputs, targets, cu = batch
    return model(inputs.to(proc.device), targets.to(proc.device), cu.to(proc.device), mtp, *windows,
                 min(MAX_DOC_TOKENS, inputs.numel()), attention)


def validation_loss(model, batch, windows, attention, args, proc):
    inputs, targets, cu = batch
    return model(inputs.to(proc.device), targets.to(proc.device), cu.to(proc.device), None, *windows,
                 args.val_seq_len, attention)


def validation_stream(args):
    return ValidationStream(find_shards(args.val_files, "--val-files"), "--val-files")


def forward_backward(model, batches, mtp, windows, attention, proc):
    """Gradients of this rank's micro-batches of a step (their losses summed, scaled by the accumulation)."""
    for batch in batches:
        (training_loss(model, batch, mtp, windows, attention, proc) / proc.grad_accum).backward()


@torch.no_grad()
def validate(model, args, proc, windows, attention):
    model.eval()
    stream = validation_stream(args)
    steps = args.val_tokens // (VIRTUAL_RANKS * args.val_seq_len)
    total = torch.zeros((), device=proc.device)
    for _ in range(steps):
        for batch in stream.micro_batches(VIRTUAL_RANKS * args.val_seq_len, proc.rank, proc.world_size):
            total += validation_loss(model, batch, windows, attention, args, proc).float()
    if proc.world_size > 1:
        dist.all_reduce(total)
    model.train()
    return (total / (steps * VIRTUAL_RANKS)).item()


def training_graph(schedule, step):
    """What the compiled graph of training step `step` is specialised on: the batch size (input and cu_seqlens
    shapes, max_len), both windows (the rotary tables' YaRN scale follows the long one), the number of MTP
    weights, and whether the embedding is untied from the head yet."""
    return ("train", schedule.batch_size(step), schedule.windows(step), len(schedule.mtp_weights(step)),
            step > schedule.split_step)


def validation_graph(schedule, step, num_iterations):
    """The same for the validation before `step` (its batch is the same at every step)."""
    return "val", validation_windows(schedule, step, num_iterations), step > schedule.split_step


def compiled_graphs(schedule, args, start_step, last_step):
    """{graph: the first step that meets it} over the steps this run takes (start_step to last_step) and the
    validations it runs among them, in step order."""
    graphs = {}
    for step in range(start_step, last_step + 1):
        if validates_at(args, step, last_step):
            graphs.setdefault(validation_graph(schedule, step, args.num_iterations), step)
        if step < last_step:
            graphs.setdefault(training_graph(schedule, step), step)
    return graphs


def compile_r18(model, graphs, coordinate_descent_tuning, device_type):
    """The whole model compiled as the record compiles it, allowed as many graphs as the run meets (or dynamo's
    limit, if larger); one more fails the run (fail_on_recompile_limit_hit) rather than running that step eager."""
    import torch._dynamo.config as dynamo_config
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, len(graphs))
    dynamo_config.accumulated_recompile_limit = max(dynamo_config.accumulated_recompile_limit, len(graphs))
    dynamo_config.fail_on_recompile_limit_hit = True
    configure_inductor(device_type, coordinate_descent_tuning)
    return torch.compile(model, dynamic=False, fullgraph=True)


def warmup_step_per_graph(train_model, model, opts, schedule, graphs, train_files, args, proc, attention):
    """kernel_warmup's take_step(i) for the i-th graph of `graphs`: the windows (and YaRN tables) advanced to its
    step, then one validation micro-batch or one training step with its optimiser step, on batches of a stream of
    the warm-up's own (the run's stream does not move). The first step of each graph is its step in the run, so
    every graph is compiled with the state that step has; the YaRN tables are reset by the run's Windows."""
    windows = Windows(model, schedule)
    stream = BosAlignedStream(train_files, "--train-files")
    val_stream = validation_stream(args)
    plan = list(graphs.items())

    def take_step(i):
        graph, step = plan[i]
        for s in range(plan[i - 1][1] + 1 if i else 0, step + 1):
            windows.advance(s)
        model.split_embed = step > schedule.split_step
        if graph[0] == "val":
            model.eval()
            with torch.no_grad():
                batch = val_stream.micro_batches(VIRTUAL_RANKS * args.val_seq_len, proc.rank, proc.world_size)[0]
                validation_loss(train_model, batch, validation_windows(schedule, step, args.num_iterations),
                                attention, args, proc)
            model.train()
            return
        mtp = torch.tensor(schedule.mtp_weights(step), device=proc.device)
        forward_backward(train_model, stream.micro_batches(schedule.batch_size(step), proc.rank, proc.world_size),
                         mtp, schedule.windows(step), attention, proc)
        # an odd step: the Adams step too, so their compiled arithmetic is warm before the clock (graphs mostly
        # start at even steps); the untying stays with the run's own step (the warm-up's state is restored)
        opts.step(step | 1 if step | 1 != schedule.split_step else step)
    return take_step


class R18OptimizerState:
    """state_dict/load_state_dict over the three optimisers for speedrun.checkpoint, whole per parameter so a
    checkpoint loads at any world size: NorMuon's state lives on the rank that steps each slice (stacked over the
    slice's parameters), is split per parameter and merged onto rank 0 by `merge`; the Adams' row shards are
    gathered onto rank 0 (whole moments, as a replicated run saved them). Each rank reloads its own slices and rows.
    A checkpoint from before the per-parameter split ("muon": stacked slices) loads at its own world size."""

    def __init__(self, opts: R18Optimizers):
        self.opts = opts
        self.muon_index = {id(p): str(i) for i, p in enumerate(p for g in opts.muon.param_groups for p in g["params"])}

    def _muon_by_param(self):
        """This rank's NorMuon state, {parameter index: {key: that parameter's rows of the slice's state}}. A slice's
        state has the same number of rows per parameter (its padding past the group's end dropped here)."""
        local = {}
        for group in self.opts.muon.param_groups:
            chunk, mine = self.opts.muon._my_slice(group)
            for key, stacked in (self.opts.muon.state[mine[0]].items() if mine else ()):
                for p, rows in zip(mine, stacked.view(chunk, -1, *stacked.shape[1:])):
                    local.setdefault(self.muon_index[id(p)], {})[key] = rows.clone()  # not a view of the stack
        return local

    def state_dict(self, merge=lambda local: local):
        return dict(adam=self.opts.adam.merged_state_dict(), scalar_adam=self.opts.scalar_adam.merged_state_dict(),
                    muon_by_param=merge(self._muon_by_param()))

    def load_state_dict(self, state):
        self.opts.adam.load_state_dict(state["adam"])
        self.opts.scalar_adam.load_state_dict(state["scalar_adam"])
        muon = self.opts.muon
        if "muon_by_param" not in state:
            self._check_stacked_slices_fit(state["muon"])
        for group in muon.param_groups:
            chunk, mine = muon._my_slice(group)
            if not mine:
                continue
            if "muon_by_param" not in state:
                saved = state["muon"].get(self.muon_index[id(mine[0])])
            elif self.muon_index[id(mine[0])] in state["muon_by_param"]:
                pieces = [state["muon_by_param"][self.muon_index[id(p)]] for p in mine]
                # the padded slots of the last slice hold zeros, as in a run: their gradient is zero
                saved = {key: torch.cat([piece[key] for piece in pieces]
                                        + [torch.zeros_like(pieces[0][key])] * (chunk - len(mine)))
                         for key in pieces[0]}
            else:
                saved = None  # not stepped before the checkpoint
            if saved is None:  # no state when saved: the kernel warm-up's must not outlive the restore
                muon.state.pop(mine[0], None)
            else:
                muon.state[mine[0]] = {k: v.to(mine[0].device) for k, v in saved.items()}

    def _check_stacked_slices_fit(self, stacked_slices):
        """Raises UsageError unless the stacked slices of an older checkpoint are this world size's."""
        muon = self.opts.muon
        chunks = [(group, -(-len(group["params"]) // muon.world_size)) for group in muon.param_groups]
        firsts = {self.muon_index[id(group["params"][start])] for group, chunk in chunks
                  for start in range(0, len(group["params"]), chunk)}
        if stacked_slices and set(stacked_slices) != firsts:
            raise UsageError("--resume: the checkpoint's NorMuon state is stacked per rank (saved before it was "
                             "saved per parameter) at another world size; resume it with the number of processes "
                             "that saved it")


class R18Run(BaseRun):
    """One --base r18 run for run_training: R18GPT in bf16, NorMuon + odd-step Adam, BOS-aligned batches, the
    record's schedule and windows, a warm-up step per compiled graph and the attention kernels in the log."""

    val_decimals = 6

    def __init__(self, config, proc):
        if config.checkpoint_every and config.checkpoint_every % 2:
            raise UsageError(f"--checkpoint-every {config.checkpoint_every}: --base r18 checkpoints after odd steps "
                             f"only (Adam's gradients are summed over two steps), so it must be even")
        self.cfg, self.schedule = r18_config(config), r18_schedule(config)

    def check_inputs(self, config, proc):
        self.attention = resolve_attention(config.attention, proc.device.type)

    def settle(self, config, compiled, init_state, resume_state):
        start_step = resume_state["step"] if config.resume else 0
        self.graphs = compiled_graphs(self.schedule, config, start_step, config.stop_after or config.num_iterations) \
            if compiled else {}
        # A resume on another kernel (another node) is labelled with both: train_time is then no one kernel's
        self.kernels = kernel_history(resume_state.get("attention") if config.resume else None, self.attention,
                                      start_step)
        # the config line says what ran
        return replace(config, warmup_steps=len(self.graphs) if compiled and config.warmup_steps != 0 else 0)

    def build_model(self, config, proc):
        return R18GPT(self.cfg, studies=config).to(proc.device).cast_low_precision(torch.bfloat16)

    def prepare_model(self, model, config, proc):
        return [f"r18 attention: {self.kernels} (train_time comparable with the record's only on fa3 throughout)"]

    def optimizers(self, model, proc, compiled):
        # compiled with the model, as #18 compiles its optimiser steps
        opts = R18Optimizers(model, self.schedule, compiled=compiled)
        return opts, R18OptimizerState(opts)

    def compile(self, model, config, proc, compiled):
        return compile_r18(model, self.graphs, config.coordinate_descent_tuning == "on", proc.device.type) \
            if compiled else model

    def logged_config(self, config, proc):
        return dict(vars(config), track="medium", base="r18", world_size=proc.world_size, device=proc.device.type,
                    attention=self.kernels)

    def warmup(self, train_model, model, opt, config, proc, train_files):
        return warmup_step_per_graph(train_model, model, opt, self.schedule, self.graphs, train_files, config, proc,
                                     self.attention)

    def stream(self, train_files, config, proc):
        return BosAlignedStream(train_files, "--train-files")

    def after_restore(self, model, start_step):
        self.windows = Windows(model, self.schedule)
        model.split_embed = start_step > self.schedule.split_step
        for step in range(start_step):  # the rotary tables as the windows grew
            self.windows.advance(step)

    def prepare(self, step):
        self.windows.advance(step)

    def validate(self, train_model, config, proc, step, _):
        return validate(train_model, config, proc, validation_windows(self.schedule, step, config.num_iterations),
                        self.attention)

    def forward_backward(self, train_model, stream, step, _, opt, proc):
        mtp = torch.tensor(self.schedule.mtp_weights(step), device=proc.device)
        forward_backward(train_model,
                         stream.micro_batches(self.schedule.batch_size(step), proc.rank, proc.world_size),
                         mtp, (self.windows.short, self.windows.long), self.attention, proc)

    def optimizer_step(self, opt, step):
        opt.step(step)

    def checkpoint_extra(self):
        return dict(attention=self.kernels)


@dataclass
class R18:
    """--base r18 as run_training's base."""
    script: str  # the script's path: its source opens the log

    def begin(self, config, proc):
        return R18Run(config, proc)


def run_r18(args, proc, script):
    run_training(R18(script), args, proc)
