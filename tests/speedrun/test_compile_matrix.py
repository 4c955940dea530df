"""Every arm of every bundled study (both tracks) under --compile off, on and regional, at tiny size on CPU inductor:
two real optimiser steps (hooks launching the gradient averages as on 2 ranks, the optimisers, DLO's per-step
hooks) each followed by a validation, as run_training runs them. Per arm: the losses of both steps (the second
after one optimiser update; at the real init the first is ln(50257) in every mode) under each compile mode equal
eager's to compile rounding, and a compiled mode has no graph break and compiles nothing after the first step and
validation. An arm on --base r18 runs as train_gpt_medium.py runs it (check_r18_arm: its kernel warm-up, two
steps, validations), under --compile off and on.

Arms that build the same model are one cell: the compiled graphs are a function of the model configuration, and
the run flags that set no part of it (--num-iterations, --stop-after, checkpoints, --compile itself, DLO's
schedule flags) change no graph. A medium arm runs at the tiny preset's 6 layers, or at the fewest layers that hold
a layer it names (13 for layer 11); a DLO arm expands a tiny 6-layer checkpoint in 2 groups (its 4 do not divide 6).
The multi-skip study's arms are generated from a finished sweep: they are backout sums of the kinds the sweep and
the norms study already run.

Backends: inductor on CPU costs ~90 s a cell here (its C++ codegen), so the CI-sized matrix runs every cell under
dynamo with AOTAutograd and no codegen (`aot_eager`: the graph breaks, recompiles, functionalisation and the
compiled backward with its gradient hooks are all there; only inductor's lowering is not), and under inductor
only models that between them hold every kind of operation the arms add (each arm is a baseline plus its own):
the cells of INDUCTOR_ARMS (run under inductor instead of aot_eager: its run holds every check of the aot_eager
one) and COMPOSED_UNDER_INDUCTOR, one model holding several studies' operations at once (a composition no
study runs, so its arms keep their aot_eager cells). COMPILE_MATRIX=inductor runs every cell under inductor,
COMPILE_MATRIX=full every model configuration. An inductor cell runs in
a process of its own (own_process: inductor's compiled kernels stay loaded for the life of a process); the time of
each compile-mode run is printed (pytest -s). Every cell under inductor, run once: benchmarks/results/
2026-11-25_cpu_compile-matrix-inductor-all.txt (all pass, 68 CPU-minutes)."""
import functools
import importlib
import os
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

from ablations.study import available_studies, load_study
from speedrun.checkpoint import load_checkpoint
from speedrun.data import TokenStream, find_shards
from speedrun.distributed import Dist, GradientReducer
from speedrun.dlo import dlo_after_step, dlo_before_step, dlo_expand_from_checkpoint
from speedrun.errors import UsageError
from speedrun.training import Track, configure_inductor, train_step, validate

MODES = ("off", "on", "regional")
STEPS = 2
MICRO_BATCHES = 2  # of the 8 per step: the last one launches the averages, an earlier one only accumulates
TINY_PRESET_LAYERS = 6
CHECKPOINT_LAYERS = TINY_PRESET_LAYERS  # the DLO cells' base checkpoint: the tiny preset's model
# Flags of a study arm that set no part of the model (the matrix supplies its own --compile and --init-from).
RUN_ONLY_FLAGS = {"--num-iterations": 1, "--stop-after": 1, "--save-final-checkpoint": 0, "--init-schedule": 1,
                  "--compile": 1, "--init-from": 1}
SECONDS = []


def model_flags(argv):
    """argv without the run-only flags; whether it had --init-from (a DLO arm's checkpoint)."""
    out, i, init_from = [], 0, False
    while i < len(argv):
        if argv[i] in RUN_ONLY_FLAGS:
            init_from |= argv[i] == "--init-from"
            i += 1 + RUN_ONLY_FLAGS[argv[i]]
            continue
        out.append(argv[i])
        i += 1
    return out, init_from


def compiled_study_arms():
    """(study, arm, argv) of every bundled study arm the matrix covers: all but those of studies generated from
    another's results."""
    for path in available_studies():
        if "requires_results" in tomllib.loads(path.read_text()):
            continue
        needs_checkpoint = "base_checkpoint" in tomllib.loads(path.read_text()).get("vars", {})
        study = load_study(str(path), {"base_checkpoint": "unused.pt"} if needs_checkpoint else None)
        for arm in study.arms:
            yield study, arm, study.argv(arm, study.seeds[0], Path("runs"))


