"""The log reader: our format, upstream eras, source code that looks like a log, broken files."""
import pytest

import analysis_logs as logs_for_tests
from analysis.logs import LogUnreadable, code_section, group_runs, load_runs, parse_log


def write_log(tmp_path, name, text):
    return logs_for_tests.write(tmp_path / name, text)


def test_our_log_is_read_from_its_own_sections_not_from_the_code(tmp_path):
    losses = {0: 10.8, 25: 4.5, 50: 3.4, 75: 3.0, 100: 2.918}
    text = logs_for_tests.our_log_text(
        variant="record", seed=3, losses=losses, step_ms=250.0, env={"params": "454496336", "added_params": 2},
        scalars=lambda step: {"backout.x": 1.0 - step / 1000, "backout.L11": -step / 1000},
        config={"backout_layers": [11]}, peak=(56812, 60123))
    run = parse_log(write_log(tmp_path, "r/seed3.txt", text))
    assert run.complete and not run.upstream
    assert (run.variant, run.seed) == ("record", 3)
    assert run.config["backout_layers"] == [11] and run.config["track"] == "medium"
    assert run.env["params"] == "454496336" and run.env["added_params"] == "2"
    assert run.val_steps == [0, 25, 50, 75, 100]
    assert run.val_losses == [10.8, 4.5, 3.4, 3.0, 2.918]
    assert run.val_times_ms == [0.0, 6250.0, 12500.0, 18750.0, 25000.0]
    assert (run.total_steps, run.final_step, run.train_time_s) == (100, 100, 25.0)
    assert (run.peak_allocated_mib, run.peak_reserved_mib) == (56812.0, 60123.0)
    assert [step for step, _ in run.scalars] == [0, 25, 50, 75, 100]
    assert run.final_scalars == {"backout.x": 0.9, "backout.L11": -0.1}
    # Nothing from the example log inside the code leaked in.
    assert "from_the_code" not in run.variant and 7 not in run.val_steps and run.env.get("params") != "1"


@pytest.mark.parametrize("era,decimals_loss", [("2024", 3.2786), ("2025", 3.278612)])
def test_upstream_eras_are_grouped_by_folder(tmp_path, era, decimals_loss):
    text = logs_for_tests.upstream_log_text(era=era, losses=lambda step: 5.0 if step < 100 else decimals_loss)
    run = parse_log(write_log(tmp_path, f"{era}_Record/0f3a-uuid.txt", text))
    assert run.upstream and run.complete
    assert run.variant == f"{era}_Record" and run.seed == "0f3a-uuid"
    assert run.final_val_loss == decimals_loss
    assert run.final_step == 100 and run.train_time_s == pytest.approx(15.0)
    assert run.peak_allocated_mib in (31563.0, 56812.0)


def test_seed_and_variant_fall_back_to_file_and_folder_names(tmp_path):
    text = logs_for_tests.our_log_text(variant="", seed=None)
    run = parse_log(write_log(tmp_path, "my_arm/seed12.txt", text))
    assert run.variant == "my_arm" and run.seed == 12


@pytest.mark.parametrize("stop_at", [0, 1, 30, 99, 100])
def test_a_log_without_the_peak_memory_line_is_unfinished(tmp_path, stop_at):
    text = logs_for_tests.our_log_text(stop_at=stop_at, complete=False, variant="arm", seed=1)
    run = parse_log(write_log(tmp_path, "arm/seed1.txt", text))
    assert not run.complete and run.final_step == stop_at
    assert run.variant == "arm" and run.val_steps == [s for s in (0, 25, 50, 75, 100) if s <= stop_at]


def test_truncation_at_any_byte_never_crashes_and_is_never_complete(tmp_path):
    text = logs_for_tests.our_log_text(variant="arm", total_steps=20, val_every=5).encode()
    code_end = len(logs_for_tests.TRICKY_CODE.encode()) + 101  # the code and the separator line after it
    config_end = text.index(b"\n", text.index(b"config: {", code_end)) + 1
    path = tmp_path / "other" / "cut.txt"
    path.parent.mkdir()
    for cut in list(range(0, code_end, 37)) + list(range(code_end, len(text) - 1, 23)):
        path.write_bytes(text[:cut])
        try:
            run = parse_log(path)
        except LogUnreadable:
            assert cut <= code_end  # only a cut inside the code leaves no separator
            continue
        if cut >= code_end:  # (a cut inside the code may end on a line of its example log: a known limit)
            assert not run.complete, cut
            assert run.variant == ("arm" if cut >= config_end else "other"), cut


def test_log_cut_inside_the_environment_section_keeps_its_config(tmp_path):
    text = logs_for_tests.our_log_text(variant="arm", seed=4)
    cut = text.index("config: ", len(logs_for_tests.TRICKY_CODE))
    cut = text.index("\n", cut) + 1  # the config line is written, the second separator is not
    run = parse_log(write_log(tmp_path, "other_folder/x.txt", text[:cut]))
    assert not run.complete and run.variant == "arm" and run.seed == 4 and run.final_step is None


def test_empty_environment_section_between_adjacent_separators(tmp_path):
    text = "print('hi')\n" + "=" * 100 + "\n" + "=" * 100 + "\nstep:0/10 val_loss:9.000000 train_time:0ms " \
        "step_avg:0.00ms\nstep:10/10 val_loss:3.000000 train_time:900ms step_avg:90.00ms\n" \
        "peak memory allocated: 5 MiB reserved: 6 MiB\n"
    run = parse_log(write_log(tmp_path, "rec/x.txt", text))
    assert run.complete and run.val_losses == [9.0, 3.0] and run.env == {} and run.config == {}
    assert code_section((tmp_path / "rec/x.txt").read_bytes()) == "print('hi')\n"


