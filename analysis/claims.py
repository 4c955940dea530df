"""One definition of a claim, for every command that prints one: which study the runs belong to, and the only claim
that holds there.

- The study is found from the runs themselves, not from the PATH a person named: a run the study runner made sits
  in <study>/<arm>/seed<k>.txt and its config line names the folder it was written to; a sequential record
  (sequential.json) in that study folder means the runs were looked at sequentially, whichever way they are given
  now (the study folder, arm folders, log files, a copy). A damaged or implausible record, or one that names none of
  the runs' arms, is refused in one line (sequential.read_record).
- A run the runner made for a sequential study also says so in its log (the study and its design's digest): copied
  away from the record, with the study folder gone, it still gets no fixed-sample claim, only "no claim" in one
  line; given with the record (the study folder, or the record copied beside the arm folders or the logs), the
  study's verdict holds when the record's design is the one the runs were made under.
- Runs of a sequential study get its verdicts only: for the claim, target, baseline and alpha the study tested.
  Anything else (another target, a record claim on an arm tested against a baseline) gets no claim, said in one
  line: the fixed-sample p is not valid after looking.
- A family is every arm of the study: Holm over all of them, whichever arms are shown. A run the runner made for a
  fixed-sample study names every arm of it in its log, so a copy of some arms' runs (the baseline and the best arm,
  the study folder gone) is still adjusted over the whole study (study_family)."""
from __future__ import annotations

import math
from pathlib import Path

from speedrun.errors import UsageError
from speedrun.logformat import STUDY_KEY, parse_study

from .runs import pooled_trainings
from .sequential import RECORD_FILE, decision_shown, design_digest, family_phrase, read_record, study_verdicts
from .stats import fixed_rule_claims, holm
from .textfmt import pval


def _record_paths(run) -> list[Path]:
    """Where the sequential record of a run's study would be: beside its arm folder, beside the log itself (a
    record package: `analysis record` copies it there), and beside the folder its config line says it was written
    to (a copied log still names its study)."""
    places = [run.path.parent.parent / RECORD_FILE, run.path.parent / RECORD_FILE]
    log_dir = run.config.get("log_dir") if isinstance(run.config, dict) else None
    if isinstance(log_dir, str) and log_dir:
        places.append(Path(log_dir).parent / RECORD_FILE)
    return places


def study_marks(runs) -> list[tuple[dict, Path]]:
    """(what its `study` line says, the log) of each run the study runner made (speedrun/logformat.py); empty for
    logs made before the line existed and runs started by hand. UsageError (one line) for a line that does not
    read."""
    marks = []
    for run in runs:
        value = run.env.get(STUDY_KEY) if isinstance(getattr(run, "env", None), dict) else None
        if value is None:
            continue
        mark = parse_study(value)
        if mark is None:
            raise UsageError(f"{run.path}: its {STUDY_KEY} line does not read ({value[:60]!r}): a damaged log of a "
                             f"study's run; no claim from it")
        marks.append((mark, run.path))
    return marks


def sequential_marks(runs) -> dict[tuple[str, str], Path]:
    """{(study, design digest): a log saying so} of the runs the study runner made for a sequential study."""
    marks: dict[tuple[str, str], Path] = {}
    for mark, path in study_marks(runs):
        if mark["design_digest"] is not None:
            marks.setdefault((mark["study"], mark["design_digest"]), path)
    return marks


def study_family(runs) -> dict | None:
    """{"study", "arms"} of the fixed-sample study the runs were made for (every arm of it, named in their logs; the
    union when the study's arms were edited between runs: the family is every arm it tested), or None when no run
    names one. Runs of two such studies mixed are refused in one line: each study is its own family, and which arms
    of the other were left out cannot be told apart from which were never run."""
    families: dict[str, dict[str, None]] = {}
    where: dict[str, Path] = {}
    for mark, path in study_marks(runs):
        if mark["arms"] is not None:
            families.setdefault(mark["study"], {}).update(dict.fromkeys(mark["arms"]))
            where.setdefault(mark["study"], path)
    if len(families) > 1:
        shown = ", ".join(f"{study} ({path})" for study, path in where.items())
        raise UsageError(f"the runs come from {len(families)} studies, each its own family of claims ({shown}): give "
                         f"one study's runs")
    if not families:
        return None
    ((study, arms),) = families.items()
    return {"study": study, "arms": list(arms)}


