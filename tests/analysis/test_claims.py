"""Issue 33: every printed claim holds its stated error rate. One definition of a finished log shared by the study
runner and analysis; diverged runs fail claims in every path; arms adjusted as a family; one verdict per arm."""
import json

import pytest

import analysis_logs as logs_for_tests
from ablations.runstate import log_is_complete
from analysis.logs import load_runs, log_problem
from analysis_logs import run_cli


def curve(final):
    return lambda step: logs_for_tests.default_curve(step, 100, final)


def finished_text(seed=0, final=2.919):
    return logs_for_tests.our_log_text(variant="claim", seed=seed, losses=curve(final))


DAMAGED = {
    "cut inside its peak-memory line": lambda text: text[:text.rindex(" reserved:")] + " reser\n",
    "config line not valid JSON": lambda text: text.replace('config: {"track"', 'config: {track', 1),
    "config line cut": lambda text: text.replace('config: {"track"', 'config: {"tr\nx', 1),
    "steps going back after the final validation": lambda text: text.replace(
        "\npeak memory", "\nstep:3/100 train_time:1ms step_avg:0.33ms\npeak memory"),
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_runner_and_analysis_agree_a_damaged_log_is_unfinished(tmp_path, damage):
    """Case 6: the runner reruns (not done) exactly the logs analysis never counts."""
    log = logs_for_tests.write(tmp_path / "claim" / "seed0.txt", DAMAGED[damage](finished_text()))
    runs, unreadable = load_runs([tmp_path])
    assert not log_is_complete(log)
    assert log_problem(log) is not None
    assert [run.complete for run in runs] == [False] and not unreadable


def test_a_whole_log_is_finished_for_both(tmp_path):
    log = logs_for_tests.write(tmp_path / "claim" / "seed0.txt", finished_text())
    assert log_is_complete(log) and log_problem(log) is None
    assert log_problem(tmp_path / "missing.txt").startswith("cannot be read")


def write_arms(root, finals: dict):
    for arm, values in finals.items():
        for seed, final in enumerate(values):
            logs_for_tests.write(root / arm / f"seed{seed}.txt", logs_for_tests.our_log_text(
                variant=arm, seed=seed, losses=curve(final)))
    return root


# Unadjusted Welch p of `lucky` against the baseline: about 0.004 (< 0.01), Holm over 5 arms: about 0.02 (> 0.01).
FAMILY = {"baseline": [2.9200, 2.9210, 2.9190, 2.9205, 2.9195],
          "lucky": [2.9180, 2.9188, 2.9176, 2.9184, 2.9182],
          **{f"null{k}": [2.9200 + d for d in (0.0009, -0.0010, 0.0002, -0.0004, 0.0003)] for k in range(4)}}


def test_a_family_of_arms_is_claimed_at_its_family_wise_alpha(capsys, tmp_path):
    """Case 1: each arm was tested at the full alpha; now Holm over the arms, named in the headline."""
    root = write_arms(tmp_path / "study", FAMILY)
    status, out, err = run_cli(capsys, "compare", root, "--json")
    assert status == 0, err
    result = json.loads(out)
    lucky = next(c for c in result["comparisons"] if c["variant"] == "lucky")
    assert lucky["loss_p"] < 0.01 < lucky["loss_p_holm"]
    assert result["claims"]["family"].startswith("family of 5 arms against baseline, family-wise alpha 0.01")
    (claim,) = [arm for arm in result["claims"]["arms"] if arm["variant"] == "lucky"]
    assert claim["claim"] is None and "not distinguishable" in claim["text"] and "unadjusted p" in claim["text"]
    from analysis.terminal import terminal_summary
    text = terminal_summary(root, load_runs([root])[0], 2.92)
    assert "a real difference" not in text and "claims: family of 5 arms" in text
    exploratory = terminal_summary(root, load_runs([root])[0], 2.92, family=False)
    assert "lucky: final loss" in exploratory and "a real difference at the 0.01 level" in exploratory
    assert "exploratory: NOT family-controlled" in exploratory


def sequential_record(root, decision, p=0.5, adjusted=0.3, claim="vs-baseline", arms=("lucky",)):
    look = {"look": 3, "n": 5, "n_baseline": 5 if claim == "vs-baseline" else None, "fraction": 1.0,
            "boundary": 3.3, "nominal_p": 0.001, "estimate": -0.002, "z": -3.0, "p": p, "repeated_ci": [-0.003, 0.001],
            "decision": decision, "adjusted_p": adjusted}
    state = {"design": {"alpha": 0.01, "max_seeds": 5, "max_factor": 1.0, "batch": 1, "claim": claim,
                        "baseline": "baseline" if claim == "vs-baseline" else None,
                        "target": 2.92 if claim != "vs-baseline" else None, "arms": list(arms), "family": True,
                        "family_size": len(arms)},
             "looks": {arm: [look] for arm in arms}}
    (root / "sequential.json").write_text(json.dumps(state))


def test_after_a_sequential_study_every_command_gives_its_verdict(capsys, tmp_path):
    """Case 3: the fixed-sample p (1e-5 here) must not turn an arm the sequential rule left "not shown" into "a real
    difference" on the terminal, in the report's Comparisons or in compare."""
    root = write_arms(tmp_path / "s", {"baseline": FAMILY["baseline"], "lucky": [2.9170, 2.9172, 2.9168, 2.9171,
                                                                                 2.9169]})
    sequential_record(root, "not shown", p=1e-5, adjusted=0.02)
    from analysis.terminal import terminal_summary
    text = terminal_summary(root, load_runs([root])[0], 2.92)
    assert "a real difference" not in text
    assert "no claim (sequential decision: not shown)" in text and "not valid after looking" in text
    status, out, _ = run_cli(capsys, "compare", root)
    assert status == 0 and "a real difference" not in out and "sequential p 0.02" in out
    assert "fixed-sample p-values and CIs, not valid after the sequential looks" in out


AFTER_LOOKING = "fixed-sample, not valid after the sequential looks"


def test_after_a_sequential_study_every_arm_level_p_is_labelled_fixed_sample(capsys, tmp_path):
    """Case 3 for the arm tables: summarize's groups, the report's Arms and the terminal's table printed the arm's
    fixed-sample p (1e-5 here) bare beside a sequential verdict of "not shown"; each is now labelled, and summarize
    gives the sequential verdicts themselves."""
    root = write_arms(tmp_path / "s", {"baseline": FAMILY["baseline"], "lucky": [2.9170, 2.9172, 2.9168, 2.9171,
                                                                                 2.9169]})
    sequential_record(root, "not shown", p=1e-5, adjusted=0.02)
    status, out, err = run_cli(capsys, "summarize", root, "--target", "2.92")
    assert status == 0, err
    assert f"mean < 2.92 ({AFTER_LOOKING})" in out and "p fixed-sample" in out
    assert "lucky: no claim (not shown) after 5 seeds, sequential p 0.02, family p 0.02" in out
    status, out, _ = run_cli(capsys, "summarize", root, "--target", "2.92", "--json")
    result = json.loads(out)
    assert result["p_value_note"] == AFTER_LOOKING and result["sequential"]["verdicts"]["lucky"]["claim"] is None
    from analysis.terminal import terminal_summary
    assert f"p (Welch, {AFTER_LOOKING})" in terminal_summary(root, load_runs([root])[0], 2.92)
    status, _, err = run_cli(capsys, "report", root, "--target", "2.92")
    assert status == 0, err
    report = (root / "report.md").read_text()
    assert f"p (mean < target; {AFTER_LOOKING})" in report and f"that p is {AFTER_LOOKING}" in report
    assert "p (mean < target) |" not in report


def test_without_a_sequential_record_the_arm_tables_keep_their_plain_p(capsys, tmp_path):
    root = write_arms(tmp_path / "s", {"baseline": FAMILY["baseline"], "lucky": FAMILY["lucky"]})
    status, out, _ = run_cli(capsys, "summarize", root, "--target", "2.92")
    assert status == 0 and AFTER_LOOKING not in out and "sequential verdicts" not in out
    from analysis.terminal import terminal_summary
    assert "p (Welch, unadjusted)" in terminal_summary(root, load_runs([root])[0], 2.92)


def test_record_check_gives_the_sequential_verdict(capsys, tmp_path):
    root = write_arms(tmp_path / "s", {"claim": [2.9170, 2.9172, 2.9168, 2.9171, 2.9169]})
    sequential_record(root, "not shown", p=1e-6, adjusted=0.03, claim="below-target", arms=("claim",))
    status, out, _ = run_cli(capsys, "record-check", root / "claim", "--resamples", "100")
    assert status == 1 and "not valid after looking" in out
    assert "sequential verdict" in out and "no claim (not shown)" in out and "verdict: FAIL" in out


def test_diverged_runs_end_a_sequential_arm_as_a_failed_claim():
    """Case 5: 2 of 4 runs at nan were left out and the survivors declared "better"; and "below target" was given
    on 3 of 4 runs where record-check said FAIL."""
    from analysis.sequential import Design, take_look
    nan = float("nan")
    better = take_look(Design(alpha=0.01, max_seeds=4, batch=4), [], [2.910, nan, 2.911, nan],
                       [2.920, 2.921, 2.919, 2.9205])
    assert better["decision"] == "diverged" and better["adjusted_p"] == 1.0 and better["n"] == 4
    below = take_look(Design(alpha=0.01, max_seeds=4, batch=4, sides=1), [], [2.910, 2.911, nan, 2.9105],
                      target=2.92)
    assert below["decision"] == "diverged" and "1 of 4 runs diverged" in below["why"]


def test_compare_and_record_check_name_every_log_they_did_not_count(capsys, tmp_path):
    """Case 7: "runs: 5 ... PASS" over 8 logs, 3 of them cut, binary or empty, without a word."""
    root = write_arms(tmp_path / "s", {"baseline": FAMILY["baseline"], "claim": [2.9170, 2.9172, 2.9168]})
    cut = logs_for_tests.write(root / "claim" / "seed7.txt", DAMAGED["cut inside its peak-memory line"](
        finished_text(seed=7)))
    (root / "claim" / "seed8.txt").write_bytes(b"\x00\x01\x02")
    (root / "claim" / "seed9.txt").write_bytes(b"")
    for argv in (["compare", root], ["record-check", root / "claim", "--resamples", "100"]):
        _, out, _ = run_cli(capsys, *argv)
        named = [line for line in out.splitlines() if line.startswith("not counted: ")]
        assert len(named) == 3, out
        assert any(str(cut) in line and "peak-memory" in line for line in named)
        assert any("seed8.txt" in line and "binary" in line for line in named)
        assert any("seed9.txt" in line and "empty file" in line for line in named)


def test_analysis_record_gives_the_sequential_verdict(capsys, tmp_path):
    """Case 3 for `analysis record`: its README quotes the sequential p, the fixed-sample one as not valid."""
    root = write_arms(tmp_path / "s", {"claim": [2.9170, 2.9172, 2.9168, 2.9171, 2.9169]})
    sequential_record(root, "below target", p=1e-6, adjusted=0.004, claim="below-target", arms=("claim",))
    status, out, err = run_cli(capsys, "record", root, "--track", "medium", "--name", "X",
                               "--records-root", tmp_path / "records")
    assert status == 0, err
    readme = (tmp_path / "records" / "track_2_medium").glob("*_X/README.md").__next__().read_text()
    assert "not valid after looking" in readme and "below target after 5 seeds, sequential p = 0.004" in readme


def test_plan_sizes_each_arm_of_a_family_at_its_share_of_alpha(capsys):
    """Case 1 when planning: the fixed design a family is compared with tests each of its M arms at alpha / M."""
    from analysis import power
    status, out, _ = run_cli(capsys, "plan", "--diff", "0.0005", "--family", "5", "--json")
    assert status == 0 and "family of 5 arms: alpha 0.01 / 5 per arm" in out
    result = json.loads(out[out.index("{"):])
    assert result["seeds_per_arm"] == power.seeds_for_difference(0.0005, result["std"], 0.002, 0.8)
    assert result["seeds_per_arm"] > power.seeds_for_difference(0.0005, result["std"], 0.01, 0.8)


def test_a_damaged_sequential_record_is_one_line_in_every_command(capsys, tmp_path):
    """Issue 36's check of a recorded look (a hand-edited "decision": null) holds for issue 33's readers too: no
    verdict, no traceback, one line and exit 2."""
    root = write_arms(tmp_path / "s", {"baseline": FAMILY["baseline"], "lucky": FAMILY["lucky"]})
    sequential_record(root, None)
    for command in (["compare", root], ["report", root, "--target", "2.92"]):
        status, out, err = run_cli(capsys, *command)
        assert status == 2 and len(err.strip().splitlines()) == 1, (out, err)
        assert "look 1 of lucky: decision None is not one of continue" in err and "move it aside" in err
    from analysis.terminal import main as terminal
    assert terminal([str(root), "--target", "2.92"]) == 2
    assert "decision None" in capsys.readouterr().err
