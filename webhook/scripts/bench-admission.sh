#!/usr/bin/env bash
# Admission latency benchmark on loopback: a release primus-webhook in self-signed mode and the
# admission-load generator (open loop, keep-alive TLS), for each example job; prints p50/p90/p99
# latency, errors, server RSS/CPU, and the server-side handler histogram.
#
#   webhook/scripts/bench-admission.sh                      # 500 req/s, 20 s, 8 connections
#   RATE=2000 CONNS=16 webhook/scripts/bench-admission.sh
#   PRIO="chrt -f 10" webhook/scripts/bench-admission.sh    # realtime priority (root): what a
#                                                           # pod with dedicated CPU would see
#
# Environment: RATE, DUR (seconds), CONNS, PORT, MANIFESTS (example names), PRIO,
# CARGO_TARGET_DIR (default target/).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
cargo build --release -q -p primus-webhook --bins
T=${CARGO_TARGET_DIR:-$ROOT/target}/release
D=$(mktemp -d)
PORT=${PORT:-18443}
# shellcheck disable=SC2086
${PRIO:-} "$T/primus-webhook" --listen "127.0.0.1:$PORT" --self-signed --cert-dir "$D/certs" \
  --log-format json 2>"$D/webhook.log" &
PID=$!
trap 'kill -TERM $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$D"' EXIT
for _ in $(seq 100); do [[ -s $D/certs/ca.crt ]] && break; sleep 0.1; done
sleep 0.5
echo "primus-webhook pid $PID, idle $(grep VmRSS /proc/$PID/status | tr -s ' \t' ' ')"
rc=0
for m in ${MANIFESTS:-fitting-pytorchjob oom-pytorchjob near-limit-pytorchjob}; do
  echo "== $m"
  # shellcheck disable=SC2086
  ${PRIO:-} "$T/admission-load" --url "https://127.0.0.1:$PORT/validate/pytorchjob" \
    --ca "$D/certs/ca.crt" --manifest "webhook/examples/$m.yaml" --rate "${RATE:-500}" \
    --duration-seconds "${DUR:-20}" --warmup-seconds 2 --connections "${CONNS:-8}" --pid "$PID" || rc=1
done
echo "== server-side handler time (primus_webhook_admission_duration_seconds)"
curl -s --cacert "$D/certs/ca.crt" "https://127.0.0.1:$PORT/metrics" |
  grep -E '^primus_webhook_admission_duration_seconds_(bucket\{kind="PyTorchJob",le="(0.0001|0.00025|0.0005|0.001|0.002|\+Inf)"|sum|count)'
exit $rc
