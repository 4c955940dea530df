"""Tokenise local text into GPT-2 token shards (the format of data/shards.py).

    python -m data.tokenize_text INPUT... --out-dir DIR [--prefix NAME] [--val-tokens N] [--shard-tokens N]

Inputs: plain text files (one document per file, or with --split-blank-lines one document per block of lines
separated by blank lines) and JSON-lines files (*.jsonl, *.ndjson: one JSON object per line, the document in
--text-field). Every document starts with the <|endoftext|> token 50256, as in the FineWeb shards. The token
stream is cut into `<prefix>_val_000000.bin` (the first --val-tokens tokens, as upstream puts validation first)
and then `<prefix>_train_000001.bin`, ... of --shard-tokens tokens each; a document may straddle two shards.

The GPT-2 BPE ranks come from data/gpt2.tiktoken, shipped with the project (see data/README.md), so no network
access is needed; the encoding built from it is tiktoken's "gpt2" encoding.
"""

from __future__ import annotations

import base64
import collections
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

if __package__ in (None, ""):  # run as a file: make the `data` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data._cli import ArgumentParser, file_problem
from data.shard_format import GPT2_VOCAB, ShardError, write_shard
from data.shards import manifest_path, shard_name, write_manifest

EOT_TOKEN = 50256
GPT2_RANKS_FILE = Path(__file__).resolve().with_name("gpt2.tiktoken")
# The same bytes as tiktoken's r50k_base.tiktoken, whose ranks are those of tiktoken's "gpt2" encoding.
GPT2_RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
# GPT-2's pre-tokeniser split, in the form tiktoken uses for its gpt2 / r50k_base encodings.
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
JSONL_SUFFIXES = (".jsonl", ".ndjson")
DEFAULT_SHARD_TOKENS = 100_000_000
# What the speedrun's validation reads (10,485,760), and the 2 tokens more its stream needs in the shard: the target
# of the last step and one to spare (upstream's stream moves to the next shard while a step would reach its end).
DEFAULT_VAL_TOKENS = 10_485_760 + 2
BATCH_CHARS = 1 << 20  # work handed to a worker at a time


class InputError(ValueError):
    """Unusable input; the message is one line naming the file (and line) or flag."""


@functools.lru_cache(maxsize=None)
def gpt2_encoding():
    """tiktoken's GPT-2 encoding, built from the shipped ranks file (works offline, no download wait)."""
    import tiktoken

    raw = GPT2_RANKS_FILE.read_bytes()
    if hashlib.sha256(raw).hexdigest() != GPT2_RANKS_SHA256:
        raise InputError(f"{GPT2_RANKS_FILE}: contents differ from the GPT-2 ranks file (sha256 mismatch)")
    ranks = {}
    for line in raw.splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_TOKEN},
        explicit_n_vocab=GPT2_VOCAB,
    )


def encode_documents(texts: list[str]) -> np.ndarray:
    """Concatenated tokens of `texts`, each document preceded by EOT_TOKEN. Text that spells
    "<|endoftext|>" is encoded as ordinary text, never as the special token."""
    encoding = gpt2_encoding()
    encoded = [encoding.encode_ordinary(text) for text in texts]
    out = np.empty(sum(len(tokens) + 1 for tokens in encoded), dtype=np.uint16)
    pos = 0
    for tokens in encoded:
        out[pos] = EOT_TOKEN
        out[pos + 1 : pos + 1 + len(tokens)] = tokens
        pos += len(tokens) + 1
    return out


def _read_lines(path: Path) -> Iterator[str]:
    """The lines of a UTF-8 file (newlines normalised to \\n), read as they are needed."""
    number = 0
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                yield line
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text (line {number + 1})") from None
    except OSError as e:
        raise InputError(file_problem(path, e)) from None


def blank_line_blocks(lines: Iterable[str]) -> Iterator[str]:
    """Blocks of non-blank lines, joined with \\n; lines holding only whitespace separate them."""
    block: list[str] = []
    for line in lines:
        if line.strip():
            block.append(line.rstrip("\n"))
        elif block:
            yield "\n".join(block)
            block = []
    if block:
        yield "\n".join(block)