def bundled_arms():
    """(script module name, model flags, needs a checkpoint, [study:arm names]) per distinct arm."""
    cells = {}
    for study, arm, argv in compiled_study_arms():
        flags, init_from = model_flags(argv)
        if "--dlo-groups" in flags:
            flags += ["--dlo-groups", "2"]
        key = (study.script.stem, tuple(flags), init_from)
        cells.setdefault(key, []).append(f"{study.name}:{arm}")
    return cells


def resolve(track, flags, data_args, checkpoint):
    """The arm's args at tiny size: the tiny preset's 6 layers, or the fewest layers that hold every layer the arm
    names (tracing cost grows with depth; the layer count is no part of a cell's graph structure, see below)."""
    extra = ["--init-from", str(checkpoint)] if checkpoint else []
    try:
        return track.resolve_args(data_args + extra + flags)
    except UsageError as too_shallow:
        for layers in range(TINY_PRESET_LAYERS + 1, 17):
            try:
                return track.resolve_args(data_args + ["--num-layers", str(layers)] + extra + flags)
            except UsageError:
                continue
        raise too_shallow


# Config fields that set only initial values or which layer feeds a skip: arms differing only in them trace the
# same operations in the same graphs, so by default (a CI-sized matrix: every distinct model is ~2.5 CPU-hours)
# one of them stands for all. COMPILE_MATRIX=full runs one cell per distinct model configuration.
SAME_GRAPH_FIELDS = ("backout_x_init", "backout_skip_init", "laurel_factor_init", "laurel_zero_factor", "dlo_init",
                     "dlo_router_init", "num_layers", "baseline_layers", "laurel_rw_scale", "dlo_score_scale",
                     "dlo_threshold")


def graph_structure(cfg):
    """The model configuration with the fields above left out, each backout source reduced to its kind (a layer
    index or a named embedding) and the gated skip's source layer to whether there is one."""
    fields = {k: v for k, v in vars(cfg).items() if k not in SAME_GRAPH_FIELDS}
    fields["backout_layers"] = tuple("layer" if isinstance(x, int) else x for x in cfg.backout_layers)
    fields["gated_skip_layer"] = cfg.gated_skip_layer is not None
    return repr(sorted(fields.items()))


# Cells (named by their first arm) compiled by inductor in the default matrix: the small record (the small baseline
# and its backout), a concatenated skip of an MLP output, DLO's router (each on the medium baseline).
INDUCTOR_ARMS = {"train_gpt:small-record:backout-L8-weighted", "train_gpt_medium:backout-concat:concat-mlp-L12",
                 "train_gpt_medium:dlo:base-s10"}
# One medium model under inductor holding a linear backout transform and all three LAuReL forms at once (the
# operations of backout-transforms:relu-linear and laurel:rw+lr+pa, on the medium baseline's): one compilation
# instead of three, and the composition of two studies in one compiled model, which no study's arm is.
# test_compile_health's composition tests use the same flags.
COMPOSED_UNDER_INDUCTOR = {"train_gpt_medium:backout+laurel": ["--backout-layers", "3", "--backout-transform",
                                                               "relu-linear", "--laurel", "rw+lr+pa",
                                                               "--laurel-rank", "4", "--laurel-k", "3"]}


def on_r18(args):
    """Whether the arm trains record #18's model (train_gpt_medium.py --base r18): a model of its own."""
    return getattr(args, "base", None) == "r18"


def distinct_models():
    """One pytest param per distinct (track, model graphs) and backend - per model configuration under
    COMPILE_MATRIX=full - named after the arms it stands for."""
    matrix = os.environ.get("COMPILE_MATRIX", "")
    full = matrix == "full"
    seen, params = {}, []
    for (script, flags, init_from), names in bundled_arms().items():
        track = importlib.import_module(script)
        args = resolve(track, list(flags), ["--preset", "tiny"], __file__ if init_from else None)  # only its existence is checked
        cfg = track.model_config(args)
        key = (script, on_r18(args), repr(cfg) if full else graph_structure(cfg))
        if key in seen:
            seen[key].extend(names)
            continue
        seen[key] = names
        cell = f"{script}:{names[0]}"
        # A cell compiled by inductor is not also run under aot_eager: inductor's run goes through the same dynamo
        # trace and AOTAutograd graphs before lowering them, so every check of the aot_eager run is in it.
        if not matrix and cell not in INDUCTOR_ARMS:
            params.append(pytest.param(script, list(flags), init_from, names, "aot_eager", id=cell))
        if matrix or cell in INDUCTOR_ARMS:
            params.append(pytest.param(script, list(flags), init_from, names, "inductor", id=f"inductor:{cell}",
                                       marks=pytest.mark.own_process))
    for cell, flags in COMPOSED_UNDER_INDUCTOR.items():
        script = cell.split(":")[0]
        params.append(pytest.param(script, flags, False, [cell], "inductor", id=f"inductor:{cell}",
                                   marks=pytest.mark.own_process))
    return params


