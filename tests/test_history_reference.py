"""The references from git history in tests/fixtures/history/: a missing one fails the test that needs it (never a
skip), and each stored file is what its header says it is."""
import re
import subprocess

import pytest

from conftest import HISTORY, ROOT, script_from_history

STORED = sorted(path.name for path in HISTORY.iterdir())
HEADER = re.compile(r"# history: (?P<file>\S+) @ (?P<commit>[0-9a-f]{7,40}) lines (?P<lines>all|[0-9,-]+)\n")


def test_a_missing_reference_fails_with_one_line_naming_it():
    with pytest.raises(pytest.fail.Exception) as failed:
        script_from_history("train_gpt_medium-0000000.py.txt")
    assert not isinstance(failed.value, pytest.skip.Exception)
    message = str(failed.value)
    assert "\n" not in message
    assert "tests/fixtures/history/train_gpt_medium-0000000.py.txt cannot be read" in message


def test_a_stored_reference_imports_as_a_module():
    module = script_from_history("train_gpt_fp8_head-c2c565e.py.txt")
    assert module.FP8HeadMatmul.__name__ == "FP8HeadMatmul" and module.FP8_WEIGHT_SCALE == 2.0 ** 9


def stored_lines(lines, text):
    """The lines of `text` named by a header's `lines` field: `all`, or numbers and ranges such as `16,99-138`."""
    if lines == "all":
        return text
    numbered = text.splitlines(keepends=True)
    out = []
    for part in lines.split(","):
        first, _, last = part.partition("-")
        out += numbered[int(first) - 1:int(last or first)]
    return "".join(out)


@pytest.mark.slow
@pytest.mark.parametrize("stored", STORED)
def test_a_stored_reference_is_the_file_its_header_names(stored):
    """Guards: each stored history reference equals the lines its header names, as `git show` gives them."""
    text = (HISTORY / stored).read_text()
    header = HEADER.match(text)
    assert header, f"{stored} does not start with a '# history: FILE @ COMMIT lines ...' header"
    lines = text.splitlines(keepends=True)
    header_length = next(i for i, line in enumerate(lines) if not line.startswith("# "))
    body = "".join(lines[header_length:])
    shown = subprocess.run(["git", "show", f"{header['commit']}:{header['file']}"], cwd=ROOT, capture_output=True,
                           text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {header['commit']} is not in this checkout's history (a shallow clone)")
    assert body == stored_lines(header["lines"], shown.stdout)
