"""An exported single file (--export-script) trains bit for bit like the modular script it came from: the same
flags and seed give the same logged losses and scalars and the same final parameters, from a folder without this
project, at world sizes 1 and 2; its log holds its own source alone and `analysis` reads it like any run log."""
import contextlib
import importlib
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

import train_gpt_medium as T
from analysis.logs import parse_log
from conftest import MEDIUM_SCRIPT, SMALL_SCRIPT, file_as_module, file_logged_config, launch_script
from speedrun import export as export_module
from speedrun.logformat import read_config
from speedrun.studies import STUDIES

COMMON = ["--num-iterations", "2", "--val-every", "1", "--seed", "5", "--save-final-checkpoint"]
# name: (script, the arm's flags (fixed in the file), run flags of both runs, world size); "{baseline}" is the r14
# baseline's final checkpoint. One pair per idea the file must carry: the r14, small-track and r18 bases, each r14
# study's module (the DLO expansion from a checkpoint), and gradient averaging across two ranks.
CONFIGS = {
    "r14-baseline": (MEDIUM_SCRIPT, [], [], 1),
    "r14-laurel": (MEDIUM_SCRIPT, ["--laurel", "rw+lr+pa"], [], 1),
    "r14-dlo-expansion": (MEDIUM_SCRIPT, ["--dlo-groups", "2", "--dlo-add", "1"], ["--init-from", "{baseline}"], 1),
    "small": (SMALL_SCRIPT, ["--fp8-head", "off"], [], 1),
    # the record's backout (at layer 4 of the tiny 6), on 2 ranks
    "r14-backout-2ranks": (MEDIUM_SCRIPT, ["--backout-layers", "4"], [], 2),
    # #18 as the record ran it: every study's code folded out of the file (its own backout stays, on by default)
    "r18-baseline": (MEDIUM_SCRIPT, ["--base", "r18"], [], 1),
    # #18 with its own backout (on by default there) and LAuReL on its blocks: the r18 package and its study wiring
    "r18-laurel": (MEDIUM_SCRIPT, ["--base", "r18", "--laurel", "rw+lr"], [], 1),
}
LOGGED = re.compile(r"^step:(\d+)/\d+ (val_loss:\S+|scalars: .*)", re.MULTILINE)


class Pair(NamedTuple):
    modular: Path  # the modular script's run folder (run.txt, run.pt)
    exported: Path  # the exported file's
    ran: Path  # the file that ran, in the folder it ran from
    written: Path  # the file the export wrote