def family_holm(p_values: list, family_size: int) -> list:
    """Holm-adjusted p of the arms given (None: untested) within a family of `family_size` arms, the arms not given
    counted at p = 1: valid, since Holm controls the family-wise error for any p-values of the missing arms and p = 1
    is the largest (the adjusted p of the arms given can only rise), and conservative for the same reason."""
    missing = family_size - sum(p is not None for p in p_values)
    return holm(list(p_values) + [1.0] * max(missing, 0))[:len(p_values)]


def family_note(family_size: int, shown: int) -> str:
    return (f"Holm over the study's {family_size} arms, {shown} shown (the runs name their study; the arms not "
            f"given count at p = 1)")


def family_of_runs(runs, present, baseline: str | None = None) -> tuple[int, int] | None:
    """(the study's family size, arms shown) when the runs name a fixed-sample study with arms beyond `present`
    (the arms the door tests; `baseline`, the arm they are tested against, is no member); None otherwise."""
    family = study_family(runs)
    if family is None:
        return None
    shown = set(present) - {baseline}
    size = len((set(family["arms"]) | shown) - {baseline})
    return (size, len(shown)) if size > len(shown) else None


def _studies(marks) -> str:
    return ", ".join(sorted({study for study, _ in marks}))


def find_study_record(runs) -> dict | None:
    """The sequential record of the study `runs` belong to, or None when they were never looked at sequentially.
    UsageError (one line) for a damaged record, runs of several sequential studies, a record that holds none
    of the runs' arms, and runs that say they were made by a sequential study (sequential_marks) whose record is
    not with them or holds another study or design: no claim, since a fixed-sample p is not valid after
    looking."""
    marks = sequential_marks(runs)
    found: dict[Path, Path] = {}
    present: dict[Path, bool] = {}  # the runs of an arm share their places: each is looked up once
    for run in runs:
        for place in _record_paths(run):
            if place not in present:
                present[place] = place.exists() or place.is_symlink()
            if present[place]:
                found.setdefault(place.resolve(), place)
                break
    if not found:
        if marks:
            plural = "ies" if len({study for study, _ in marks}) > 1 else "y"
            raise UsageError(f"no claim: these runs were made by sequential stud{plural} {_studies(marks)} whose "
                             f"record ({RECORD_FILE}) is not with them; give them with it (the study folder, or "
                             f"the record beside their arm folders)")
        return None
    if len(found) > 1:
        shown = ", ".join(str(place) for place in found.values())
        raise UsageError(f"the runs belong to {len(found)} sequential studies ({shown}): give one study's runs")
    (place,) = found.values()
    state = read_record(place)
    design = state["design"]
    tested = set(design["arms"]) | ({design["baseline"]} if design.get("baseline") else set())
    variants = {run.variant for run in runs}
    if not set(design["arms"]) & variants and variants - tested:
        raise UsageError(f"{place}: a sequential record of other arms ({', '.join(sorted(tested))}) than the runs' "
                         f"({', '.join(sorted({run.variant for run in runs}))}): a foreign record; move it aside")
    digest = state.get("design_digest") or design_digest(design)
    recorded_study = state.get("study")  # records written before the runner named the study: the digest alone
    other = sorted(mark for mark in marks if mark[1] != digest or recorded_study not in (None, mark[0]))
    if other:
        study, theirs = other[0]
        raise UsageError(f"no claim: runs of sequential study {study} were made under another study or design "
                         f"(digest {theirs}) than {place} holds ({recorded_study or 'study unnamed'}, {digest}), "
                         f"e.g. {marks[other[0]]}; give them with their own study's record")
    state["path"] = str(place)
    return state


