"""The study runner under the faults of issue 36: a flag left at `auto` and logged as what it resolved to is not
an edit."""

import train_gpt_medium as T
from ablations.staleness import ConfigCheck
from ablations.study import load_study


def test_an_auto_attention_logged_as_its_kernel_is_not_stale(tmp_path):
    study = load_study("r18-record")
    check = ConfigCheck(T, study, tmp_path)
    run = study.runs(tmp_path)[0]
    expected = check.expected(run)
    assert expected["attention"] == "auto"
    for logged in ("sdpa", "fa3", "flex to step 400, then fa3"):
        assert check.difference(run, dict(expected, attention=logged)) is None
    asking_sdpa = study.runs(tmp_path)[0]  # a kernel the study names is still compared
    asking_sdpa.flags = [*asking_sdpa.flags, "--attention", "sdpa"]
    assert "--attention fa3, the study now asks sdpa" in check.difference(asking_sdpa, dict(expected, attention="fa3"))
