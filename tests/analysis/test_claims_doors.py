"""Issue 40: every door that prints a claim (compare, record-check, summarize, report, analysis.terminal, record) takes
it from one definition, so the same study sets give the same verdict per arm whichever door and whichever way the
runs are named, and no door prints a claim the study does not hold."""
import json
import math

import pytest

import analysis_logs as logs_for_tests
from analysis.logs import load_runs
from analysis.sequential import Design, take_look
from analysis_logs import run_cli

CLOSE_TO_TARGET = [2.9209, 2.9211, 2.9212, 2.9210, 2.9213]  # mean 2.9211: above 2.92, below 2.925
BASELINE = [2.9200, 2.9210, 2.9190, 2.9205, 2.9195]
LUCKY = [2.9170, 2.9172, 2.9168, 2.9171, 2.9169]  # fixed-sample p about 1e-4 against the baseline


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The report's claims are what these tests read: its plots (most of a report's time) are left out."""
    monkeypatch.setattr("analysis.report._planned_figures", lambda *args: [])


def write_arms(root, finals: dict):
    for arm, values in finals.items():
        for seed, final in enumerate(values):
            logs_for_tests.write(root / arm / f"seed{seed}.txt", logs_for_tests.our_log_text(
                variant=arm, seed=seed, losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final)))
    return root


def record(root, arm, decision, claim="vs-baseline", target=None, p=1e-4, adjusted=0.5, n=5, **design):
    look = {"look": 1, "n": n, "n_baseline": n if claim == "vs-baseline" else None, "fraction": 1.0,
            "boundary": 3.3, "nominal_p": 0.001, "estimate": -0.003, "z": -3.0, "p": p,
            "repeated_ci": [-0.004, -0.001], "decision": decision, "adjusted_p": adjusted}
    state = {"design": {"alpha": 0.01, "max_seeds": 5, "max_factor": 1.0, "batch": 1, "claim": claim,
                        "baseline": "baseline" if claim == "vs-baseline" else None, "target": target,
                        "arms": [arm], "family": True, "family_size": 1, **design},
             "looks": {arm: [look]}}
    (root / "sequential.json").write_text(json.dumps(state))
    return state


def doors(capsys, tmp_path, paths, arm, target=2.92):
    """{door: (exit status, output)} of every analysis door over the runs at `paths` (arm: the one record-check
    and record look at)."""
    out = {"compare": run_cli(capsys, "compare", *paths),
           "record-check": run_cli(capsys, "record-check", *paths, "--variant", arm, "--target", target,
                                   "--resamples", "50", "--max-runs", "3"),
           "summarize": run_cli(capsys, "summarize", *paths, "--target", target)}
    if len(paths) == 1 and paths[0].is_dir():
        out["report"] = run_cli(capsys, "report", paths[0], "--target", target, "--out", tmp_path / "report.md")
        if out["report"][0] == 0:
            out["report"] = (0, (tmp_path / "report.md").read_text(), "")
        from analysis.terminal import main as terminal
        status = terminal([str(paths[0]), "--target", str(target)])
        captured = capsys.readouterr()
        out["terminal"] = (status, captured.out, captured.err)
        records = tmp_path / f"records{len(list(tmp_path.glob('records*')))}"
        status, printed, err = run_cli(capsys, "record", paths[0], "--track", "medium", "--name", "X",
                                       "--variant", arm, "--target", target, "--records-root", records)
        readme = next(records.rglob("README.md"), None)
        out["record"] = (status, readme.read_text() if readme else printed, err)
    return {door: (status, text + err) for door, (status, text, err) in out.items()}


def loss_part(text):
    """What a door says of the record claim (record-check's loss lines, the record README's p lines)."""
    return "\n".join(line for line in text.splitlines() if "loss below" in line or "sequential study (" in line)


def test_case1_a_record_claim_for_a_target_the_study_never_tested(capsys, tmp_path):
    """A below-target study at 2.925 decided "below target"; 2.92 was never tested: no door passes 2.92."""
    root = write_arms(tmp_path / "s", {"claim": CLOSE_TO_TARGET})
    record(root, "claim", "below target", claim="below-target", target=2.925, adjusted=0.004)
    for door, (status, text) in doors(capsys, tmp_path, [root], "claim").items():
        if door == "compare":
            assert status == 2 and "nothing to compare" in text
            continue
        assert "loss below 2.92 at p < 0.01: PASS" not in text and "below target after" not in loss_part(text)
        if door in ("record-check", "record", "summarize", "report", "terminal"):  # summarize said "claim: below
            # target after 3 seeds" under --target 2.92, the report gave the verdict table alone, the terminal
            # nothing (audit)
            assert "no claim: the sequential study tested mean < 2.925, not mean < 2.92" in text, (door, text)
        if door == "summarize":
            assert "below target after" not in text and "against the target 2.925" in text, text
    status, text, _ = run_cli(capsys, "record-check", root / "claim", "--target", "2.925", "--resamples", "50",
                              "--max-runs", "3")
    assert "below target after 5 seeds" in text and "loss below 2.925 at p < 0.01: PASS" in text
    from analysis.terminal import main as terminal
    assert terminal([str(root), "--target", "2.925"]) == 0
    assert "claim: below target after 5 seeds" in capsys.readouterr().out  # at the tested target: the verdict
    status, text, _ = run_cli(capsys, "record-check", root / "claim", "--target", "2.925", "--alpha", "0.001",
                              "--resamples", "50", "--max-runs", "3")  # decided at 0.01: no PASS at 0.001
    assert status == 1 and "PASS" not in loss_part(text)
    assert "no claim: the sequential study tested at family-wise alpha 0.01, not at 0.001" in text


@pytest.mark.parametrize("shape", ["study folder", "arm folders", "log files"])
def test_case2_the_sequential_design_follows_the_runs_however_they_are_named(capsys, tmp_path, shape):
    """The arm the sequential rule left "not shown" gets no claim by every door, also from arm folders or files."""
    root = write_arms(tmp_path / "s", {"baseline": BASELINE, "lucky": LUCKY})
    record(root, "lucky", "not shown", adjusted=0.02)
    paths = {"study folder": [root], "arm folders": [root / "baseline", root / "lucky"],
             "log files": sorted(root.glob("*/seed*.txt"))}[shape]
    for door, (status, text) in doors(capsys, tmp_path, paths, "lucky").items():
        assert status in (0, 1) and "a real difference" not in text, (door, text)
        if door in ("compare", "terminal", "report"):
            assert "no claim (sequential decision: not shown)" in text, (door, text)
        if door == "record-check":
            assert "tested its arms against baseline, not a record claim" in text
            assert "PASS" not in loss_part(text)


DAMAGED = {"cut": lambda path: path.write_text('{"design": {"alpha": 0.0'),
           "empty": lambda path: path.write_text(""),
           "binary": lambda path: path.write_bytes(b"\x00\xff\x13"),
           "a JSON array": lambda path: path.write_text("[1, 2]"),
           "a folder": lambda path: path.mkdir(),
           "n beyond the design": None, "p not a number": None, "an unknown claim": None, "alpha 1.5": None}


@pytest.mark.parametrize("damage", DAMAGED)
def test_case3_and_8_a_damaged_or_implausible_record_is_refused_by_every_door(capsys, tmp_path, damage):
    root = write_arms(tmp_path / "s", {"baseline": BASELINE, "lucky": LUCKY})
    path = root / "sequential.json"
    if DAMAGED[damage] is not None:
        DAMAGED[damage](path)
    else:
        changes = {"n beyond the design": dict(n=40), "p not a number": dict(p=math.nan),
                   "an unknown claim": dict(claim="below-targett"), "alpha 1.5": dict(alpha=1.5)}[damage]
        record(root, "lucky", "better", **changes)
    for door, (status, text) in doors(capsys, tmp_path, [root], "lucky").items():
        assert status == 2 and len(text.strip().splitlines()) == 1, (door, text)
        assert "not a sequential record the study runner wrote" in text and "move it aside" in text, (door, text)
    status, text = doors(capsys, tmp_path, [root / "lucky" / "seed0.txt", root / "lucky" / "seed1.txt"],
                         "lucky")["record-check"]
    assert status == 2 and "not a sequential record" in text


def test_a_foreign_record_is_refused(capsys, tmp_path):
    root = write_arms(tmp_path / "s", {"baseline": BASELINE, "lucky": LUCKY})
    record(root, "elsewhere", "better")
    status, _, err = run_cli(capsys, "compare", root)
    assert status == 2 and "a foreign record" in err


def test_case6_arms_named_after_the_fact_keep_the_study_family(capsys, tmp_path):
    nulls = {f"null{k}": [2.9200 + d for d in (0.0009, -0.0010, 0.0002, -0.0004, 0.0003)] for k in range(4)}
    root = write_arms(tmp_path / "s", {"baseline": BASELINE, "lucky": [2.9180, 2.9188, 2.9176, 2.9184, 2.9182],
                                       **nulls})
    status, out, _ = run_cli(capsys, "compare", root, "--arms", "baseline,lucky", "--json")
    result = json.loads(out)
    (lucky,) = result["comparisons"]
    assert lucky["loss_p"] < 0.01 < lucky["loss_p_holm"] and result["claims"]["arms"][0]["claim"] is None
    assert result["claims"]["family"].startswith("family of 5 arms against baseline (1 shown)")
    from analysis.terminal import main as terminal
    assert terminal([str(root), "--target", "2.92", "--arms", "baseline,lucky"]) == 0
    shown = capsys.readouterr().out
    assert "family of 5 arms against baseline (1 shown)" in shown and "a real difference" not in shown
    assert "null0" not in shown
    status, _, err = run_cli(capsys, "report", root, "--target", "2.92", "--arms", "baseline,lucky",
                             "--out", tmp_path / "report.md")
    report = (tmp_path / "report.md").read_text()
    assert status == 0 and "family of 5 arms against baseline (1 shown)" in report, err
    assert "a real difference" not in report


def test_case7_zero_variance_makes_no_claim_anywhere(capsys, tmp_path):
    root = write_arms(tmp_path / "s", {"baseline": [2.9230] * 4, "flat": [2.9200] * 4})
    texts = doors(capsys, tmp_path, [root], "flat")
    assert "flat: cannot test: no variance" in texts["compare"][1] and "a real difference" not in texts["compare"][1]
    assert "cannot test: no variance" in texts["terminal"][1]
    assert texts["record-check"][0] == 1 and "cannot test: no variance" in texts["record-check"][1]
    design = Design(alpha=0.01, max_seeds=4, batch=4)
    for arm, base in (([2.92] * 4, [2.92] * 4), ([2.91] * 4, [2.92] * 4)):
        assert take_look(design, [], arm, base)["decision"] != "better"
    at_target = take_look(Design(alpha=0.01, max_seeds=4, batch=4, sides=1), [], [2.92] * 4, target=2.92)
    assert at_target["decision"] != "below target" and at_target["why"] == "cannot test: no variance"


def test_a_run_with_an_infinite_final_loss_is_diverged_and_never_reached_the_target(capsys, tmp_path):
    """Issue 43: a -inf final loss counted as reaching the target (summarize "reached 6/6"), and record-check said
    "final loss nan" for inf."""
    root = write_arms(tmp_path / "s", {"claim": [2.9100, 2.9110]})
    logs_for_tests.write(root / "claim" / "seed2.txt", logs_for_tests.our_log_text(
        variant="claim", seed=2, losses=lambda step: -math.inf if step == 100 else 3.5))
    status, out, _ = run_cli(capsys, "summarize", root, "--target", "2.92", "--json")
    (group,) = json.loads(out)["groups"]
    assert group["n_diverged"] == 1 and group["n_reached_target"] == 2
    status, out, _ = run_cli(capsys, "record-check", root, "--target", "2.92", "--resamples", "50",
                             "--max-runs", "3")
    assert status == 1 and "1 diverged: final loss nan or inf" in out
    assert len(load_runs([root])[0]) == 3


def test_analysis_record_names_what_it_could_not_package(capsys, tmp_path, monkeypatch):
    """Issue 43: "no complete runs to package" named neither the unfinished logs nor the unknown variant, and a full
    disk was blamed on the source log."""
    import errno
    root = tmp_path / "s"
    cut = logs_for_tests.write(root / "claim" / "seed0.txt", logs_for_tests.our_log_text(variant="claim",
                                                                                        complete=False))
    common = ["--track", "medium", "--name", "X", "--records-root", tmp_path / "records"]
    status, _, err = run_cli(capsys, "record", root, *common)
    assert status == 2 and "no complete runs among 1 run log(s)" in err and str(cut) in err
    write_arms(root, {"claim": [2.9100, 2.9110]})
    status, _, err = run_cli(capsys, "record", root, *common, "--variant", "nosuch")
    assert status == 2 and "--variant nosuch: no run logs of it" in err and "arms: claim" in err

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(args[0]))
    monkeypatch.setattr("analysis.record.shutil.copy2", full_disk)
    status, _, err = run_cli(capsys, "record", root, *common)
    destination = next(iter(common[-1].glob("track_2_medium")), None)
    assert status == 2 and "track_2_medium" in err and "No space left on device" in err and "seed" not in err
    assert destination is not None and not list(destination.iterdir())  # nothing half-written left


def test_a_design_edited_by_hand_after_the_runner_wrote_it_is_refused_by_every_door(capsys, tmp_path):
    """Issue 43: a record the runner wrote, its alpha then edited to 0.05 (a value in (0, 1)), was refused by the
    runner (against the study file) but shown and used by compare, which has no study file: the runner's digest of
    the design makes every reader refuse it."""
    from ablations.sequential_study import _save_state

    root = write_arms(tmp_path / "s", {"baseline": BASELINE, "lucky": LUCKY})
    path = root / "sequential.json"
    state = record(root, "lucky", "better")
    _save_state(path, state)
    assert doors(capsys, tmp_path, [root], "lucky")["compare"][0] == 0  # as the runner wrote it: read
    path.write_text(path.read_text().replace('"alpha": 0.01', '"alpha": 0.05'))
    for door, (status, text) in doors(capsys, tmp_path, [root], "lucky").items():
        assert status == 2 and len(text.strip().splitlines()) == 1, (door, text)
        assert "its design was edited after the runner wrote it" in text, (door, text)


def marked_study(tmp_path, made_under=None):
    """A sequential study's folder as the runner leaves it: the record beside the arms, each log naming the study
    and its design's digest (the runner hands them to the script; `made_under`: design keys that differ from the
    record's) and, on its config line, the folder it was written to."""
    from analysis.sequential import design_digest
    from speedrun.logformat import study_value

    root = tmp_path / "s"
    root.mkdir(parents=True)
    state = record(root, "lucky", "not shown", adjusted=0.02)
    mark = study_value("s", design_digest=design_digest({**state["design"], **(made_under or {})}))
    for arm, values in {"baseline": BASELINE, "lucky": LUCKY}.items():
        for seed, final in enumerate(values):
            logs_for_tests.write(root / arm / f"seed{seed}.txt", logs_for_tests.our_log_text(
                variant=arm, seed=seed, config={"log_dir": str(root / arm)}, env={"study": mark},
                losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final)))
    return root


