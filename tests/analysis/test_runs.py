"""Issue 40: one definition of a run. Logs of one training are one sample whatever else differs; a study flag makes
another; a log whose lines contradict each other is no run, for analysis and for the study runner alike."""
import dataclasses
import json

import pytest

import analysis_logs as logs_for_tests
from ablations.runstate import log_is_complete
from analysis.logs import load_runs, log_problem
from analysis.runs import NOT_TRAINING, training_config
from analysis_logs import run_cli

# Every entry of a config line, and whether it changes the trajectory ("training": another value, another sample)
# or only says where or how the run was made ("not").
SIDES = {
    "seed": "training", "track": "training", "base": "training", "variant": "training", "preset": "training",
    "num_iterations": "training", "stop_after": "training", "train_seq_len": "training", "val_seq_len": "training",
    "train_files": "training", "val_files": "training", "num_layers": "training", "low_precision": "training",
    "init_from": "training", "init_schedule": "training", "init_schedule_origin": "training",
    "model_dim": "training", "num_heads": "training", "head_dim": "training", "block_size": "training",
    "max_window_tokens": "training", "fp8_head": "training",
    **{key: "training" for key in (
        "backout_layers", "backout_mode", "backout_transform", "backout_x_init", "backout_skip_init",
        "backout_fixed_x", "backout_freeze", "backout_norm_after_sum", "backout_concat_dim", "backout_mlp_ratio",
        "rolling_skip", "laurel", "laurel_rank", "laurel_k", "laurel_rw_form", "laurel_rw_scale", "laurel_pa_h",
        "laurel_where", "laurel_layers", "laurel_factor_init", "laurel_zero_factor", "dlo_groups", "dlo_add",
        "dlo_init", "dlo_slerp_t", "dlo_sparsity", "dlo_anneal_start", "dlo_anneal_steps", "dlo_skip_loss_weight",
        "dlo_layer_lr", "dlo_threshold", "dlo_score", "dlo_score_scale", "dlo_router_init", "dlo_skip_allocation",
        "dlo_train_gating", "gated_skip_layer")},
    "log_dir": "not", "run_name": "not", "resume": "not", "checkpoint_every": "not", "save_final_checkpoint": "not",
    "profile_steps": "not", "val_every": "not", "val_tokens": "not", "compile": "not", "warmup_steps": "not",
    "coordinate_descent_tuning": "not", "attention": "not", "world_size": "not", "device": "not", "params": "not",
}
# What the training scripts add to their resolved flags on the config line (speedrun/training.py, speedrun/r18).
LOGGED_EXTRAS = {"track", "world_size", "device", "low_precision", "params", "base", "attention"}


def _resolved_configs():
    import train_gpt
    import train_gpt_medium
    return [json.loads(json.dumps(dataclasses.asdict(module.resolve_args(["--preset", "tiny", *argv]))))  # as logged
            for module, argv in ((train_gpt_medium, []), (train_gpt_medium, ["--base", "r18"]), (train_gpt, []))]


@pytest.mark.slow
def test_every_config_key_is_on_one_named_side():
    """Guards: each config key of both scripts (both bases) is listed here and classified as analysis/runs.py does."""
    configs = _resolved_configs()
    keys = set().union(*configs) | LOGGED_EXTRAS
    assert keys == set(SIDES), (keys ^ set(SIDES))
    assert {key for key, side in SIDES.items() if side == "not"} == set(NOT_TRAINING)
    from speedrun.studies import STUDIES
    study_keys = {flag.dest for study in STUDIES for flag in study.flags}
    for config in configs:  # a study that is off leaves its keys at values equal to absent: the export omits them
        assert training_config({key: config[key] for key in study_keys if key in config}) == {}


def curve(final):
    return lambda step: logs_for_tests.default_curve(step, 100, final)


def write_seed(path, final, seed=0, **config):
    return logs_for_tests.write(path, logs_for_tests.our_log_text(variant="claim", seed=seed, losses=curve(final),
                                                                  config=config))


