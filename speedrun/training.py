"""The training run every base shares (run_training: the skeleton, written once), what a base supplies to it (a
BaseRun; TrackRun for the scripts' Tracks, speedrun.r18.train.R18Run for --base r18), and its pieces: the gradient
step, the validation pass, the kernel warm-up and the step / scalars / peak-memory log lines."""

import copy
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from speedrun.checkpoint import load_checkpoint, load_model_weights, load_resume_state, save_checkpoint
from data.shard_format import validate_shard
from speedrun.data import VIRTUAL_RANKS, TokenStream, check_stream_length, find_shards, read_shard
from speedrun.distributed import Dist, sync_gradients
from speedrun.errors import UsageError
from speedrun.layers import val_head_chunks
from speedrun.logformat import added_params_line, peak_line, scalars_line, train_step_line, validation_line
from speedrun.profiling import StepProfiler
from speedrun.run_config import at_run_start
from speedrun.runlog import LogWriter, write_preamble
from speedrun.schedule import run_schedule_origin, schedule_clock


def train_step(model, batches, window, proc: Dist, reducer=None):
    """Forward and backward of every micro-batch. With a GradientReducer the gradient averages are launched during
    the last backward and left in flight for the optimisers to wait on; without one they are done on return."""
    for i, (inputs, targets) in enumerate(batches):
        loss = model(inputs.to(proc.device), targets.to(proc.device), window)  # no-ops for stream batches
        if reducer is not None and i == len(batches) - 1:
            reducer.arm()
        (loss / len(batches)).backward()
    if reducer is None:
        sync_gradients(model, proc)
    else:
        reducer.finish_backward()


@torch.no_grad()
def validate(model, args, proc: Dist, window, fewest_head_chunks=1):
    """Mean validation loss over args.val_tokens tokens of args.val_files, read from the start; the head runs in
    val_head_chunks pieces of each sequence (at least fewest_head_chunks), whatever the compile mode."""
    head_chunks = val_head_chunks(args.val_seq_len, fewest_head_chunks)
    model.eval()
    stream = TokenStream(find_shards(args.val_files, "--val-files"), args.val_seq_len, "--val-files", proc.device)
    steps = args.val_tokens // (VIRTUAL_RANKS * args.val_seq_len)
    total = torch.zeros((), device=proc.device, dtype=torch.float32)
    for _ in range(steps):
        for inputs, targets in stream.next_batch(proc.virtual_ranks):
            total += model(inputs, targets, window, head_chunks=head_chunks).float()
    if proc.world_size > 1:
        dist.all_reduce(total)
    model.train()
    return (total / (steps * VIRTUAL_RANKS)).item()


def kernel_warmup(steps, model, opt, take_step):
    """Runs take_step(i) for i < steps (untimed: compiles the kernels), then restores the model's and the
    optimisers' state exactly as it was. `opt` has state_dict() (this rank's own state) / load_state_dict."""
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    for i in range(steps):
        take_step(i)
    model.zero_grad(set_to_none=True)  # a warm-up step may leave gradients for a later optimiser step (r18's Adam)
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)


def log_validation(log, step, num_iterations, val_loss, train_ms, scalars, decimals=6):
    log.write(validation_line(step, num_iterations, val_loss, train_ms, decimals), keep=True)
    log.write(scalars_line(step, num_iterations, scalars), echo=False, keep=True)


def log_train_step(log, steps_done, num_iterations, elapsed_ms):
    log.write(train_step_line(steps_done, num_iterations, elapsed_ms), echo=False, keep=True)


def peak_memory_line(proc: Dist):
    """The log's last line (a log without it is an unfinished run)."""
    if proc.device.type == "cuda":
        alloc = torch.cuda.max_memory_allocated() // 1024 // 1024
        reserved = torch.cuda.max_memory_reserved() // 1024 // 1024
    else:  # CPU: no allocator statistics; the process's peak resident memory stands in for both
        import resource
        alloc = reserved = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return peak_line(alloc, reserved)


def check_data(args):
    """Checks the run's shards (every header and size, the first train shard's tokens, enough validation tokens
    for one validation) and returns the train files. The study runner calls it too, before launching anything."""
    train_files = find_shards(args.train_files, "--train-files")
    val_files = find_shards(args.val_files, "--val-files")
    read_shard(train_files[0])
    try:
        check_stream_length(val_files, args.val_seq_len, args.val_tokens // (VIRTUAL_RANKS * args.val_seq_len),
                            "--val-files")
    except UsageError:
        # The stream (as upstream's) serves a step only from a shard holding the step, the target past its end and
        # one token more: a validation of N tokens needs N + 2 in one shard.
        total = sum(validate_shard(path) for path in val_files)
        raise UsageError(f"--val-files {args.val_files}: {total:,} tokens in {len(val_files)} shard(s), too few "
                         f"for one validation: --val-tokens {args.val_tokens} in steps of {VIRTUAL_RANKS} x "
                         f"--val-seq-len {args.val_seq_len} needs {args.val_tokens + 2:,} in one shard; lower "
                         f"--val-tokens, or write a longer val shard (data.tokenize_text --val-tokens "
                         f"{args.val_tokens + 2})") from None
    return train_files


