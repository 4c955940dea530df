"""Every pair of bundled studies that compose exports, on each base (r14, --base r18, the small track), to a file that
trains bit for bit like the modular script.

Cheap by design (the CI budget): one process, no subprocess; the export's own check (verify_export) is replaced by
the same comparison (first_difference: the config line, every logged loss and scalar, every final parameter) of
the modular script's main and the file's main run in this process, one step of the tiny preset each.
tests/scripts/test_export_runs.py runs single studies from a folder without the checkout and at two ranks."""
import itertools
import runpy

import pytest

import train_gpt as S
import train_gpt_medium as T
from speedrun import export as export_module
from speedrun.errors import UsageError
from speedrun.studies import STUDIES

# Each bundled study switched on by its smallest command line (at the tiny preset's 6 layers, and #18's 16).
SWITCHED_ON = {"backout": ["--backout-layers", "4"], "rolling": ["--rolling-skip"], "laurel": ["--laurel", "rw+lr"],
               "dlo": ["--dlo-groups", "2", "--dlo-add", "1"], "gated-skip": ["--gated-skip-layer", "2"]}
BASES = {"r14": (T, ["--base", "r14"]), "r18": (T, ["--base", "r18"]), "small": (S, [])}


def composing_pairs():
    """(base, study, study) of every pair the base's command line accepts together."""
    pairs = []
    for base, (track, base_flags) in BASES.items():
        for first, second in itertools.combinations([study.name for study in STUDIES], 2):
            try:
                track.resolve_args(["--preset", "tiny", *base_flags, *SWITCHED_ON[first], *SWITCHED_ON[second]])
            except UsageError:  # refused together (DLO rebuilds a baseline checkpoint: no other study with it)
                continue
            pairs.append((base, first, second))
    return pairs


PAIRS = composing_pairs()


def test_every_bundled_study_is_switched_on_here_and_pairs_with_another_on_every_base():
    assert set(SWITCHED_ON) == {study.name for study in STUDIES}
    for base in BASES:
        paired = {name for pair in PAIRS if pair[0] == base for name in pair[1:]}
        assert paired == set(SWITCHED_ON) - {"dlo"}, base  # DLO refuses every other study


@pytest.mark.slow
@pytest.mark.parametrize("base, first, second", PAIRS, ids=lambda value: value)
def test_every_pair_of_studies_that_compose_exports_bit_for_bit(tmp_path, monkeypatch, base, first, second):
    """Guards what no single-study export does: two studies' modules inlined into one namespace, their hooks on one
    model and their parameters in one optimiser (a name both define, a field one reads of the other)."""
    track, base_flags = BASES[base]
    monkeypatch.setattr(export_module, "VERIFY_STEPS", 1)
    compared = []

    def verify_in_this_process(script, text, modular_argv, file_argv, kept_in):
        exported = tmp_path / "exported.py"
        exported.write_text(text)
        logs = {"modular": tmp_path / "modular", "exported": tmp_path / "exported"}
        assert track.main([*modular_argv, "--log-dir", str(logs["modular"]), "--run-name", "run"]) == 0
        file_main = runpy.run_path(str(exported), run_name="exported_file")["main"]
        assert file_main([*file_argv, "--log-dir", str(logs["exported"]), "--run-name", "run"]) == 0
        compared.append(export_module.first_difference(logs["modular"], logs["exported"]))
    monkeypatch.setattr(export_module, "verify_export", verify_in_this_process)
    out = tmp_path / "out.py"
    argv = ["--export-script", str(out), "--preset", "tiny", *base_flags, *SWITCHED_ON[first], *SWITCHED_ON[second]]
    assert track.main(argv) == 0
    assert compared == [None]
    sections = out.read_text()
    for name in (first, second):  # each study's module is in the file
        module = next(study for study in STUDIES if study.name == name).resolve.__module__
        assert f"# {module.replace('.', '/')}.py" in sections
