"""The run log's line grammar (speedrun/logformat.py): every line kind the writer builds is read back by the parsers
every reader uses, upstream log lines of every era parse, and the readers agree on a log written with the builders."""
import math
import subprocess
import sys
from pathlib import Path

import pytest

import analysis_logs as logs_for_tests
from ablations.runstate import LogFollower, log_config, log_is_complete
from analysis.logs import parse_log
from speedrun import logformat as lf

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("step,total,loss,ms,decimals", [(0, 1750, 10.825812, 0.0, 6), (1750, 1750, 3.27861, 179527.4, 6),
                                                         (125, 6000, 4.123456789, 40950.6, 4), (3, 7, math.nan, 9.0, 6)])
def test_a_validation_line_reads_back_as_written(step, total, loss, ms, decimals):
    line = lf.validation_line(step, total, loss, ms, decimals)
    parsed = lf.parse_step_line(line)
    assert (parsed.step, parsed.total, parsed.train_time_ms) == (step, total, round(ms))
    if math.isnan(loss):
        assert math.isnan(parsed.val_loss) and "val_loss:nan " in line
    else:
        assert parsed.val_loss == round(loss, decimals)
    assert line.endswith(f"step_avg:{ms / max(step, 1):.2f}ms")


def test_a_training_line_reads_back_without_a_loss():
    line = lf.train_step_line(40, 1750, 5234.7)
    assert line == "step:40/1750 train_time:5235ms step_avg:130.87ms"
    assert lf.parse_step_line(line) == lf.StepLine(40, 1750, None, 5235.0)
    assert lf.parse_scalars_line(line) is None


def test_a_scalars_line_reads_back_as_written():
    values = {"backout.x": 0.875, "laurel.gamma.L3": -0.25, "dlo.rank": 2}
    line = lf.scalars_line(25, 100, values)
    assert lf.parse_scalars_line(line) == (25, values)
    assert lf.parse_step_line(line) is None  # a scalars line is no step of progress
    assert lf.parse_scalars_line("step:25/100 scalars: [1, 2]") is None  # not a table
    assert lf.parse_scalars_line("step:25/100 scalars: {not json}") is None


def test_the_config_line_is_sorted_and_read_back_from_its_section():
    config = {"variant": "backout", "seed": 3, "track": "medium", "backout_layers": [11]}
    line = lf.config_line(config)
    assert line.startswith(lf.CONFIG_PREFIX) and line.index('"backout_layers"') < line.index('"variant"')
    log = "\n".join(["print('hi')", lf.SEPARATOR, "Running Python 3.12", line, lf.SEPARATOR, ""])
    assert lf.read_config(log.encode()) == config
    assert lf.read_config(log.split(lf.SEPARATOR)[0].encode()) is None  # the source alone: no config yet
    # Cut inside the environment section (one separator so far), the config line is found after it.
    assert lf.read_config(log[:log.rindex(lf.SEPARATOR)].encode()) == config


def test_the_added_params_line_reads_back_with_its_total():
    line = lf.added_params_line({"backout": 3 + 2 * 64 * 64, "rolling": 6})
    assert line == 'added_params: {"backout": 8195, "rolling": 6} total 8201'
    assert lf.parse_added_params(line) == ({"backout": 8195, "rolling": 6}, 8201)
    assert lf.parse_added_params("added_params: nothing") is None


def test_the_peak_line_finishes_a_run_and_reads_back():
    line = lf.peak_line(56812, 60010)
    assert lf.is_finished_line(line) and lf.parse_peak_line(line) == (56812.0, 60010.0)
    assert not lf.is_finished_line(None) and not lf.is_finished_line(lf.train_step_line(1, 2, 3.0))


def test_source_headers_split_the_code_section_back_into_files():
    modules = {"speedrun/model.py": logs_for_tests.TRICKY_MODULE, "data/shard_format.py": "MAGIC = 20240520\n"}
    lines = [logs_for_tests.TRICKY_CODE.rstrip("\n")]
    for path, text in modules.items():
        lines += [lf.source_header(path), text.rstrip("\n")]
    log = "\n".join(lines + [lf.SEPARATOR, lf.config_line({}), lf.SEPARATOR, lf.peak_line(1, 1)]) + "\n"
    script, sources = lf.split_sources(lf.code_section(log.encode()))
    assert script.rstrip("\n") == logs_for_tests.TRICKY_CODE.rstrip("\n")
    assert {path: text.rstrip("\n") for path, text in sources.items()} == \
        {path: text.rstrip("\n") for path, text in modules.items()}


