"""Every rank issues the same collectives in the same order: for every arm of every bundled study (both tracks;
arms with the same parameter shapes and collective-relevant flags run once), two ranks (gloo) run the real training
path at tiny size - a kernel warm-up step, two training steps (Snoo fires on the medium track), three validations
and a checkpoint save (a save in the loop and the final one make the same call: one is enough) - while each rank
records its sequence of collectives (name, process group, sizes, dtype, and the parameters of each gradient bucket
by name); the sequences must be identical. A rank that launched its reductions in autograd's order, a collective
issued by one rank only, or a size or dtype that depends on the rank fails here (on NCCL: a hang or gradients
mixed up between same-size buckets).

Run-only flags of an arm that cannot change the sequence are replaced: the schedule (--num-iterations,
--stop-after) by the short one above and --compile by off (CPU inductor would take minutes per arm; the
reductions' order is fixed by the buckets, not by the compiled graph). A validation issues one all_reduce however
many batches it reads, so it reads one (ONE_VALIDATION_BATCH): the tiny preset's two were ~30% of rank 0's time in
the 50k-token head, for the same sequence (the same count of collectives per case, measured). Only the DLO base's
checkpoint is written out; the driver serialises every other into nothing (see its docstring)."""
import json
import tomllib

import pytest
import torch

import train_gpt as small
import train_gpt_medium as medium
from conftest import ROOT, launch_script
from ablations.study import available_studies, load_study
from speedrun.presets import tiny_preset
from speedrun.data import VIRTUAL_RANKS

DRIVER = ROOT / "tests" / "collective_order_driver.py"
TRACK_SIZE = {"train_gpt.py": ["--preset", "tiny"],  # 12 layers: the small studies' layer indices exist
              "train_gpt_medium.py": ["--preset", "tiny", "--num-layers", "16"]}
CASES_PER_LAUNCH = 6  # launches run in order: the first case writes the checkpoint the later DLO cases read
ONE_VALIDATION_BATCH = VIRTUAL_RANKS * tiny_preset(1)["val_seq_len"]  # --val-tokens: one sequence per virtual rank
DROPPED = {"--num-iterations": 1, "--stop-after": 1, "--compile": 1, "--profile-steps": 1}


def without_run_flags(argv):
    out, skip = [], 0
    for token in argv:
        if skip:
            skip -= 1
        elif token in DROPPED:
            skip = DROPPED[token]
        else:
            out.append(token)
    return out


def parameter_shapes(module, args):
    """The model's parameters (name, shape): with the flags above, what decides the collectives' sizes."""
    with torch.device("meta"):
        model = module.GPT(module.model_config(args), max_seq_len=args.train_seq_len)
    return tuple((name, tuple(p.shape)) for name, p in model.named_parameters())


def cases(shard_dir, runs_dir, log_dir):
    """The deduplicated (script, argv) of every bundled study arm, the DLO base checkpoint's run first."""
    data = ["--train-files", str(shard_dir / "syn_train_*.bin"), "--val-files", str(shard_dir / "syn_val_*.bin")]
    schedule = ["--num-iterations", "2", "--val-every", "1", "--checkpoint-every", "2", "--warmup-steps", "1",
                "--val-tokens", str(ONE_VALIDATION_BATCH), "--compile", "off", "--log-dir", str(log_dir)]
    base = runs_dir / "record" / "baseline"
    out = [dict(id="dlo-base-checkpoint", script="train_gpt_medium.py",
                argv=TRACK_SIZE["train_gpt_medium.py"] + data + schedule[:-2]
                + ["--log-dir", str(base), "--run-name", "seed0", "--save-final-checkpoint"], keep_checkpoint=True)]
    base.mkdir(parents=True, exist_ok=True)
    (base / "seed0.pt").touch()  # the DLO arms' flags are checked before the first case writes it
    seen = set()
    for path in available_studies():
        if "requires_results" in tomllib.loads(path.read_text()):
            continue  # generated from another study's results: plain backout sums, covered by its other arms
        study = load_study(str(path))
        module = {"train_gpt.py": small, "train_gpt_medium.py": medium}[study.script.name]
        for arm in study.arms:
            study_argv = study.argv(arm, study.seeds[0], runs_dir=runs_dir)
            if "--base" in study_argv and study_argv[study_argv.index("--base") + 1] == "r18":
                continue  # r18 arms: test_r18_train runs the r18 base on two ranks
            argv = (TRACK_SIZE[study.script.name] + data + without_run_flags(study_argv) + schedule)
            args = module.resolve_args(argv)
            key = (study.script.name, parameter_shapes(module, args), args.dlo_groups, args.dlo_layer_lr,
                   bool(args.init_from), args.low_precision)
            if key not in seen:
                seen.add(key)
                out.append(dict(id=f"{study.name}:{arm}", script=study.script.name,
                                argv=argv + ["--run-name", f"case{len(out)}"]))
    return out


@pytest.mark.slow
def test_every_study_arm_issues_the_same_collectives_on_every_rank(shard_dir, tmp_path):
    """Guards: two real gloo ranks issue identical collective sequences (order, sizes, dtypes) for every bundled arm."""
    todo = cases(shard_dir, tmp_path / "runs", tmp_path / "logs")
    assert {c["script"] for c in todo} == {"train_gpt.py", "train_gpt_medium.py"}
    assert any("--dlo-layer-lr" in c["argv"] for c in todo) and any("--laurel" in c["argv"] for c in todo)
    results = []
    # A few cases per launch: a rank's resident memory grows by 0.1-0.4 GB with each run it holds (allocator
    # caches), and all 36 in one pair of processes went past the 24 GiB of a CI machine.
    for first in range(0, len(todo), CASES_PER_LAUNCH):
        case_file = tmp_path / f"cases{first}.json"
        case_file.write_text(json.dumps(todo[first:first + CASES_PER_LAUNCH]))
        res = launch_script([str(case_file)], nproc=2, script=DRIVER, timeout=1200)
        assert res.returncode == 0, res.stderr[-3000:]
        results += json.loads(res.stdout.strip().splitlines()[-1])
    assert [r["id"] for r in results] == [c["id"] for c in todo]
    differing = {r["id"]: r["example"] for r in results if r["differs_at"] is not None}
    assert differing == {}
    for r in results:
        # the recorder saw the step's collectives: reductions, Muon's and the shards' gathers, validation's sum
        assert {"reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
                "all_reduce", "all_gather_object"} <= set(r["kinds"]), r


def test_the_driver_discards_checkpoint_bytes_but_not_the_object_collectives_buffers(tmp_path):
    """The driver's torch.save for cases whose checkpoint nothing reads: a file gets nothing, an in-memory buffer
    (torch.distributed pickles a gathered object's tensors through one) the whole serialisation."""
    import io

    from collective_order_driver import discarding_writes
    save = discarding_writes(torch.save)
    with open(tmp_path / "case.pt", "wb") as f:
        save({"w": torch.ones(1000)}, f)
    assert (tmp_path / "case.pt").stat().st_size == 0
    buffer = io.BytesIO()
    save({"w": torch.ones(3)}, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer)["w"], torch.ones(3))
