#!/usr/bin/env python3
"""How much of the cost model's error is the machine's: reads several outputs of
`target/release/examples/cost_model` (one file each, same binary, runs one after the
other) and scores an oracle that predicts every schedule at its median measured time
over all the runs, with the example's own two measures per run: predictions within
25 % of the measurement, and settings whose predicted fastest is the measured fastest.

    for i in $(seq 6); do target/release/examples/cost_model > /tmp/run$i.out; done
    python3 benches/cost_model_noise.py /tmp/run*.out
"""
import statistics
import sys
from collections import defaultdict


def table(path):
    """{(case, P, schedule): measured ms} of one output."""
    rows = {}
    for line in open(path):
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 6 and cells[5].endswith("%"):
            try:
                rows[tuple(cells[:3])] = float(cells[3])
            except ValueError:
                pass
    return rows


def main(paths):
    runs = [table(p) for p in paths]
    keys = set.intersection(*(set(r) for r in runs))
    if len(runs) < 2 or not keys:
        sys.exit("give two or more outputs of the same cases")
    oracle = {k: statistics.median(r[k] for r in runs) for k in keys}
    spread = sorted(max(r[k] for r in runs) / min(r[k] for r in runs) for k in keys)
    print(f"{len(runs)} runs, {len(keys)} cases; a case's slowest run over its fastest: "
          f"median {statistics.median(spread):.2f}x, 90th percentile "
          f"{spread[int(0.9 * len(spread))]:.2f}x")
    within, fastest = [], []
    for r in runs:
        within.append(sum(abs(oracle[k] / r[k] - 1) <= 0.25 for k in keys))
        settings = defaultdict(list)
        for k in keys:
            settings[k[:2]].append((r[k], oracle[k], k[2]))
        fastest.append(sum(min(v)[2] == min(v, key=lambda x: x[1])[2] for v in settings.values()))
    print(f"oracle within 25 % per run: {sorted(within)} of {len(keys)}")
    print(f"oracle's fastest = measured fastest per run: {sorted(fastest)} of {len(settings)}")


if __name__ == "__main__":
    main(sys.argv[1:])
