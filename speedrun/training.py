"""The training run both tracks share (run_training), parameterised by a Track, and its pieces: the gradient
step, the validation pass, the kernel warm-up skeleton and the step / scalars / peak-memory log lines."""

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
    """The step loop both training paths share (run_training, and --base r18's): from start_step to the last step,
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


@dataclass
class Track:
    """What a training script hands to run_training: its names, model, optimisers, schedules and log details."""
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


def run_training(track: Track, config, proc: Dist):
    """One training run: checks the data, builds model and optimisers (from a checkpoint with --init-from or
    --resume), writes the log preamble, warms the kernels up, then trains, validates and checkpoints."""
    cfg = track.model_config(config)
    problem = None
    try:  # every input that can be checked is, on every rank, before the log starts and before any collective
        train_files = check_data(config)
        # the tests on the flags let an exported file fold away what a run without them never executes
        resume_state = load_resume_state(config) if config.resume else None
        init_state = load_checkpoint(config.init_from) if config.init_from else None
        if proc.rank == 0:
            check_log_dir(config.log_dir)  # last: it makes the folder
    except UsageError as e:
        problem = str(e)
    proc.agree(problem)
    low = {"bf16": torch.bfloat16, "fp32": torch.float32}.get(
        config.low_precision, torch.bfloat16 if proc.device.type == "cuda" else torch.float32)
    compiled = compiles_model(config, proc.device.type)
    config = at_run_start(config, compiled, run_schedule_origin(config, init_state, resume_state)
                          if config.resume or config.init_from else None)
    schedule_at = schedule_clock(config.init_schedule_origin, config.num_iterations)

    torch.manual_seed(config.seed)
    model = track.model_class(cfg, max_seq_len=max(config.train_seq_len, config.val_seq_len)).to(proc.device)
    model.cast_low_precision(low)
    # A study part may load the checkpoint itself (ModelPart.init_from: e.g. expanding it).
    if config.init_from and not model.parts_init_from(init_state, config):
        load_model_weights(model, init_state, config.init_from)
    if config.resume:
        load_model_weights(model, resume_state, config.resume)
    for p in model.parameters():  # identical start on every rank
        if proc.world_size > 1:
            dist.broadcast(p.data, 0)
    track_lines = track.prepare_model(model, config, proc)
    # With --low-precision fp32 (CPU default) the NS5 iteration runs in fp32 too: bf16 matmuls are slow on CPU.
    # Muon's update is compiled where it pays (CUDA); on CPU the eager update keeps the bitwise reference.
    opt = track.optimizers(model, proc.rank, proc.world_size, fused_adam=proc.device.type == "cuda", ns_dtype=low,
                           compile_muon=compiled and proc.device.type == "cuda")
    if compiled:
        configure_inductor(proc.device.type, track.coordinate_descent_tuning(config))
        if config.compile == "regional":
            model.compile_regions()
            train_model = model
        else:
            train_model = model.compile_whole()
    else:
        train_model = model

    log = LogWriter(Path(config.log_dir) / f"{config.run_name}.txt", proc.rank == 0)
    logged = dict(config.as_dict(), track=track.name, world_size=proc.world_size, device=proc.device.type,
                  low_precision=str(low).replace("torch.", ""),
                  params=sum(p.numel() for p in model.parameters()))
    added = model.added_params()
    write_preamble(log, track.script, proc, logged, [added_params_line(added)] + track_lines)

    N = config.num_iterations
    last_step = config.stop_after or N

    if config.warmup_steps:
        kernel_warmup(config.warmup_steps, model, opt, track.warmup(train_model, opt, config, proc, cfg))
    if proc.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()  # the figure reports training, not the warm-up
    window_tensors = {}

    stream = TokenStream(train_files, config.train_seq_len, "--train-files", proc.device)
    start_step, train_ms = restore_run_state(resume_state, opt, stream, log) if config.resume else (0, 0.0)
    ckpt_path = Path(config.log_dir) / f"{config.run_name}.pt"

    def sync():
        if proc.device.type == "cuda":
            torch.cuda.synchronize()
        if track.barrier_around_validation:
            proc.barrier()

    profiler = StepProfiler(max(start_step, last_step - config.profile_steps), proc.device) \
        if config.profile_steps else None

    def window_at(step):
        # A tensor, so the compiled model is not specialised on (and recompiled for) each window size; one per
        # value, made once, so no step waits on a host-to-device copy.
        blocks = track.window_blocks_at(*schedule_at(step), cfg)
        if blocks not in window_tensors:
            window_tensors[blocks] = torch.tensor(blocks, device=proc.device)
        return window_tensors[blocks]

    def validate_and_log(step, window, train_ms):
        val_loss = validate(train_model, config, proc, window, track.val_head_chunks)
        log_validation(log, step, N, val_loss, train_ms, model.named_scalars(), track.val_decimals)

    def train(step, window):
        if config.profile_steps:
            profiler.begin_step(step)
        model.parts_before_step(config, step)
        train_step(train_model, stream.next_batch(proc.virtual_ranks), window, proc, opt.reducer)
        model.parts_after_step(opt, config, proc)
        if config.profile_steps:
            with profiler.optimizer():
                opt.step(*schedule_at(step))
        else:
            opt.step(*schedule_at(step))

    def save(steps_done, train_ms):
        save_checkpoint(ckpt_path, model, opt, stream, steps_done, train_ms, config, log, proc)

    run_steps(config, proc, log, start_step, train_ms, sync, window_at, validate_and_log, train, save)
    if config.profile_steps:
        profiler.finish(Path(config.log_dir) / f"{config.run_name}.profile.json" if proc.rank == 0 else None)
    log.write(peak_memory_line(proc))
    log.close()
