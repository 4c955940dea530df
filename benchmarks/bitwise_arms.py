"""Before/after check of a refactor that must change no number: every distinct arm of every bundled study file
(ablations/*.toml) trained at the tiny preset on every base (r14: train_gpt_medium.py, r18: its --base r18, small:
train_gpt.py), seed 1, two steps with a validation before and after, eager. One line per (base, arm): the
validation losses, a digest of the logged scalars (at 6 decimals) and a digest of the final parameters (every
tensor's bytes), or the one-line refusal when the base does not run the arm. Diff the output of the code before
the change with the output after it.

    OMP_NUM_THREADS=1 python benchmarks/bitwise_arms.py > /tmp/after.txt && diff /tmp/before.txt /tmp/after.txt

An arm naming a layer the tiny r14 model lacks runs at the fewest layers that hold it; a DLO arm expands the base's
own tiny baseline checkpoint (2 groups: 4 does not divide the tiny depth). Arms that differ only in the layers a
backout or gated skip reads are one kind, run once (--every-layer runs each); --only SUBSTRING keeps the matching
arms.
"""
import argparse
import contextlib
import hashlib
import importlib
import io
import json
import re
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "speedrun")]
from test_compile_matrix import compiled_study_arms, model_flags  # noqa: E402  (the matrix's reading of the arms)

from speedrun.errors import UsageError  # noqa: E402

BASES = {"r14": ("train_gpt_medium", []), "r18": ("train_gpt_medium", ["--base", "r18"]), "small": ("train_gpt", [])}
RUN = ["--preset", "tiny", "--seed", "1", "--num-iterations", "2", "--val-every", "2", "--val-seq-len", "64",
       "--val-tokens", "512", "--compile", "off",
       "--save-final-checkpoint"]


LAYER_FLAGS = ("--backout-layers", "--gated-skip-layer")  # arms differing only in these layers are one kind
OWN_FLAGS = ("--base", "--preset", "--val-every")  # set here (the demo study's tiny preset is the one used)


def arm_kind(flags):
    return tuple(re.sub(r"\d+", "N", flag) if i and flags[i - 1] in LAYER_FLAGS else flag
                 for i, flag in enumerate(flags))


def arm_flags(every_layer):
    """{model flags: [study:arm names]}, in the study files' order: one arm per kind unless every_layer."""
    arms, kinds = {}, {}
    for study, arm, argv in compiled_study_arms():
        flags, _ = model_flags(argv)
        for own in OWN_FLAGS:
            if own in flags:
                at = flags.index(own)
                flags = flags[:at] + flags[at + 2:]
        if "--dlo-groups" in flags:
            flags += ["--dlo-groups", "2"]
        flags = kinds.setdefault(tuple(flags) if every_layer else arm_kind(flags), tuple(flags))
        arms.setdefault(flags, []).append(f"{study.name}:{arm}")
    return arms


def fitting_depth(track, argv):
    """argv, with --num-layers raised to the fewest layers (up to 16) that resolve, when the tiny depth does not."""
    try:
        track.resolve_args(argv)
        return argv
    except UsageError as too_shallow:
        for layers in range(7, 17):
            try:
                track.resolve_args(argv + ["--num-layers", str(layers)])
                return argv + ["--num-layers", str(layers)]
            except UsageError:
                continue
        raise too_shallow


def rounded(value):
    """A logged scalar (or a list or dict of them) at 6 decimals: a base may log more digits than another."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return round(value, 6) if isinstance(value, float) else value


def digest(tensors):
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def run_arm(base, flags, log_dir, checkpoints):
    script, base_flags = BASES[base]
    track = importlib.import_module(script)
    argv = RUN + base_flags + list(flags) + ["--log-dir", str(log_dir), "--run-name", "run"]
    if "--dlo-groups" in flags:
        if base not in checkpoints:
            return "refused: no baseline checkpoint"
        argv += ["--init-from", str(checkpoints[base])]
    try:
        argv = fitting_depth(track, argv)
    except UsageError as e:
        return f"refused: {e}"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = track.main(argv)
    if code:
        return f"refused (exit {code}): {err.getvalue().strip().splitlines()[-1]}"
    lines = (log_dir / "run.txt").read_text().splitlines()
    added = next(line for line in lines if line.startswith("added_params:"))
    steps = [line for line in lines if line.startswith("step:")]  # not the source the log opens with
    losses = [line.split("val_loss:")[1].split()[0] for line in steps if "val_loss:" in line]
    logged = [rounded(json.loads(line.split(" scalars: ")[1])) for line in steps if " scalars: " in line]
    scalars = hashlib.sha256(json.dumps(logged, sort_keys=True).encode()).hexdigest()[:16]
    state = torch.load(log_dir / "run.pt", weights_only=False)["model"]
    return f"val {' '.join(losses)} scalars {scalars} params {digest(state)} {added}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[],
                        help="keep the arms whose flags or names contain this (repeatable: any of them)")
    parser.add_argument("--every-layer", action="store_true",
                        help="every arm, not one per kind (arms differing only in the layers a skip reads)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    arms = arm_flags(args.every_layer)
    checkpoints = {}
    with tempfile.TemporaryDirectory() as tmp:
        for base in BASES:
            for index, (flags, names) in enumerate(arms.items()):
                if args.only and not any(word in " ".join(flags + tuple(names)) for word in args.only):
                    continue
                log_dir = Path(tmp) / base / str(index)
                result = run_arm(base, flags, log_dir, checkpoints)
                if not flags:  # the baseline runs first: the DLO arms expand its checkpoint
                    checkpoints[base] = log_dir / "run.pt"
                print(f"{base} {' '.join(flags) or 'baseline'} [{names[0]}]: {result}", flush=True)
    print(json.dumps({"arms": len(arms), "bases": list(BASES)}))


if __name__ == "__main__":
    main()
