"""`record`: package finished runs the way an upstream record PR carries them: the logs, the script that ran, and
a README with the losses, times, their means and standard deviations, the p-value and the Python that recomputes it.
The folder is built under a temporary name and renamed at the end, so a half-written record never has its name."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from speedrun.logformat import changed_source, code_section, split_sources

from .claims import family_holm, family_note, family_of_runs
from .runs import pooled_trainings
from .sequential import decision_shown
from .stats import loss_time_stats
from .textfmt import num, pval, table
from .tracks import RECORD_FOLDERS, TARGETS, track_of_run

SCRIPT_NAMES = {"medium": "train_gpt_medium.py", "small": "train_gpt.py"}
PROJECT_ROOT = Path(__file__).resolve().parent.parent
TRACK_TITLES = {"medium": "GPT-2 Medium track", "small": "GPT-2 Small track"}


class RecordError(ValueError):
    pass


def _log_names(runs) -> list[str]:
    """File names for the copied logs: the original name, prefixed by its folder where two would collide."""
    names = [run.path.name for run in runs]
    if len(set(names)) == len(names):
        return names
    return [f"{run.path.parent.name}_{run.path.name}" for run in runs]


def _shared_code(runs) -> str | None:
    sources = {code_section(run.path.read_bytes()) for run in runs}
    if len(sources) == 1:
        (source,) = sources
        return source if source and source.strip() else None
    return None


def readme_text(runs, names, track: str, name: str, date: str, target: float, variant: str,
                left_out: int = 0, sequential: dict | None = None, not_counted=(), code_note: str = "") -> str:
    """The record's README. `sequential`: the verdict of the sequential study the runs come from (its p-value is
    the claim's; the fixed-sample p is then not valid after looking); `not_counted`: logs left out, with why;
    `code_note`: which code made the logs (the single file or the modular script)."""
    losses = [run.final_val_loss for run in runs]
    times = [run.train_time_s for run in runs]
    st = loss_time_stats(losses, times, target)
    mean_loss, std_loss, p_value = st["mean_val_loss"], st["std_val_loss"], st["p_value"]
    mean_time, std_time = st["mean_time_s"], st["std_time_s"]
    pooled = pooled_trainings(runs)
    claim_lines = _sequential_lines(sequential) + (
        f"\n- no claim: the arm {pooled}, stale runs beside current ones" if pooled else
        _family_line(runs, variant, p_value, sequential))
    rows = [[f"`{log}`", run.seed, repr(run.final_val_loss), repr(run.train_time_s)] for log, run in zip(names, runs)]
    return f"""# {name}

{TRACK_TITLES[track]} (target validation loss {target:g}). Variant `{variant}`, {len(runs)} complete runs,
packaged on {date}{f"; {left_out} unfinished run(s) of the same folder were left out" if left_out else ""}.

{table(["log", "seed", "final val loss", "train time (s)"], rows, markdown=True)}

- final validation loss: mean {num(mean_loss, 6)}, sample standard deviation {num(std_loss, 6)}
- train time: mean {num(mean_time, 3)} s, sample standard deviation {num(std_time, 3)} s
- one-sided one-sample t-test that the mean loss is below {target:g}: p = {pval(p_value)}{claim_lines}
{_not_counted_lines(not_counted)}
{code_note}

The p-value, recomputed from the losses above:

```python
import scipy.stats

losses = {losses!r}
times = {times!r}
print("mean loss", sum(losses) / len(losses), "mean time", sum(times) / len(times))
print("p =", scipy.stats.ttest_1samp(losses, {target!r}, alternative="less").pvalue)
```
"""


def _family_line(runs, variant: str, p_value, sequential: dict | None) -> str:
    """The claim's p when the runs name a fixed-sample study of several arms (this one may be the best of them)."""
    study_family = family_of_runs(runs, {variant}) if sequential is None else None
    if not study_family or p_value is None:
        return ""
    return (f"\n- {family_note(*study_family)}: p = {pval(family_holm([p_value], study_family[0])[0])}, the "
            f"claim's p-value (the arm may have been picked as the best of the study's arms)")


def _sequential_lines(sequential: dict | None) -> str:
    if sequential is None:
        return ""
    if sequential.get("untested"):
        return f" (fixed-sample: not valid after looking)\n- sequential study ({sequential['family']}): {sequential['untested']}"
    verdict = sequential["claim"] or f"no claim ({decision_shown(sequential)})"
    return (" (fixed-sample: not valid after looking)\n- sequential study (" + sequential["family"] + f"): {verdict} "
            f"after {sequential['n']} seeds, sequential p = {pval(sequential['adjusted_p'])}, family p = "
            f"{pval(sequential['family_p'])}: the claim's p-value")


def _not_counted_lines(not_counted) -> str:
    if not not_counted:
        return ""
    return "\nLogs not counted:\n\n" + "\n".join(f"- `{entry['path']}`: {entry['why']}" for entry in not_counted) + "\n"


