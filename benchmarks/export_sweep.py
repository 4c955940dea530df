"""Check: every study setting a user can type exports, its file trained bit for bit beside the modular script.

tests/speedrun/test_export_pairs.py exports each pair of studies at one setting each; this exports each study at
each value of each of its choice flags and with each of its switches, on each base, as a user would (one process
per export, the full preset, the export's own check: two tiny trainings compared bit for bit). A form the modular
command line refuses (e.g. a backout transform on --base r18) is listed as refused there, not exported. DLO grows a
baseline checkpoint (--init-from): its forms run at the tiny preset from one the sweep trains first (2 steps). About
40 s of CPU per export:

    python benchmarks/export_sweep.py --bases r14 --studies backout rolling laurel gated-skip   # 36 forms
    python benchmarks/export_sweep.py --bases r14 --studies dlo     # DLO's 18
    python benchmarks/export_sweep.py                               # every study on every base

Prints a line per form (ok / refused by the command line / FAILED with the export's last line), then the counts;
exits 1 if any export failed.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_gpt as small_track  # noqa: E402  (after the path: run from anywhere)
import train_gpt_medium as medium_track  # noqa: E402
from speedrun.dlo import DLO_CHOICES, dlo_flag  # noqa: E402
from speedrun.errors import UsageError  # noqa: E402
from speedrun.laurel import (LAUREL_FACTOR_INITS, LAUREL_PA_H, LAUREL_RW_FORMS, LAUREL_VARIANTS,  # noqa: E402
                             LAUREL_WHERE, LAUREL_ZERO_FACTORS)
from speedrun.studies import STUDIES  # noqa: E402

# base: (script, its flags, the layer a one-layer study reads: the medium record's 11, the small track's 8)
BASES = {"r14": (medium_track, [], "11"), "r18": (medium_track, ["--base", "r18"], "11"), "small": (small_track, [], "8")}
# each study switched on with every option its other flags refine (LAuReL's RW, LR and PA)
SWITCHED_ON = {"backout": ["--backout-layers", "{layer}"], "rolling": ["--rolling-skip"],
               "laurel": ["--laurel", "rw+lr+pa"], "gated-skip": ["--gated-skip-layer", "{layer}"],
               "dlo": ["--dlo-groups", "2", "--init-from", "{checkpoint}", "--preset", "tiny"]}
# the values of the flags its resolution checks, not argparse
CHOICES = {"--laurel": LAUREL_VARIANTS, "--laurel-rw-form": LAUREL_RW_FORMS, "--laurel-pa-h": LAUREL_PA_H,
           "--laurel-where": LAUREL_WHERE, "--laurel-factor-init": LAUREL_FACTOR_INITS,
           "--laurel-zero-factor": LAUREL_ZERO_FACTORS,
           **{dlo_flag(key): values for key, values in DLO_CHOICES.items()}}


def study_forms(study, layer, checkpoint):
    """The command lines of one study: switched on, then each value of each choice flag and each switch."""
    on = [token.format(layer=layer, checkpoint=checkpoint) for token in SWITCHED_ON[study.name]]
    forms = [on]
    for flag in study.flags:
        choices = flag.options.get("choices") or CHOICES.get(flag.name, ())
        if flag is study.flags[0]:  # the switch itself: each of its values is a form of its own
            forms += [[flag.name, value] for value in choices if [flag.name, value] != on]
        elif choices:
            forms += [on + [flag.name, value] for value in choices]
        elif flag.options.get("action") == "store_true":
            forms += [on + [flag.name]]
    return forms


def shown(form):
    """A form as printed: the checkpoint's temporary path named by its role."""
    return " ".join("BASELINE.pt" if token.endswith(".pt") else token for token in form)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bases", nargs="+", choices=list(BASES), default=list(BASES))
    names = [study.name for study in STUDIES]
    parser.add_argument("--studies", nargs="+", choices=names, default=names)
    args = parser.parse_args(argv)
    counts = {"ok": 0, "refused by the command line": 0, "FAILED": 0}
    with tempfile.TemporaryDirectory() as folder:
        for base in args.bases:
            track, base_flags, layer = BASES[base]
            checkpoint = Path(folder) / base / "baseline.pt"
            if "dlo" in args.studies:
                trained = subprocess.run([sys.executable, track.__file__, *base_flags, "--preset", "tiny",
                                          "--num-iterations", "2", "--save-final-checkpoint", "--log-dir",
                                          str(checkpoint.parent)], capture_output=True, text=True, cwd=ROOT)
                found = sorted(checkpoint.parent.rglob("*.pt"))
                if trained.returncode != 0 or not found:
                    print(f"{base}: the baseline checkpoint DLO grows could not be trained: "
                          f"{(trained.stdout + trained.stderr).strip().splitlines()[-1:]}")
                    return 1
                checkpoint = found[-1]
            for study in [s for s in STUDIES if s.name in args.studies]:
                if study.name not in SWITCHED_ON:  # a study registered after this table: not swept, and said so
                    print(f"{base:5} {study.name:60} FAILED: no command line switches it on here (add it to "
                          f"SWITCHED_ON)", flush=True)
                    counts["FAILED"] += 1
                    continue
                for form in study_forms(study, layer, checkpoint):
                    flags = [*base_flags, *form]
                    try:
                        track.resolve_args(flags)
                    except UsageError as refusal:
                        print(f"{base:5} {shown(form):60} refused by the command line: {refusal}")
                        counts["refused by the command line"] += 1
                        continue
                    out = Path(folder) / "exported.py"
                    done = subprocess.run([sys.executable, track.__file__, "--export-script", str(out), "--force",
                                           *flags], capture_output=True, text=True, cwd=ROOT)
                    last = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
                    verdict = "ok" if done.returncode == 0 and "bit for bit" in last[0] else "FAILED"
                    counts[verdict] += 1
                    print(f"{base:5} {shown(form):60} {verdict}" + ("" if verdict == "ok" else f": {last[0]}"),
                          flush=True)
    print(", ".join(f"{n} {what}" for what, n in counts.items()))
    return 1 if counts["FAILED"] else 0


if __name__ == "__main__":
    sys.exit(main())
