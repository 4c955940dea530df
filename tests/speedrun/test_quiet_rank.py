"""Bad input under torchrun: the ranks that do not report it wait before they exit. The first worker to exit makes
torchrun's agent stop the others, so a quiet rank exiting at once could stop the reporting rank before its one
`error:` line (CI saw a 2-rank `--no-such-flag` run print none, under load)."""
import pytest

import speedrun.errors as errors
from speedrun.errors import QUIET_RANK_GRACE_S, OneLineErrorParser


@pytest.mark.parametrize("world_size, rank, waits, prints", [
    ("2", "1", True, False),  # the quiet rank of a 2-rank run
    ("2", "0", False, True),  # the reporting rank: prints, exits at once
    ("1", "0", False, True),  # one process
])
def test_only_a_quiet_rank_waits_before_it_exits(monkeypatch, capsys, world_size, rank, waits, prints):
    waited = []
    monkeypatch.setattr(errors.time, "sleep", waited.append)
    monkeypatch.setenv("WORLD_SIZE", world_size)
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as ended:
        OneLineErrorParser(prog="train").parse_args(["--no-such-flag"])
    assert ended.value.code == 2 and waited == ([QUIET_RANK_GRACE_S] if waits else [])
    assert ("error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err) == prints
