#!/usr/bin/env bash
# Tensor parallelism across two hosts (issue 47's overlap, measured; not part of CI): the
# tensor_parallel example's larger GPT with one rank on each of two namespaced hosts
# (benches/namespaced_hosts.sh) joined by a link rate-limited to RATE each way, every
# all-reduce of the Megatron layers crossing it. Per round, interleaved inside the
# example: the separate calls against the matmuls overlapped with their all-reduces
# (4 row chunks). Needs root.
#
#   sudo benches/tp_two_hosts.sh [RATE] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-1gbit}
STEPS=${2:-10}
cargo build --release --quiet -p coconet -p coconet-launch --features coconet/launcher,coconet/candle --bin coconet-launch --example tensor_parallel
# shellcheck source=benches/namespaced_hosts.sh
source benches/namespaced_hosts.sh
make_hosts "$RATE"
grep -m1 "model name" /proc/cpuinfo || true
nproc
uptime
echo "link: veth, tbf rate $RATE each way; 2 hosts x 1 rank; RAYON_NUM_THREADS=1"
for h in 1 0; do
  on "$h" env RAYON_NUM_THREADS=1 target/release/coconet-launch --nnodes 2 --node-rank "$h" \
    --nproc-per-node 1 --master-addr "${A[0]}" --master-port 29627 --secret-file "$SECRET" \
    target/release/examples/tensor_parallel -- --tcp --bench --steps "$STEPS" 2>&1 |
    grep -E "processes over TCP|rror" &
done
wait
uptime
