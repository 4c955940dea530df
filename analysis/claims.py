"""One definition of a claim, for every command that prints one: which study the runs belong to, and the only claim
that holds there.

- The study is found from the runs themselves, not from the PATH a person named: a run the study runner made sits
  in <study>/<arm>/seed<k>.txt and its config line names the folder it was written to; a sequential record
  (sequential.json) in that study folder means the runs were looked at sequentially, whichever way they are given
  now (the study folder, arm folders, log files, a copy). A damaged or implausible record, or one that names none of
  the runs' arms, is refused in one line (sequential.read_record).
- Runs of a sequential study get its verdicts only: for the claim, target, baseline and alpha the study tested.
  Anything else (another target, a record claim on an arm tested against a baseline) gets no claim, said in one
  line: the fixed-sample p is not valid after looking.
- A family is every arm of the study: Holm over all of them, whichever arms are shown."""
from __future__ import annotations

import math
from pathlib import Path

from speedrun.errors import UsageError

from .sequential import RECORD_FILE, family_phrase, read_record, study_verdicts


def _record_paths(run) -> list[Path]:
    """Where the sequential record of a run's study would be: beside its arm folder, and beside the folder its
    config line says it was written to (a copied log still names its study)."""
    places = [run.path.parent.parent / RECORD_FILE]
    log_dir = run.config.get("log_dir") if isinstance(run.config, dict) else None
    if isinstance(log_dir, str) and log_dir:
        places.append(Path(log_dir).parent / RECORD_FILE)
    return places


def find_study_record(runs) -> dict | None:
    """The sequential record of the study `runs` belong to, or None when they were never looked at sequentially.
    UsageError (one line) for a damaged record, runs of several sequential studies, or a record that holds none
    of the runs' arms."""
    found: dict[Path, Path] = {}
    for run in runs:
        for place in _record_paths(run):
            if place.exists() or place.is_symlink():
                found.setdefault(place.resolve(), place)
                break
    if not found:
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
    state["path"] = str(place)
    return state


def record_claim(state: dict | None, arm: str, target: float) -> dict | None:
    """The sequential verdict on the record claim "mean final loss of `arm` below `target`", when the runs belong to
    a sequential study (None otherwise): {family, claim, decision, n, adjusted_p, family_p} of the study for that
    claim, or, for a claim the study never tested, claim None and `untested` saying why in one line."""
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
    if why is not None:
        return {"family": family, "claim": None, "decision": "not tested", "n": None, "adjusted_p": None,
                "family_p": None, "untested": f"no claim: {why}; its fixed-sample p is not valid after looking"}
    return {"family": family, **study_verdicts(state)[arm]}


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
