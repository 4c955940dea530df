"""Where the test suite's time goes: groups the per-test cost lines that SPEEDRUN_TEST_COSTS=PATH makes the suite
write (tests/cost_meter.py) by what each test started, and prints the groups, the files and the slowest tests.

    SPEEDRUN_TEST_COSTS=/tmp/costs.jsonl ./run.sh test
    python benchmarks/suite_costs.py /tmp/costs.jsonl [--top 25]

CPU minutes (the test process and every child it waited for) are the figure to compare between runs: unlike wall
time they hardly move when the machine is shared. Wall minutes are summed per test, so with N workers the suite's
wall time is about their sum over N."""
import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cost_meter import KINDS  # noqa: E402


def read_costs(path):
    lines = []
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            raise SystemExit(f"suite_costs: {path} line {number} is not a cost line (JSON): {text[:80]!r}")
    if not lines:
        raise SystemExit(f"suite_costs: {path} holds no cost lines (was the suite run with SPEEDRUN_TEST_COSTS?)")
    return lines


def cpu_minutes(line):
    return (line["cpu_s"] + line["child_cpu_s"]) / 60


def table(rows, header):
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r) for r in [header, *rows])


def grouped(lines, key):
    groups = defaultdict(list)
    for line in lines:
        groups[key(line)].append(line)
    return groups


def summary_rows(groups, order=None):
    total = sum(cpu_minutes(line) for g in groups.values() for line in g) or 1.0
    names = order or sorted(groups, key=lambda k: -sum(map(cpu_minutes, groups[k])))
    rows = []
    for name in names:
        if name not in groups:
            continue
        g = groups[name]
        cpu = sum(map(cpu_minutes, g))
        rows.append((name, len(g), f"{cpu:.1f}", f"{100 * cpu / total:.0f}%", f"{sum(x['wall_s'] for x in g) / 60:.1f}",
                     f"{max(x['wall_s'] for x in g):.0f}"))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("costs", help="the JSON-lines file SPEEDRUN_TEST_COSTS named")
    parser.add_argument("--top", type=int, default=25, help="how many of the slowest tests and files to list")
    args = parser.parse_args(argv)
    lines = read_costs(args.costs)
    header = ("group", "tests", "CPU-min", "share", "wall-min", "max wall-s")
    print(f"{len(lines)} tests, {sum(map(cpu_minutes, lines)):.1f} CPU-minutes, "
          f"{sum(x['wall_s'] for x in lines) / 60:.1f} wall-minutes summed over tests\n")
    print("By what the test starts (a test counts under the most expensive kind it started):")
    print(table(summary_rows(grouped(lines, lambda x: x["kind"]), KINDS), header))
    print("\nBy file:")
    files = summary_rows(grouped(lines, lambda x: x["test"].split("::")[0]))
    print(table(files[:args.top], ("file",) + header[1:]))
    print(f"\nThe {args.top} tests of most CPU:")
    slowest = sorted(lines, key=cpu_minutes, reverse=True)[:args.top]
    print(table([(x["test"], x["kind"], f"{cpu_minutes(x) * 60:.0f}", f"{x['wall_s']:.0f}") for x in slowest],
                ("test", "kind", "CPU-s", "wall-s")))
    failed = [x["test"] for x in lines if x["outcome"] == "failed"]
    if failed:
        print(f"\n{len(failed)} failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
