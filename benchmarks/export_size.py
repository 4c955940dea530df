"""Benchmark: how big a single-file export (--export-script) is against the upstream record it reproduces.

Per file: lines by kind (code, docstring, comment, blank), functions and classes, and for an export the lines and
code lines of each inlined section (`# speedrun/x.py` comments). Upstream records are read from their logs (the
code section that opens each log, as every upstream record log carries its script):

    python train_gpt_medium.py --export-script /tmp/r14.py
    python benchmarks/export_size.py /tmp/r14.py --upstream RECORD_LOG.txt

--upstream-without FIRST LAST also counts each upstream record less its top-level definitions FIRST..LAST (with the
comments above them): #18 less its Triton/FP8 kernels is `--upstream-without mm_op ba_plus_cAA`. --diff A B counts
the lines B adds and removes against A (a study's record file against the baseline's), section by section.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from speedrun.logformat import code_section  # noqa: E402  (after the path: run from anywhere)

# a module's section, or one of the script's (`# train_gpt_medium.py: Model ---`: each its own)
SECTION = re.compile(r"^# ((?:speedrun|data)/\S+\.py|train_gpt\w*\.py(?:: [A-Z][a-z]*(?: [a-z]+)*)?)")
KINDS = ("code", "doc", "comment", "blank")


def line_kinds(text):
    """The kind of each line of a Python source."""
    tree = ast.parse(text)
    doc = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and ast.get_docstring(node):
            doc.update(range(node.body[0].lineno - 1, node.body[0].end_lineno))
    kinds = []
    for i, line in enumerate(text.rstrip("\n").split("\n")):
        stripped = line.strip()
        kinds.append("blank" if not stripped else "doc" if i in doc else "comment" if stripped.startswith("#")
                     else "code")
    return kinds, tree


def describe(name, text, sections=False):
    kinds, tree = line_kinds(text)
    functions = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in ast.walk(tree))
    classes = sum(isinstance(n, ast.ClassDef) for n in ast.walk(tree))
    out = [f"{name}: {len(kinds)} lines ({', '.join(f'{k} {kinds.count(k)}' for k in KINDS)}), "
           f"{functions} functions, {classes} classes"]
    if sections:
        lines = text.rstrip("\n").split("\n")
        starts = [i for i, line in enumerate(lines) if SECTION.match(line)]
        for start, end in zip(starts, starts[1:] + [len(lines)]):
            part = kinds[start:end]
            out.append(f"    {SECTION.match(lines[start]).group(1):36s} {end - start:5d} lines, "
                       f"{part.count('code'):4d} code")
    return out, len(kinds)


def without_definitions(text, first, last):
    """The source less its top-level statements from the definition `first` through the definition `last`, with the
    comment and blank lines right above `first`; None where either is not a top-level definition."""
    body = ast.parse(text).body
    names = [getattr(node, "name", None) for node in body]
    if first not in names or last not in names:
        return None
    start, end = body[names.index(first)], body[names.index(last)]
    lines = text.rstrip("\n").split("\n")
    top = min([start.lineno] + [d.lineno for d in start.decorator_list]) - 1
    while top > 0 and (not lines[top - 1].strip() or lines[top - 1].startswith("#")):
        top -= 1
    return "\n".join(lines[:top] + lines[end.end_lineno:]) + "\n"


def sections_of(text):
    """{section name: its lines} of an export (the lines above the first section under ""), in order."""
    found, name = {"": []}, ""
    for line in text.rstrip("\n").split("\n"):
        match = SECTION.match(line)
        if match:
            name = match.group(1)
            found[name] = []
        found[name].append(line)
    return found


def diff_counts(before, after):
    """(lines added, lines removed) from `before` to `after`, section by section: a module the export places
    elsewhere (its imports reached in another order) is no change."""
    old, new = sections_of(before), sections_of(after)
    added = removed = 0
    for name in dict.fromkeys([*old, *new]):
        for line in difflib.unified_diff(old.get(name, []), new.get(name, []), lineterm="", n=0):
            if line[:3] not in ("+++", "---"):
                added += line.startswith("+")
                removed += line.startswith("-")
    return added, removed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("exports", nargs="+", type=Path, help="exported files")
    p.add_argument("--upstream", nargs="*", type=Path, default=[], help="upstream record logs")
    p.add_argument("--upstream-without", nargs=2, metavar=("FIRST", "LAST"),
                   help="also count each upstream record less its top-level definitions FIRST..LAST")
    p.add_argument("--diff", nargs=2, type=Path, metavar=("A", "B"), help="lines B adds and removes against A")
    args = p.parse_args(argv)
    for log in args.upstream:
        code = code_section(log.read_bytes())
        if code is None:
            sys.exit(f"error: {log}: no code section (not a run log)")
        print("\n".join(describe(f"upstream {log.name}", code)[0]))
        if args.upstream_without:
            cut = without_definitions(code, *args.upstream_without)
            if cut is not None:
                print("\n".join(describe(f"upstream {log.name} less {'..'.join(args.upstream_without)}", cut)[0]))
    for path in args.exports:
        print("\n".join(describe(str(path), path.read_text(), sections=True)[0]))
    if args.diff:
        added, removed = diff_counts(*(path.read_text() for path in args.diff))
        print(f"{args.diff[1]} against {args.diff[0]}: +{added} -{removed} lines")


if __name__ == "__main__":
    main()