def record_claim(state: dict | None, arm: str, target: float, alpha: float | None = None) -> dict | None:
    """The sequential verdict on the record claim "mean final loss of `arm` below `target`" (at `alpha`, when one
    is asked), when the runs belong to a sequential study (None otherwise): {family, claim, decision, n, adjusted_p,
    family_p} of the study for that claim, or, for a claim the study never tested, claim None and `untested` saying
    why in one line."""
    if state is None:
        return None
    design = state["design"]
    family = family_phrase(design)
    why = None
    if design["claim"] != "below-target":
        why = (f"the runs belong to a sequential study that tested its arms against {design['baseline']}, not a "
               f"record claim")
    elif arm not in design["arms"]:
        why = f"the sequential study tested {', '.join(design['arms'])}, not {arm}"
    elif not math.isclose(design["target"], target, rel_tol=0, abs_tol=1e-12):
        why = f"the sequential study tested mean < {design['target']:g}, not mean < {target:g}"
    elif alpha is not None and not math.isclose(alpha, design["alpha"], rel_tol=1e-9):
        why = f"the sequential study tested at family-wise alpha {design['alpha']:g}, not at {alpha:g}"
    if why is not None:
        return {"family": family, "claim": None, "decision": "not tested", "n": None, "adjusted_p": None,
                "family_p": None, "untested": f"no claim: {why}; its fixed-sample p is not valid after looking"}
    return {"family": family, **study_verdicts(state)[arm]}


def target_untested(state: dict, target: float) -> str | None:
    """Why the verdicts of the sequential study `state` say nothing about `target` (a record-claim study of another
    target; record_claim's line), or None: what summarize and report print instead of those verdicts."""
    if state["design"]["claim"] != "below-target":
        return None
    return record_claim(state, state["design"]["arms"][0], target).get("untested")


def comparison_untested(state: dict, baseline: str, alpha: float, alternative: str) -> str | None:
    """Why the sequential study `state` never tested the comparison asked (another baseline, alpha or alternative,
    or a record-claim study), or None when it did."""
    design = state["design"]
    if design["claim"] != "vs-baseline":
        return f"the sequential study tested each arm's mean below {design['target']:g}, not arms against a baseline"
    if baseline != design["baseline"]:
        return f"the sequential study tested its arms against {design['baseline']}, not {baseline}"
    if not math.isclose(alpha, design["alpha"], rel_tol=1e-9) or alternative != "two-sided":
        return (f"the sequential study tested at family-wise alpha {design['alpha']:g}, two-sided, not at "
                f"{alpha:g} {alternative}")
    return None


NO_VARIANCE = "cannot test: no variance"


def no_variance(*samples) -> bool:
    """Whether a test of these samples has no noise to measure: every sample of two runs or more holds one value."""
    finite = [[value for value in sample if value is not None and math.isfinite(value)] for sample in samples]
    return all(len(set(values)) <= 1 for values in finite) and any(len(values) >= 2 for values in finite)