@pytest.fixture(scope="module")
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    print(f"\ncompile matrix: {len(SECONDS)} compile-mode runs in {sum(SECONDS):.0f} s")


@pytest.fixture(scope="module")
def dlo_checkpoint(shard_dir, tmp_path_factory):
    from test_dlo import write_checkpoint
    return write_checkpoint(tmp_path_factory.mktemp("matrix") / "base6.pt", CHECKPOINT_LAYERS, shard_dir)


@pytest.fixture(scope="module")
def r18_checkpoint(shard_dir, tmp_path_factory):
    from test_r18_dlo import write_r18_checkpoint
    return write_r18_checkpoint(tmp_path_factory.mktemp("matrix") / "r18.pt", shard_dir)


def run_arm(track, args, mode):
    """Two steps and two validations of the arm as run_training runs them under --compile `mode`; returns each
    step's first micro-batch loss and the frame-compile count after each step and its validation."""
    track_spec = next(v for v in vars(track).values() if isinstance(v, Track))
    proc = Dist()
    torch.manual_seed(args.seed)
    model = track.GPT(track.model_config(args), max_seq_len=max(args.train_seq_len, args.val_seq_len))
    if args.dlo_groups:
        dlo_expand_from_checkpoint(model, load_checkpoint(args.init_from), args, max(args.train_seq_len,
                                                                                     args.val_seq_len))
    track_spec.prepare_model(model, args, proc)
    opt = track.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    opt.reducer = GradientReducer.per_parameter(model.parameters(), world_size=2)  # hooks as on 2 ranks
    torch._dynamo.reset()
    counters.clear()
    train_model = {"off": model, "on": None, "regional": model}[mode]
    if mode != "off":
        configure_inductor(proc.device.type, track_spec.coordinate_descent_tuning(args))
    if mode == "on":
        train_model = model.compile_whole()
    elif mode == "regional":
        model.compile_regions()
    losses = []

    def recording(*inputs):
        loss = train_model(*inputs)
        losses.append(loss.detach())
        return loss

    stream = TokenStream(find_shards(args.train_files, "x"), args.train_seq_len, "x")
    frames = []
    for step in range(STEPS):
        window = torch.tensor(track.window_blocks_at(step, args.num_iterations, model.cfg))
        dlo_before_step(model, args, step)
        train_step(recording, stream.next_batch(proc.virtual_ranks)[:MICRO_BATCHES], window, proc, opt.reducer)
        dlo_after_step(model, opt, args, proc)
        opt.step(step, args.num_iterations)
        validate(train_model, args, proc, window, track_spec.val_head_chunks)
        model.named_scalars()  # as the run logs them (DLO resets its validation counts here)
        frames.append(counters["frames"]["total"])
    return [losses[step * MICRO_BATCHES].item() for step in range(STEPS)], frames


def check_r18_arm(args, arms, log_dir, monkeypatch):
    """An r18 arm (--compile off and on; regional is refused there) as train_gpt_medium.py runs it: the kernel
    warm-up, two steps and a validation before each and after the last, at 120 iterations so that both steps
    share their graphs. The compiled run has no graph break, compiles nothing after its warm-up (neither the model
    nor the optimiser steps), and validates as the eager one."""
    from test_r18_compile import r18_run
    args = replace(args, num_iterations=120, stop_after=2, val_every=1, log_dir=str(log_dir))
    val_losses = {}
    for mode in ("off", "on"):
        start = time.perf_counter()
        val_losses[mode], _, graphs_after_warmup, graphs = r18_run(replace(args, compile=mode, run_name=mode),
                                                                   monkeypatch)
        SECONDS.append(time.perf_counter() - start)
    assert dict(counters["graph_break"]) == {}, arms
    # the model's two graphs (training, validation) and the optimiser steps' (compiled as #18's), all by the warm-up
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from speedrun.r18.model import R18GPT
    assert len(_debug_get_cache_entry_list(R18GPT.forward.__code__)) == 2, arms
    assert graphs_after_warmup == [graphs], (graphs_after_warmup, graphs, arms)
    assert val_losses["on"] == pytest.approx(val_losses["off"], rel=1e-5), (val_losses, arms)


