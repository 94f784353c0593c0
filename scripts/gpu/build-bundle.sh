#!/usr/bin/env bash
# Builds here (x86-64, no CUDA needed) everything gpu-bringup.sh runs on a borrowed GPU
# machine, into one directory that the device tool can carry:
#
#   scripts/gpu/build-bundle.sh [DEST]        run from the project root; DEST defaults to
#                                             target/gpu-bundle (carry that path)
#
# The test binaries are plain Rust executables: Rust code static, glibc dynamic (built on
# Debian 12 they need GLIBC_2.34: Ubuntu 22.04 / Debian 12 / RHEL 9 or newer), every CUDA
# library (libcuda, libnvrtc, libcublas(+Lt), libnccl) dlopen'ed by cudarc at run time.
set -euo pipefail
REPO=$(pwd)
DEST=${1:-$REPO/target/gpu-bundle}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
mkdir -p "$DEST"
# --release: release timings are the ones that matter. --no-run: build only.
cargo test --release --locked --features cuda \
  --test backend_cuda --test backend_cuda_nccl --test cuda_codegen \
  --no-run --message-format=json 2>/dev/null |
  python3 -c '
import json, sys, shutil, os
dest = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and exe and m["target"]["kind"] == ["test"]:
        shutil.copy2(exe, os.path.join(dest, m["target"]["name"]))
        print("test binary:", m["target"]["name"], "<-", exe)
' "$DEST"
# The project's own GPU benchmark binary, when it has one.
if cargo build --release --locked -p coconet-tools --features cuda --bin coconet-gpu-bench 2>/dev/null; then
  cp "$CARGO_TARGET_DIR/release/coconet-gpu-bench" "$DEST/"
else
  echo "no coconet-gpu-bench binary in this checkout: the bench phase will be skipped"
fi
# The candle trainer on CUDA (feature candle-cuda: candle's kernels need nvcc, and the
# build links the CUDA libraries), with CANDLE_CUDA=1: a CUDA 13 toolkit from PyPI
# (scripts/gpu/setup-cuda13.sh, ~1 min and 1.6 GB the first time) and a target folder of
# its own (~11 min the first time). See scripts/gpu/candle-cuda.md.
if [ "${CANDLE_CUDA:-0}" = 1 ]; then
  CU13=${CU13:-${TMPDIR:-/tmp}/coconet-cuda13}   # the one CI uses too
  [ -e "$CU13/cuda-env.sh" ] || bash "$HERE/setup-cuda13.sh" "$CU13"
  ( # shellcheck disable=SC1091
    source "$CU13/cuda-env.sh"
    CARGO_TARGET_DIR=$REPO/target/candle-cuda cargo test --release --locked \
      --features candle-cuda --test candle_cuda --no-run --message-format=json 2>/dev/null |
      python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy2(m["executable"], os.path.join(sys.argv[1], m["target"]["name"]))
        print("test binary:", m["target"]["name"])
' "$DEST" )
  strip "$DEST/candle_cuda" 2>/dev/null || echo "candle_cuda: not built (see the cargo output above)"
  # train_gpt's model trained on the GPU (and its torch counterpart for the bench
  # phase); the tensor-parallel GPT on the GPU.
  ( # shellcheck disable=SC1091
    source "$CU13/cuda-env.sh"
    CARGO_TARGET_DIR=$REPO/target/candle-cuda cargo build --release --locked \
      --features candle-cuda --example train_gpt_cuda --example tensor_parallel_cuda )
  for b in train_gpt_cuda tensor_parallel_cuda; do
    cp "$REPO/target/candle-cuda/release/examples/$b" "$DEST/" &&
      strip "$DEST/$b" || echo "$b: not built (see the cargo output above)"
  done
  # candle's kernels make each ~60 MB, past what the device tool carries (64 MiB in
  # all); xz takes them to ~8 MB, and the bring-up unpacks them.
  for b in candle_cuda train_gpt_cuda tensor_parallel_cuda; do
    [ -e "$DEST/$b" ] && xz -T0 -f "$DEST/$b"
  done
  cp "$REPO/benches/gpt_torch.py" "$DEST/"
fi
cp "$HERE/gpu-bringup.sh" "$HERE/gpu-probe.py" "$DEST/"
strip "$DEST"/backend_cuda "$DEST"/backend_cuda_nccl "$DEST"/cuda_codegen "$DEST"/coconet-gpu-bench 2>/dev/null || true
ls -la "$DEST"
echo "glibc needed: $(objdump -T "$DEST/backend_cuda" | grep -o 'GLIBC_[0-9.]*' | sort -Vu | tail -1)"
