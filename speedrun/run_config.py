"""The run's configuration: the command line resolved once (preset values filled in, study defaults derived, the
variant named) into a frozen dataclass. That object is what the run reads, logs as its `config:` line and writes
into its checkpoints; nothing changes it afterwards (a value known only at the start of the run, such as the
warm-up length that follows compilation, is derived with dataclasses.replace into a new object before the log
starts)."""

from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace
from functools import cache


# Far beyond any model of either track (16 and 12 layers), yet refused before a model of 10^5 layers is allocated.
MAX_LAYERS = 256


def resume_field(must_match):
    """A config field; must_match: a resumed run refuses a checkpoint written with another value of it (it would
    continue another schedule, model or study arm, or write validation lines that measure something else)."""
    return field(metadata=dict(resume=must_match))


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """The flags every track shares, and the preset's model sizes. A track's config class adds its own flags and
    the study flags as further fields (run_config_class). resume_field(True): --resume must match it."""
    # run
    preset: str = resume_field(True)
    seed: int = resume_field(True)
    log_dir: str
    run_name: str
    variant: str
    num_iterations: int = resume_field(True)
    stop_after: int | None
    val_every: int
    val_tokens: int = resume_field(True)
    train_seq_len: int = resume_field(True)
    val_seq_len: int = resume_field(True)
    train_files: str = resume_field(True)
    val_files: str = resume_field(True)
    num_layers: int = resume_field(True)
    compile: str
    warmup_steps: int | None  # None until the run knows whether it compiles (at_run_start)
    low_precision: str = resume_field(True)
    profile_steps: int
    # checkpoints
    checkpoint_every: int
    save_final_checkpoint: bool
    resume: str | None
    init_from: str | None
    init_schedule: str
    # [step, schedule length] of the --init-from checkpoint a continued schedule starts from (at_run_start)
    init_schedule_origin: list | None = None
    # the preset's model sizes
    model_dim: int
    num_heads: int
    head_dim: int
    block_size: int
    max_window_tokens: int

    def as_dict(self):
        """Field name -> value: the run log's config line and the checkpoint's `config` entry."""
        return asdict(self)


SHARED_FIELDS = frozenset(f.name for f in fields(RunConfig))


@cache
def run_config_class(flags: tuple):
    """RunConfig with a field for each further flag (speedrun.study.Flag: a track's own flags and the study flags),
    frozen too."""
    return make_dataclass("TrackRunConfig", [(f.dest, f.kind, resume_field(f.resume)) for f in flags],
                          bases=(RunConfig,), frozen=True, kw_only=True)


def must_match_on_resume(config):
    """The fields of a config that a resumed run must share with the run that wrote its checkpoint."""
    return [f.name for f in fields(config) if f.metadata.get("resume")]


def at_run_start(config, compiled, init_schedule_origin):
    """The config a run logs and trains with: the warm-up length when not given (10 steps when compiled, else 0)
    and where a continued schedule starts (schedule_origin; None for a restarted one)."""
    warmup = config.warmup_steps if config.warmup_steps is not None else (10 if compiled else 0)
    return replace(config, warmup_steps=warmup, init_schedule_origin=init_schedule_origin)