def test_log_cut_right_after_the_second_separator(tmp_path):
    text = logs_for_tests.our_log_text(variant="arm", seed=4)
    cut = text.index("step:0/")
    run = parse_log(write_log(tmp_path, "f/x.txt", text[:cut]))
    assert not run.complete and run.variant == "arm" and run.val_steps == []


@pytest.mark.parametrize("content,problem", [
    (b"", "empty"), (b"   \n\n", "empty"), (bytes(range(256)) * 20, "binary"),
    (b"just some notes\nstep:1/2 train_time:5ms step_avg:5.00ms\n", "no line of 100"),
])
def test_unreadable_files_raise_a_clear_reason(tmp_path, content, problem):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(LogUnreadable, match=problem):
        parse_log(path)


def test_nul_filled_tail_of_a_crashed_run_is_an_unfinished_run(tmp_path):
    text = logs_for_tests.our_log_text(variant="arm", stop_at=60, complete=False).encode()
    path = tmp_path / "arm" / "seed0.txt"
    path.parent.mkdir()
    path.write_bytes(text + b"\x00" * 4096)
    run = parse_log(path)
    assert not run.complete and run.final_step == 60 and run.variant == "arm"


def test_invalid_utf8_and_crlf_are_tolerated(tmp_path):
    text = logs_for_tests.our_log_text(variant="crlf").replace("\n", "\r\n").encode()
    path = tmp_path / "a.txt"
    path.write_bytes(b"\xff\xfe broken bytes in the code\r\n" + text)
    run = parse_log(path)
    assert run.complete and run.variant == "crlf" and run.final_step == 100


def test_garbage_step_lines_are_skipped_and_repeated_steps_keep_the_later_value(tmp_path):
    text = logs_for_tests.our_log_text(variant="arm", total_steps=10, val_every=5,
                                       losses={0: 9.0, 5: 5.0, 10: 3.0})
    extra = ("step:5/10 val_loss:4.000000 train_time:1250ms step_avg:250.00ms\n"
             "step:x/10 val_loss:1.0 train_time:1ms step_avg:1ms\n"
             "step:6/10 val_loss:1.0 train_time:5ms\n"  # no step_avg: not a step line
             "step:6/10 scalars: {not json}\n")
    text = text.replace("step:10/10 train_time", extra + "step:10/10 train_time")
    run = parse_log(write_log(tmp_path, "a/seed0.txt", text))
    assert run.val_steps == [0, 5, 10] and run.val_losses == [9.0, 4.0, 3.0] and run.complete


def test_nan_losses_are_read_as_nan(tmp_path):
    text = logs_for_tests.our_log_text(total_steps=10, val_every=5, losses={0: 9.0, 5: float("nan"), 10: 3.0})
    run = parse_log(write_log(tmp_path, "a/seed0.txt", text))
    assert run.val_losses[1] != run.val_losses[1] and run.val_losses[2] == 3.0


def test_code_section_is_the_source_before_the_environment(tmp_path):
    text = logs_for_tests.our_log_text()
    path = write_log(tmp_path, "a.txt", text)
    assert code_section(path.read_bytes()) == logs_for_tests.TRICKY_CODE


@pytest.mark.slow
def test_load_runs_sorts_readable_from_unreadable_in_parallel_too(tmp_path):
    """Guards: load_runs with 2 worker processes reads 61 files exactly as serially, unreadable ones set apart."""
    for seed in range(30):
        write_log(tmp_path, f"a/seed{seed}.txt", logs_for_tests.our_log_text(variant="a", seed=seed))
        write_log(tmp_path, f"b/seed{seed}.txt", logs_for_tests.our_log_text(variant="b", seed=seed,
                                                                           complete=seed % 2 == 0))
    (tmp_path / "b" / "junk.txt").write_bytes(b"\x00\x01")
    (tmp_path / "notes.md").write_text("not a txt")
    serial = load_runs([tmp_path], jobs=1)
    parallel = load_runs([tmp_path], jobs=2)
    assert len(serial[0]) == 60 and [u.path.name for u in serial[1]] == ["junk.txt"]
    assert [r.path for r in serial[0]] == [r.path for r in parallel[0]]
    assert [r.val_losses for r in serial[0]] == [r.val_losses for r in parallel[0]]
    groups = group_runs(serial[0])
    assert {k: len(v) for k, v in groups.items()} == {"a": 30, "b": 15}
    assert {k: len(v) for k, v in group_runs(serial[0], by="folder").items()} == {"a": 30, "b": 15}
    with pytest.raises(FileNotFoundError):
        load_runs([tmp_path / "missing"])


def test_r18_runs_without_fa3_are_flagged_as_not_comparable_in_time():
    from types import SimpleNamespace

    from analysis.logs import attention_warnings
    runs = lambda *configs: [SimpleNamespace(config=c) for c in configs]  # noqa: E731
    groups = {"fa3": runs({"base": "r18", "attention": "fa3"}),
              "r14": runs({"base": "r14", "attention": "auto"}, {}),
              "mixed": runs({"base": "r18", "attention": "fa3"}, {"base": "r18", "attention": "sdpa"})}
    assert attention_warnings(groups) == [
        "arm 'mixed' ran --base r18 with attention sdpa, not fa3: its train_time is comparable with upstream's only "
        "when fa3 ran (its losses are)"]
