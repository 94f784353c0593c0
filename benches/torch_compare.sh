#!/usr/bin/env bash
# coconet's optimizer step beside torch.distributed's on this machine (not part of CI),
# on rank threads and with one process per rank over TCP:
# makes a virtualenv with torch from PyPI, then runs torch, coconet, torch again
# (A-B-A, so drift on a shared machine shows), printing the CPU model first.
#
#   benches/torch_compare.sh [RANKS] [LOG2N]
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-4}
LOG2N=${2:-24}
VENV=${TORCH_VENV:-${TMPDIR:-/tmp}/coconet-torch-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch
fi
grep -m1 "model name" /proc/cpuinfo || true
nproc
uptime
"$VENV/bin/python" benches/torch_ddp.py --ranks "$RANKS" --log2n "$LOG2N"
cargo bench --bench runtime -- "(adam|adamw_clipped)/P$RANKS/N$((1 << LOG2N))/" 2>&1 \
  | grep -E "^adam|time:"
# One rank per process over TCP (what a loop under coconet-launch pays per iteration).
cargo run --release --quiet --example processes -- --ranks "$RANKS" --log2n "$LOG2N" --iters 7
"$VENV/bin/python" benches/torch_ddp.py --ranks "$RANKS" --log2n "$LOG2N"