def check_log_dir(log_dir):
    """Makes the log folder and checks that files can be written in it (a read-only mount, /proc)."""
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=log_dir, prefix=".write-check-"):
            pass
    except OSError as e:
        raise UsageError(f"--log-dir {log_dir}: cannot write there ({e.strerror or e})") from None


def checkpoint_due(args, steps_done, last_step):
    """Whether a checkpoint is written after steps_done steps (the run's end has its own save)."""
    return bool(args.checkpoint_every) and steps_done % args.checkpoint_every == 0 and steps_done < last_step


def restore_run_state(resume_state, opt, stream, log):
    """A resumed run's optimiser state, stream position, RNG and earlier log lines; returns (step, train_ms) to
    go on from ((0, 0.0) without a resume)."""
    if resume_state is None:
        return 0, 0.0
    opt.load_state_dict(resume_state["optimizers"])
    stream.restore(resume_state["stream"])
    torch.set_rng_state(resume_state["rng"]["cpu"])
    cuda_rng = resume_state["rng"]["cuda"]
    if torch.cuda.is_available() and cuda_rng is not None and len(cuda_rng) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda_rng)
    for line in resume_state["log_lines"]:
        log.write(line, echo=False, keep=True)
    return resume_state["step"], resume_state["train_ms"]


def compiles_model(config, device_type):
    """Whether the run torch.compiles its model: --compile on or regional, or auto on CUDA."""
    return config.compile in ("on", "regional") or (config.compile == "auto" and device_type == "cuda")


CPU_INDUCTOR_VECTOR_BITS = 256


def configure_inductor(device_type, coordinate_descent_tuning):
    """inductor's options for a compiled run. On CPU its C++ vector code is held to 256 bits: on an AVX-512
    machine torch 2.13's 512-bit code gave non-finite MLP-projection gradients in r18's bf16 model (tiny preset)
    where 256-bit, scalar, eager and AOTAutograd code agree (test_r18_compile). CUDA code is Triton's, unaffected."""
    import torch._inductor.config as inductor_config
    inductor_config.coordinate_descent_tuning = coordinate_descent_tuning
    if device_type == "cpu":
        inductor_config.cpp.simdlen = CPU_INDUCTOR_VECTOR_BITS


def validates_at(config, step, last_step):
    """Whether run_steps validates before `step`: every --val-every steps and at the last step."""
    return step == last_step or bool(config.val_every and step % config.val_every == 0)


def run_steps(config, proc: Dist, log, start_step, train_ms, sync, prepare, validate_and_log, train, save):
    """run_training's step loop: from start_step to the last step,
    prepare(step) -> that step's state, validation when due (validate_and_log(step, state, train_ms), the clock
    stopped between two sync() calls), train(step, state), the step's time line, a checkpoint when due
    (save(steps_done, train_ms)); at the end the final checkpoint when one is asked for."""
    N = config.num_iterations
    last_step = config.stop_after or N
    sync()
    t0 = time.perf_counter()
    for step in range(start_step, last_step + 1):
        is_last = step == last_step
        state = prepare(step)
        if validates_at(config, step, last_step):
            sync()
            train_ms += 1000 * (time.perf_counter() - t0)
            validate_and_log(step, state, train_ms)
            sync()
            t0 = time.perf_counter()
        if is_last:
            break
        train(step, state)
        log_train_step(log, step + 1, N, train_ms + 1000 * (time.perf_counter() - t0))
        if config.checkpoint_every and checkpoint_due(config, step + 1, last_step):
            train_ms += 1000 * (time.perf_counter() - t0)
            save(step + 1, train_ms)
            t0 = time.perf_counter()
    if config.checkpoint_every or config.save_final_checkpoint:
        save(last_step, train_ms)


