"""Does LAuReL's low-rank PA train? Runs train_gpt_medium.py with a LAuReL variant over several seeds and reports,
per seed, how far gamma, the zero-initialised factors and the live factors moved from their init (issue 11: with
gamma = 0 next to B = 0 none of them ever moved). Prints a header (date, command) and one line per seed; save the
output under benchmarks/results/.

    python benchmarks/laurel_pa_trains.py --seeds 0 1 2 -- --preset tiny --laurel rw+lr+pa
"""
import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import train_gpt_medium as tgm  # noqa: E402
from analysis.logs import parse_log  # noqa: E402


def initial_study_tensors(flags, seed):
    """The LAuReL factors and gammas exactly as the script initialises them for this seed."""
    args = tgm.resolve_args(flags + ["--seed", str(seed)])
    torch.manual_seed(seed)
    model = tgm.GPT(tgm.model_config(args), max_seq_len=max(args.train_seq_len, args.val_seq_len))
    return study_tensors(model.state_dict(), model.scalar_layout)


def study_tensors(state, layout):
    a, b = layout["laurel.gamma"]
    return dict(gamma=state["scalars"][a:b].float(), up=state["study.laurel.up"].float(),
                down=state["study.laurel.down"].float())


def run_seed(flags, seed, folder):
    name = f"seed{seed}"
    cmd = [sys.executable, str(ROOT / "train_gpt_medium.py"), *flags, "--seed", str(seed), "--log-dir", str(folder),
           "--run-name", name, "--save-final-checkpoint"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        sys.exit(f"error: seed {seed} failed: {done.stderr.strip().splitlines()[-1]}")
    args = tgm.resolve_args(flags + ["--seed", str(seed)])
    torch.manual_seed(seed)
    layout = tgm.GPT(tgm.model_config(args), max_seq_len=1).scalar_layout
    final = study_tensors(torch.load(folder / f"{name}.pt", map_location="cpu", weights_only=False)["model"], layout)
    log = parse_log(folder / f"{name}.txt")
    return final, log.val_losses, [values for _, values in log.scalars]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("flags", nargs=argparse.REMAINDER, help="training flags after --")
    opts = p.parse_args()
    flags = [f for f in opts.flags if f != "--"]
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, CPU, torch {torch.__version__}")
    print(f"# command: python benchmarks/laurel_pa_trains.py --seeds {' '.join(map(str, opts.seeds))} -- "
          f"{' '.join(flags)}")
    print("# per seed: val loss first -> last; gamma: entries, init value, entries moved, mean |gamma - init|, "
          "min..max at the end; up (B) / down (A): products moved (of all), mean Frobenius norm init -> end")
    with tempfile.TemporaryDirectory() as tmp:
        for seed in opts.seeds:
            start = initial_study_tensors(flags, seed)
            end, losses, scalars = run_seed(flags, seed, Path(tmp))
            gamma0, gamma = start["gamma"], end["gamma"]
            moved = (gamma != gamma0).sum().item()
            parts = [f"seed {seed}: val_loss {losses[0]:.4f} -> {losses[-1]:.4f}",
                     f"gamma {gamma.numel()} init {gamma0.unique().tolist()} moved {moved} "
                     f"mean|d| {(gamma - gamma0).abs().mean().item():.4f} "
                     f"range {gamma.min().item():.4f}..{gamma.max().item():.4f}"]
            for factor in ("up", "down"):
                before, after = start[factor], end[factor]
                changed = (after != before).flatten(1).any(dim=1).sum().item()
                parts.append(f"{factor} moved {changed}/{after.size(0)} "
                             f"|.| {before.flatten(1).norm(dim=1).mean().item():.4f} -> "
                             f"{after.flatten(1).norm(dim=1).mean().item():.4f}")
            print("; ".join(parts))
            last = {k: round(v, 4) for k, v in scalars[-1].items() if ".gamma" in k}
            print(f"#   seed {seed} last scalars line, gammas: {json.dumps(last)}")


if __name__ == "__main__":
    main()
