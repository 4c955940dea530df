"""Study files are checked before anything is launched: bad ones give one line and exit status 2."""

import tomllib
from pathlib import Path

import pytest

from ablations.errors import StudyError
from ablations.study import STUDY_DIR, TOP_KEYS, load_study, parse_seeds
from runner_support import ablations, read_events, runner_env, write_study

ARMS = {"baseline": {}, "backout": {"backout-layers": [11, 3]}}


def refused(tmp_path: Path, study: Path, *extra) -> str:
    """Runs the study and checks it was refused before launch; returns the one error line."""
    starts = tmp_path / "starts.jsonl"
    result = ablations(["run", study, *extra], tmp_path, runner_env(starts))
    assert result.returncode == 2, result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists(), "nothing may be written for a refused study"
    assert read_events(starts) == [], "nothing may be launched for a refused study"
    return lines[0]


@pytest.mark.slow
def test_flag_the_script_does_not_have_is_refused(tmp_path):
    """Guards: an arm's flag the script lacks is refused by the runner CLI in one line, exit 2, nothing launched."""
    study = write_study(tmp_path, "s", {**ARMS, "typo": {"backout-layer": 11}})
    line = refused(tmp_path, study)
    assert "'typo'" in line and "--backout-layer" in line


@pytest.mark.slow
def test_flag_value_the_script_rejects_is_refused(tmp_path):
    """Guards: a flag value the script's own parser rejects is refused by the runner CLI before any launch."""
    study = write_study(tmp_path, "s", ARMS, flags={"preset": "huge"})
    line = refused(tmp_path, study)
    assert "--preset" in line and "huge" in line


@pytest.mark.slow
def test_unknown_arm_is_refused(tmp_path):
    """Guards: `run --arms` naming an arm the study lacks is one line listing the arms; nothing written or launched."""
    study = write_study(tmp_path, "s", ARMS)
    line = refused(tmp_path, study, "--arms", "baseline", "nope")
    assert "nope" in line and "baseline, backout" in line


@pytest.mark.slow
@pytest.mark.parametrize("extra, flags, words", [
    ('seed_list = [1]', {}, ["unknown key", "'seed_list'"]),
    ('', {"seed": 3}, ["--seed", "set by the runner"]),
    ('', {"--num-iterations": 3}, ["not a flag name"]),
    ('', {"init-from": "{nowhere}/x.pt"}, ["unknown placeholder", "{nowhere}"]),
    ('nproc = 0', {}, ["nproc"]),
])
def test_malformed_study_file_is_refused(tmp_path, extra, flags, words):
    """Guards: malformed study files (unknown key, --seed, bad flag name, placeholder, nproc) are one line, exit 2."""
    study = write_study(tmp_path, "s", ARMS, flags=flags, extra=extra)
    if extra.startswith("nproc"):  # the helper writes nproc itself
        study.write_text(study.read_text().replace("nproc = 1\n", ""))
    line = refused(tmp_path, study)
    assert all(word in line for word in words), line


@pytest.mark.slow
def test_unknown_launcher_is_refused(tmp_path):
    """Guards: a study naming an unknown launcher is refused by the runner CLI in one line before any launch."""
    study = write_study(tmp_path, "s", ARMS, launcher="mpirun")
    assert "launcher must be one of torchrun, python" in refused(tmp_path, study)


@pytest.mark.slow
def test_missing_script_and_missing_study_are_refused(tmp_path):
    """Guards: a missing script and an unknown study name are each one line, exit 2, nothing written or launched."""
    study = write_study(tmp_path, "s", ARMS, script=tmp_path / "absent.py")
    assert "absent.py" in refused(tmp_path, study)
    assert "no study 'no-such-study'" in refused(tmp_path, "no-such-study")


@pytest.mark.slow
def test_init_from_checkpoint_must_exist(tmp_path):
    """Guards: a missing --init-from file is refused, `--set` can point it at a real one, unknown --set refused."""
    extra = '[vars]\nbase = "{runs}/base/seed{seed}.pt"'
    study = write_study(tmp_path, "s", {"a": {"init-from": "{base}"}}, seeds=[0], extra=extra)
    line = refused(tmp_path, study)
    assert "runs/base/seed0.pt" in line and "--init-from" in line
    # The same study with the variable pointed at an existing file passes validation (dry run launches nothing).
    (tmp_path / "ck0.pt").write_text("x")
    result = ablations(["run", study, "--dry-run", "--set", "base=ck{seed}.pt"], tmp_path, runner_env())
    assert result.returncode == 0, result.stderr
    assert "--init-from ck0.pt" in result.stdout
    assert "no such variable" in refused(tmp_path, study, "--set", "other=1")


def test_flag_tables_merge_and_render(tmp_path):
    extra = ""
    study_file = write_study(tmp_path, "s", {"off": {"fixed": False, "num-iterations": 7},
                                             "on": {"layers": [1, 2]}},
                             flags={"fixed": True, "num-iterations": 5}, extra=extra)
    study = load_study(str(study_file))
    off, on = study.argv("off", 0, Path("runs")), study.argv("on", 0, Path("runs"))
    assert off == ["--num-iterations", "7"]  # false drops the shared boolean flag; the arm's value wins
    assert on == ["--fixed", "--num-iterations", "5", "--layers", "1,2"]
    order = [(run.arm, run.seed) for run in study.runs(Path("runs"))]
    assert order == [("off", 0), ("on", 0), ("off", 1), ("on", 1)]  # every arm gets a seed before the next seed


def test_seed_option_parsing():
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7]
    with pytest.raises(StudyError):
        parse_seeds("a,b")


def test_bundled_studies_are_well_formed():
    names = {path.stem for path in STUDY_DIR.glob("*.toml")}
    required = {"record", "backout-layer-sweep", "backout-multi-skip", "backout-transforms", "backout-norms",
                "backout-concat", "rolling-skip", "laurel", "laurel-forms", "dlo", "speed", "demo"}
    assert required <= names, required - names
    for name in sorted(names):
        with open(STUDY_DIR / f"{name}.toml", "rb") as f:
            data = tomllib.load(f)
        assert set(data) <= TOP_KEYS and data["description"]
        if "requires_results" in data:
            with pytest.raises(StudyError, match="needs finished results"):
                load_study(name, runs_dir=Path("/nonexistent-runs"))
            continue
        study = load_study(name, runs_dir=Path("/nonexistent-runs"))
        assert study.arms and study.seeds


def test_record_study_is_the_articles_comparison():
    study = load_study("record")
    assert study.nproc == 8
    assert study.argv("baseline", 0, Path("runs"))[:2] == ["--num-iterations", "5590"]
    backout = study.argv("backout-L11", 0, Path("runs"))
    assert backout == ["--num-iterations", "5550", "--backout-layers", "11"]
