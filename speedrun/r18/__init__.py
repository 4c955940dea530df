"""Record #18 (medium, 2025-12-31) as a base: its token-window document attention and its model. Not yet wired to
the training scripts (no --base r18 flag): a subpackage so runs of the #14 and small tracks log exactly the modules
they use."""
