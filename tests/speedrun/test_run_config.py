"""The run config: resolved once into a frozen dataclass; the run logs and checkpoints exactly the config it
trained with; --resume reads it back."""
import dataclasses
import json

import pytest
import torch

import speedrun.training
import train_gpt as S
import train_gpt_medium as T
from test_faults_training import TINY, data_flags
from speedrun.run_config import RunConfig

# Facts of the run, not of the command line, that the config line adds (low_precision: the dtype "auto" became).
RUN_FACTS = {"track", "world_size", "device", "params", "low_precision"}


@pytest.mark.parametrize("track", [T, S], ids=["medium", "small"])
def test_the_resolved_config_cannot_be_changed(track):
    config = track.resolve_args(["--preset", "tiny", "--laurel", "rw"])
    assert isinstance(config, RunConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.laurel_rank = 4  # a study flag's field is frozen too
    # the derived values are already there: laurel's defaults, the variant name, the preset's sizes
    assert (config.laurel_rw_form, config.variant, config.model_dim) == ("softmax", "laurel-rw", 64)


def config_line(log_path):
    line = next(l for l in log_path.read_text().splitlines() if l.startswith("config: "))
    return json.loads(line.removeprefix("config: "))


@pytest.mark.slow
def test_the_logged_and_checkpointed_config_is_the_one_the_run_used(tmp_path, monkeypatch):
    """Guards: a real run logs and checkpoints the very config its validation used, and a resume logs the same."""
    used = []
    validate = speedrun.training.validate

    def recording_validate(model, config, *rest, **kw):
        used.append(config)
        return validate(model, config, *rest, **kw)
    monkeypatch.setattr(speedrun.training, "validate", recording_validate)
    argv = [*TINY, *data_flags(tmp_path / "data"), "--num-iterations", "2", "--seed", "1", "--rolling-skip",
            "--log-dir", str(tmp_path / "logs"), "--run-name", "r", "--save-final-checkpoint"]
    assert T.main(argv) == 0
    run_config = used[-1].as_dict()
    # resolved at the start of the run: the warm-up (eager on CPU: none) and the schedule origin
    assert run_config["warmup_steps"] == 0 and run_config["init_schedule_origin"] is None
    logged = config_line(tmp_path / "logs" / "r.txt")
    assert {k: v for k, v in logged.items() if k not in RUN_FACTS} == json.loads(json.dumps(
        {k: v for k, v in run_config.items() if k != "low_precision"}))
    assert logged["low_precision"] == "float32" and run_config["low_precision"] == "auto"
    saved = torch.load(tmp_path / "logs" / "r.pt", map_location="cpu", weights_only=False)["config"]
    assert saved == run_config
    # and a resumed run goes on from it, its config line the same but for the run name
    assert T.main([*argv[:-5], "--log-dir", str(tmp_path / "again"), "--run-name", "again",
                   "--resume", str(tmp_path / "logs" / "r.pt")]) == 0
    again = config_line(tmp_path / "again" / "again.txt")
    assert {k: v for k, v in again.items() if k not in ("run_name", "log_dir", "resume", "save_final_checkpoint")} \
        == {k: v for k, v in logged.items() if k not in ("run_name", "log_dir", "resume", "save_final_checkpoint")}
