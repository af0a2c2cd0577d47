#!/usr/bin/env bash
# Single-node GPU benchmarks on an NVIDIA H200 node (issue 8): build `primus` with the `cuda`
# backend, run `primus bench` for Llama 3.1 8B (BF16 and FP8) and a small MoE (Qwen3-30B-A3B),
# compare the measured GEMM TFLOP/s and collective bus bandwidth with the analytic model, and
# project each plan analytically and calibrated by its own report.
#
# Output: bench/results/<UTC date>-h200/
#   <case>.plan.yaml            the TrainingPlan benchmarked
#   <case>.report.json          the BenchmarkResults (every measurement, shape, device, versions)
#   <case>.compare.txt          measured vs analytic per op pass and collective
#   <case>.project.txt          `primus project` analytic, then calibrated (SOURCE column)
#   environment.txt             nvidia-smi, topology, library versions
#   log.txt                     everything this script printed
#
# Environment:
#   PRIMUS=/path/to/primus   use a prebuilt binary (built with `--features cuda`) instead of
#                            building here (the machine may have no crate registry)
#   RUNS=20 WARMUP=5         timed and warm-up runs per case
#   OUT=dir                  output directory
#   CASES="llama8b-bf16 ..." subset of the cases below
#
# Needs: the NVIDIA driver (libcuda.so.1), cuBLASLt (libcublasLt.so.12: the CUDA toolkit or pip's
# nvidia-cublas-cu12) and, for the collectives, NCCL (libnccl.so.2) and more than one GPU. With
# one GPU the collectives are skipped (the report says which) and the ops are still measured.
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$PWD
DATE=$(date -u +%Y-%m-%d)
OUT=${OUT:-$ROOT/bench/results/$DATE-h200}
RUNS=${RUNS:-20}
WARMUP=${WARMUP:-5}
CASES=${CASES:-"llama8b-bf16 llama8b-fp8 qwen3-30b-a3b-bf16"}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) run-h200.sh in $ROOT -> $OUT"

# --- libraries: cudarc loads libcuda.so / libcublasLt.so / libnccl.so by these names (and a
# few versioned ones, not libnccl.so.2): link whatever versioned files exist into one
# directory on LD_LIBRARY_PATH.
LIBDIR=$(mktemp -d /tmp/primus-cuda-libs.XXXXXX)
search_dirs() {
  echo /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/lib64 \
    /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64
  if command -v python3 >/dev/null; then
    python3 - <<'PY' 2>/dev/null || true
import glob, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for r in roots:
    for d in glob.glob(r + "/nvidia/*/lib"):
        print(d)
PY
  fi
}
link_lib() { # link_lib libname: the first libname.so* found becomes $LIBDIR/libname.so
  local name=$1 d f
  for d in $(search_dirs); do
    for f in "$d/$name.so" "$d"/"$name".so.*; do
      if [ -e "$f" ]; then ln -sf "$f" "$LIBDIR/$name.so"; echo "lib: $name -> $f"; return 0; fi
    done
  done
  echo "lib: $name not found"
}
link_lib libcuda
link_lib libcublasLt
link_lib libcublas
link_lib libnccl
export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# --- environment
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "kernel: $(uname -r)"
  nvidia-smi || echo "nvidia-smi: not available"
  nvidia-smi topo -m 2>/dev/null || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv 2>/dev/null || true
  ls -l "$LIBDIR"
  git -C "$ROOT" rev-parse HEAD 2>/dev/null || true
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

# --- build
if [ -n "${PRIMUS:-}" ]; then
  echo "using prebuilt $PRIMUS"
else
  echo "== cargo build --release -p primus-cli --bin primus --features cuda"
  cargo build --release -p primus-cli --bin primus --features cuda
  PRIMUS=$ROOT/target/release/primus
fi
"$PRIMUS" --version || true

# --- plans
nvidia-smi -L 2>/dev/null || echo "nvidia-smi -L: not available"
# shellcheck source=bench/scripts/cases.sh
source "$ROOT/bench/scripts/cases.sh"
write_plans h200
run_cases cuda
rm -rf "$LIBDIR"
echo "== done (status $status): $OUT"
exit $status