class BaseRun:
    """What a base supplies to run_training for one run (its `begin(config, proc)` makes one). It defines, in the
    order the skeleton calls them:
      build_model(config, proc) -> the model, on the device, in its precision;
      optimizers(model, proc, compiled) -> (the optimisers: the study hooks' `opt`, stepped by optimizer_step;
        their state: state_dict / load_state_dict of what a checkpoint keeps);
      logged_config(config, proc) -> the config line's fields (the skeleton adds the parameter count);
      warmup(train_model, model, opt, config, proc, train_files) -> kernel_warmup's take_step(i) for
        config.warmup_steps steps;
      stream(train_files, config, proc) -> the training batches;
      validate(train_model, config, proc, step, state) -> the validation loss before `step`;
      forward_backward(train_model, stream, step, state, opt, proc); optimizer_step(opt, step);
      val_decimals: the decimals of the logged validation loss;
    and may replace the no-ops below."""

    def check_inputs(self, config, proc):
        """Checks of the base's own inputs, on every rank before any collective (UsageError)."""

    def settle(self, config, compiled, init_state, resume_state):
        """The run's config as it runs (and is logged): the schedule's origin, the warm-up's length."""
        return config

    def prepare_model(self, model, config, proc):
        """Model state of the base's own, set before the optimisers are built; returns the log lines saying it."""
        return []

    def compile(self, model, config, proc, compiled):
        """The model the steps run: compiled, or the model itself."""
        return model

    def after_restore(self, model, start_step):
        """Model state that follows the step the run starts at (0, or a resume's)."""

    def sync(self, proc):
        """Where the clock stops around a validation."""
        proc.barrier()

    def prepare(self, step):
        """Step `step`'s state, handed to validate and forward_backward."""

    def checkpoint_extra(self):
        """Entries of the base's own in every checkpoint."""
        return None


@dataclass
class Track:
    """What a training script of the #14 kind (r14, the small track) hands to run_training: its names, model,
    optimisers, schedules and log details."""
    name: str  # the config line's `track` (analysis maps it to the target)
    script: str  # the script's path: its source opens the log
    model_config: Callable  # args -> ModelConfig
    model_class: type  # a StudyGPT subclass: (cfg, max_seq_len)
    optimizers: Callable  # (model, rank, world_size, fused_adam, ns_dtype, compile_muon) -> TrackOptimizers
    window_blocks_at: Callable  # (step, num_iterations, cfg) -> attention window in blocks
    warmup: Callable  # (train_model, opt, args, proc, cfg) -> take_step(i) for the untimed kernel warm-up
    val_head_chunks: int = 1  # the fewest pieces validation's head splits a sequence into
    val_decimals: int = 6
    barrier_around_validation: bool = True  # False: the clock stops on a CUDA sync only
    coordinate_descent_tuning: Callable = lambda args: False
    # (model, args, proc) -> log lines: sets up track-specific model state before compilation (e.g. which lm head
    # runs); its lines are written after the config line.
    prepare_model: Callable = lambda model, args, proc: []

    def begin(self, config, proc):
        return TrackRun(self, config, proc)


class TrackRun(BaseRun):
    """One run of a Track: token-stream batches, one attention window per step (a tensor), the schedule's clock."""

    def __init__(self, track: Track, config, proc: Dist):
        self.track, self.cfg = track, track.model_config(config)
        self.low = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
            config.low_precision, torch.bfloat16 if proc.device.type == "cuda" else torch.float32)
        self.val_decimals, self.device = track.val_decimals, proc.device
        self.window_tensors = {}

    def settle(self, config, compiled, init_state, resume_state):
        config = at_run_start(config, compiled, run_schedule_origin(config, init_state, resume_state)
                              if config.resume or config.init_from else None)
        self.schedule_at = schedule_clock(config.init_schedule_origin, config.num_iterations)
        return config

    def build_model(self, config, proc):
        model = self.track.model_class(self.cfg, max_seq_len=max(config.train_seq_len, config.val_seq_len))
        model = model.to(proc.device)
        model.cast_low_precision(self.low)
        return model

    def prepare_model(self, model, config, proc):
        return self.track.prepare_model(model, config, proc)

    def optimizers(self, model, proc, compiled):
        # With --low-precision fp32 (CPU default) the NS5 iteration runs in fp32 too: bf16 matmuls are slow on CPU.
        # Muon's update is compiled where it pays (CUDA); on CPU the eager update keeps the bitwise reference.
        opt = self.track.optimizers(model, proc.rank, proc.world_size, fused_adam=proc.device.type == "cuda",
                                    ns_dtype=self.low, compile_muon=compiled and proc.device.type == "cuda")
        return opt, opt

    def compile(self, model, config, proc, compiled):
        if not compiled:
            return model
        configure_inductor(proc.device.type, self.track.coordinate_descent_tuning(config))
        if config.compile == "regional":
            model.compile_regions()
            return model
        return model.compile_whole()

    def logged_config(self, config, proc):
        return dict(config.as_dict(), track=self.track.name, world_size=proc.world_size, device=proc.device.type,
                    low_precision=str(self.low).replace("torch.", ""))

    def warmup(self, train_model, model, opt, config, proc, train_files):
        return self.track.warmup(train_model, opt, config, proc, self.cfg)

    def stream(self, train_files, config, proc):
        return TokenStream(train_files, config.train_seq_len, "--train-files", proc.device)

    def sync(self, proc):
        if proc.device.type == "cuda":
            torch.cuda.synchronize()
        if self.track.barrier_around_validation:
            proc.barrier()

    def prepare(self, step):
        # A tensor, so the compiled model is not specialised on (and recompiled for) each window size; one per
        # value, made once, so no step waits on a host-to-device copy.
        blocks = self.track.window_blocks_at(*self.schedule_at(step), self.cfg)
        if blocks not in self.window_tensors:
            self.window_tensors[blocks] = torch.tensor(blocks, device=self.device)
        return self.window_tensors[blocks]

    def validate(self, train_model, config, proc, step, window):
        return validate(train_model, config, proc, window, self.track.val_head_chunks)

    def forward_backward(self, train_model, stream, step, window, opt, proc):
        train_step(train_model, stream.next_batch(proc.virtual_ranks), window, proc, opt.reducer)

    def optimizer_step(self, opt, step):
        opt.step(*self.schedule_at(step))


