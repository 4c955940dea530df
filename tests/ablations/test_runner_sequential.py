"""Group-sequential studies (--until-decided) on the stand-in training script: an arm decided early gets no more
seeds, the looks are recorded and replayed after a kill, bad input is refused in one line."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ablations.cli import main
from ablations.sequential_study import RULE
from analysis.sequential import describe_look
from runner_support import REPO, ablations, read_events, runner_env, start_ablations, wait_for, write_study

pytestmark = pytest.mark.slow  # every test here starts the runner or training processes

# The stand-in's final loss is 0.001 * seed plus 0.03 for backout layer 4: a clear difference, decided early.
ARMS = {"baseline": {}, "backout-L4": {"backout-layers": 4}}
FLAGS = {"num-iterations": 10, "val-every": 5}


def state_of(tmp_path: Path, study: str = "s") -> dict:
    return json.loads((tmp_path / "runs" / study / "sequential.json").read_text())


def looks_of(tmp_path: Path, study: str = "s") -> dict:
    return state_of(tmp_path, study)["looks"]


@pytest.mark.slow
def test_clear_difference_stops_before_the_maximum_and_reports_the_looks(tmp_path):
    """Guards: --until-decided stops a clearly worse arm early, starting no later seed; report and status show looks."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    starts = tmp_path / "starts.jsonl"
    result = ablations(["run", study, "--until-decided", "--max-seeds", "8", "--report"], tmp_path,
                       runner_env(starts))
    assert result.returncode == 0, result.stdout + result.stderr
    (looks,) = looks_of(tmp_path).values()
    assert looks[-1]["decision"] == "worse" and looks[-1]["n"] < 8
    assert all(look["decision"] == "continue" for look in looks[:-1])
    assert looks[-1]["adjusted_p"] < 0.01 and looks[-1]["repeated_ci"][0] > 0
    # no seed beyond the deciding look was started, for either arm
    started = {(e["variant"], e["seed"]) for e in read_events(starts) if e["event"] == "start"}
    assert started == {(arm, seed) for arm in ARMS for seed in range(looks[-1]["n"])}
    look_lines = [line for line in result.stdout.splitlines() if " look " in line]
    assert len(look_lines) == len(looks) and "-> worse, adjusted p" in look_lines[-1]
    report = (tmp_path / "runs" / "s" / "report.md").read_text()
    assert "## Sequential looks" in report and "| backout-L4 | worse | " in report and "| worse |" in report
    # status shows the design, and each arm's last look with its decision and adjusted p
    status = ablations(["status", study], tmp_path, runner_env())
    assert status.returncode == 0, status.stderr
    shown = status.stdout.splitlines()
    (design_line,) = [line for line in shown if line.startswith("sequential (")]
    assert "sequential.json): group-sequential, claim vs-baseline against baseline" in design_line
    assert "up to 8 seeds per arm in looks at 3,4,5,6,7,8" in design_line
    assert shown[-2].strip() == describe_look("backout-L4", looks[-1], state_of(tmp_path)["design"])
    assert f"look {len(looks)} backout-L4" in shown[-2] and "-> worse, adjusted p" in shown[-2]
    assert "family of 1 arm(s)" in shown[-1] and "backout-L4: worse after" in shown[-1]
    as_json = json.loads(ablations(["status", study, "--json"], tmp_path, runner_env()).stdout)
    assert as_json["sequential"]["looks"]["backout-L4"] == looks


@pytest.mark.slow
def test_study_file_keys_and_a_record_claim_against_the_target(tmp_path):
    """Guards: a study file's own until_decided keys run a below-target claim: one arm shown, the other futile."""
    extra = "until_decided = true\nmax_seeds = 4\nclaim = \"below-target\"\ntarget = 3.74"
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS, extra=extra)
    result = ablations(["run", study], tmp_path, runner_env())
    assert result.returncode == 0, result.stdout + result.stderr
    looks = looks_of(tmp_path)
    assert set(looks) == set(ARMS)  # one-sample claims: every arm, no baseline
    # baseline ends near 3.727 (below 3.74), backout-L4 near 3.757 (above): one shown, one futile
    assert looks["baseline"][-1]["decision"] == "below target"
    assert looks["backout-L4"][-1]["decision"] == "futile"


