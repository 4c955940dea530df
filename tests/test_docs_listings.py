"""The docs show some project files whole (docs/adding-a-study.md walks through a shipped study's files so that a
contributor reads one page): each listing, marked `<!-- listing: PATH -->` above its code fence, must be that file
as it is in the repository."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LISTING = re.compile(r"<!-- listing: (\S+) -->\n```\w*\n(.*?)\n```\n", re.S)


def listings(doc_text):
    return [(path, body) for path, body in LISTING.findall(doc_text)]


def test_listing_parser_reads_the_block_after_the_marker():
    text = "intro\n<!-- listing: a/b.py -->\n```python\nx = 1\n\ny = 2\n```\nafter\n```python\nz\n```\n"
    assert listings(text) == [("a/b.py", "x = 1\n\ny = 2")]


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_listing_is_the_file_it_names(doc):
    for path, body in listings(doc.read_text()):
        shown = ROOT / path
        assert shown.is_file(), f"{doc.name} lists {path}, which does not exist"
        assert body == shown.read_text().rstrip("\n"), f"{doc.name}: the listing of {path} differs from the file"


def test_adding_a_study_shows_every_file_a_contributor_writes():
    found = {path for path, _ in listings((ROOT / "docs" / "adding-a-study.md").read_text())}
    assert found == {"speedrun/gated_skip.py", "ablations/gated-skip.toml", "tests/speedrun/test_gated_skip.py"}