def _jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{number}: not valid JSON ({e.msg})") from None
        if not isinstance(record, dict):
            raise InputError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        if text_field not in record:
            raise InputError(f"{path}:{number}: no field {text_field!r} (set --text-field)")
        value = record[text_field]
        if not isinstance(value, str):
            raise InputError(f"{path}:{number}: field {text_field!r} is {type(value).__name__}, not a string")
        yield value


def iter_documents(path, *, text_field: str = "text", split_blank_lines: bool = False,
                   input_format: str = "auto") -> Iterator[str]:
    """The documents of one input file, read lazily. Empty documents are skipped (they would be a lone EOT)."""
    path = Path(path)
    is_jsonl = input_format == "jsonl" or (input_format == "auto" and path.suffix.lower() in JSONL_SUFFIXES)
    if is_jsonl:
        documents = _jsonl_documents(path, text_field)
    elif split_blank_lines:
        documents = blank_line_blocks(_read_lines(path))
    else:
        documents = iter(["".join(_read_lines(path))])
    return (doc for doc in documents if doc.strip())


def _batches(documents: Iterable[str]) -> Iterator[list[str]]:
    batch, chars = [], 0
    for doc in documents:
        batch.append(doc)
        chars += len(doc)
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _spawned_pool(workers: int):
    """A pool of `workers` processes that never take Ctrl-C: it reaches the whole process group, and this process
    alone stops them. Spawned, not forked: a forked worker inherits the parent's signal handlers and any lock another
    thread held (a pool forked inside a test process once waited forever on its queue's lock)."""
    context = multiprocessing.get_context("spawn")
    ignoring = dict(initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN))
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set a disposition
        return context.Pool(workers, **ignoring)
    # Ignored while they are spawned, SIGINT stays ignored in them from their first instruction (exec keeps an
    # ignored signal so, and Python keeps it); the initializer alone left a worker still importing open to it,
    # printing a traceback. A Ctrl-C in this window of milliseconds is lost: the user presses it again.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return context.Pool(workers, **ignoring)
    finally:
        signal.signal(signal.SIGINT, previous)


def _encoded_batches(documents: Iterable[str], workers: int) -> Iterator[tuple[int, np.ndarray]]:
    """(document count, tokens) per batch, in input order."""
    if workers == 1:
        for batch in _batches(documents):
            yield len(batch), encode_documents(batch)
        return
    with _spawned_pool(workers) as pool:
        # First in, first out keeps the order; the bounded queue bounds memory.
        pending: collections.deque = collections.deque()
        for batch in _batches(documents):
            pending.append((len(batch), pool.apply_async(encode_documents, (batch,))))
            while len(pending) >= 2 * workers:
                count, result = pending.popleft()
                yield count, result.get()
        while pending:
            count, result = pending.popleft()
            yield count, result.get()


class _ShardWriter:
    """Cuts the token stream into the val shard (index 0) and train shards (1, 2, ...)."""

    def __init__(self, out_dir: Path, prefix: str, shard_tokens: int, val_tokens: int, log: Callable):
        self.out_dir, self.prefix, self.log = out_dir, prefix, log
        self.shard_tokens, self.val_tokens = shard_tokens, val_tokens
        self.index = 0 if val_tokens > 0 else 1
        self.pieces: list[np.ndarray] = []
        self.filled = 0
        self.written: list[Path] = []

    def _capacity(self) -> int:
        return self.val_tokens if self.index == 0 else self.shard_tokens

    def add(self, tokens: np.ndarray) -> None:
        while len(tokens):
            take = min(len(tokens), self._capacity() - self.filled)
            self.pieces.append(tokens[:take])
            self.filled += take
            tokens = tokens[take:]
            if self.filled == self._capacity():
                self._flush()

    def _flush(self) -> None:
        path = self.out_dir / shard_name(self.prefix, self.index)
        write_shard(path, np.concatenate(self.pieces))
        self.written.append(path)
        self.log(f"wrote {path.name}: {self.filled:,} tokens")
        self.index, self.pieces, self.filled = self.index + 1, [], 0

    def finish(self) -> list[Path]:
        if not self.written and not self.filled:
            raise InputError("the inputs hold no text (every document was empty)")
        if self.index == 0:
            raise InputError(f"the inputs hold only {self.filled:,} tokens, fewer than --val-tokens "
                             f"{self.val_tokens:,}: lower --val-tokens")
        if self.filled:
            self._flush()
        if self.index == 1:
            raise InputError("no tokens left for training after the validation split: lower --val-tokens "
                             "or add input")
        return self.written


