"""Plain-text and Markdown tables, and number formatting where a missing value shows as '-'."""
from __future__ import annotations

import math

MISSING = "-"


def num(value, digits: int = 4, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:+d}" if signed else str(value)
    if isinstance(value, float):
        return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return str(value)


def pval(value) -> str:
    """p-values: 4 significant digits, scientific below 1e-4 so small ones stay readable."""
    if value is None:
        return MISSING
    return f"{value:.3e}" if value < 1e-4 else f"{value:.4g}"


def interval(bounds, digits: int = 4) -> str:
    if not bounds or bounds[0] is None or bounds[1] is None:
        return MISSING
    return f"[{bounds[0]:+.{digits}f}, {bounds[1]:+.{digits}f}]"


def integer_like(value) -> str:
    """Counts such as parameters or FLOPs read from logs: thousands separators when numeric."""
    if value is None:
        return MISSING
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(number):
        return MISSING
    if abs(number) >= 1000:  # whole counts, one style per column: a mean of counts is rounded, never 3.1e+04
        return f"{round(number):,}"
    return f"{number:.4g}"


def one_line(text: str) -> str:
    """Text with its line breaks and other control characters shown as escapes (a variant name read from a log may
    hold any): a table row or a report line stays one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def table(headers, rows, markdown: bool = False) -> str:
    cells = [[one_line(h) for h in headers]] + [[one_line(c) for c in row] for row in rows]
    if markdown:  # a | inside a cell would end it
        cells = [[c.replace("|", "\\|") for c in row] for row in cells]
        lines = ["| " + " | ".join(cells[0]) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells[1:]]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
