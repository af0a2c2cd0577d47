#!/usr/bin/env bash
# Single-node GPU benchmarks on an AMD MI300X node (issue 8): build `primus` with the `rocm`
# backend, run `primus bench` for Llama 3.1 8B (BF16 and FP8) and a small MoE (Qwen3-30B-A3B),
# compare the measured GEMM TFLOP/s and collective bus bandwidth with the analytic model, and
# project each plan analytically and calibrated by its own report.
#
# Output: bench/results/<UTC date>-mi300x/ with the same files as run-h200.sh (plans, reports,
# comparisons, projections, environment.txt, log.txt).
#
# Environment:
#   ROCM_PATH=/opt/rocm      the ROCm install: HIP headers and libamdhip64 for the build,
#                            libhipblaslt.so and librccl.so at run time (ROCm 6.1 or newer)
#   PRIMUS=/path/to/primus   use a binary built with `--features rocm` against this machine's
#                            ROCm (the HIP runtime is linked at build time: a binary built
#                            against Debian's HIP 5 needs libamdhip64.so.5)
#   RUNS=20 WARMUP=5 OUT=dir CASES="llama8b-bf16 ..." as in run-h200.sh
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$PWD
DATE=$(date -u +%Y-%m-%d)
OUT=${OUT:-$ROOT/bench/results/$DATE-mi300x}
RUNS=${RUNS:-20}
WARMUP=${WARMUP:-5}
CASES=${CASES:-"llama8b-bf16 llama8b-fp8 qwen3-30b-a3b-bf16"}
export ROCM_PATH=${ROCM_PATH:-/opt/rocm}
export LD_LIBRARY_PATH=$ROCM_PATH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) run-mi300x.sh in $ROOT -> $OUT"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "kernel: $(uname -r)"
  echo "ROCM_PATH: $ROCM_PATH"
  cat "$ROCM_PATH/.info/version" 2>/dev/null || true
  (amd-smi static --asic --driver 2>/dev/null || rocm-smi --showproductname --showdriverversion 2>/dev/null) || echo "amd-smi/rocm-smi: not available"
  rocm-smi --showtopo 2>/dev/null || true
  rocminfo 2>/dev/null | grep -E "Marketing Name|gfx" | sort -u || true
  ls -l "$ROCM_PATH"/lib/libhipblaslt.so* "$ROCM_PATH"/lib/librccl.so* "$ROCM_PATH"/lib/libamdhip64.so* 2>/dev/null || true
  git -C "$ROOT" rev-parse HEAD 2>/dev/null || true
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

if [ -n "${PRIMUS:-}" ]; then
  echo "using prebuilt $PRIMUS"
else
  echo "== HIP_PATH=$ROCM_PATH cargo build --release -p primus-cli --bin primus --features rocm"
  HIP_PATH=$ROCM_PATH cargo build --release -p primus-cli --bin primus --features rocm
  PRIMUS=$ROOT/target/release/primus
fi
"$PRIMUS" --version || true

# shellcheck source=bench/scripts/cases.sh
source "$ROOT/bench/scripts/cases.sh"
write_plans mi300x
run_cases rocm
echo "== done (status $status): $OUT"
exit $status