def package_record(runs, track: str, name: str, date: str, root: Path, target: float | None = None,
                   sequential: dict | None = None, not_counted=(), sequential_record: Path | None = None) -> Path:
    """Copy the complete `runs` into `root/<track folder>/<date>_<name>/` with a README, and the record of the
    sequential study they come from (`sequential_record`) beside them, so that the package keeps the study's verdict
    when the study folder is gone (analysis.claims). Raises RecordError when there is nothing to package, several
    variants are mixed, or the folder exists."""
    left_out = sum(not run.complete for run in runs)
    runs = [run for run in runs if run.complete]
    if not runs:
        raise RecordError("no complete runs to package")
    other_track = next((run for run in runs if track_of_run(run) not in (None, track)), None)
    if other_track is not None:
        raise RecordError(f"{other_track.path} is a {track_of_run(other_track)}-track run, not a {track}-track one: "
                          f"a record holds runs of its own track only")
    variants = sorted({run.variant for run in runs})
    if len(variants) > 1:
        raise RecordError(f"the runs hold several variants ({', '.join(variants)}): choose one with --variant")
    target = TARGETS[track] if target is None else target
    destination = Path(root) / RECORD_FOLDERS[track] / f"{date}_{name}"
    if destination.exists():
        raise RecordError(f"{destination} already exists")
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}.", dir=destination.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it private; the record is meant to be shared
        names = _log_names(runs)
        for run, log_name in zip(runs, names):
            shutil.copy2(run.path, staging / log_name)
        if sequential_record is not None:
            shutil.copy2(sequential_record, staging / sequential_record.name)
        code_note = write_code(_shared_code(runs), runs[0].path, track, staging)
        (staging / "README.md").write_text(
            readme_text(runs, names, track, name, date, target, variants[0], left_out, sequential, not_counted,
                        code_note),
            encoding="utf-8")
        if destination.exists():  # created meanwhile by someone else: never overwrite
            raise RecordError(f"{destination} already exists")
        staging.rename(destination)
    except OSError as error:  # a full disk, a read-only folder: the destination is what could not be written
        shutil.rmtree(staging, ignore_errors=True)
        raise RecordError(f"{destination}: cannot be written ({error.strerror or error})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return destination


def export_single_file(log: Path, track: str, out: Path) -> tuple[str | None, str | None]:
    """Exports the run of `log` as one file (the training script's --export-script --from-log, which checks the
    file against the modular script before it keeps it): (what the check ran, None) when written, else (None, the
    one line saying why not)."""
    from speedrun.export import CHECKED_PREFIX
    script = PROJECT_ROOT / SCRIPT_NAMES[track]
    done = subprocess.run([sys.executable, str(script), "--export-script", str(out), "--from-log", str(log)],
                          capture_output=True, text=True, cwd=PROJECT_ROOT)
    if done.returncode == 0:
        checked = [line for line in done.stdout.splitlines() if line.startswith(CHECKED_PREFIX)]
        return (checked[-1].removeprefix(CHECKED_PREFIX) if checked else "no check reported"), None
    return None, (done.stderr.strip().splitlines() or ["the export failed"])[-1].removeprefix("error: ")


def write_code(code: str | None, log: Path, track: str, folder: Path) -> str:
    """Writes the code the runs share into the record folder under upstream's name; returns the README's lines on
    which code made the logs. Logs of one file: that file. Logs of the modular script: its export as one file
    under upstream's name (the modular code stays in each log's code section); without an export (code other than
    this checkout's, a base it cannot export, a file its check refused), the modular script under upstream's name
    and its modules."""
    script_name = SCRIPT_NAMES[track]
    if code is None:
        return "\nThe logs do not share one source: no script is included.\n"
    script, modules = split_sources(code)
    if not modules:
        (folder / script_name).write_text(script, encoding="utf-8")
        return f"\nThe logs were made by `{script_name}`, this folder's single file (its source opens each log).\n"
    changed = changed_source(code, PROJECT_ROOT, script_name)
    if changed is not None:
        checked, why_not = None, f"the runs' {changed} is not this checkout's (export it from the commit that ran them)"
    else:
        checked, why_not = export_single_file(log, track, folder / script_name)
    if why_not:
        for path, source in [(script_name, script), *modules.items()]:
            (folder / path).parent.mkdir(parents=True, exist_ok=True)
            (folder / path).write_text(source, encoding="utf-8")
        return (f"\nThe logs were made by the modular script `{script_name}` and the project modules beside it, as "
                f"each log embeds them. No single file: {why_not}.\n")
    return (f"\nThe logs were made by the modular script with the flags of their config lines (its source and the "
            f"project modules it imported open each log). `{script_name}` is that run exported as one file "
            f"(`--export-script --from-log`): with no flags it trains this run. Before it was kept, the export "
            f"checked it against the modular script: {checked}.\n")