@pytest.fixture(scope="module")
def paired_runs(shard_dir, tmp_path_factory):
    """name -> Pair, each made once for the module. At one rank the pair is the export's own check, kept with
    --export-check-dir: the run's arm, flags and seed, 2 tiny-preset steps validating each, on the demo shards
    (verification_argv), the file run from the check's folder; nothing trains a second time. At two ranks (the
    check trains at one) the test trains both under torchrun, the file from a folder of its own."""
    done = {}
    data = ["--preset", "tiny", "--train-files", str(shard_dir / "syn_train_*.bin"),
            "--val-files", str(shard_dir / "syn_val_*.bin")]

    def run_pair(name):
        if name in done:
            return done[name]
        script, arm, run_flags, nproc = CONFIGS[name]
        run_flags = [f.replace("{baseline}", str(run_pair("r14-baseline").modular / "run.pt")) for f in run_flags]
        root = tmp_path_factory.mktemp(name)
        written, checked, ranks = root / "written" / "exported_run.py", root / "checked", root / "ranks"
        written.parent.mkdir()
        keep = ["--export-check-dir", str(checked)] if nproc == 1 else []
        # in this process (the script's main, as `python SCRIPT` calls it): no interpreter and torch import per pair
        with contextlib.redirect_stderr(io.StringIO()) as err:
            code = importlib.import_module(script.stem).main(["--export-script", str(written), *keep, *data,
                                                              "--seed", "5", *arm, *run_flags])
        assert code == 0, err.getvalue()
        if nproc == 1:
            done[name] = Pair(checked / "modular", checked / "exported", checked / "exported.py", written)
            return done[name]
        ranks.mkdir()
        ran = ranks / "exported.py"
        ran.write_text(written.read_text())
        for folder, target, argv, cwd in ((ranks / "modular", script, [*data, *arm, *run_flags], script.parent),
                                          (ranks / "exported", ran, [*data, *run_flags], ranks)):
            res = launch_script([*argv, *COMMON, "--log-dir", str(folder), "--run-name", "run"], nproc=nproc,
                                script=target, cwd=cwd)
            assert res.returncode == 0, f"{target}: {res.stderr[-3000:]}"
        done[name] = Pair(ranks / "modular", ranks / "exported", ran, written)
        return done[name]
    return run_pair


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIGS)
def test_export_trains_bit_for_bit_like_the_modular_script(paired_runs, name):
    """Guards that the export is the same program: no fast test runs the file. Asserted here apart from the check's
    own comparison (first_difference), on the runs it kept."""
    modular, exported, ran, written = paired_runs(name)
    modular_log, exported_log = (modular / "run.txt").read_text(), (exported / "run.txt").read_text()
    logged = LOGGED.findall(modular_log)
    assert len(logged) >= 6 and LOGGED.findall(exported_log) == logged
    ours, theirs = (torch.load(f / "run.pt", weights_only=False)["model"] for f in (modular, exported))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # the file that ran is the one written; the log opens with its own source, no module sections; analysis reads
    # it as the same arm
    assert ran.read_text() == written.read_text()
    assert exported_log.startswith(written.read_text().rstrip("\n") + "\n" + "=" * 100)
    assert "\n==> speedrun/" not in exported_log
    assert "\n==> speedrun/export.py" not in modular_log  # a run imports nothing of the export
    a, b = parse_log(modular / "run.txt"), parse_log(exported / "run.txt")
    assert b.complete and (b.variant, b.seed, b.val_losses, b.final_step) == (a.variant, a.seed, a.val_losses,
                                                                              a.final_step)
    # the folder the file ran from holds nothing of this project: the file and the two runs' logs and checkpoints
    assert sorted(p.name for p in ran.parent.iterdir()) == ["exported", "exported.py", "modular"]
    assert {p.name for run in (modular, exported) for p in run.iterdir()} <= {"run.txt", "run.pt", "stderr"}
    # both trained from the checkpoint the run starts from (DLO: the file keeps --init-from, the check passes it on)
    starts = {read_config((run / "run.txt").read_bytes())["init_from"] for run in (modular, exported)}
    given = CONFIGS[name][2]
    assert starts == ({str(paired_runs("r14-baseline").modular / "run.pt")} if "--init-from" in given else {None})


@pytest.mark.slow
def test_record_holds_the_single_file_under_upstreams_name_and_says_what_made_the_logs(paired_runs, tmp_path,
                                                                                        monkeypatch):
    """Guards analysis record on real logs of both kinds (the fast record tests use made-up logs)."""
    import json

    from analysis.record import package_record
    modular, exported, _, out = paired_runs("r14-backout-2ranks")
    folder = package_record([parse_log(modular / "run.txt")], "medium", "M", "2026-11-27", tmp_path / "a")
    readme = (folder / "README.md").read_text()
    assert "made by the modular script" in readme
    # the check the export ran, for this run's arm and flags
    checked = readme[readme.index("checked it against the modular script: `python train_gpt_medium.py "):]
    assert "--backout-layers 4 " in checked and "--preset tiny --num-iterations 2 " in checked
    assert "bit for bit" in checked
    single = (folder / "train_gpt_medium.py").read_text()
    assert "\n==> " not in single
    # no modular tree beside the file: the logs embed the modular code
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "run.txt", "train_gpt_medium.py"]
    # the file's arm (its studies fixed as the logged config's) is the run's: the study fields and the name
    run_flags = ["--preset", "tiny", "--run-name", "r"]
    logged = file_logged_config(file_as_module(folder / "train_gpt_medium.py", monkeypatch), run_flags)
    modular = T.resolve_args([*CONFIGS["r14-backout-2ranks"][1], *run_flags]).as_dict()
    arm = ["variant", *(flag.dest for study in STUDIES for flag in study.flags)]
    assert json.loads(json.dumps({k: logged[k] for k in arm})) == json.loads(json.dumps({k: modular[k] for k in arm}))
    # logs of the exported file: that file is the record's script
    folder = package_record([parse_log(exported / "run.txt")], "medium", "E", "2026-11-27", tmp_path / "b")
    assert (folder / "train_gpt_medium.py").read_text().rstrip("\n") == out.read_text().rstrip("\n")
    assert "this folder's single file" in (folder / "README.md").read_text()


