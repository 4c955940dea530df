"""data/cached_fineweb10B.py against local stand-ins for the Hugging Face Hub (no network)."""

import hashlib
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from data import cached_fineweb10B as downloader
from data.cached_fineweb10B import FetchError, HubUnreachable, download, shard_files
from data.shard_format import load_tokens, validate_shard, write_shard

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "data" / "cached_fineweb10B.py"


def make_remote(folder, num_train):
    folder.mkdir()
    for index, name in enumerate(shard_files(num_train)):
        write_shard(folder / name, np.arange(index, index + 50 + index, dtype=np.uint16))
    return folder


def corrupt(path):
    """Cuts the last token off: the header then promises more than the file holds."""
    path.write_bytes(path.read_bytes()[:-2])


class FolderHub:
    """fetch() stand-in: copies from a local folder and records what was asked for."""

    def __init__(self, folder):
        self.folder, self.calls = folder, []

    def __call__(self, filename, directory):
        self.calls.append(filename)
        source = self.folder / filename
        if not source.exists():
            raise FetchError(f"{filename}: no such file in the dataset")
        return Path(shutil.copy(source, directory / filename))


def online():
    return None


class Recorder:
    def __init__(self):
        self.log, self.errors = [], []

    def kwargs(self):
        return {"log": self.log.append, "error": self.errors.append}


def test_fresh_download_then_idempotent(tmp_path):
    hub = FolderHub(make_remote(tmp_path / "remote", 2))
    out = tmp_path / "fineweb10B"
    rec = Recorder()
    assert download(2, out, fetch=hub, connection_problem=online, **rec.kwargs()) == 0
    assert hub.calls == ["fineweb_val_000000.bin", "fineweb_train_000001.bin", "fineweb_train_000002.bin"]
    for name in hub.calls:
        assert (out / name).read_bytes() == (hub.folder / name).read_bytes()
    assert any("downloading fineweb_train_000002.bin" in line for line in rec.log)
    assert rec.errors == []

    hub.calls.clear()
    # Everything present and valid: no fetch, and no network needed at all.
    assert download(2, out, fetch=hub, connection_problem=lambda: "offline", **rec.kwargs()) == 0
    assert hub.calls == [] and rec.errors == []


def test_corrupt_local_file_is_fetched_again(tmp_path):
    hub = FolderHub(make_remote(tmp_path / "remote", 2))
    out = tmp_path / "d"
    download(2, out, fetch=hub, connection_problem=online, log=lambda m: None)
    corrupt(out / "fineweb_train_000001.bin")
    hub.calls.clear()
    rec = Recorder()
    assert download(2, out, fetch=hub, connection_problem=online, **rec.kwargs()) == 0
    assert hub.calls == ["fineweb_train_000001.bin"]
    assert validate_shard(out / "fineweb_train_000001.bin") == 51
    assert any("present but invalid" in line for line in rec.log)


def test_corrupt_download_is_removed_and_reported(tmp_path):
    remote = make_remote(tmp_path / "remote", 2)
    corrupt(remote / "fineweb_train_000002.bin")
    out = tmp_path / "d"
    rec = Recorder()
    assert download(2, out, fetch=FolderHub(remote), connection_problem=online, **rec.kwargs()) == 1
    assert not (out / "fineweb_train_000002.bin").exists()
    assert validate_shard(out / "fineweb_train_000001.bin") == 51  # the good ones are kept
    corrupt_lines = [e for e in rec.errors if "fineweb_train_000002.bin" in e]
    assert len(corrupt_lines) == 1 and "corrupt" in corrupt_lines[0] and "\n" not in corrupt_lines[0]


def test_missing_remote_file_is_reported(tmp_path):
    hub = FolderHub(make_remote(tmp_path / "remote", 1))
    rec = Recorder()
    assert download(2, tmp_path / "d", fetch=hub, connection_problem=online, **rec.kwargs()) == 1
    assert any("fineweb_train_000002.bin" in e and "no such file" in e for e in rec.errors)
    assert validate_shard(tmp_path / "d" / "fineweb_train_000001.bin") == 51


def test_no_network_gives_one_line_and_fetches_nothing(tmp_path):
    hub = FolderHub(make_remote(tmp_path / "remote", 1))
    rec = Recorder()
    assert download(1, tmp_path / "d", fetch=hub, connection_problem=lambda: "cannot connect to x:443",
                    **rec.kwargs()) == 1
    assert hub.calls == []
    assert rec.errors == ["cannot reach the Hugging Face Hub: cannot connect to x:443"]


