"""The study registry (speedrun/studies.py) is the one definition of a study flag: the parser, the run config, the
resume check, variant names and the model config all come from it."""
import argparse
import dataclasses
from types import SimpleNamespace

import pytest

import train_gpt as S
import train_gpt_medium as T
from test_faults_training import TINY, checkpoint_of_a_4_step_run, one_error_line  # noqa: F401
from speedrun.run_config import RunConfig
from speedrun.studies import STUDIES
from speedrun.cli import make_parser, resolve_study_args
from speedrun.study import Flag, ModelPart, Study
from conftest import flags_named_but_not_offered

TINY_DLO = T.resolve_args(["--preset", "tiny", "--init-from", __file__, "--dlo-groups", "2"])


def test_a_flag_must_say_whether_resume_must_match_it():
    with pytest.raises(TypeError, match="resume"):
        Flag("--new-study-flag", "help")


@pytest.mark.parametrize("track", [T, S], ids=["medium", "small"])
def test_every_flag_of_the_parser_is_a_classified_field_of_the_run_config(track):
    parser = track.make_arg_parser()
    config = track.resolve_args(["--preset", "tiny"])
    fields = {f.name: f for f in dataclasses.fields(config)}
    # SUPPRESS: the export's flags, read before the parser and listed for --help only, are no run settings
    dests = {a.dest for a in parser._actions
             if a.option_strings and a.dest != "help" and a.default is not argparse.SUPPRESS}
    assert dests <= set(fields)
    study_flags = [flag for study in STUDIES for flag in study.flags]
    assert len({f.dest for f in study_flags}) == len(study_flags)  # no two studies declare one flag
    for flag in study_flags:
        assert flag.dest in dests
        assert fields[flag.dest].metadata["resume"] is flag.resume is True
    shared = {f.name for f in dataclasses.fields(RunConfig)}
    assert dests - shared - {f.dest for f in study_flags} == {f.dest for f in track.TRACK_FLAGS}


def test_model_config_defaults_are_stated_once_and_are_the_command_lines():
    """A study's defaults are stated once: where the model fields are the flags (LAuReL), the model of a run with
    the study on gets the values its resolve filled in (rank 32) and an off model the flags' unset values; DLO's
    hand-declared fields default to the command line's (skip-loss weight 0.1)."""
    off = T.ModelConfig()
    assert (off.dlo_skip_loss_weight, off.laurel, off.laurel_rank, off.laurel_k) == (0.1, None, None, None)
    dlo_args = T.resolve_args(["--preset", "tiny", "--init-from", __file__, "--dlo-groups", "2"])
    laurel_args = T.resolve_args(["--preset", "tiny", "--laurel", "rw+lr+pa"])
    assert dlo_args.dlo_skip_loss_weight == off.dlo_skip_loss_weight
    assert T.model_config(dlo_args).dlo_skip_loss_weight == 0.1
    laurel_cfg = T.model_config(laurel_args)
    assert (laurel_cfg.laurel_rank, laurel_cfg.laurel_k, laurel_cfg.laurel_pa_h) == (32, 3, "lowrank")
    study_fields = {name for study in STUDIES for name, _, _ in study.model_fields}
    assert study_fields <= {f.name for f in dataclasses.fields(off)}


@pytest.mark.parametrize("argv, message", [
    (["--dlo-groups", "2", "--laurel", "rw"], "--dlo-groups cannot be combined with --laurel"),
    (["--dlo-groups", "2", "--rolling-skip"], "--dlo-groups cannot be combined with --rolling-skip"),
    (["--rolling-skip", "--num-layers", "3"], "--rolling-skip needs at least 4 layers"),
])
def test_a_studys_exclusions_and_checks_are_its_own(argv, message):
    with pytest.raises(T.UsageError, match=message):
        T.resolve_args(["--preset", "tiny", "--init-from", __file__, *argv])


def a_switch_study(name, help_text="a switch"):
    """A one-flag study that changes nothing, declared here: no module of the project knows it."""
    return Study(name=name, title=name, description=None,
                 flags=(Flag(f"--{name}", help_text, resume=True, kind=bool, options=dict(action="store_true")),),
                 resolve=lambda config, pattern: {}, model_config=lambda model_cfg, config: {})