def copy_runs(root, to, with_record=False):
    import shutil
    for arm in ("baseline", "lucky"):
        shutil.copytree(root / arm, to / arm)
    if with_record:
        shutil.copy2(root / "sequential.json", to / "sequential.json")
    return to


@pytest.mark.parametrize("shape", ["study folder", "arm folders", "log files"])
def test_case2_runs_copied_without_their_record_with_the_study_gone_make_no_claim_at_any_door(capsys, tmp_path,
                                                                                             shape):
    """Copied away from sequential.json, with the study folder gone, the runs of a sequential study got fixed-sample
    claims ("a real difference" for the arm the looks left "not shown"): the runs now name their study, so every
    door says in one line that there is no claim without its record."""
    import shutil

    copy = copy_runs(marked_study(tmp_path), tmp_path / "copy")
    shutil.rmtree(tmp_path / "s")
    paths = {"study folder": [copy], "arm folders": [copy / "baseline", copy / "lucky"],
             "log files": sorted(copy.glob("*/seed*.txt"))}[shape]
    texts = doors(capsys, tmp_path, paths, "lucky")
    assert set(texts) >= {"compare", "record-check", "summarize"}
    for door, (status, text) in texts.items():
        assert status == 2 and len(text.strip().splitlines()) == 1, (door, text)
        assert ("no claim: these runs were made by sequential study s whose record (sequential.json) is not with "
                "them") in text, (door, text)


