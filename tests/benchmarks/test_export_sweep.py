"""benchmarks/export_sweep.py sweeps what it says: every registered study, each value of each choice flag."""
from conftest import ROOT, file_as_module
from speedrun.studies import STUDIES


def load_sweep(monkeypatch):
    return file_as_module(ROOT / "benchmarks" / "export_sweep.py", monkeypatch)


def test_every_choice_value_and_switch_of_every_study_is_a_form(monkeypatch):
    """Guards: study_forms' coverage (a choice value or a switch of any study no form gives is never swept)."""
    sweep = load_sweep(monkeypatch)
    assert set(sweep.SWITCHED_ON) == {study.name for study in STUDIES}
    for study in STUDIES:
        forms = sweep.study_forms(study, "11", "BASELINE.pt")
        given = {(form[i], form[i + 1] if i + 1 < len(form) else None) for form in forms for i in range(len(form))}
        for flag in study.flags:
            values = flag.options.get("choices") or sweep.CHOICES.get(flag.name, ())
            if values:
                assert {(flag.name, value) for value in values} <= given, (study.name, flag.name)
            elif flag.options.get("action") == "store_true":
                assert any(flag.name in form for form in forms), (study.name, flag.name)


def test_a_study_no_command_line_switches_on_is_reported_not_skipped(monkeypatch, capsys):
    """Guards: a study registered without a SWITCHED_ON entry fails the sweep in one line (it was silently left out),
    and the other studies asked for still run."""
    sweep = load_sweep(monkeypatch)
    left_out = STUDIES[0].name
    monkeypatch.setattr(sweep, "SWITCHED_ON", {k: v for k, v in sweep.SWITCHED_ON.items() if k != left_out})

    def no_export(*args, **kwargs):
        raise AssertionError("the uncovered study must not be exported")
    monkeypatch.setattr(sweep.subprocess, "run", no_export)
    assert sweep.main(["--bases", "r14", "--studies", left_out]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(left_out in line and "FAILED: no command line switches it on" in line for line in out), out
    assert out[-1].endswith("1 FAILED")