def test_a_switch_with_a_part_is_declared_once():
    """Its model field (named, typed and defaulted as the flag) and the copy into the model config are derived."""
    study = Study(name="logit-scale", model_part=ModelPart, flags=(
        Flag("--logit-scale", "a switch", resume=True, kind=bool, options=dict(action="store_true")),))
    assert study.model_fields == (("logit_scale", bool, False),) and study.title == "logit-scale"
    assert study.model_values(None, SimpleNamespace(logit_scale=True)) == {"logit_scale": True}
    assert study.model_values(None, SimpleNamespace(logit_scale=False)) == {}
    # no count to declare: the added_params line measures the built model (test_study_added_params checks it)
    assert study.resolve(None, None) == {} and not hasattr(study, "added_params")


@pytest.mark.parametrize("track", [T, S], ids=["medium", "small"])
def test_a_scripts_help_names_only_flags_it_has(track):
    """The small track has no --base: its --help said what `--base r18` does with --compile and --warmup-steps.
    What one base does with a shared flag is said in that base's help (train_gpt_medium.py's --base)."""
    parser = track.make_arg_parser()
    options = {option for action in parser._actions for option in action.option_strings}
    assert flags_named_but_not_offered(parser.format_help(), options) == []
    assert flags_named_but_not_offered("a --base r18 note, --preset", {"--preset"}) == ["--base"]  # it can fail


def test_any_help_text_is_shown_as_written():
    study = a_switch_study("braces", "sets {x} to {0}, as {record_layer} reads")
    text = " ".join(make_parser("d", "b", T.PRESETS, studies=STUDIES + (study,)).format_help().split())
    assert "sets {x} to {0}, as {record_layer} reads" in text  # a KeyError or IndexError before


def test_a_study_that_rebuilds_the_model_refuses_any_study_it_does_not_name():
    """DLO names no compatible study: a study it has never heard of is refused with it, in one line."""
    new = a_switch_study("made-up-switch")
    fields = [("made_up_switch", bool, dataclasses.field(default=False))]
    config_class = dataclasses.make_dataclass("WithMadeUpSwitch", fields, bases=(type(TINY_DLO),), frozen=True)
    config = config_class(**vars(TINY_DLO), made_up_switch=True)
    studies, pattern = STUDIES + (new,), T.layer_pattern(config.num_layers)
    with pytest.raises(T.UsageError, match=r"^--dlo-groups cannot be combined with --made-up-switch \(DLO expands"):
        resolve_study_args(config, pattern, studies)
    named = tuple(dataclasses.replace(study, compatible=("made-up-switch",)) if study.rebuilds_model else study
                  for study in studies)
    assert resolve_study_args(config, pattern, named).made_up_switch  # named compatible: runs


@pytest.mark.slow
@pytest.mark.parametrize("changed, named", [
    (["--rolling-skip"], "--rolling-skip"),
    (["--laurel", "rw"], "--laurel"),
])
def test_resume_refuses_another_value_of_a_study_flag_in_one_line(checkpoint_of_a_4_step_run, tmp_path, capsys,
                                                                   changed, named):
    """Guards: --resume of a real checkpoint refuses a changed study flag (--rolling-skip, --laurel): one line."""
    folder, flags = checkpoint_of_a_4_step_run
    log_dir = tmp_path / "logs"
    rc = T.main([*TINY, *flags, "--num-iterations", "4", "--seed", "1", *changed, "--resume",
                 str(folder / "logs" / "r.pt"), "--log-dir", str(log_dir), "--run-name", "again"])
    assert rc == 2
    line = one_error_line(capsys)
    assert f"made with {named} " in line and "r.pt" in line
    assert not log_dir.exists()


def test_no_bundled_study_spells_out_a_model_field_that_is_a_copy_of_its_flag():
    """A switch is declared once: a study whose model fields are all its flags leaves model_fields and
    model_config to the defaults (the copy is derived); hand code is for a study that computes a model value
    (DLO: the expanded depth and the checkpoint's, dlo_base_layers)."""
    for study in STUDIES:
        if study.model_config is None:
            derived = tuple((flag.dest, flag.kind, flag.unset) for flag in study.flags) if study.model_part else ()
            assert study.model_fields == derived, study.name
            continue
        flag_fields = {flag.dest for flag in study.flags}
        computed = [name for name, _, _ in study.model_fields if name not in flag_fields]
        assert computed, f"{study.name}: every model field is a flag; declare the switch once (the copy is derived)"
