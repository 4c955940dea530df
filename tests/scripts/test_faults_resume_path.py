"""The training script under the faults of issue 43: --resume naming a folder is called a folder."""

import train_gpt_medium as T
from test_faults_training import TINY, data_flags, one_error_line


def test_resume_naming_a_folder_says_it_is_a_folder(tmp_path, capsys):
    folder = tmp_path / "ck"
    folder.mkdir()
    assert T.main([*TINY, *data_flags(tmp_path / "data"), "--resume", str(folder)]) == 2
    assert one_error_line(capsys) == f"error: --resume {folder}: a folder, not a checkpoint file"
    assert T.main([*TINY, *data_flags(tmp_path / "data"), "--resume", str(tmp_path / "none.pt")]) == 2
    assert one_error_line(capsys) == f"error: --resume: no such file {tmp_path / 'none.pt'}"