def existing_outputs(out_dir: Path, prefix: str) -> list[Path]:
    """The shards of `prefix` in out_dir, and its manifest when there is one."""
    shards = sorted(out_dir.glob(f"{prefix}_val_*.bin")) + sorted(out_dir.glob(f"{prefix}_train_*.bin"))
    manifest = manifest_path(out_dir, prefix)
    return shards + ([manifest] if manifest.exists() else [])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_abandoned_work(out_dir: Path, prefix: str) -> None:
    """Work folders of tokenisers that were killed (their process is gone): never part of the shard set. (A
    `.<prefix>.old-<pid>` folder, old shards of a swap killed half-way, is left for a person to look at.)"""
    for folder in out_dir.glob(f".{prefix}.partial-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if folder.is_dir() and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _swap_in(staging: Path, out_dir: Path, prefix: str, written: list[Path], old: list[Path]) -> list[Path]:
    """Replaces the old shard set by the new one. The old manifest leaves first and the new one arrives last, so the
    folder never holds a manifest that does not describe its shards; until then the old files wait in a folder of
    their own, and any failure puts them back."""
    write_manifest(staging, prefix, written)
    retired = out_dir / f".{prefix}.old-{os.getpid()}"
    moved_in: list[Path] = []
    if old:
        retired.mkdir()
    try:
        for path in sorted(old, key=lambda p: p.suffix != ".json"):  # the manifest first
            os.replace(path, retired / path.name)
        for path in [*written, manifest_path(staging, prefix)]:  # the manifest last
            os.replace(path, out_dir / path.name)
            moved_in.append(out_dir / path.name)
    except BaseException:
        for path in moved_in:
            path.unlink(missing_ok=True)
        for path in retired.glob("*") if old else []:
            os.replace(path, out_dir / path.name)
        raise
    shutil.rmtree(retired, ignore_errors=True)
    return [out_dir / path.name for path in written]


def tokenize_to_shards(documents: Iterable[str], out_dir, prefix: str, *, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                       val_tokens: int = DEFAULT_VAL_TOKENS, workers: int = 1, overwrite: bool = False,
                       log: Callable = print) -> list[Path]:
    """Encodes `documents` in order and writes the shards; returns their paths (val first).

    The shards are written into a work folder inside out_dir and moved in only when all of them exist, followed by
    `<prefix>_manifest.json`, which marks the set complete. A failure or a kill leaves out_dir as it was (with
    --overwrite, the old shards stay until the new ones are in)."""
    if shard_tokens < 1:
        raise InputError(f"--shard-tokens must be at least 1, got {shard_tokens}")
    if val_tokens < 0:
        raise InputError(f"--val-tokens must be 0 or more, got {val_tokens}")
    if max(shard_tokens, val_tokens) > np.iinfo(np.int32).max:
        raise InputError("--shard-tokens and --val-tokens must fit the int32 shard header")
    if workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    out_dir = Path(out_dir)
    old = existing_outputs(out_dir, prefix)
    if old and not overwrite:
        state = ("" if manifest_path(out_dir, prefix) in old
                 else f" without {manifest_path(out_dir, prefix).name}, so possibly an unfinished set")
        raise InputError(f"{out_dir}: already holds {prefix}_*.bin shards ({old[0].name}, ...){state}; "
                         "pass --overwrite to replace them or choose another --prefix")
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_work(out_dir, prefix)
    staging = out_dir / f".{prefix}.partial-{os.getpid()}"
    staging.mkdir()
    try:
        writer = _ShardWriter(staging, prefix, shard_tokens, val_tokens, log)
        progress = _Progress(log)
        for count, tokens in _encoded_batches(documents, workers):
            progress.update(count, len(tokens))
            writer.add(tokens)
        written = _swap_in(staging, out_dir, prefix, writer.finish(), old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress.done()
    return written


class _Progress:
    def __init__(self, log: Callable, every_s: float = 2.0):
        self.log, self.every_s = log, every_s
        self.start = self.last = time.monotonic()
        self.documents = self.tokens = 0

    def update(self, documents: int, tokens: int) -> None:
        self.documents += documents
        self.tokens += tokens
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self._report(now)

    def _report(self, now: float) -> None:
        rate = self.tokens / max(now - self.start, 1e-9)
        self.log(f"tokenised {self.documents:,} documents, {self.tokens:,} tokens ({rate / 1e6:.2f}M tokens/s)")

    def done(self) -> None:
        self._report(time.monotonic())


def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def make_arg_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python -m data.tokenize_text",
        description="Tokenise plain text and JSON-lines files into GPT-2 token shards "
                    "(<prefix>_val_000000.bin, <prefix>_train_000001.bin, ...). Every document starts with token "
                    "50256.",
    )
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="text files (one document each) or JSON-lines files (*.jsonl, *.ndjson)")
    parser.add_argument("--out-dir", required=True, help="folder for the shards (created if needed)")
    parser.add_argument("--prefix", help="shard name prefix (default: the name of --out-dir)")
    parser.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto",
                        help="input format; auto: *.jsonl and *.ndjson are JSON lines, anything else text")
    parser.add_argument("--text-field", default="text", help="JSON field holding the document (default: text)")
    parser.add_argument("--split-blank-lines", action="store_true",
                        help="text files: each block of lines between blank lines is a document")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS,
                        help=f"tokens per train shard (default {DEFAULT_SHARD_TOKENS:,}, as upstream)")
    parser.add_argument("--val-tokens", type=int, default=DEFAULT_VAL_TOKENS,
                        help=f"tokens in the val shard, taken from the start of the stream (default "
                             f"{DEFAULT_VAL_TOKENS:,}: the speedrun validates on 2 fewer; a run with --val-tokens N "
                             f"needs N + 2 here; 0: no val shard)")
    parser.add_argument("--workers", type=int, default=_default_workers(),
                        help="tokeniser processes (default: every core this process may use)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace existing <prefix>_*.bin shards in --out-dir (they stay until the new set is "
                             "complete)")
    return parser


def main(argv=None) -> int:
    args = make_arg_parser().parse_args(argv)
    prefix = args.prefix or Path(args.out_dir).resolve().name
    inputs = [Path(p) for p in args.inputs]
    for path in inputs:
        if not path.is_file():
            problem = "not a regular file" if path.exists() else "no such file"
            print(f"error: {path}: {problem}", file=sys.stderr)
            return 2

    def documents() -> Iterator[str]:
        for path in inputs:
            yield from iter_documents(path, text_field=args.text_field, split_blank_lines=args.split_blank_lines,
                                      input_format=args.format)

    def log(message: str) -> None:
        print(message, flush=True)

    try:
        written = tokenize_to_shards(documents(), args.out_dir, prefix, shard_tokens=args.shard_tokens,
                                     val_tokens=args.val_tokens, workers=args.workers, overwrite=args.overwrite,
                                     log=log)
    except (InputError, ShardError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or args.out_dir}: {e.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"error: interrupted; {args.out_dir} is as it was before this run", file=sys.stderr)
        return 130
    log(f"done: {len(written)} shards and {manifest_path(Path(args.out_dir), prefix).name} in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
