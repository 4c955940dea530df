"""Sets of shard files of GPT-2 tokens (the file format itself: data/shard_format.py): names, manifests, finding and
checking them.

    python -m data.shards FILE...    validate each file as training reads it (header, size, at least one token,
                                     every id inside GPT-2's vocabulary), print `path: N tokens`; exit 2 at the
                                     first bad one (also when a manifest next to them lists a shard that is
                                     missing or altered)
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

import numpy as np

from data._cli import ArgumentParser
from data.shard_format import ShardError, read_tokens_into, validate_nonempty_shard, validate_shard


def manifest_path(folder, prefix: str) -> Path:
    """`<prefix>_manifest.json`: written last by data/tokenize_text.py, so its presence marks a complete set."""
    return Path(folder) / f"{prefix}_manifest.json"


def write_manifest(folder, prefix: str, shards: list[Path]) -> Path:
    """Records every shard of a finished set (name, tokens, bytes) next to them; returns the manifest's path."""
    entries = [{"name": Path(p).name, "tokens": validate_shard(p), "bytes": Path(p).stat().st_size} for p in shards]
    path = manifest_path(folder, prefix)
    temp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    temp.write_text(json.dumps({"prefix": prefix, "shards": entries}, indent=1) + "\n")
    os.replace(temp, path)
    return path


def check_manifest(paths) -> None:
    """For shards that have a manifest next to them (same folder, same prefix): ShardError unless every shard it
    lists is there with its recorded size. Shards without a manifest (downloaded ones) are not checked here."""
    groups: dict[Path, list[Path]] = {}
    for path in map(Path, paths):
        prefix = path.name.rsplit("_", 2)[0]
        groups.setdefault(manifest_path(path.parent, prefix), []).append(path)
    for manifest in groups:
        if not manifest.exists():
            continue
        try:
            entries = json.loads(manifest.read_text())["shards"]
            expected = {entry["name"]: int(entry["bytes"]) for entry in entries}
        except (OSError, ValueError, KeyError, TypeError):
            raise ShardError(f"{manifest}: unreadable manifest; tokenise again with --overwrite") from None
        for name, size in expected.items():
            shard = manifest.parent / name
            actual = shard.stat().st_size if shard.exists() else None
            if actual != size:
                problem = "is missing" if actual is None else f"has {actual} bytes, the manifest says {size}"
                raise ShardError(f"{shard} {problem} ({manifest.name} lists it): an incomplete or altered set")


def shard_name(prefix: str, index: int) -> str:
    """Upstream naming: index 0 is the validation shard, 1, 2, ... are training shards."""
    split = "val" if index == 0 else "train"
    return f"{prefix}_{split}_{index:06d}.bin"


def find_shards(pattern) -> list[Path]:
    """Files matching the glob `pattern`, sorted by path; ShardError when nothing matches."""
    pattern = str(pattern)
    matches = sorted(Path(p) for p in glob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not matches:
        raise ShardError(f"{pattern}: no shard files match this pattern")
    return matches


def _paths_from_args(args: list[str]) -> list[Path]:
    paths = []
    for arg in args:
        # A pattern the shell left unexpanded (nothing matched) still gets a clear message.
        paths.extend(find_shards(arg) if glob.has_magic(arg) else [Path(arg)])
    return paths


def main(argv=None) -> int:
    parser = ArgumentParser(
        prog="python -m data.shards",
        description="Validate token shard files as training reads them (header, magic, version, size, at least one "
                    "token, ids below 50257); print `path: N tokens` for each.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="shard files or glob patterns")
    args = parser.parse_args(argv)
    try:
        paths = _paths_from_args(args.files)
        check_manifest(paths)
        for path in paths:
            count = validate_nonempty_shard(path)
            read_tokens_into(path, count, np.empty(count, dtype=np.uint16))
            print(f"{path}: {count} tokens", flush=True)
    except ShardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
