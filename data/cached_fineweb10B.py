"""Download the GPT-2 token shards of FineWeb10B from the Hugging Face Hub (dataset kjj0/fineweb10B-gpt2).

    python data/cached_fineweb10B.py 9      # small track: the val shard + 9 train shards (900M tokens)
    python data/cached_fineweb10B.py 30     # medium track: it reads ~2.93B train tokens

Files land in data/fineweb10B/ (next to this script), where the training scripts look by default. A file that
is already present and valid is not fetched again; every file is checked (header and size) after download.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

if __package__ in (None, ""):  # run as a file: make the `data` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data._cli import ArgumentParser
from data.shard_format import ShardError, validate_shard
from data.shards import shard_name

REPO_ID = "kjj0/fineweb10B-gpt2"
DEFAULT_DIR = Path(__file__).resolve().parent / "fineweb10B"
ALL_TRAIN_SHARDS = 103  # the whole of FineWeb10B, 100M tokens per shard
PROBE_TIMEOUT_S = 5.0
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


class FetchError(Exception):
    """One file could not be fetched; the message is one line."""


class HubUnreachable(FetchError):
    """No connection to the hub: further files would fail the same way."""


def shard_files(num_train: int) -> list[str]:
    """The val shard, then train shards 1..num_train."""
    return [shard_name("fineweb", index) for index in range(num_train + 1)]


def hub_fetch(filename: str, directory: Path) -> Path:
    """Downloads one file of the dataset repo into `directory` (huggingface_hub shows its own progress bar)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        return Path(hf_hub_download(repo_id=REPO_ID, filename=filename, repo_type="dataset", local_dir=directory))
    # LocalEntryNotFoundError is what the hub raises when it cannot connect; it subclasses EntryNotFoundError.
    except LocalEntryNotFoundError:
        raise HubUnreachable(f"{filename}: cannot connect to the Hugging Face Hub; check the network") from None
    except (EntryNotFoundError, RepositoryNotFoundError):
        raise FetchError(f"{filename}: no such file in the dataset {REPO_ID}") from None
    except HfHubHTTPError as e:
        raise FetchError(f"{filename}: the hub answered with an error: {_first_line(e)}") from None
    except OSError as e:
        raise HubUnreachable(f"{filename}: download failed: {_first_line(e)}") from None
    except Exception as e:  # the HTTP client's own errors (connection reset, timeout) vary between versions
        raise FetchError(f"{filename}: download failed: {type(e).__name__}: {_first_line(e)}") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def hub_connection_problem() -> str | None:
    """A quick TCP check of the hub endpoint, so that an offline machine gets one line at once instead of
    the hub client's retries. None when the hub looks reachable (or a proxy is configured, which a direct
    connection cannot judge)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    url = urlparse(constants.ENDPOINT)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        return f"cannot connect to {host}:{port} ({e.strerror or e}); check the network"
    return None


def download(num_train: int, directory, *, fetch: Callable[[str, Path], Path] = hub_fetch,
             connection_problem: Callable[[], str | None] = hub_connection_problem,
             log: Callable[[str], None] = print, error: Callable[[str], None] | None = None) -> int:
    """Makes `directory` hold valid copies of the val shard and train shards 1..num_train. Returns the exit
    status: 0 when all are there, 1 when some could not be fetched (each reported in one line)."""
    if error is None:
        def error(message: str) -> None:
            print(f"error: {message}", file=sys.stderr, flush=True)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = shard_files(num_train)
    missing = []
    for name in names:
        path = directory / name
        if not path.exists():
            missing.append(name)
            continue
        try:
            log(f"{name}: present, {validate_shard(path):,} tokens")
        except ShardError as e:
            log(f"{name}: present but invalid, fetching it again ({e})")
            path.unlink()
            missing.append(name)
    if not missing:
        log(f"all {len(names)} files present and valid in {directory}")
        return 0
    problem = connection_problem()
    if problem:
        error(f"cannot reach the Hugging Face Hub: {problem}")
        return 1
    failures = 0
    for number, name in enumerate(missing, start=1):
        log(f"[{number}/{len(missing)}] downloading {name} from {REPO_ID}")
        try:
            path = fetch(name, directory)
        except HubUnreachable as e:
            error(str(e))
            return 1
        except FetchError as e:
            error(str(e))
            failures += 1
            continue
        try:
            log(f"{name}: ok, {validate_shard(path):,} tokens")
        except ShardError as e:
            path.unlink(missing_ok=True)
            error(f"{name}: the downloaded file is corrupt and was removed; run again to retry ({e})")
            failures += 1
    if failures:
        error(f"{failures} of {len(missing)} files could not be fetched into {directory}")
        return 1
    log(f"all {len(names)} files present and valid in {directory}")
    return 0


def make_arg_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python data/cached_fineweb10B.py",
        description=f"Download GPT-2 token shards of FineWeb10B (Hugging Face dataset {REPO_ID}): "
                    "fineweb_val_000000.bin and fineweb_train_000001.bin .. fineweb_train_<N>.bin, 100M tokens "
                    "each. Present files that validate are kept; every download is checked.",
        epilog="How many: the small track (train_gpt.py) needs 9 train shards: `python data/cached_fineweb10B.py 9`. "
               "The medium track (train_gpt_medium.py) reads about 2.93B train tokens: about 30 shards "
               "(2.93B / 100M per shard): `python data/cached_fineweb10B.py 30`.",
    )
    parser.add_argument("num_train", nargs="?", type=int, default=ALL_TRAIN_SHARDS, metavar="N",
                        help=f"number of train shards (default {ALL_TRAIN_SHARDS}: all of FineWeb10B, ~10B tokens)")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR,
                        help="download folder (default: data/fineweb10B next to this script)")
    return parser


def main(argv=None) -> int:
    parser = make_arg_parser()
    args = parser.parse_args(argv)
    if args.num_train < 0:
        parser.error(f"N must be 0 or more, got {args.num_train}")
    try:
        return download(args.num_train, args.dir, log=lambda message: print(message, flush=True))
    except OSError as e:
        print(f"error: {e.filename or args.dir}: {e.strerror}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