def test_case2_copied_with_the_record_the_study_verdict_holds(capsys, tmp_path):
    """The record travels with the copy (beside the arm folders, or in the package `analysis record` makes): the
    study's verdict, not a fixed-sample claim; a record of another design than the runs were made under: refused."""
    import shutil

    root = marked_study(tmp_path)
    copy = copy_runs(root, tmp_path / "copy", with_record=True)
    status, text, _ = run_cli(capsys, "record", root, "--track", "medium", "--name", "X", "--variant", "lucky",
                              "--target", "2.92", "--records-root", tmp_path / "records")
    package = next((tmp_path / "records").rglob("README.md")).parent
    assert status == 0 and (package / "sequential.json").is_file()
    shutil.rmtree(root)
    for paths in ([copy], [copy / "baseline", copy / "lucky"]):
        status, text, err = run_cli(capsys, "compare", *paths)
        assert status == 0 and "no claim (sequential decision: not shown)" in text and "a real difference" not in \
            text, err
    status, text, err = run_cli(capsys, "record-check", package, "--target", "2.92", "--resamples", "50",
                                "--max-runs", "3")
    assert "tested its arms against baseline, not a record claim" in text and "PASS" not in loss_part(text), err
    status, _, err = run_cli(capsys, "compare", marked_study(tmp_path / "other", made_under={"alpha": 0.05}))
    assert status == 2 and "no claim: runs of sequential study s were made under another study or design" in err
    foreign = marked_study(tmp_path / "foreign")  # the same design, another study's record (its runs' flags differ)
    record_file = foreign / "sequential.json"
    record_file.write_text(json.dumps({**json.loads(record_file.read_text()), "study": "t"}))
    status, _, err = run_cli(capsys, "compare", foreign)
    assert status == 2 and "another study or design" in err and "(t, " in err


