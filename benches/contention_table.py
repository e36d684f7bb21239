#!/usr/bin/env python3
"""The tables of benches/contention.rs: checks per second by threads, bulwark against governor.

    python3 benches/contention_table.py [CRITERION_DIR ...]

Each argument is a criterion output folder (default: target/criterion) of one run; with several,
each figure is the median of the runs, and so is each ratio (taken run by run).
"""
import json
import statistics
import sys
from pathlib import Path

GROUPS = {
    "contention_direct": "direct limiter",
    "contention_hot_key": "one hot key",
    "contention_hot_key_5000": "one hot key, 5 000 a second",
    "contention_hot_key_50000": "one hot key, 50 000 a second",
    "contention_hot_key_500000": "one hot key, 500 000 a second",
    "contention_100k_keys": "100 000 keys",
}


def per_second(folder, group, name, threads):
    path = Path(folder) / group / name / str(threads) / "new" / "estimates.json"
    if not path.exists():
        return None
    ns = json.loads(path.read_text())["median"]["point_estimate"]
    return 1e9 / ns


def main():
    folders = sys.argv[1:] or ["target/criterion"]
    for group, title in GROUPS.items():
        counts = sorted(
            {int(p.name) for f in folders for p in (Path(f) / group / "bulwark").glob("[0-9]*")}
        )
        if not counts:
            continue
        rows = {"bulwark": [], "governor": [], "ratio": []}
        for n in counts:
            ours = [per_second(f, group, "bulwark", n) for f in folders]
            theirs = [per_second(f, group, "governor", n) for f in folders]
            pairs = [(a, b) for a, b in zip(ours, theirs) if a and b]
            rows["bulwark"].append(f"{statistics.median(a for a, _ in pairs) / 1e6:.1f} M")
            rows["governor"].append(f"{statistics.median(b for _, b in pairs) / 1e6:.1f} M")
            rows["ratio"].append(f"{statistics.median(a / b for a, b in pairs):.2f}")
        print(f"\n{title} ({len(folders)} run(s), median)\n")
        print("| threads | " + " | ".join(str(n) for n in counts) + " |")
        print("|---|" + "---:|" * len(counts))
        for label, cells in rows.items():
            print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