def test_reruns_differing_only_where_training_is_untouched_are_one_sample(capsys, tmp_path):
    """Case 4a: four logs of seed 0 (val_every, compile, log_dir, val_tokens differ) were n 4, std 0, PASS."""
    for index, config in enumerate([{"val_every": 10}, {"compile": "off"}, {"log_dir": "elsewhere"},
                                    {"val_tokens": 4096}]):
        write_seed(tmp_path / "claim" / f"copy{index}" / "seed0.txt", 2.9, **config)
    runs, unreadable = load_runs([tmp_path])
    assert len(runs) == 1 and len(unreadable) == 3
    status, out, _ = run_cli(capsys, "record-check", tmp_path, "--target", "2.92", "--resamples", "50")
    assert status == 1 and "runs: 1" in out and "PASS" not in out.split("loss below")[1].split("\n")[0]


def test_an_export_log_without_the_off_study_keys_is_the_modular_run(tmp_path):
    """Case 4b: the export's config line lacks the keys of the studies that are off; the modular log holds them at
    their off values. One training, one sample."""
    write_seed(tmp_path / "modular" / "seed0.txt", 2.9, backout_layers=[], laurel=None, rolling_skip=False)
    write_seed(tmp_path / "export" / "seed0.txt", 2.9)
    runs, unreadable = load_runs([tmp_path])
    assert len(runs) == 1 and len(unreadable) == 1 and "another log of the run" in unreadable[0].problem


def test_a_study_flag_makes_another_sample(tmp_path):
    write_seed(tmp_path / "a" / "seed0.txt", 2.9, backout_layers=[11])
    write_seed(tmp_path / "b" / "seed0.txt", 2.9)
    assert len(load_runs([tmp_path])[0]) == 2


CONTRADICTIONS = {
    "two config lines": (lambda text: text.replace('\nconfig: {"track"', '\nconfig: {"variant": "other"}\nconfig: {"track"'),
                         "2 config lines"),
    "no config line in a study folder": (lambda text: "\n".join(
        line for line in text.splitlines() if not line.startswith("config: ")) + "\n", "no config line"),
    "steps counting to fewer than the config plans": (
        lambda text: text.replace('"num_iterations": 100', '"num_iterations": 400'), "plans 400"),
}


@pytest.mark.parametrize("case", CONTRADICTIONS)
def test_a_log_that_contradicts_itself_is_no_run_for_anyone(capsys, tmp_path, case):
    """Case 8: such logs were counted (or "done" for the runner); now named once with the reason, never counted."""
    damage, reason = CONTRADICTIONS[case]
    study = tmp_path / "study"
    (study).mkdir()
    (study / "runner.log").write_text("")
    for seed in range(3):
        write_seed(study / "claim" / f"seed{seed}.txt", 2.9 + seed * 1e-4, seed=seed)
    text = logs_for_tests.our_log_text(variant="claim", seed=3, losses=curve(2.9))
    log = logs_for_tests.write(study / "claim" / "seed3.txt", damage(text))
    assert reason in log_problem(log) and not log_is_complete(log)
    runs, unreadable = load_runs([study])
    assert len(runs) == 3 and [entry.problem for entry in unreadable if entry.path == log][0].startswith("not a run")
    status, out, _ = run_cli(capsys, "summarize", study, "--target", "2.92")
    assert status == 0 and out.count(str(log)) == 1 and reason in out


def test_an_upstream_log_without_config_line_is_still_a_run(tmp_path):
    log = logs_for_tests.write(tmp_path / "records" / "a" / "log.txt", logs_for_tests.upstream_log_text())
    assert log_problem(log) is None
    assert json.dumps(training_config({"seed": 1, "val_every": 5, "laurel": None})) == '{"seed": 1}'


def test_an_arm_pooling_runs_of_two_trainings_is_named(capsys, tmp_path):
    """Case 5 for analysis: logs of seeds made before an arm was edited were pooled without a word."""
    for seed in range(3):
        write_seed(tmp_path / "claim" / f"seed{seed}.txt", 2.9, seed=seed, backout_layers=[11])
    write_seed(tmp_path / "claim" / "seed7.txt", 2.9, seed=7, backout_layers=[4])
    status, out, _ = run_cli(capsys, "summarize", tmp_path, "--target", "2.92")
    assert status == 0 and "arm 'claim' pools runs of 2 different trainings (backout_layers [11] in seed0.txt, " \
                           "[4] in seed7.txt)" in out