def arm_claims(result: dict, alpha: float, family: bool = True, sequential_state: dict | None = None) -> dict:
    """One verdict per arm of a comparison (compare.compare_arms's result) on its final loss: {"family": what the claims are controlled as, "arms": [{variant,
    claim ("lower", "higher" or None), p (the p-value the claim rests on), text}]}. A study that ran sequentially
    (its sequential.json, claims.find_study_record) gives the sequential verdicts and p-values, for the comparison
    it tested only: the fixed-sample p is shown only as not valid after looking. Otherwise Holm over every arm of
    the study (`result["family_size"]` arms, also those not shown), or each arm at alpha when the arms are
    exploratory. An arm with a diverged run, or a baseline with one, makes no claim; nor does an arm whose runs and
    baseline's all ended at one loss each (no variance), nor one whose runs, or the baseline's, pool several
    trainings (runs.pooled_trainings)."""
    baseline = result["baseline"]
    diverged = {arm["variant"]: arm["n_diverged"] for arm in result["arms"]}
    untested = (comparison_untested(sequential_state, baseline, alpha, result["alternative"])
                if sequential_state else None)
    verdicts = study_verdicts(sequential_state) if sequential_state and untested is None else {}
    comparisons = result["comparisons"]
    size = result.get("family_size", len(comparisons))
    shown = f" ({len(comparisons)} shown)" if size != len(comparisons) else ""
    if sequential_state:
        phrase = "sequential: " + family_phrase(sequential_state["design"])
    elif family and size > 1 and result.get("study_family"):
        phrase = (f"{result['study_family']}, against {baseline}, family-wise alpha {alpha:g} (Holm-adjusted p; the "
                  f"unadjusted p beside it)")
    elif family and size > 1:
        phrase = (f"family of {size} arms against {baseline}{shown}, family-wise alpha {alpha:g} (Holm-adjusted "
                  f"p; the unadjusted p beside it)")
    else:
        phrase = (f"{len(comparisons)} arm(s) against {baseline} at alpha {alpha:g}"
                  + ("; exploratory: NOT family-controlled" if not family and len(comparisons) > 1 else ""))
    arms = []
    for c in comparisons:
        name, diff, raw = c["variant"], c["loss_diff"], c["loss_p"]
        entry = {"variant": name, "claim": None, "p": None}
        if diverged.get(name) or diverged.get(baseline):
            who = name if diverged.get(name) else baseline
            entry["text"] = (f"{name}: no claim: {diverged[who]} run(s) of {who} diverged (final loss nan or inf), a failed "
                             f"run of any claim")
        elif c.get("pooled"):
            entry["text"] = (f"{name}: no claim: {c['pooled']}, stale runs beside current ones; fixed-sample p "
                             f"{pval(raw)}")
        elif sequential_state and (untested or name not in verdicts):
            why = untested or f"the sequential study did not test {name}"
            entry["text"] = (f"{name}: no claim: {why}; fixed-sample p {pval(raw)} (not valid after looking)")
        elif name in verdicts:
            v = verdicts[name]
            entry.update(claim=("lower" if v["claim"] == "better" else "higher") if v["claim"] else None,
                         p=v["family_p"])
            entry["text"] = (f"{name}: " + (f"{v['claim']} than {baseline}: a real difference at family-wise alpha "
                                            f"{sequential_state['design']['alpha']:g}" if v["claim"] else
                                            f"no claim (sequential decision: {decision_shown(v)})")
                             + f" after {v['n']} seeds; sequential p {pval(v['adjusted_p'])}, family p "
                               f"{pval(v['family_p'])}; fixed-sample p {pval(raw)} (not valid after looking)")
        elif raw is None and c.get("no_variance"):
            entry["text"] = (f"{name}: {NO_VARIANCE} (the runs of {name} and of {baseline} each ended at one loss): "
                             f"no claim")
        elif raw is None:
            entry["text"] = f"{name}: too few complete runs for a test (two per arm at least)"
        else:
            holm_applies = family and size > 1
            p = c["loss_p_holm"] if holm_applies else raw
            claimed = fixed_rule_claims(p, alpha)
            entry.update(claim=("lower" if diff < 0 else "higher") if claimed else None, p=p)
            adjusted = f"Holm p {pval(p)}, unadjusted p {pval(raw)}" if holm_applies else f"p {pval(raw)}"
            entry["text"] = (f"{name}: final loss {abs(diff):.4f} {'lower' if diff < 0 else 'higher'} than "
                             f"{baseline} ({adjusted}); " + (f"a real difference at the {alpha:g} level" if claimed
                                                              else f"not distinguishable from seed noise at the "
                                                                   f"{alpha:g} level"))
        arms.append(entry)
    return {"family": phrase, "arms": arms, "sequential": bool(sequential_state)}


def record_loss_claim(candidates, p_value, n_diverged: int, alpha: float, sequential: dict | None) -> dict:
    """The record claim "mean final loss below the target" on one arm's runs: {loss_ok, p_family, study_family,
    no_variance, pooled}. `p_value`: the one-sided one-sample t-test's (stats.loss_time_stats); `sequential`: the
    verdict of the sequential study the runs belong to (record_claim), which is then the claim. A diverged run fails
    it; runs that name a fixed-sample study of several arms are Holm-adjusted over all of them (this arm may be the
    best, picked after the fact); runs pooling trainings, or without variance, make none."""
    family = family_of_runs(candidates, {run.variant for run in candidates})
    p_claim = family_holm([p_value], family[0])[0] if family and p_value is not None else p_value
    pooled = pooled_trainings(candidates)
    if sequential is not None:
        holds = sequential["claim"] == "below target"
    else:
        holds = p_claim is not None and bool(fixed_rule_claims(p_claim, alpha))
    return {"loss_ok": not n_diverged and not pooled and holds, "p_family": p_claim if family else None,
            "study_family": family_note(*family) if family else None,
            "no_variance": not n_diverged and no_variance([run.final_val_loss for run in candidates]),
            "pooled": pooled}
