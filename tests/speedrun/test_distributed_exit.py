"""How a multi-rank run ends (speedrun.distributed.exit_before_interpreter_teardown)."""
import subprocess
import sys

import pytest

from conftest import ROOT

ENDING = """
import atexit, sys
from speedrun.distributed import exit_before_interpreter_teardown
atexit.register(lambda: open(sys.argv[1], "w").write("exit handler ran"))
sys.stdout.write("buffered, no newline")
exit_before_interpreter_teardown(3)
print("not reached")
"""


@pytest.mark.slow
def test_a_multi_rank_ending_keeps_its_status_output_and_exit_handlers(tmp_path):
    """Guards: the teardown-free exit of a gloo run (os._exit) still runs atexit handlers, flushes stdout, keeps the
    status."""
    marker = tmp_path / "marker"
    res = subprocess.run([sys.executable, "-c", ENDING, str(marker)], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert res.returncode == 3, res.stderr
    assert res.stdout == "buffered, no newline"
    assert marker.read_text() == "exit handler ran"
