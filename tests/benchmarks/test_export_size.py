"""benchmarks/export_size.py reads an export's sections as the exporter writes them."""
from conftest import ROOT, file_as_module

RULE = "# " + "-" * 114


def test_each_section_of_the_script_is_its_own(monkeypatch):
    """Guards: the script's sections (`# train_gpt.py: Model ---`) counted apart; keyed by the file name alone, the
    last one replaced the others and a line one arm's file adds in the script's model went uncounted."""
    sizes = file_as_module(ROOT / "benchmarks" / "export_size.py", monkeypatch)
    header = lambda name: f"# {name} ".ljust(len(RULE), "-")  # noqa: E731
    base = "\n".join([header("train_gpt.py: Configuration"), "A = 1", header("speedrun/model.py"), "def f():",
                      "    return 1", header("train_gpt.py: Model"), "B = 2", header("train_gpt.py: Training"),
                      "main()"]) + "\n"
    sections = sizes.sections_of(base)
    assert list(sections) == ["", "train_gpt.py: Configuration", "speedrun/model.py", "train_gpt.py: Model",
                              "train_gpt.py: Training"]
    assert sections["train_gpt.py: Model"][1:] == ["B = 2"]
    assert sizes.diff_counts(base, base.replace("B = 2", "B = 2\nC = 3")) == (1, 0)
    described, lines = sizes.describe("x.py", base, sections=True)
    assert lines == 9 and described[3].split()[:4] == ["train_gpt.py:", "Model", "2", "lines,"]
