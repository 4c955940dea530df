"""The flags both training scripts share (the study runner relies on --seed, --log-dir, --run-name, --variant,
--resume) and the preset plumbing."""

import os
import sys
import uuid
from argparse import SUPPRESS
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist

from speedrun.compile_cache import truncated_kernel_problem
from speedrun.schedule import INIT_SCHEDULES
from speedrun.data import VIRTUAL_RANKS
from speedrun.distributed import exit_before_interpreter_teardown, setup_distributed
from speedrun.errors import (HelpWithDefaults, OneLineErrorParser, ReportedByAnotherRank, UsageError,
                             end_quietly, is_reporting_rank)
from speedrun.flag_scopes import EXPORT_ONLY_FLAGS, choices_help
from speedrun.run_config import MAX_LAYERS, run_config_class
from speedrun.studies import OFFERED_STUDIES
from speedrun.study import FIXED_STUDIES, check_fixed_depth
from speedrun.variants import default_variant, given_study_flags


MAX_SEED = 2**32 - 1  # torch's and numpy's generators take seeds of 64 and 32 bits


def make_parser(title, baseline, presets, track_flags=(), studies=OFFERED_STUDIES):
    """The parser with the shared run and checkpoint flags, the track's own run flags (speedrun.study.Flag) and a
    group per study (speedrun.studies), each flag's help as the study wrote it; its --help opens with the track's
    title and what the script runs with no flags (the track's `baseline`, as an exported file's command changes it)."""
    if not RUNS_BASELINE:
        baseline += ", changed by the flags of the command at the top of this file"
    p = OneLineErrorParser(description=f"{title} With no flags: {baseline}. Size "
                                       f"and run flags without a default take the --preset's value.",
                           formatter_class=HelpWithDefaults)
    run = p.add_argument_group("run")
    run.add_argument("--preset", choices=sorted(presets), default="full",
                     help="model size and data defaults: full = the record run; tiny = CPU-sized, demo shards")
    run.add_argument("--seed", type=int, default=0, help=f"seed for initialisation and warm-up tokens (0..{MAX_SEED})")
    run.add_argument("--log-dir", default="logs", help="folder of the run log")
    run.add_argument("--run-name", default=None, help="log file is <log-dir>/<run-name>.txt (default: a uuid)")
    run.add_argument("--variant", default=None,
                     help="short name of the study arm, for the config line (default: made from the study flags, "
                          "e.g. backout-L11; baseline without any)")
    run.add_argument("--num-iterations", type=int, default=None, help="optimiser steps of the full schedule")
    run.add_argument("--stop-after", type=int, default=None,
                     help="run only the first N steps of the schedule (validates at the stop)")
    run.add_argument("--val-every", type=int, default=None, help="validate every N steps (0: only at the end)")
    run.add_argument("--val-tokens", type=int, default=None, help="validation tokens per validation")
    run.add_argument("--train-seq-len", type=int, default=None, help="tokens per virtual rank per step")
    run.add_argument("--val-seq-len", type=int, default=None, help="validation tokens per virtual rank per step")
    run.add_argument("--train-files", default=None, help="glob of training shards")
    run.add_argument("--val-files", default=None, help="glob of validation shards")
    run.add_argument("--num-layers", type=int, default=None,
                     help=f"transformer layers, at most {MAX_LAYERS} (the layer patterns follow the rule in "
                          f"layer_pattern)")
    run.add_argument("--compile", choices=["auto", "on", "regional", "off"], default="auto",
                     help=choices_help("torch.compile the model.", auto="on, on CUDA only.",
                                       regional="each block and the head compiled apart, so gradient averages "
                                                "start during the backward (see compile_regions)"))
    # what another base does with a shared flag is said in that base's own help (--base r18's), so a script or a
    # file without it names no flag it does not have
    run.add_argument("--warmup-steps", type=int, default=None,
                     help="untimed kernel warm-up steps, every piece of state restored afterwards "
                          "(default: 10 when compiled, else 0)")
    run.add_argument("--low-precision", choices=["auto", "bf16", "fp32"], default="auto",
                     help="dtype of embeddings, matrices and activations (auto: bf16 on CUDA, fp32 on CPU, "
                          "where bf16 matmuls are emulated and slow)")
    run.add_argument("--profile-steps", type=int, default=0, metavar="N",
                     help="profile the last N training steps: optimiser-step time and exposed communication per "
                          "step, written to <log-dir>/<run-name>.profile.json (benchmarks)")
    # Read before the parser (run_main): listed for --help; SUPPRESS keeps them out of the config.
    run.add_argument("--export-script", metavar="OUT.py", default=SUPPRESS,
                     help="write this run (the other flags) as one standalone file instead of training, after "
                          "checking that it trains a few tiny-preset steps bit for bit as this script "
                          "(speedrun/export.py)")
    run.add_argument("--from-log", metavar="LOG", default=SUPPRESS,
                     help="with --export-script: the run a log of this checkout records, its flags from the log")
    run.add_argument("--force", action="store_true", default=SUPPRESS,
                     help="with --export-script: replace an existing OUT.py (a file of this checkout never)")
    run.add_argument("--export-check-dir", metavar="DIR", default=SUPPRESS,
                     help="with --export-script: keep the check's two runs (logs and final checkpoints, ~260 MB "
                          "each) and the file as it ran in DIR, a new or empty folder outside the checkout")
    ck = p.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint-every", type=int, default=0,
                    help="write <log-dir>/<run-name>.pt every K steps and at the end (0: off)")
    ck.add_argument("--save-final-checkpoint", action="store_true", help="write the checkpoint at the end")
    ck.add_argument("--resume", default=None, help="continue a run from its checkpoint")
    ck.add_argument("--init-from", default=None, help="start a new run from a checkpoint's model weights")
    ck.add_argument("--init-schedule", choices=INIT_SCHEDULES, default=None,
                    help="with --init-from: restart the learning-rate and window schedules, or continue them from "
                         "the checkpoint's position in its own schedule (docs/dlo.md) (default restart)")
    for flag in track_flags:
        flag.add_to(run)
    for study in studies:
        group = p.add_argument_group(study.title, None if FIXED_FLAGS else study.description)
        for flag in study.flags:
            flag.add_to(group)
    if FIXED_FLAGS:  # an exported file: it parses the flags it refuses on its command line, but does not offer them
        for action in p._actions:
            if set(action.option_strings) & refused_flags():
                action.help = SUPPRESS
    return p


