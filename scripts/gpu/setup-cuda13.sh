#!/usr/bin/env bash
# CUDA 13.0 toolkit from PyPI wheels, enough to BUILD candle's `cuda` feature
# (candle-kernels via cudaforge/nvcc + cudarc `dynamic-linking`) on a machine with
# no GPU and no system CUDA.  Tested on Debian 12, Python 3.11, Rust 1.95, 2 cores.
#
#   bash scripts/gpu/setup-cuda13.sh [PREFIX]   # PREFIX: venv dir, default $TMPDIR/coconet-cuda13
#   source PREFIX/cuda-env.sh          # then: cargo build --release (do NOT set CUDARC_CUDA_VERSION
#                                      # while coconet's cudarc feature `cuda-12080` is in the build)
set -euo pipefail
PREFIX=${1:-${TMPDIR:-/tmp}/coconet-cuda13}
CUDARC_VER=${CUDARC_VER:-0.19.10}

# 1. Wheels, all from the cuda-toolkit 13.0.3 release (pip resolves these exact pins).
[ -x "$PREFIX/bin/pip" ] || python3 -m venv "$PREFIX"
"$PREFIX/bin/pip" install -q \
  "cuda-toolkit[nvcc,cudart,crt,cccl,nvrtc,cublas,curand]==13.0.3.0" \
  nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
  nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cuda-nvrtc==13.0.88 \
  nvidia-cublas==13.1.1.3 nvidia-curand==10.4.0.35 nvidia-nccl-cu13==2.32.3
SP=$("$PREFIX/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
CU=$SP/nvidia/cu13
NCCL_LIB=$SP/nvidia/nccl/lib
test -x "$CU/bin/nvcc" && test -x "$CU/nvvm/bin/cicc"

# 2. Unversioned names for the linker (-lcublas -lcublasLt -lcurand -lnvrtc -lcudart -lnccl).
( cd "$CU/lib"
  for f in lib*.so.*; do [ -L "$f" ] && continue; ln -sfn "$f" "${f%%.so.*}.so"; done
  ln -sfn "$NCCL_LIB/libnccl.so.2" libnccl.so.2   # NCCL wheel lives outside cu13/
  ln -sfn libnccl.so.2 libnccl.so )

# 3. libcuda stub (no wheel ships one).  Symbols: every driver entry point cudarc's
#    bindings declare (all CUDA versions it supports) + every cu* function in the wheel's
#    cuda.h after preprocessing (so the _v2/_v3 aliases are the real exported names).
#    Each returns CUDA_ERROR_STUB_LIBRARY (34), like NVIDIA's toolkit stub.
#    SONAME libcuda.so.1 so the binary asks for the driver's real library at run time.
CUDARC_SRC=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-"$CUDARC_VER" 2>/dev/null | head -1 || true)
mkdir -p "$CU/lib/stubs"; TMP=$(mktemp -d)
{ [ -n "$CUDARC_SRC" ] && grep -o 'load::<_F>("cu[A-Za-z0-9_]*")' "$CUDARC_SRC/src/driver/sys/mod.rs" | sed 's/.*("\(.*\)")/\1/'
  echo '#include <cuda.h>' | gcc -E -I"$CU/include" -x c - | grep -oE '\bcu[A-Z][A-Za-z0-9_]*\s*\(' | sed 's/\s*($//'
} | sort -u > "$TMP/syms"
[ -n "$CUDARC_SRC" ] || echo "warning: cudarc-$CUDARC_VER source not in cargo registry (run cargo fetch first); stub uses cuda.h names only" >&2
sed 's/.*/int &(void) { return 34; }/' "$TMP/syms" > "$TMP/libcuda_stub.c"
gcc -O2 -fPIC -shared -Wl,-soname,libcuda.so.1 -o "$CU/lib/stubs/libcuda.so" "$TMP/libcuda_stub.c"
ln -sfn libcuda.so "$CU/lib/stubs/libcuda.so.1"   # only to run binaries HERE; never on the GPU machine
echo "stub: $(wc -l < "$TMP/syms") symbols -> $CU/lib/stubs/libcuda.so"; rm -rf "$TMP"

# 4. Environment for cargo.
cat > "$PREFIX/cuda-env.sh" <<EOF
export CU=$CU
export PATH=\$CU/bin:\$PATH CUDA_HOME=\$CU CUDA_PATH=\$CU CUDA_ROOT=\$CU
export CUDA_COMPUTE_CAP=90            # cudaforge: else it runs nvidia-smi
# CUDARC_CUDA_VERSION: leave UNSET if any crate asks cudarc for a cuda-XXXXX feature
# (coconet: cuda-12080); set it to 13000 only if none does (or they ask for cuda-13000).
# To run binaries here (no GPU): LD_LIBRARY_PATH=\$CU/lib:\$CU/lib/stubs
EOF
"$CU/bin/nvcc" --version | tail -2
echo "now: source $PREFIX/cuda-env.sh && cargo build --release"