@pytest.mark.slow
def test_killed_study_resumes_with_its_looks(tmp_path):
    """Guards: a SIGKILLed sequential study resumes with its recorded looks as they were; another alpha is refused."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.15)
    runner = start_ablations(["run", study, "--until-decided", "--max-seeds", "8"], tmp_path, env,
                             tmp_path / "first.out")
    record = tmp_path / "runs" / "s" / "sequential.json"
    wait_for(lambda: record.exists(), 60, "the first look")
    first = looks_of(tmp_path)["backout-L4"]
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait(30)
    assert [look["look"] for look in first] == [1]
    again = ablations(["run", study, "--until-decided", "--max-seeds", "8"], tmp_path, runner_env())
    assert again.returncode == 0, again.stdout + again.stderr
    looks = looks_of(tmp_path)["backout-L4"]
    assert looks[0] == first[0]  # the look taken before the kill, unchanged
    assert [look["look"] for look in looks] == list(range(1, len(looks) + 1)) and looks[-1]["decision"] == "worse"
    assert sum(" replayed " in line for line in again.stdout.splitlines()) == 1
    # another design on the recorded looks is refused
    other = ablations(["run", study, "--until-decided", "--max-seeds", "8", "--alpha", "0.05"], tmp_path,
                      runner_env())
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1 and "alpha" in other.stderr


def test_max_factor_sets_the_most_seeds_from_the_studys_own(tmp_path):
    """--max-factor F (study key max_factor): at most F x the study's seed count seeds per arm (nearest seed), here
    1.5 x 4; without either, 1.15 x (power 0.8: benchmarks/sequential_sim.py), but a study recorded under the old
    rule (1 x by default, a factor rounded up) keeps its maximum; --dry-run lists every run the design may start,
    and nothing runs."""
    study = write_study(tmp_path, "s", ARMS, seeds=range(4), flags=FLAGS)
    default = ablations(["run", study, "--until-decided", "--dry-run"], tmp_path, runner_env())
    assert default.returncode == 0, default.stderr
    assert sum("--seed 4" in line for line in default.stdout.splitlines()) == 2  # round(1.15 x 4) = 5 seeds
    assert "up to 5 seeds per arm (1.15 x the fixed-n design's seeds)" in default.stdout
    old = {"alpha": 0.01, "max_seeds": 4, "batch": 1, "claim": "vs-baseline", "baseline": "baseline",
           "target": None, "arms": ["backout-L4"], "family": True, "family_size": 1, "rule": RULE}  # no max_factor
    (tmp_path / "runs" / "s").mkdir(parents=True)
    (tmp_path / "runs" / "s" / "sequential.json").write_text(json.dumps({"design": old, "looks": {"backout-L4": []}}))
    resumed = ablations(["run", study, "--until-decided", "--dry-run"], tmp_path, runner_env())
    assert resumed.returncode == 0, resumed.stderr
    assert not any("--seed 4" in line for line in resumed.stdout.splitlines()) and "up to 4 seeds" in resumed.stdout
    # a factor's maximum was rounded up: 1.1 x 4 gave 5 seeds then, 4 now; a record of then keeps its 5
    nearest = ablations(["run", study, "--until-decided", "--max-factor", "1.1", "--dry-run"], tmp_path, runner_env())
    assert nearest.returncode == 2 and "max_factor 1.0, now 1.1" in nearest.stderr  # the old record: another design
    (tmp_path / "runs" / "s" / "sequential.json").write_text(json.dumps(
        {"design": old | {"max_seeds": 5, "max_factor": 1.1}, "looks": {"backout-L4": []}}))
    rounded_up = ablations(["run", study, "--until-decided", "--max-factor", "1.1", "--dry-run"], tmp_path,
                           runner_env())
    assert rounded_up.returncode == 0, rounded_up.stderr
    assert "up to 5 seeds per arm (1.1 x" in rounded_up.stdout
    shutil.rmtree(tmp_path / "runs")
    listed = ablations(["run", study, "--until-decided", "--max-factor", "1.5", "--dry-run"], tmp_path, runner_env())
    assert listed.returncode == 0, listed.stderr
    assert sum("--seed 5" in line for line in listed.stdout.splitlines()) == 2  # both arms, seeds 0-5
    assert not any("--seed 6" in line for line in listed.stdout.splitlines())
    keyed = write_study(tmp_path, "k", ARMS, seeds=range(4), flags=FLAGS, extra="until_decided = true\nmax_factor = 2")
    listed = ablations(["run", keyed, "--dry-run"], tmp_path, runner_env())
    assert sum("--seed 7" in line for line in listed.stdout.splitlines()) == 2
    # the flag wins over the study key, and --max-seeds over both
    listed = ablations(["run", keyed, "--max-seeds", "3", "--dry-run"], tmp_path, runner_env())
    assert sum("--seed 2" in line for line in listed.stdout.splitlines()) == 2
    assert not any("--seed 3" in line for line in listed.stdout.splitlines())
    assert not (tmp_path / "runs").exists()


def test_status_of_a_study_with_an_unreadable_sequential_record(tmp_path):
    """Guards: `ablations status` of a study whose sequential.json is not JSON names the problem (text and --json)."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    before = ablations(["status", study], tmp_path, runner_env())
    assert before.returncode == 0 and "sequential" not in before.stdout  # no looks yet: nothing to show
    (tmp_path / "runs" / "s").mkdir(parents=True)
    (tmp_path / "runs" / "s" / "sequential.json").write_text("{not json")
    status = ablations(["status", study], tmp_path, runner_env())
    assert status.returncode == 0 and "4 to do" in status.stdout
    assert "sequential (" in status.stdout and "not a sequential record the study runner wrote" in status.stdout
    assert "problem" in json.loads(ablations(["status", study, "--json"], tmp_path, runner_env()).stdout)["sequential"]