PICKED = [2.9185, 2.9175, 2.9190, 2.9170, 2.9180]  # Welch p 0.0039 against BASELINE; one-sided p 0.0024 below 2.92


def copied_best_of_fixed_study(tmp_path, shape):
    """Issue 40 case 6 with the study folder gone: a fixed study of 5 arms against a baseline (the runner names all
    six arms in each log), of which only the baseline and the arm that looked best were copied."""
    from speedrun.logformat import study_value

    mark = study_value("f", arms=["baseline", "a1", "a2", "a3", "a4", "picked"])
    copy = tmp_path / "copy"
    for arm, values in {"baseline": BASELINE, "picked": PICKED}.items():
        for seed, final in enumerate(values):
            logs_for_tests.write(copy / arm / f"seed{seed}.txt", logs_for_tests.our_log_text(
                variant=arm, seed=seed, config={"log_dir": str(tmp_path / "gone" / "f" / arm)}, env={"study": mark},
                losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final)))
    return {"study folder": [copy], "arm folders": [copy / "baseline", copy / "picked"],
            "log files": sorted(copy.glob("*/seed*.txt"))}[shape]


@pytest.mark.parametrize("shape", ["study folder", "arm folders", "log files"])
def test_case6_the_best_arm_of_a_fixed_study_copied_alone_is_adjusted_over_the_whole_study(capsys, tmp_path, shape):
    """The baseline and the best of 5 arms copied away: compare claimed "a real difference" at the raw p 0.0039 over
    a family of 1, record-check PASSed at the raw p 0.0024 (4.1% and more false claims). The runs name their study's
    arms, so every door adjusts over all of them (the absent arms' p taken as 1) and says so."""
    paths = copied_best_of_fixed_study(tmp_path, shape)
    texts = doors(capsys, tmp_path, paths, "picked")
    assert set(texts) >= {"compare", "record-check", "summarize"}
    for door, (status, text) in texts.items():
        assert "a real difference" not in text and "PASS" not in loss_part(text), (door, text)
        if door in ("compare", "report", "terminal"):
            assert status == 0 and "Holm over the study's 5 arms, 1 shown" in text, (door, text)
            assert "p 0.0197" in text or "0.0197" in text, (door, text)  # 5 x 0.00395: Holm with four p = 1
        else:
            assert "Holm over the study's 6 arms" in text, (door, text)  # a record claim: every arm is a candidate
    assert texts["record-check"][0] == 1 and "FAIL" in loss_part(texts["record-check"][1])