def test_the_log_embeds_the_shard_format_beside_the_speedrun_modules():
    import data.shard_format  # noqa: F401 (imported by every training run, through speedrun/data.py)
    from speedrun.runlog import package_sources
    names = [name for name, _ in package_sources()]
    assert {"data/shard_format.py", "speedrun/logformat.py", "speedrun/runlog.py"} <= set(names)
    assert names == sorted(names, key=lambda name: name.split("/"))  # path order, subpackages (speedrun/r18) too
    assert all(name.split("/")[0] in ("data", "speedrun") for name in names)  # no test file, no other folder
    assert dict(package_sources())["data/shard_format.py"] == (ROOT / "data" / "shard_format.py").read_text()


def write_log_with_builders(path: Path, last_step: int, total: int = 10, finished: bool = True) -> Path:
    """A log as the training scripts write it, every line from the builders."""
    lines = ["print('the script')", lf.source_header("speedrun/x.py"), "X = 1", lf.SEPARATOR, "Running Python 3",
             lf.config_line({"variant": "arm", "seed": 4, "track": "medium", "num_iterations": total}),
             lf.added_params_line({"backout": 12}), lf.SEPARATOR]
    for step in range(last_step + 1):
        if step:
            lines.append(lf.train_step_line(step, total, 100.0 * step))
        if step % 5 == 0 or step == total:
            lines += [lf.validation_line(step, total, 4.0 - step / 10, 100.0 * step),
                      lf.scalars_line(step, total, {"backout.x": step / 10})]
    if finished:
        lines.append(lf.peak_line(7, 9))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_every_reader_agrees_on_a_log_written_with_the_builders(tmp_path):
    log = write_log_with_builders(tmp_path / "arm" / "seed4.txt", 10)
    run = parse_log(log)
    assert run.complete and not run.upstream and (run.variant, run.seed) == ("arm", 4)
    assert run.val_steps == [0, 5, 10] and run.val_losses == [4.0, 3.5, 3.0] and run.train_time_ms == 1000.0
    assert run.final_scalars == {"backout.x": 1.0} and run.env["added_params"] == '{"backout": 12} total 12'
    assert (run.peak_allocated_mib, run.peak_reserved_mib) == (7.0, 9.0)
    assert log_is_complete(log) and log_config(log) == run.config
    follower = LogFollower(log)
    updates = follower.poll()
    assert [u.step for u in updates if u.is_val] == [0, 5, 10] and follower.progress.val_loss == 3.0
    assert follower.progress.step == follower.progress.total == 10


def test_a_log_that_died_is_unfinished_for_every_reader(tmp_path):
    log = write_log_with_builders(tmp_path / "arm" / "seed4.txt", 7, finished=False)
    run = parse_log(log)
    assert not run.complete and run.problem == "stopped at step 7/10"
    assert not log_is_complete(log) and log_config(log)["seed"] == 4


# Lines as public upstream modded-nanogpt record logs and READMEs print them.
UPSTREAM_LINES = [
    ("step:1393/1393 val_loss:3.2785 train_time:179527ms step_avg:129.81ms", (1393, 1393, 3.2785, 179527.0)),
    ("step:1390/1390 val_loss:3.2782 train_time:202898ms step_avg:147.03ms", (1390, 1390, 3.2782, 202898.0)),
    ("step:1480/1480 val_loss:3.2794 train_time:81354ms step_avg:54.97ms", (1480, 1480, 3.2794, 81354.0)),
    ("step:1390/1390 train_time:79448ms step_avg:57.16ms", (1390, 1390, None, 79448.0)),
]


@pytest.mark.parametrize("line,expected", UPSTREAM_LINES)
def test_upstream_step_lines_parse(line, expected):
    parsed = lf.parse_step_line(line)
    assert (parsed.step, parsed.total, parsed.val_loss, parsed.train_time_ms) == expected