def test_connection_lost_midway_stops(tmp_path):
    calls = []

    def dropping_fetch(filename, directory):
        calls.append(filename)
        raise HubUnreachable(f"{filename}: cannot connect to the Hugging Face Hub; check the network")

    rec = Recorder()
    assert download(3, tmp_path / "d", fetch=dropping_fetch, connection_problem=online, **rec.kwargs()) == 1
    assert calls == ["fineweb_val_000000.bin"] and len(rec.errors) == 1


def test_hub_fetch_maps_connection_failure(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.utils import LocalEntryNotFoundError

    def offline_download(**kwargs):
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub ...")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline_download)
    with pytest.raises(HubUnreachable, match="fineweb_val_000000.bin: cannot connect"):
        downloader.hub_fetch("fineweb_val_000000.bin", tmp_path)


# --- The real huggingface_hub client against a stand-in hub served on the loopback interface ---

class StandInHub(http.server.ThreadingHTTPServer):
    """Answers the hub's file URLs (/datasets/<repo>/resolve/<rev>/<file>) from a local folder."""

    def __init__(self, folder):
        self.folder, self.downloads = folder, []
        super().__init__(("127.0.0.1", 0), _StandInHandler)


class _StandInHandler(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self._answer(send_body=False)

    def do_GET(self):
        self._answer(send_body=True)

    def _answer(self, send_body):
        prefix = f"/datasets/{downloader.REPO_ID}/resolve/"
        name = self.path.split("?")[0][len(prefix):].split("/", 1)[-1] if self.path.startswith(prefix) else ""
        path = self.server.folder / name
        if not name or not path.is_file():
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = path.read_bytes()
        self.send_response(200)
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
        self.send_header("X-Repo-Commit", "0" * 40)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if send_body:
            self.server.downloads.append(name)
            self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in_hub(tmp_path):
    hub = StandInHub(make_remote(tmp_path / "remote", 2))
    thread = threading.Thread(target=hub.serve_forever, daemon=True)
    thread.start()
    yield hub
    hub.shutdown()
    hub.server_close()


def run_downloader(args, endpoint, tmp_path, as_module=False):
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_DISABLE_TELEMETRY="1",
               NO_PROXY="127.0.0.1,localhost",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "data.cached_fineweb10B"] if as_module else [sys.executable, str(SCRIPT)]
    return subprocess.run(command + args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_script_with_real_client_against_stand_in_hub(stand_in_hub, tmp_path):
    """Guards: the script with the real huggingface_hub client over HTTP: fetches, skips held files, names bad ones."""
    endpoint = f"http://127.0.0.1:{stand_in_hub.server_address[1]}"
    out = tmp_path / "fineweb10B"
    first = run_downloader(["1", "--dir", str(out)], endpoint, tmp_path)
    assert first.returncode == 0, first.stderr
    assert stand_in_hub.downloads == ["fineweb_val_000000.bin", "fineweb_train_000001.bin"]
    assert load_tokens(out / "fineweb_train_000001.bin").tolist() == list(range(1, 52))

    second = run_downloader(["1", "--dir", str(out)], endpoint, tmp_path, as_module=True)
    assert second.returncode == 0, second.stderr
    assert stand_in_hub.downloads == ["fineweb_val_000000.bin", "fineweb_train_000001.bin"]  # nothing new

    corrupt(stand_in_hub.folder / "fineweb_train_000002.bin")
    third = run_downloader(["3", "--dir", str(out)], endpoint, tmp_path)
    assert third.returncode == 1
    assert "Traceback" not in third.stderr
    errors = [line for line in third.stderr.splitlines() if line.startswith("error:")]
    assert any("fineweb_train_000002.bin" in line and "corrupt" in line for line in errors)
    assert any("fineweb_train_000003.bin" in line and "no such file" in line for line in errors)
    assert not (out / "fineweb_train_000002.bin").exists()


@pytest.mark.slow
def test_script_without_network_says_so_in_one_line(tmp_path):
    """Guards: the script, real client, refused connection: one line saying that it cannot reach the Hub."""
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_downloader(["1", "--dir", str(tmp_path / "d")], f"http://127.0.0.1:{port}", tmp_path)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "cannot reach the Hugging Face Hub" in result.stderr and "Traceback" not in result.stderr


def test_help_names_both_tracks(capsys):
    with pytest.raises(SystemExit):
        downloader.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "cached_fineweb10B.py 9" in text and "30" in text and "2.93B" in text


def test_negative_count_is_a_flag_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        downloader.main(["-2"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: N must be 0 or more"), err  # the shared parser