def test_case6_runs_of_two_fixed_studies_mixed_are_refused_and_unmarked_runs_behave_as_before(capsys, tmp_path):
    """Each study is its own family: runs of two fixed studies given together are refused in one line; runs of one
    study whose arms were edited between them count every arm it named. Logs without the line (made before it, or by
    hand) keep the old behaviour: the raw p over the arms given."""
    from speedrun.logformat import study_value

    paths = copied_best_of_fixed_study(tmp_path, "study folder")
    for seed, final in enumerate(PICKED):
        other = tmp_path / "copy" / "other" / f"seed{seed}.txt"
        logs_for_tests.write(other, logs_for_tests.our_log_text(
            variant="other", seed=seed, env={"study": study_value("g", arms=["baseline", "other"])},
            losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final)))
    for command in (["compare"], ["summarize"]):
        status, _, err = run_cli(capsys, *command, *paths)
        assert status == 2 and len(err.strip().splitlines()) == 1 and "the runs come from 2 studies" in err, err
    from types import SimpleNamespace

    from analysis.claims import study_family
    edited = [SimpleNamespace(path=tmp_path / f"{i}.txt", env={"study": study_value("f", arms=arms)})
              for i, arms in enumerate((["baseline", "a1"], ["baseline", "a1", "a2"]))]
    assert study_family(edited) == {"study": "f", "arms": ["baseline", "a1", "a2"]}  # an arm added: every arm counts
    plain = write_arms(tmp_path / "plain", {"baseline": BASELINE, "picked": PICKED})
    status, text, _ = run_cli(capsys, "compare", plain)
    assert status == 0 and "picked: final loss 0.0020 lower than baseline (p 0.0039" in text and "Holm over" not in text