def resolve_track_args(parsed, presets, script_path, layer_pattern, track_flags=()):
    """The run's frozen config from its parsed flags (a dict): the preset's values filled in, every flag checked
    (the study flags against the track's model: its width and its layer pattern at --num-layers), study defaults
    derived and the variant named; raises UsageError on a combination that cannot work."""
    given = given_study_flags(parsed)
    config_class = run_config_class(tuple(track_flags) + tuple(f for study in OFFERED_STUDIES for f in study.flags))
    config = config_class(**resolve_shared_args(parsed, presets, script_path))
    pattern = layer_pattern(config.num_layers)  # refuses a --num-layers the track's model cannot be built with
    config = resolve_study_args(config, pattern)
    for _, depths in FIXED_STUDIES:  # an exported file's studies, resolved at its export
        check_fixed_depth(config, depths)
    if config.variant is None:
        # Naive scaling and regional compilation are no study flags, but each is an arm of its own (a loss and a
        # speed comparison with the baseline).
        extra = [f"layers{config.num_layers}"] if config.num_layers != presets[config.preset]["num_layers"] else []
        extra += ["compile-regional"] if config.compile == "regional" else []
        config = replace(config, variant=default_variant(given, config, extra=extra))
    return config


def resolve_study_args(config, pattern, studies=OFFERED_STUDIES):
    """The config with the study flags checked against the track's model (its width and its layer `pattern` at
    --num-layers) and their defaults filled in. The exclusions a study declares are checked before those of a study
    that rebuilds the model (which refuses every study it does not name), so a declared one names its reason."""
    if not FIXED_FLAGS:  # an exported file's studies are its one arm, fixed: its export checked their exclusions
        for study in sorted(studies, key=lambda study: study.rebuilds_model):
            study.check_exclusions(config, studies)
    for study in studies:
        config = replace(config, **study.resolve(config, pattern))
    return config


def resolve_shared_args(parsed, presets, script_path):
    """The parsed flags (a dict) with the preset's values filled into those left unset (data globs relative to the
    script's folder), a run name and the schedule choice; checks the shared flags, raises UsageError on a value or
    combination that cannot work. Returns a new dict."""
    values = dict(parsed)
    for key, value in presets[values["preset"]].items():
        if values.get(key) is None:
            if key in ("train_files", "val_files"):  # the preset's data lives next to this script
                value = os.path.relpath(Path(script_path).resolve().parent / value)
            values[key] = value
    if values["run_name"] is None:
        values["run_name"] = str(uuid.uuid4())
    check_shared_args(SimpleNamespace(**values), presets)
    values["init_schedule"] = values["init_schedule"] or INIT_SCHEDULES[0]
    return values


