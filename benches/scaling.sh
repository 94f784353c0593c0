#!/usr/bin/env bash
# The fused step's scaling beside torch DDP (BENCHMARKS.md, issue 20 item 5), not part of
# CI: per (P, N), interleaved, torch's all_reduce + Adam(fused=True) over gloo processes,
# then coconet's fuse(RS-C-AG) on rank threads. Needs the virtualenv that
# benches/torch_compare.sh makes.
#
#   benches/scaling.sh
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${TORCH_VENV:-${TMPDIR:-/tmp}/coconet-torch-venv}
grep -m1 "model name" /proc/cpuinfo || true
nproc
uptime
for P in 2 4; do
  for L in 20 22 24 26; do
    N=$((1 << L))
    echo "=== P=$P log2n=$L"
    "$VENV/bin/python" benches/torch_ddp.py --ranks "$P" --log2n "$L" --rounds 5 2>/dev/null | grep RESULT
    COCONET_BENCH_P=$P COCONET_BENCH_N=$N cargo bench --bench runtime -- "adam/P$P/N$N/fuse" 2>&1 | grep -E "^adam/|time:"
  done
done
uptime
