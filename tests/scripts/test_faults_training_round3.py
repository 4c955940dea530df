"""The training script under the faults of issue 36: a choice of attention that cannot train here refused in one
line before any log."""

import train_gpt_medium as T
from test_faults_training import TINY, data_flags, one_error_line


def test_flex_attention_on_cpu_is_refused_in_one_line_before_any_log(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(T.torch.cuda, "is_available", lambda: False)
    rc = T.main([*TINY, *data_flags(tmp_path / "data"), "--base", "r18", "--attention", "flex", "--num-iterations",
                 "2", "--log-dir", str(tmp_path / "logs")])
    assert rc == 2
    line = one_error_line(capsys)
    assert "--attention flex: FlexAttention has no backward on CPU" in line and "use sdpa" in line
    assert not (tmp_path / "logs").exists()
