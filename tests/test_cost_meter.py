"""The suite's cost table (cost_meter.py, benchmarks/suite_costs.py): what a test is filed under, and the grouping."""
import json
import subprocess
import sys

import pytest

from cost_meter import CostMeter, kind_of
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import suite_costs  # noqa: E402


@pytest.mark.parametrize("commands, own_process, frames, kind", [
    ([], True, 0, "own process"),
    (["python -m torch.distributed.run --standalone --nproc_per_node=2 train_gpt_medium.py"], False, 3, "torchrun"),
    (["python -m ablations run demo", "python train_gpt_medium.py"], False, 0, "study"),
    (["bash run.sh test"], False, 0, "study"),
    (["python train_gpt.py --preset tiny"], False, 5, "process"),
    ([], False, 2, "compile"),
    ([], False, 0, "in process"),
])
def test_a_test_is_filed_under_the_most_expensive_kind_it_started(commands, own_process, frames, kind):
    assert kind_of(commands, own_process, frames) == kind


def test_the_meter_records_the_commands_started_and_puts_popen_back(tmp_path, monkeypatch):
    costs = tmp_path / "costs.jsonl"
    started = []
    monkeypatch.setattr(subprocess.Popen, "_execute_child", lambda popen, args, *a, **k: started.append(args))
    meter = CostMeter(costs)
    meter.start()
    subprocess.Popen._execute_child(None, ["python", "-m", "ablations", "run", "x"])
    meter.stop("t::one", own_process=False, outcome="passed")
    line = json.loads(costs.read_text())
    assert line["test"] == "t::one" and line["kind"] == "study" and line["cpu_s"] >= 0
    assert started == [["python", "-m", "ablations", "run", "x"]]  # the real spawn still ran
    assert subprocess.Popen._execute_child is not None and "recording" not in subprocess.Popen._execute_child.__name__


def test_groups_add_up_and_bad_lines_are_refused_in_one_line(tmp_path, capsys):
    lines = [{"test": f"tests/a.py::t{i}", "outcome": "passed", "wall_s": 2.0, "cpu_s": 30.0, "child_cpu_s": 30.0,
              "kind": "torchrun", "worker": "gw0"} for i in range(2)]
    lines.append({"test": "tests/b.py::u", "outcome": "failed", "wall_s": 1.0, "cpu_s": 60.0, "child_cpu_s": 0.0,
                  "kind": "in process", "worker": "gw1"})
    costs = tmp_path / "costs.jsonl"
    costs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    suite_costs.main([str(costs), "--top", "2"])
    out = capsys.readouterr().out
    assert "3 tests, 3.0 CPU-minutes" in out
    torchrun = next(row for row in out.splitlines() if row.startswith("torchrun"))
    assert torchrun.split()[1:4] == ["2", "2.0", "67%"]
    assert "1 failed: tests/b.py::u" in out
    costs.write_text(json.dumps(lines[0]) + "\nnot json\n")
    with pytest.raises(SystemExit, match="line 2 is not a cost line"):
        suite_costs.main([str(costs)])


def test_a_cost_line_that_cannot_be_written_never_fails_the_suite(tmp_path, capsys):
    meter = CostMeter(tmp_path / "no-such-folder" / "costs.jsonl")  # as a full disk: open() raises OSError
    for name in ("t::a", "t::b"):
        meter.start()
        meter.stop(name, own_process=False, outcome="passed")
    err = capsys.readouterr().err
    assert err.count("cost_meter: cannot write") == 1 and meter.path is None


def test_the_summary_and_the_budget_name_the_total_the_machine_and_the_costliest_tests(tmp_path, capsys):
    lines = [{"test": f"tests/a.py::t{i}", "outcome": "passed", "wall_s": 1.0, "cpu_s": 60.0 * i, "child_cpu_s": 0.0,
              "kind": "in process", "worker": "gw0"} for i in range(1, 5)]
    costs = tmp_path / "costs.jsonl"
    costs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    suite_costs.main([str(costs), "--summary", "--wall-s", "125"])
    cores, model = suite_costs.machine()
    assert capsys.readouterr().out == (f"Suite cost: 4 tests, 10.0 CPU-minutes (user+sys), 2 min 5 s wall; "
                                       f"nproc {cores}, {model}\n")
    suite_costs.main([str(costs), "--budget", "8", "--top", "2"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("CPU budget: 10.0 of 8 CPU-minutes, OVER by 2.0")
    assert [row.split()[0] for row in out[3:]] == ["tests/a.py::t4", "tests/a.py::t3"]
    suite_costs.main([str(costs), "--budget", "35"])
    assert capsys.readouterr().out.startswith("CPU budget: 10.0 of 35 CPU-minutes, 25.0 to spare")
    costs.write_text("")  # no test ran (none collected, or pytest stopped first): said, not an error
    suite_costs.main([str(costs), "--summary"])
    assert capsys.readouterr().out == "Suite cost: no test was measured\n"