def test_case5_an_arm_pooling_runs_of_two_trainings_makes_no_claim_at_any_door(capsys, tmp_path):
    """An arm edited after some of its seeds were run (its flag 4 -> 3, the old seeds left in the folder): compare,
    report and analysis.terminal said "a real difference", record-check PASSed, the record README gave the claim's
    p, each beside a warning that the arm pools two trainings. The sample is of no one training: no claim."""
    root = tmp_path / "s"
    for arm, values in {"baseline": BASELINE, "edited": LUCKY}.items():
        for seed, final in enumerate(values):
            flags = {"backout_layers": [3 if seed == 0 else 4]} if arm == "edited" else {}
            logs_for_tests.write(root / arm / f"seed{seed}.txt", logs_for_tests.our_log_text(
                variant=arm, seed=seed, config=flags,
                losses=lambda step, final=final: logs_for_tests.default_curve(step, 100, final)))
    texts = doors(capsys, tmp_path, [root], "edited", target=2.9185)
    why = "pools runs of 2 different trainings (backout_layers [3] in seed0.txt, [4] in seed1.txt)"
    for door, (status, text) in texts.items():
        assert "a real difference" not in text and "PASS" not in loss_part(text), (door, text)
        assert why in text, (door, text)
        if door in ("compare", "report", "terminal"):
            assert f"edited: no claim: edited {why}" in text, (door, text)
        if door in ("record-check", "record"):
            assert f"no claim: the arm {why}" in text, (door, text)
    assert texts["record-check"][0] == 1


def test_case7_a_sequential_look_at_runs_without_variance_says_so_at_every_door(capsys, tmp_path):
    """Audit of case 7: take_look records "cannot test: no variance" as the look's reason, but the doors printed only
    "no claim (futile)", a decision about power that never was computed."""
    root = write_arms(tmp_path / "s", {"baseline": [2.9200] * 4, "flat": [2.9200] * 4})
    state = record(root, "flat", "futile", p=1.0, adjusted=1.0, n=4)
    state["looks"]["flat"][0]["why"] = "cannot test: no variance"
    (root / "sequential.json").write_text(json.dumps(state))
    texts = doors(capsys, tmp_path, [root], "flat")
    for door in ("compare", "report", "terminal"):
        assert "flat: no claim (sequential decision: futile: cannot test: no variance)" in texts[door][1], door
    assert "flat: no claim (futile: cannot test: no variance) after 4 seeds" in texts["summarize"][1]
    for door, (status, text) in texts.items():
        assert status in (0, 1) and "a real difference" not in text, (door, text)