@pytest.mark.parametrize("era", logs_for_tests.ERAS)
def test_every_step_line_of_every_upstream_era_parses(era):
    text = logs_for_tests.upstream_log_text(era=era, step_ms=150.0)
    sections = lf.split_sections(b"\n" + text.encode())
    assert sections is not None and sections.config_json is None  # upstream logs have no config line
    lines = [line for line in sections.steps.decode().splitlines() if line.startswith("step:")]
    parsed = [lf.parse_step_line(line) for line in lines]
    assert len(lines) == 100 + 5 and None not in parsed
    assert [p.step for p in parsed if p.val_loss is not None] == [0, 25, 50, 75, 100]
    assert parsed[-1].train_time_ms == pytest.approx(15000.0)  # ms or seconds in the text, milliseconds here
    last = text.rstrip("\n").splitlines()[-1]
    assert (lf.parse_peak_line(last) is None) == (era == "2024-early")  # the earliest logs end without one


@pytest.mark.parametrize("line", ["step:6/10 val_loss:1.0 train_time:5ms", "step:x/10 val_loss:1.0 train_time:1ms "
                                  "step_avg:1ms", "s:10 tel:3.2722", "step:1/10 train_time:5ms step_avg:5.00ms extra"])
def test_lines_of_other_shapes_are_not_step_lines(line):
    assert lf.parse_step_line(line) is None


def test_the_script_writes_the_study_the_runner_hands_it_and_readers_find_it(tmp_path, monkeypatch):
    """Issue 40 cases 2 and 6: a run of a sequential study names the study and its design's digest in its log, so a
    copy without the study's record still knows it was looked at sequentially; a run of a fixed study names every arm
    of it, so a copy of some arms is still adjusted over all; a run started without the variable (by hand, any log
    made before the line existed) has no such line."""
    from types import SimpleNamespace

    import torch

    from analysis.claims import sequential_marks, study_family
    from speedrun.runlog import LogWriter, write_preamble

    def written(name):
        log = LogWriter(tmp_path / "arm" / f"{name}.txt", True)
        write_preamble(log, __file__, SimpleNamespace(device=torch.device("cpu")), {"track": "medium", "seed": 0})
        log.close()
        return parse_log(tmp_path / "arm" / f"{name}.txt")

    value = lf.study_value("s", design_digest="0123abcd")
    monkeypatch.setenv(lf.STUDY_VARIABLE, value)
    marked = written("seed0")
    assert marked.env[lf.STUDY_KEY] == value and marked.config == {"seed": 0, "track": "medium"}
    assert sequential_marks([marked]) == {("s", "0123abcd"): marked.path} and study_family([marked]) is None
    monkeypatch.setenv(lf.STUDY_VARIABLE, lf.study_value("f", arms=["baseline", "a", "b"]))
    fixed = written("seed2")
    assert study_family([fixed]) == {"study": "f", "arms": ["baseline", "a", "b"]} and sequential_marks([fixed]) == {}
    monkeypatch.delenv(lf.STUDY_VARIABLE)
    assert sequential_marks([written("seed1")]) == {} and study_family([written("seed1")]) is None
    for broken in ("not json", '{"study": "s"}', '{"study": "s", "arms": []}', '{"study": "s", "arms": ["a", "a"]}',
                   '{"study": "s", "arms": ["a"], "design_digest": "d"}'):
        assert lf.parse_study(broken) is None, broken


def test_no_project_file_outside_the_grammar_builds_or_matches_a_log_line():
    """The writer's line shapes live in speedrun/logformat.py only (the tests' fixtures of foreign eras aside)."""
    shapes = ('f"step:{', 'rb"^step:', 'r"^step:', '"peak memory allocated', '"config: "', '"=" * 100', "'=' * 100",
              '"==> ')
    offenders = []
    for folder in ("speedrun", "analysis", "ablations", "benchmarks", "data"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "logformat.py":
                text = path.read_text()
                offenders += [f"{path.relative_to(ROOT)}: {shape}" for shape in shapes if shape in text]
    offenders += [f"train_gpt*.py: {shape}" for script in ROOT.glob("train_gpt*.py") for shape in shapes
                  if shape in script.read_text()]
    assert offenders == []


@pytest.mark.slow
def test_the_grammar_loads_without_torch():
    """Guards: a fresh interpreter imports the log grammar, analysis.logs and ablations.runstate without torch."""
    code = "import sys, speedrun.logformat, analysis.logs, ablations.runstate; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