def check_shared_args(args, presets):
    """Raises UsageError on a shared flag's value or combination that cannot work."""
    positive = ["num_iterations", "train_seq_len", "val_seq_len", "val_tokens", "num_layers"]
    for name in positive:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    if args.num_layers > MAX_LAYERS:
        raise UsageError(f"--num-layers must be at most {MAX_LAYERS}, got {args.num_layers}")
    if not 0 <= args.seed <= MAX_SEED:
        raise UsageError(f"--seed must be in 0..{MAX_SEED}, got {args.seed}")
    for name in ["val_every", "checkpoint_every"] + (["warmup_steps"] if args.warmup_steps is not None else []):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative")
    if args.stop_after is not None and not 0 < args.stop_after <= args.num_iterations:
        raise UsageError(f"--stop-after must be in 1..{args.num_iterations}")
    bs = presets[args.preset]["block_size"]
    for name in ["train_seq_len", "val_seq_len"]:
        if getattr(args, name) % bs:
            raise UsageError(f"--{name.replace('_', '-')} must be a multiple of the attention block size {bs}")
    if args.val_tokens % (VIRTUAL_RANKS * args.val_seq_len):
        raise UsageError(f"--val-tokens must be a multiple of {VIRTUAL_RANKS} x --val-seq-len")
    if args.resume and args.init_from:
        raise UsageError("--resume and --init-from cannot be combined")
    if args.init_schedule and not args.init_from:
        raise UsageError("--init-schedule needs --init-from")
    for name in ["resume", "init_from"]:
        path = getattr(args, name)
        if path and os.path.isdir(path):
            raise UsageError(f"--{name.replace('_', '-')} {path}: a folder, not a checkpoint file")
        if path and not os.path.isfile(path):
            raise UsageError(f"--{name.replace('_', '-')}: no such file {path}")
    if "/" in args.run_name or not args.run_name.strip():
        raise UsageError("--run-name must be a plain file name")
    if args.profile_steps < 0:
        raise UsageError(f"--profile-steps must be at least 0, got {args.profile_steps}")


# The study and track flags of the run an exported single file was made for (speedrun/export.py writes them here,
# in that file); read before the command line's.
FIXED_FLAGS = ()
# The other flags of that run (its preset and schedule among them): the file's defaults, which its command line may
# override (of a flag given twice, the last counts).
RUN_DEFAULTS = ()
# Whether the script with no flags runs its track's baseline: an export folds it to whether its file does, so that an
# arm's file does not say so in its --help.
RUNS_BASELINE = True


def refused_flags():
    """The flags an exported file refuses on its command line: its fixed ones and every study flag (the file is one
    arm's)."""
    return {token for token in FIXED_FLAGS if token.startswith("--")} | {flag.name for study in OFFERED_STUDIES
                                                                          for flag in study.flags}


def with_fixed_flags(argv):
    """FIXED_FLAGS and RUN_DEFAULTS, then argv. In an exported file (FIXED_FLAGS set) a flag of refused_flags given on
    the command line is refused."""
    if not FIXED_FLAGS:
        return [*RUN_DEFAULTS, *argv]
    refused = refused_flags()
    for token in argv:
        if token.split("=")[0] in refused:
            raise UsageError(f"{token.split('=')[0]}: this file runs one arm ({' '.join(FIXED_FLAGS)}); export the "
                             f"modular script again for another")
    return [*FIXED_FLAGS, *RUN_DEFAULTS, *argv]


def runs_r18(base):
    """Whether --base names record #18's code (speedrun/r18). The one test of the base: an export folds every call
    of it to its run's base (speedrun/export.py, FOLDED_CALLS), so nothing of the other base reaches the file."""
    return base == "r18"


def asks_for_export(argv):
    """Whether argv holds --export-script or another of the export's own flags: the export reads them all (and
    refuses one without --export-script in a line; a run's config has no field for them)."""
    return any(token.split("=")[0] in EXPORT_ONLY_FLAGS for token in argv)


def run_main(resolve_args, run, argv=None, script=None, track_flags=()):
    """Parses and checks the flags, sets up the process group and runs; bad input at any point is one line on
    stderr and exit status 2. With --export-script OUT.py it writes the run's standalone file instead (script:
    the training script's path, track_flags: its own flags, fixed in that file)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if asks_for_export(argv):  # folded away in the exported file
        from speedrun.export import export_main
        return export_main(script, argv, resolve_args, track_flags)
    try:
        args = resolve_args(with_fixed_flags(argv))
        proc = setup_distributed()
    except UsageError as e:  # every rank parses the same flags: rank 0 alone says what is wrong
        if not is_reporting_rank():
            return end_quietly()
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        code = run_reporting_bad_input(run, args, proc)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if proc.world_size > 1:
        exit_before_interpreter_teardown(code)
    return code


def run_reporting_bad_input(run, args, proc):
    """run(args, proc) -> exit status: 0, or 2 after bad input (one line), 1 after a poisoned compile cache."""
    try:
        run(args, proc)
    except ReportedByAnotherRank:
        return end_quietly()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (only a poisoned compile cache is turned into one line)
        problem = truncated_kernel_problem(e)
        if problem is None:
            raise
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0
