#!/usr/bin/env bash
# Adam's fused step across two hosts (issue 48, item 3's measurement; not part of CI):
# two hosts made of network namespaces joined by a veth pair whose both ends are rate-
# limited with `tc tbf` (default 1 Gbit/s), each host with its own PID, IPC and mount
# namespaces and /dev/shm, 2 ranks per host. Per round, interleaved: torch DDP's way
# (all_reduce over gloo + Adam(fused=True) on every rank; benches/torch_ddp.py) and
# coconet's fused step over TCP (examples/processes under coconet-launch on each host:
# single-copy within a host, the stream between hosts), with its all-gathers relayed
# across hosts (each block crosses once) and flat (COCONET_FLAT_GATHER=1). Needs root and the virtualenv
# benches/torch_compare.sh makes (made here if missing).
#
#   sudo benches/two_hosts.sh [LOG2N] [RATE] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
LOG2N=${1:-22}
RATE=${2:-1gbit}
ROUNDS=${3:-2}
VENV=${TORCH_VENV:-${TMPDIR:-/tmp}/coconet-torch-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check torch
fi
cargo build --release --quiet -p coconet -p coconet-launch --features coconet/launcher --bin coconet-launch --example processes
# shellcheck source=benches/namespaced_hosts.sh
source benches/namespaced_hosts.sh
make_hosts "$RATE"
grep -m1 "model name" /proc/cpuinfo || true
nproc
uptime
echo "link: veth, tbf rate $RATE each way; N = 2^$LOG2N f32, 2 hosts x 2 ranks"
ITERS=$(( LOG2N >= 24 ? 5 : 9 ))
for round in $(seq "$ROUNDS"); do
  echo "== round $round"
  for h in 1 0; do
    on "$h" env GLOO_SOCKET_IFNAME="${V[$h]}" "$VENV/bin/python" benches/torch_ddp.py \
      --ranks 4 --nodes 2 --node-rank "$h" --master "${A[0]}" --port 29717 \
      --log2n "$LOG2N" --rounds 5 2>/dev/null | grep -E "RESULT torch ddp-fused|phases" &
  done
  wait
  # The all-gathers relayed across hosts (the default), then flat.
  for flat in 0 1; do
    for h in 1 0; do
      on "$h" env COCONET_FLAT_GATHER=$flat target/release/coconet-launch --nnodes 2 \
        --node-rank "$h" --nproc-per-node 2 --master-addr "${A[0]}" --master-port 29617 \
        --secret-file "$SECRET" target/release/examples/processes -- --log2n "$LOG2N" \
        --iters "$ITERS" 2>/dev/null | sed "s/^/coconet (COCONET_FLAT_GATHER=$flat): /" &
    done
    wait
  done
done
uptime