@pytest.fixture
def refused(tmp_path, monkeypatch, capsys):
    """`python -m ablations run STUDY ARGS` in this process (refusals need no subprocess): its one error line,
    after checking the exit status 2 and that no run started."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_TRAIN_STARTS", str(tmp_path / "starts.jsonl"))

    def run(study, *extra) -> str:
        try:
            code = main(["run", str(study), *map(str, extra)])
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
        out, err = capsys.readouterr()
        assert code == 2, out + err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err + out and lines[0].startswith("error: "), err
        assert not (tmp_path / "starts.jsonl").exists()
        return lines[0]

    return run


def test_bad_input_is_one_line_and_exit_2(tmp_path, refused):
    """Guards: bad sequential-design input is one line, exit 2: in-process, via ./run.sh and `python -m ablations`."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    assert "alpha" in refused(study, "--until-decided", "--alpha", "1.5")
    assert "alpha" in refused(study, "--until-decided", "--alpha", "0")
    assert "below one batch" in refused(study, "--until-decided", "--max-seeds", "1")
    assert "below one batch" in refused(study, "--until-decided", "--max-seeds", "0")
    assert "below one batch" in refused(study, "--until-decided", "--parallel", "8", "--max-seeds", "3")
    one_arm = write_study(tmp_path, "one", {"baseline": {}}, flags=FLAGS)
    assert "one arm" in refused(one_arm, "--until-decided")
    assert "--until-decided" in refused(study, "--max-seeds", "4")
    assert "--until-decided" in refused(study, "--max-factor", "2")
    # non-numeric values, from the command line and from the study file
    assert "--alpha: invalid float value: 'abc'" in refused(study, "--until-decided", "--alpha", "abc")
    assert "--max-seeds: invalid int value: 'x'" in refused(study, "--until-decided", "--max-seeds", "x")
    assert "--max-factor: invalid float value" in refused(study, "--until-decided", "--max-factor", "2x")
    assert "alpha" in refused(study, "--until-decided", "--alpha", "nan")
    for key, value, needle in (("alpha", '"0.05"', "alpha must be a number"),
                               ("max_seeds", "2.5", "max_seeds must be an integer"),
                               ("max_factor", '"big"', "max_factor must be a number")):
        keyed = write_study(tmp_path, "keyed", ARMS, flags=FLAGS, extra=f"{key} = {value}")
        assert needle in refused(keyed, "--until-decided")
    # the factor: at least 1, not with --max-seeds, not both keys; one batch at least
    assert "--max-factor 0.5 is not a number of at least 1" in refused(study, "--until-decided",
                                                                       "--max-factor", "0.5")
    assert "--max-factor inf" in refused(study, "--until-decided", "--max-factor", "inf")
    assert "give one" in refused(study, "--until-decided", "--max-seeds", "4", "--max-factor", "2")
    both = write_study(tmp_path, "both", ARMS, flags=FLAGS, extra="max_seeds = 4\nmax_factor = 2")
    assert "max_seeds and max_factor both" in refused(both, "--until-decided")
    one_seed = write_study(tmp_path, "one-seed", ARMS, seeds=[0], flags=FLAGS)
    assert "at most 1 seeds per arm is below one batch" in refused(one_seed, "--until-decided",
                                                                  "--max-factor", "1")
    # a study file in a folder that does not exist, and argparse's own usage errors
    assert "does not exist" in refused(tmp_path / "nowhere" / "s.toml", "--until-decided")
    assert "unrecognized arguments: --untill-decided" in refused(study, "--untill-decided")
    # the front door as a user types it: ./run.sh STUDY --until-decided ... (python3 on PATH: the tests' own)
    env = runner_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("FORCE_VENV", None)
    front = subprocess.run([str(REPO / "run.sh"), str(study), "--until-decided", "--alpha", "1.5"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert front.returncode == 2 and front.stderr.splitlines() == [
        "error: --until-decided: alpha 1.5 is not strictly between 0 and 1"], front.stdout + front.stderr
    usage = ablations(["run"], tmp_path, runner_env())  # the command line as typed, in a process of its own
    assert usage.returncode == 2 and usage.stderr.startswith("error: the following arguments are required: study")
    assert len(usage.stderr.strip().splitlines()) == 1