@pytest.mark.slow
@pytest.mark.parametrize("script, flags, init_from, arms, backend", distinct_models())
def test_arm_compiles_without_break_or_recompile_and_matches_eager(script, flags, init_from, arms, backend,
                                                                    tiny_data_args, request, one_rank_group,
                                                                    monkeypatch, tmp_path):
    """Guards: every bundled arm under --compile on, regional: no graph break, no compile after step 1, eager losses."""
    if backend != "inductor":  # every torch.compile the model makes (nn.Module.compile calls it too)
        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    track = importlib.import_module(script)
    checkpoint = None
    if init_from:  # the checkpoint of the arm's base (only when it needs one: writing it takes steps)
        on_r18_base = "--base" in flags and flags[flags.index("--base") + 1] == "r18"
        checkpoint = request.getfixturevalue("r18_checkpoint" if on_r18_base else "dlo_checkpoint")
    args = resolve(track, flags, tiny_data_args + ["--val-tokens", "1024"], checkpoint)
    if on_r18(args):
        return check_r18_arm(args, arms, tmp_path, monkeypatch)
    step_losses = {}
    for mode in MODES:
        start = time.perf_counter()
        step_losses[mode], frames = run_arm(track, args, mode)
        SECONDS.append(time.perf_counter() - start)
        if mode != "off":
            assert dict(counters["graph_break"]) == {}, (mode, arms)
            assert frames[-1] == frames[0], (mode, frames, arms)
        if mode == "on":  # the whole model compiles exactly twice: training, then validation's no-grad graph
            assert frames[0] == 2 and counters["stats"]["unique_graphs"] == 2, (dict(counters["stats"]), arms)
    for mode in ("on", "regional"):
        assert step_losses[mode] == pytest.approx(step_losses["off"], rel=1e-5), (mode, step_losses, arms)


def test_the_matrix_covers_every_arm_of_every_study():
    params = [p for p in distinct_models() if p.id.removeprefix("inductor:") not in COMPOSED_UNDER_INDUCTOR]
    covered = {name for *_, names, _ in (p.values for p in params) for name in names}
    assert covered == {f"{study.name}:{arm}" for study, arm, _ in compiled_study_arms()}
    assert {script for script, *_ in (p.values for p in params)} == {"train_gpt", "train_gpt_medium"}
    inductor_cells = {p.id.removeprefix("inductor:") for p in params if p.values[-1] == "inductor"}
    if not os.environ.get("COMPILE_MATRIX"):  # a renamed arm would otherwise drop out of inductor's share silently
        assert inductor_cells == INDUCTOR_ARMS


def test_the_composed_inductor_model_holds_the_studies_it_stands_for():
    """The composition is the model of both arms at once: every parameter of the relu-linear backout arm and of
    the rw+lr+pa LAuReL arm (at the composition's depth and rank) is in it, with its shape, and the packed scalars
    hold the baseline's and each study's own."""
    import train_gpt_medium as medium
    composed = COMPOSED_UNDER_INDUCTOR["train_gpt_medium:backout+laurel"]
    def shapes(flags):
        args = medium.resolve_args(["--preset", "tiny", *flags])
        with torch.device("meta"):
            model = medium.GPT(medium.model_config(args), max_seq_len=args.train_seq_len)
        return {name: tuple(p.shape) for name, p in model.named_parameters()}
    backout = composed[:composed.index("--laurel")]
    laurel = composed[composed.index("--laurel"):]
    baseline, with_backout, with_laurel = shapes([]), shapes(backout), shapes(laurel)
    assert set(with_backout) > set(baseline) and set(with_laurel) > set(baseline)
    packed = with_backout["scalars"][0] + with_laurel["scalars"][0] - baseline["scalars"][0]
    assert shapes(composed) == with_backout | with_laurel | {"scalars": (packed,)}