@pytest.mark.slow
def test_an_export_that_trains_otherwise_than_the_modular_script_is_not_written(tmp_path, monkeypatch, capsys):
    """Guards the export's own check (verify_export): a file whose numbers differ is refused naming the first
    difference, and no file is left; --export-check-dir (an empty folder given) keeps the two runs it compared."""
    checked = export_module.verify_export

    def with_another_softcap(script, text, *argvs):
        assert "return 15 * logits" in text
        checked(script, text.replace("return 15 * logits", "return 16 * logits"), *argvs)
    monkeypatch.setattr(export_module, "verify_export", with_another_softcap)
    out, kept = tmp_path / "x.py", tmp_path / "check"
    kept.mkdir()
    assert T.main(["--export-script", str(out), "--preset", "tiny", "--export-check-dir", str(kept)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not written: the file trains otherwise than the modular script" in err
    assert re.search(r"step \d+: val_loss \S+ \(modular script\) vs step \d+: val_loss \S+ \(exported file\)", err)
    assert not out.exists()
    assert "return 16 * logits" in (kept / "exported.py").read_text()
    assert err.rstrip("\n").endswith(export_module.first_difference(kept / "modular", kept / "exported"))


@pytest.mark.parametrize("where, message", [
    ("full", "exists and is not an empty folder"),
    ("file", "exists and is not an empty folder"),
    ("missing/check", "no folder"),
    ("checkout", "inside this checkout"),
])
def test_a_check_folder_that_cannot_be_kept_is_refused_before_the_check_trains(tmp_path, monkeypatch, capsys, where,
                                                                               message):
    """--export-check-dir DIR: a new or empty folder outside the checkout, in an existing folder."""
    checked = []
    monkeypatch.setattr(export_module, "verify_export", lambda *args: checked.append(args))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "run.txt").write_text("another check's\n")
    (tmp_path / "file").write_text("")
    folder = export_module.ROOT / "export-check" if where == "checkout" else tmp_path / where
    out = tmp_path / "x.py"
    assert T.main(["--export-script", str(out), "--export-check-dir", str(folder), "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --export-check-dir {folder}: {message}") and err.count("\n") == 1
    assert checked == [] and not out.exists() and not (export_module.ROOT / "export-check").exists()


@pytest.mark.parametrize("flags", [["--export-check-dir", "check"], ["--from-log", "run.txt"], ["--force"]])
def test_a_flag_of_the_export_without_export_script_is_refused_in_one_line(capsys, flags):
    assert T.main(["--preset", "tiny", *flags]) == 2
    assert capsys.readouterr().err == f"error: {flags[0]}: only with --export-script OUT.py\n"


def project_copy(folder):
    """A copy of the checkout's medium track (its script, speedrun/ and data/), to change a module in."""
    import shutil
    root = MEDIUM_SCRIPT.parent
    shutil.copy(MEDIUM_SCRIPT, folder / MEDIUM_SCRIPT.name)
    for package in ("speedrun", "data"):
        shutil.copytree(root / package, folder / package, ignore=shutil.ignore_patterns("__pycache__"))
    return folder / MEDIUM_SCRIPT.name


@pytest.mark.slow
def test_a_study_reading_another_studys_field_is_refused_where_the_file_would_fail(tmp_path):
    """Guards the check against a file that exports cleanly and dies when run: backout's part reading
    cfg.rolling_skip, a field the file's config lacks with rolling skip out of it (rc 0, then AttributeError,
    before the check)."""
    script = project_copy(tmp_path)
    backout = tmp_path / "speedrun" / "backout.py"
    source = backout.read_text()
    line = "        self.cfg = cfg\n"
    assert source.count(line) == 1
    backout.write_text(source.replace(line, line + "        self.rolling = cfg.rolling_skip\n"))
    out = tmp_path / "out" / "x.py"
    out.parent.mkdir()
    made = subprocess.run([sys.executable, str(script), "--export-script", str(out), "--preset", "tiny",
                           "--backout-layers", "4"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert made.returncode == 2 and made.stderr.count("\n") == 1, made.stderr[-2000:]
    assert "not written: the exported file fails" in made.stderr and "AttributeError" in made.stderr
    assert not out.exists()
