"""The study registry (speedrun/studies.py) is the one definition of a study flag: the parser, the run config, the
resume check, variant names and the model config all come from it."""
import dataclasses

import pytest

import train_gpt as S
import train_gpt_medium as T
from test_faults_training import TINY, checkpoint_of_a_4_step_run, one_error_line  # noqa: F401
from speedrun.model import GPTConfig
from speedrun.run_config import RunConfig
from speedrun.studies import STUDIES
from speedrun.study import Flag


def test_a_flag_must_say_whether_resume_must_match_it():
    with pytest.raises(TypeError, match="resume"):
        Flag("--new-study-flag", "help")


@pytest.mark.parametrize("track", [T, S], ids=["medium", "small"])
def test_every_flag_of_the_parser_is_a_classified_field_of_the_run_config(track):
    parser = track.make_arg_parser()
    config = track.resolve_args(["--preset", "tiny"])
    fields = {f.name: f for f in dataclasses.fields(config)}
    dests = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    assert dests <= set(fields)
    study_flags = [flag for study in STUDIES for flag in study.flags]
    assert len({f.dest for f in study_flags}) == len(study_flags)  # no two studies declare one flag
    for flag in study_flags:
        assert flag.dest in dests
        assert fields[flag.dest].metadata["resume"] is flag.resume is True
    shared = {f.name for f in dataclasses.fields(RunConfig)}
    assert dests - shared - {f.dest for f in study_flags} == {f.dest for f in track.TRACK_FLAGS}


def test_model_config_defaults_are_stated_once_and_are_the_command_lines():
    """The model's study fields default to what the command line gives (DLO's skip-loss weight 0.1, LAuReL's
    rank 32), apart from the switches that turn a study off."""
    off = T.ModelConfig()
    assert (off.dlo_skip_loss_weight, off.laurel_rank, off.laurel_k) == (0.1, 32, 3)
    dlo_args = T.resolve_args(["--preset", "tiny", "--init-from", __file__, "--dlo-groups", "2"])
    laurel_args = T.resolve_args(["--preset", "tiny", "--laurel", "rw+lr+pa"])
    assert (dlo_args.dlo_skip_loss_weight, laurel_args.laurel_rank) == (off.dlo_skip_loss_weight, off.laurel_rank)
    assert T.model_config(dlo_args).dlo_skip_loss_weight == 0.1
    study_fields = {name for study in STUDIES for name, _, _ in study.model_fields}
    assert study_fields <= {f.name for f in dataclasses.fields(GPTConfig)}


@pytest.mark.parametrize("argv, message", [
    (["--dlo-groups", "2", "--laurel", "rw"], "--dlo-groups cannot be combined with --laurel"),
    (["--dlo-groups", "2", "--rolling-skip"], "--dlo-groups cannot be combined with --rolling-skip"),
    (["--rolling-skip", "--num-layers", "3"], "--rolling-skip needs at least 4 layers"),
])
def test_a_studys_exclusions_and_checks_are_its_own(argv, message):
    with pytest.raises(T.UsageError, match=message):
        T.resolve_args(["--preset", "tiny", "--init-from", __file__, *argv])


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