def run_training(base, config, proc: Dist):
    """One training run of any base (a Track, or --base r18's speedrun.r18.train.R18): checks the inputs, builds
    model and optimisers (from a checkpoint with --init-from or --resume), writes the log preamble, warms the
    kernels up, then trains, validates and checkpoints. What differs by base comes from base.begin: a BaseRun."""
    run = base.begin(config, proc)
    problem = None
    try:  # every input that can be checked is, on every rank, before the log starts and before any collective
        train_files = check_data(config)
        # the tests on the flags let an exported file fold away what a run without them never executes
        resume_state = load_resume_state(config) if config.resume else None
        init_state = load_checkpoint(config.init_from) if config.init_from else None
        run.check_inputs(config, proc)
        if proc.rank == 0:
            check_log_dir(config.log_dir)  # last: it makes the folder
    except UsageError as e:
        problem = str(e)
    proc.agree(problem)
    compiled = compiles_model(config, proc.device.type)
    config = run.settle(config, compiled, init_state, resume_state)

    torch.manual_seed(config.seed)
    model = run.build_model(config, proc)
    # A study part may load the checkpoint itself (ModelPart.load_init_state: e.g. expanding it).
    if config.init_from and not model.parts_init_from(init_state, config):
        load_model_weights(model, init_state, config.init_from)
    if config.resume:
        load_model_weights(model, resume_state, config.resume)
    for p in model.parameters():  # identical start on every rank
        if proc.world_size > 1:
            dist.broadcast(p.data, 0)
    base_lines = run.prepare_model(model, config, proc)
    opt, opt_state = run.optimizers(model, proc, compiled)
    train_model = run.compile(model, config, proc, compiled)

    log = LogWriter(Path(config.log_dir) / f"{config.run_name}.txt", proc.rank == 0)
    logged = dict(run.logged_config(config, proc), params=sum(p.numel() for p in model.parameters()))
    write_preamble(log, base.script, proc, logged, [added_params_line(model.added_params())] + base_lines)

    N = config.num_iterations
    last_step = config.stop_after or N

    if config.warmup_steps:
        kernel_warmup(config.warmup_steps, model, opt_state,
                      run.warmup(train_model, model, opt, config, proc, train_files))
    if proc.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()  # the figure reports training, not the warm-up

    stream = run.stream(train_files, config, proc)
    start_step, train_ms = restore_run_state(resume_state, opt_state, stream, log) if config.resume else (0, 0.0)
    run.after_restore(model, start_step)
    ckpt_path = Path(config.log_dir) / f"{config.run_name}.pt"
    profiler = StepProfiler(max(start_step, last_step - config.profile_steps), proc.device) \
        if config.profile_steps else None

    def validate_and_log(step, state, train_ms):
        val_loss = run.validate(train_model, config, proc, step, state)
        log_validation(log, step, N, val_loss, train_ms, model.named_scalars(), run.val_decimals)

    def train(step, state):
        if config.profile_steps:
            profiler.begin_step(step)
        model.parts_before_step(config, step)
        run.forward_backward(train_model, stream, step, state, opt, proc)
        model.parts_after_step(opt, config, proc)
        if config.profile_steps:
            with profiler.optimizer():
                run.optimizer_step(opt, step)
        else:
            run.optimizer_step(opt, step)

    def save(steps_done, train_ms):
        save_checkpoint(ckpt_path, model, opt_state, stream, steps_done, train_ms, config, log, proc,
                        extra=run.checkpoint_extra())

    run_steps(config, proc, log, start_step, train_ms, lambda: run.sync(proc), run.prepare, validate_and_log,
              train, save)
    if config.profile_steps:
        profiler.finish(Path(config.log_dir) / f"{config.run_name}.profile.json" if proc.rank == 0 else None)
    log.write(peak_memory_line(proc))
    log.close()
