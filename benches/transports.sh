#!/usr/bin/env bash
# Adam's fused step with one rank per process, per transport, beside torch's DDP way
# (not part of CI): torch (gloo), coconet over TCP on the stream path, on the
# single-copy path and with the job's buffers in shared memory, over MPI (if `--features mpi` is built: its shared-memory window, and
# its messages), in ROUNDS interleaved rounds,
# printing the CPU model and load first. Every coconet figure is a median iteration that
# writes the gradient into the job, runs and reads the weights.
#
#   benches/transports.sh [RANKS] [LOG2N] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=${1:-4}
LOG2N=${2:-22}
ROUNDS=${3:-2}
VENV=${TORCH_VENV:-${TMPDIR:-/tmp}/coconet-torch-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch
fi
grep -m1 "model name" /proc/cpuinfo || true
nproc
uptime
cargo build --release --quiet --example processes
MPI=target/release/coconet-mpi-check
[ -x "$MPI" ] || echo "no $MPI (cargo build --release -p coconet-tools --features mpi --bin coconet-mpi-check): MPI skipped"
ITERS=$(( LOG2N >= 24 ? 7 : 15 ))
for round in $(seq "$ROUNDS"); do
  echo "== round $round"
  "$VENV/bin/python" benches/torch_ddp.py --ranks "$RANKS" --log2n "$LOG2N" 2>/dev/null | grep "ddp-fused P"
  for data in stream single-copy shared-memory; do
    printf "coconet TCP %s: " "$data"
    COCONET_TCP_DATA=$data target/release/examples/processes --ranks "$RANKS" \
      --log2n "$LOG2N" --iters "$ITERS" | sed -n 1p
  done
  if [ -x "$MPI" ]; then
    for how in "" --messages; do
      printf "coconet MPI %s: " "${how:-(shared memory)}"
      mpirun --allow-run-as-root --oversubscribe -np "$RANKS" "$MPI" --bench $((1 << LOG2N)) $how \
        | grep "^rank 0: training loop" | grep -o "with the gradient copied in instead [0-9.]* ms"
    done
  fi
done
