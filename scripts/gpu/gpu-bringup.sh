#!/usr/bin/env bash
# First run of coconet's CUDA backend on a GPU machine that has CUDA/PyTorch but no Rust.
#
#   gpu-bringup.sh [PHASE ...]        PHASE: env | tests | bench | sanitize | all (default)
#
# Environment:
#   BUNDLE   directory with the prebuilt binaries (default: this script's directory):
#              backend_cuda  backend_cuda_nccl  cuda_codegen  coconet-gpu-bench  gpu-probe.py
#   OUT      where logs and the summary go (default: $OUT if set by the runner, else
#            /tmp/coconet-gpu-out)
#   ONLY     regex of test names to run in the `tests` phase (default: all)
#   BUDGET   seconds the `tests` phase may use before skipping the rest (default 540:
#            one device command may run 10 minutes)
#   LOG2N    benchmark size (default 28), RANKS (default 1,2,4), BIG=1 adds the 2^31 run
#
# Each phase sets up the libraries again (cheap), so phases can be separate commands
# (one device command may run 10 minutes: run env+tests, then bench, then sanitize).
# Prints one line per check (also appended to $OUT/summary.txt); full logs in $OUT.
set -u
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUNDLE=${BUNDLE:-$HERE}
OUT=${OUT:-/tmp/coconet-gpu-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
PHASES=("$@"); [ ${#PHASES[@]} -eq 0 ] && PHASES=(all)
START=$(date +%s)
say() { echo "$*" | tee -a "$SUMMARY"; }
have() { command -v "$1" >/dev/null 2>&1; }
PY=$(command -v python3 || command -v python)
export PATH="$PATH:/usr/local/cuda/bin"   # compute-sanitizer, nvcc

# ---------------------------------------------------------------- libraries
# cudarc (0.19, bindings for CUDA 12.8, dynamic loading) dlopens, in order of its list:
#   libcuda.so, ..., libcuda.so.12, ..., libcuda.so.1
#   libnvrtc.so / libnvrtc.so.12 / .11 ...   (NOT .so.13)
#   libcublas.so / libcublas.so.12 ...       (NOT .so.13; libcublasLt must resolve too)
#   libnccl.so / libnccl.so.12 / ... / .so.1 (NOT libnccl.so.2)
# We put a shim directory first on LD_LIBRARY_PATH with the unversioned names pointing at
# the chosen libraries, and their real directories after it.
SHIM=/tmp/coconet-libs
setup_libs() {
  rm -rf "$SHIM"; mkdir -p "$SHIM"
  # A stub libcuda (toolkit's lib64/stubs) on the path makes cuInit fail with
  # CUDA_ERROR_STUB_LIBRARY: drop such entries.
  LD_LIBRARY_PATH=$(echo "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v -e '/stubs' -e '^$' | paste -sd: -)
  local site=""
  if [ -n "$PY" ]; then
    site=$("$PY" - <<'EOF' 2>/dev/null
import site, sys
print(" ".join(site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p.endswith("-packages")]))
EOF
)
  fi
  local dirs=()
  for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-* /opt/cuda; do
    for l in "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib"; do [ -d "$l" ] && dirs+=("$l"); done
  done
  for s in $site; do  # pip wheels: nvidia/cuda_nvrtc/lib, nvidia/cublas/lib, nvidia/nccl/lib, nvidia/cu13/lib
    for l in "$s"/nvidia/*/lib "$s"/torch/lib; do [ -d "$l" ] && dirs+=("$l"); done
  done
  [ -n "${CONDA_PREFIX:-}" ] && dirs+=("$CONDA_PREFIX/lib")
  for l in $(ldconfig -p 2>/dev/null | grep -E 'lib(nvrtc|cublas|nccl)\.so' | sed 's/.*=> //' | xargs -r -n1 dirname | sort -u); do dirs+=("$l"); done
  dirs+=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib)
  # Driver.
  DRV_LINE=$("$PY" "$BUNDLE/gpu-probe.py" driver 2>&1 | tail -1)
  DRIVER=$(echo "$DRV_LINE" | sed -n 's/^driver=\([0-9]*\).*/\1/p'); DRIVER=${DRIVER:-0}
  # NVRTC: the newest whose PTX this driver loads (a newer NVRTC than the driver gives
  # CUDA_ERROR_UNSUPPORTED_PTX_VERSION at module load).
  NVRTC=""; NVRTC_LINE="none found"; local best=0
  for f in $(for d in "${dirs[@]}"; do ls "$d"/libnvrtc.so.1[0-9]* 2>/dev/null; done | grep -v builtins | sort -u); do
    local line; line=$("$PY" "$BUNDLE/gpu-probe.py" nvrtc "$f" 2>&1 | tail -1)
    echo "  candidate $f: $line" >>"$OUT/libs.log"
    # Score: major 12 (cudarc's bindings) first, then the newest.
    local v; v=$(echo "$line" | sed -n 's/^nvrtc=\([0-9]*\)\.\([0-9]*\).*/\1 \2/p' | awk '{print ($1==12?100000:0)+$1*1000+$2*10}')
    [ -z "$v" ] && continue
    if echo "$line" | grep -q "ptx_load=ok" && [ "$v" -gt "$best" ]; then best=$v; NVRTC=$f; NVRTC_LINE=$line; fi
  done
  if [ -z "$NVRTC" ]; then  # nothing loads: take any, the tests will say why
    NVRTC=$(for d in "${dirs[@]}"; do ls "$d"/libnvrtc.so.1[0-9]* 2>/dev/null; done | grep -v builtins | head -1)
    [ -n "$NVRTC" ] && NVRTC_LINE=$("$PY" "$BUNDLE/gpu-probe.py" nvrtc "$NVRTC" 2>&1 | tail -1)
  fi
  # cuBLAS (same major as the NVRTC chosen when possible), NCCL (any).
  local major; major=$(basename "${NVRTC:-libnvrtc.so.12}" | sed 's/.*\.so\.\([0-9]*\).*/\1/')
  CUBLAS=$(for d in "${dirs[@]}"; do ls "$d"/libcublas.so."$major"* 2>/dev/null; done | head -1)
  [ -z "$CUBLAS" ] && CUBLAS=$(for d in "${dirs[@]}"; do ls "$d"/libcublas.so.1[0-9]* 2>/dev/null; done | head -1)
  NCCL=$(for d in "${dirs[@]}"; do ls "$d"/libnccl.so.2* 2>/dev/null; done | head -1)
  local libdirs=()
  for f in "$NVRTC" "$CUBLAS" "$NCCL"; do
    [ -z "$f" ] && continue
    local d; d=$(dirname "$f"); libdirs+=("$d")
    # Every versioned sibling (libnvrtc-builtins, libcublasLt) next to the shim's links.
    for s in "$d"/libnvrtc*.so* "$d"/libcublas*.so* "$d"/libnccl*.so*; do [ -e "$s" ] && ln -sf "$s" "$SHIM/"; done
  done
  [ -n "$NVRTC" ] && ln -sf "$NVRTC" "$SHIM/libnvrtc.so"
  [ -n "$CUBLAS" ] && ln -sf "$CUBLAS" "$SHIM/libcublas.so"
  [ -n "$CUBLAS" ] && ls "$(dirname "$CUBLAS")"/libcublasLt.so.1[0-9]* >/dev/null 2>&1 &&
    ln -sf "$(ls "$(dirname "$CUBLAS")"/libcublasLt.so.1[0-9]* | head -1)" "$SHIM/libcublasLt.so"
  [ -n "$NCCL" ] && ln -sf "$NCCL" "$SHIM/libnccl.so"
  # The candle binaries link the CUDA 13 libraries they were built with by SONAME
  # (libcudart.so.13, libcublas.so.13, ...): every library directory found, after the rest.
  CANDLE_LIBS=$(printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd: -)
  local uniq; uniq=$(printf '%s\n' "${libdirs[@]}" | awk '!seen[$0]++' | paste -sd: -)
  export LD_LIBRARY_PATH="$SHIM${uniq:+:$uniq}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  CUBLAS_LINE=$([ -n "$CUBLAS" ] && "$PY" "$BUNDLE/gpu-probe.py" cublas "$SHIM/libcublas.so" 2>&1 | tail -1 || echo "cublas=none found")
  NCCL_LINE=$([ -n "$NCCL" ] && "$PY" "$BUNDLE/gpu-probe.py" nccl "$SHIM/libnccl.so" 2>&1 | tail -1 || echo "nccl=none found (backend_cuda_nccl will fail)")
  # One node, no network needed: NCCL's bootstrap on loopback.
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_DEBUG=${NCCL_DEBUG:-WARN}
  export RUST_BACKTRACE=${RUST_BACKTRACE:-1}
  # f32 matmuls must not silently become TF32.
  unset NVIDIA_TF32_OVERRIDE
}

phase_env() {
  say "== env ($(date -u +%FT%TZ))"
  if have nvidia-smi; then
    say "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,clocks.max.memory --format=csv,noheader 2>&1 | head -4 | paste -sd';' -)"
  else
    say "nvidia-smi: missing"
  fi
  say "probe: $DRV_LINE"
  local mem bw
  mem=$(echo "$DRV_LINE" | sed -n 's/.*memclk_khz=\([0-9]*\).*/\1/p'); bw=$(echo "$DRV_LINE" | sed -n 's/.*busbits=\([0-9]*\).*/\1/p')
  [ -n "$mem" ] && [ -n "$bw" ] && say "theoretical HBM bandwidth: $(awk -v m="$mem" -v b="$bw" 'BEGIN{printf "%.0f GB/s", 2*m*1e3*b/8/1e9}')"
  say "glibc: $(ldd --version 2>&1 | head -1)"
  have nvcc && say "nvcc: $(nvcc --version | tail -2 | head -1)"
  [ -n "$PY" ] && say "torch: $("$PY" -c 'import torch;print(torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' 2>&1 | tail -1)"
  say "nvrtc: ${NVRTC:-none} -> $NVRTC_LINE"
  say "cublas: ${CUBLAS:-none} -> $CUBLAS_LINE"
  say "nccl: ${NCCL:-none} -> $NCCL_LINE"
  say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in backend_cuda backend_cuda_nccl cuda_codegen coconet-gpu-bench; do
    if [ ! -x "$BUNDLE/$b" ]; then say "binary $b: MISSING in $BUNDLE"; continue; fi
    local miss; miss=$(ldd "$BUNDLE/$b" 2>&1 | grep -E "not found|GLIBC" | head -2 | paste -sd';' -)
    say "binary $b: ${miss:-ok (ldd)}"
  done
  for b in candle_cuda train_gpt_cuda tensor_parallel_cuda; do  # bundled with CANDLE_CUDA=1
    [ -x "$BUNDLE/$b" ] || continue
    local miss; miss=$(candle_env ldd "$BUNDLE/$b" 2>&1 | grep -E "not found|GLIBC" | head -3 | paste -sd';' -)
    say "binary $b: ${miss:-ok (ldd)}"
  done
  have compute-sanitizer && say "compute-sanitizer: $(command -v compute-sanitizer)"
}

# A command with the candle binaries' libraries on the path too.
candle_env() { LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$CANDLE_LIBS" "$@"; }

# Runs every test of a binary in its own process (a sticky CUDA error poisons the
# process's context, so one failure must not take the others with it).
run_tests() {
  local bin=$1 filter=${2:-} skip=${3:-}
  [ -x "$BUNDLE/$bin" ] || { say "$bin: MISSING"; return; }
  local tests
  tests=$("$BUNDLE/$bin" --list --format terse 2>/dev/null | sed -n 's/: test$//p')
  [ -n "$filter" ] && tests=$(echo "$tests" | grep -E "$filter")
  [ -n "$skip" ] && tests=$(echo "$tests" | grep -vE "$skip")
  [ -n "${ONLY:-}" ] && tests=$(echo "$tests" | grep -E "$ONLY")
  for t in $tests; do
    local now=$(( $(date +%s) - START ))
    if [ "$now" -gt "${BUDGET:-540}" ]; then say "SKIP   $bin::$t (budget; rerun with ONLY='$t')"; continue; fi
    local log="$OUT/$bin.$(echo "$t" | tr ':/' '__').log" t0=$(date +%s)
    timeout "${TEST_TIMEOUT:-300}" "$BUNDLE/$bin" "$t" --exact --test-threads 1 --nocapture >"$log" 2>&1
    local rc=$? dt=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ] && grep -q "1 passed" "$log"; then
      say "PASS   $bin::$t (${dt}s)"
    elif [ $rc -eq 124 ]; then
      say "TIMEOUT $bin::$t (${dt}s) $(grep -m1 -E 'panicked|Error|error' "$log" | cut -c1-200)"
    else
      say "FAIL   $bin::$t (${dt}s, rc=$rc): $(grep -m1 -A2 -E 'panicked at|Error' "$log" | tr '\n' ' ' | cut -c1-400)"
    fi
  done
}

phase_tests() {
  say "== tests"
  # NVRTC on this machine, every generated program for sm_80/sm_90 (no GPU needed).
  export COCONET_REQUIRE_NVRTC=1
  run_tests cuda_codegen 'nvrtc_compiles'
  # Every suite test on virtual ranks, then through NCCL: sgd and adam first (the
  # simplest launches), then the rest (a name filter would miss new tests).
  run_tests backend_cuda '^(sgd|adam)$'
  run_tests backend_cuda '.' '^(sgd|adam)$'
  run_tests backend_cuda_nccl '::(sgd|adam)$'
  run_tests backend_cuda_nccl '.' '::(sgd|adam)$'
  # The candle trainer on candle's CUDA device (bundled with CANDLE_CUDA=1).
  if [ -x "$BUNDLE/candle_cuda" ]; then candle_env run_tests candle_cuda; fi
  # train_gpt's model trained on the GPU, checked against candle's AdamW there.
  if [ -x "$BUNDLE/train_gpt_cuda" ]; then
    local log=$OUT/train_gpt_cuda.log t0=$(date +%s)
    candle_env timeout "${TEST_TIMEOUT:-300}" "$BUNDLE/train_gpt_cuda" >"$log" 2>&1
    local rc=$?
    grep -E "^(candle|coconet|trained)" "$log" | tee -a "$SUMMARY"
    say "$( [ $rc -eq 0 ] && echo PASS || echo "FAIL (rc=$rc)")   train_gpt_cuda ($(( $(date +%s) - t0 ))s) $(grep -m1 -E 'Error|panicked' "$log" | cut -c1-300)"
  fi
  # The tensor-parallel GPT on the GPU (rank threads, one CUDA job per collective),
  # checked against the single-GPU model's losses.
  if [ -x "$BUNDLE/tensor_parallel_cuda" ]; then
    local log=$OUT/tensor_parallel_cuda.log t0=$(date +%s)
    candle_env timeout "${TEST_TIMEOUT:-300}" "$BUNDLE/tensor_parallel_cuda" --steps "${TP_STEPS:-30}" >"$log" 2>&1
    local rc=$?
    grep -E "^ +[0-9]" "$log" | tee -a "$SUMMARY"
    say "$( [ $rc -eq 0 ] && echo PASS || echo "FAIL (rc=$rc)")   tensor_parallel_cuda ($(( $(date +%s) - t0 ))s) $(grep -m1 -E 'Error|panicked|not the single' "$log" | cut -c1-300)"
  fi
}

phase_bench() {
  say "== bench"
  if [ -n "$PY" ]; then
    # Reference points from PyTorch on the same GPU: a copy (read+write) and torch's
    # fused Adam on one 2^LOG2N-element tensor (28 bytes/element, as coconet's P=1 model),
    # and bias + layer norm eager and compiled.
    "$PY" - "${LOG2N:-28}" <<'EOF' 2>&1 | tee -a "$OUT/bench.log" | grep RESULT | tee -a "$SUMMARY"
import sys, torch
n = 1 << int(sys.argv[1]); dev = "cuda"
def timeit(f, iters=20):
    for _ in range(3): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(iters):
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
    ts.sort(); return ts[len(ts) // 2]
x = torch.empty(1 << 29, device=dev); y = torch.empty_like(x)
t = timeit(lambda: y.copy_(x)); print(f"RESULT torch copy 2 GiB: {2 * x.numel() * 4 / t / 1e9:.0f} GB/s")
del x, y
p = torch.zeros(n, device=dev, requires_grad=True); p.grad = torch.rand(n, device=dev)
opt = torch.optim.Adam([p], lr=1e-3, fused=True)
t = timeit(opt.step); print(f"RESULT torch fused Adam N=2^{sys.argv[1]}: {t*1e3:.3f} ms, {28 * n / t / 1e9:.0f} GB/s (28 B/elem)")
del p, opt
# Bias + layer norm over rows of 4096, N/4 elements (coconet-gpu-bench's layer_norm).
import torch.nn.functional as F
h = 4096; rows = max(n // 4 // h, 1)
x = torch.rand(rows, h, device=dev); b, g, be = (torch.rand(h, device=dev) for _ in range(3))
f = lambda: F.layer_norm(x + b, (h,), g, be, 1e-5)
t = timeit(f); print(f"RESULT torch eager layer_norm(x + bias) {rows}x{h}: {t*1e3:.3f} ms, {8 * rows * h / t / 1e9:.0f} GB/s (8 B/elem)")
try:
    fc = torch.compile(f); t = timeit(fc)
    print(f"RESULT torch.compile layer_norm(x + bias) {rows}x{h}: {t*1e3:.3f} ms, {8 * rows * h / t / 1e9:.0f} GB/s (8 B/elem)")
except Exception as e:
    print(f"RESULT torch.compile layer_norm: failed ({type(e).__name__})")
del x
# AdamW(fused=True) over the tensor lists of coconet-gpu-bench's lent cases, timed the
# same way (wall time of queued steps, host work included, then one synchronize).
import time
def walltime(f, iters):
    for _ in range(3): f()
    torch.cuda.synchronize(); ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters): f()
        torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) / iters)
    ts.sort(); return ts[len(ts) // 2]
d = 768
gpt2 = [50257 * d, 1024 * d] + [s for _ in range(12) for s in (d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d)] + [d, d]
for what, sizes, iters in ((f"one tensor 2^{sys.argv[1]}", [n], 20), ("GPT-2 small's tensors", gpt2, 20), ("2^16 (fixed cost)", [1 << 16], 200)):
    ps = [torch.zeros(k, device=dev, requires_grad=True) for k in sizes]
    for q in ps: q.grad = torch.rand_like(q)
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True)
    t = walltime(opt.step, iters); N = sum(sizes)
    print(f"RESULT torch AdamW(fused=True) {what} N={N} in {len(sizes)} tensors: {t*1e3:.4f} ms per step, {28 * N / t / 1e9:.1f} GB/s (28 B/elem)")
    del ps, opt
EOF
  fi
  # A GPT-2-small-shaped model trained by candle on the GPU: candle's AdamW against
  # coconet's step in place, then torch with AdamW(fused=True) on the same shape.
  if [ -x "$BUNDLE/train_gpt_cuda" ]; then
    candle_env timeout "${GPT_TIMEOUT:-240}" "$BUNDLE/train_gpt_cuda" --bench >"$OUT/train_gpt_cuda.bench.log" 2>&1 ||
      say "train_gpt_cuda --bench rc=$? (see $OUT/train_gpt_cuda.bench.log)"
    grep -E "^(bench model|RESULT)" "$OUT/train_gpt_cuda.bench.log" | tee -a "$SUMMARY"
    if [ -n "$PY" ] && [ -e "$BUNDLE/gpt_torch.py" ]; then
      for a in "" --sdpa; do
        timeout 180 "$PY" "$BUNDLE/gpt_torch.py" $a 2>&1 | tee -a "$OUT/gpt_torch.log" | grep -E "^(torch|RESULT)" | tee -a "$SUMMARY"
      done
    fi
  fi
  # The tensor-parallel GPT on virtual ranks of the GPU: the fused epilogue against the
  # separate calls, against the single-GPU model.
  if [ -x "$BUNDLE/tensor_parallel_cuda" ]; then
    candle_env timeout "${TP_TIMEOUT:-120}" "$BUNDLE/tensor_parallel_cuda" --bench >"$OUT/tensor_parallel_cuda.bench.log" 2>&1 ||
      say "tensor_parallel_cuda --bench rc=$? (see $OUT/tensor_parallel_cuda.bench.log)"
    grep -E "^(GPT| +[0-9])" "$OUT/tensor_parallel_cuda.bench.log" | tee -a "$SUMMARY"
  fi
  local args=(--log2n "${LOG2N:-28}" --ranks "${RANKS:-1,2,4}" --iters 20)
  [ "${BIG:-0}" = 1 ] && args+=(--big)
  timeout "${BENCH_TIMEOUT:-500}" "$BUNDLE/coconet-gpu-bench" "${args[@]}" >"$OUT/coconet-bench.log" 2>&1
  local rc=$?
  grep -E "^device|baseline|RESULT|check|FAIL|WARNING|panicked" "$OUT/coconet-bench.log" | tee -a "$SUMMARY"
  [ $rc -ne 0 ] && say "coconet-gpu-bench rc=$rc (see $OUT/coconet-bench.log)"
}

phase_sanitize() {
  say "== sanitize"
  have compute-sanitizer || { say "compute-sanitizer: not installed, skipped"; return; }
  # memcheck: out-of-bounds/misaligned accesses of the generated kernels (small sizes);
  # racecheck: shared-memory hazards of the block reductions and row caches (lamb's norms,
  # layer norm); megatron: the row kernel after a dropout (its cached row).
  for spec in "memcheck sgd" "memcheck lamb" "racecheck lamb" "memcheck layer_norm" "racecheck layer_norm" "memcheck megatron"; do
    set -- $spec
    local log="$OUT/sanitize.$1.$2.log"
    timeout "${SAN_TIMEOUT:-150}" compute-sanitizer --tool "$1" --error-exitcode 99 \
      "$BUNDLE/backend_cuda" "$2" --exact --test-threads 1 >"$log" 2>&1
    local rc=$?
    say "$( [ $rc -eq 0 ] && echo OK || echo "rc=$rc") compute-sanitizer $1 backend_cuda::$2 $(grep -m1 -E '=========.*(Invalid|Race|Barrier|ERROR)' "$log" | cut -c1-200)"
  done
}

# Binaries the bundle carries compressed (the candle ones: build-bundle.sh), unpacked
# beside it once.
unpack() {
  local f b
  for f in "$BUNDLE"/*.xz; do
    [ -e "$f" ] || continue
    b=${f%.xz}
    [ -x "$b" ] && continue
    if have xz; then xz -dc "$f" >"$b.part"; else
      "$PY" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$b.part"
    fi && chmod +x "$b.part" && mv "$b.part" "$b" || say "unpacking $f failed"
  done
}

unpack
setup_libs
for p in "${PHASES[@]}"; do
  case $p in
    env) phase_env ;;
    tests) phase_tests ;;
    bench) phase_bench ;;
    sanitize) phase_sanitize ;;
    all) BUDGET=${BUDGET:-300}; phase_env; phase_tests; phase_bench ;;
    *) echo "unknown phase $p (env|tests|bench|sanitize|all)"; exit 2 ;;
  esac
done
say "== done in $(( $(date +%s) - START ))s; logs in $OUT (summary: $SUMMARY)"
