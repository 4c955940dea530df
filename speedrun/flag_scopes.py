"""Which flags belong to whom, read both by the command line (speedrun/cli.py) and by the export (speedrun/export.py).
They live apart from both because cli.py starts the export and the export reads these: one module importing the
other both ways would be an import cycle (tests/test_import_graph.py)."""

# What one base of the medium track alone runs: the other refuses it in one line (train_gpt_medium.py says why), and a
# file exported for the other does not offer it (speedrun/export.py, having checked that the modular script refuses
# it there: docs/export.md, rule 12). A flag: {flag: that base} (r18 has #18's depth alone).
BASE_ONLY_FLAGS = {"--attention": "r18", "--num-layers": "r14"}
# Choices of a shared flag, cut from its choices=[...]: {flag: {choice: that base}}.
BASE_ONLY_CHOICES = {"--compile": {"regional": "r14"}}


def choices_help(summary, **notes):
    """A flag's help: its summary, then a note for each choice (a keyword) that needs one. A file that does not offer
    a choice leaves its note out with it (speedrun/export.py, cut_choices): its --help explains only what it runs."""
    return " ".join([summary] + [f"{choice}: {note}" for choice, note in notes.items()])

# The export's own flags: a run's config has no field for them, and a run does not import the export (its log would
# embed that module); in an exported file's parser for --help alone.
EXPORT_ONLY_FLAGS = ("--export-script", "--from-log", "--force", "--export-check-dir")
