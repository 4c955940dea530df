"""Where the test suite's time goes: groups the per-test cost lines that SPEEDRUN_TEST_COSTS=PATH makes the suite
write (tests/cost_meter.py) by what each test started, and prints the groups, the files and the slowest tests.

    SPEEDRUN_TEST_COSTS=/tmp/costs.jsonl ./run.sh test
    python benchmarks/suite_costs.py /tmp/costs.jsonl [--top 25]

`./run.sh test` meters every run (a temporary file unless SPEEDRUN_TEST_COSTS names one) and ends with --summary:
the suite's CPU-minutes, its wall time and the machine; .ci/run adds --budget and the most expensive tests.

CPU minutes (the test process and every child it waited for) are the figure to compare between runs: unlike wall
time they hardly move when the machine is shared. Wall minutes are summed per test, so with N workers the suite's
wall time is about their sum over N."""
import argparse
import json
import os
import platform
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


def machine():
    """The cores this process may use (what `nproc` counts) and the CPU's model name."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass  # not Linux
    # platform.processor() runs `uname -p`: only where /proc has no name
    return cores, model or platform.processor() or platform.machine() or "unknown CPU"


def minutes_seconds(seconds):
    return f"{int(seconds) // 60} min {int(seconds) % 60} s"


def summary(lines, wall_s):
    """One line: the tests' CPU-minutes (user+sys, each test's process and the children it waited for), the wall
    time of the run when given, and the machine (CPU-minutes compare between machines of a kind; wall does not)."""
    cores, model = machine()
    wall = f", {minutes_seconds(wall_s)} wall" if wall_s is not None else ""
    return (f"Suite cost: {len(lines)} tests, {sum(map(cpu_minutes, lines)):.1f} CPU-minutes (user+sys){wall}; "
            f"nproc {cores}, {model}")


def budget_line(lines, budget):
    cpu = sum(map(cpu_minutes, lines))
    verdict = f"{budget - cpu:.1f} to spare" if cpu <= budget else f"OVER by {cpu - budget:.1f}"
    return (f"CPU budget: {cpu:.1f} of {budget:g} CPU-minutes, {verdict} (printed, not a gate: CPU time still "
            f"varies with the machine)")


def slowest_table(lines, top):
    slowest = sorted(lines, key=cpu_minutes, reverse=True)[:top]
    return table([(x["test"], x["kind"], f"{cpu_minutes(x) * 60:.0f}", f"{x['wall_s']:.0f}") for x in slowest],
                 ("test", "kind", "CPU-s", "wall-s"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("costs", help="the JSON-lines file SPEEDRUN_TEST_COSTS named")
    parser.add_argument("--top", type=int, help="how many of the slowest tests (and files) to list (default: 25; "
                        "none with --summary or --budget)")
    parser.add_argument("--summary", action="store_true", help="only the one line of the suite's CPU-minutes, wall "
                        "time and machine, not the tables")
    parser.add_argument("--wall-s", type=float, help="the run's wall seconds, for --summary")
    parser.add_argument("--budget", type=float, help="the suite's budget in CPU-minutes: print the total against it")
    args = parser.parse_args(argv)
    if args.summary or args.budget is not None:
        if not Path(args.costs).exists() or not Path(args.costs).read_text().strip():
            print("Suite cost: no test was measured")  # nothing collected, or pytest stopped before a test
            return
        lines = read_costs(args.costs)
        if args.summary:
            print(summary(lines, args.wall_s))
        if args.budget is not None:
            print(budget_line(lines, args.budget))
        if args.top:
            print(f"The {args.top} tests of most CPU:\n{slowest_table(lines, args.top)}")
        return
    args.top = 25 if args.top is None else args.top
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
    print(slowest_table(lines, args.top))
    failed = [x["test"] for x in lines if x["outcome"] == "failed"]
    if failed:
        print(f"\n{len(failed)} failed: " + ", ".join(failed))


if __name__ == "__main__":
    main()
