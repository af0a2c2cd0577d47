# Sourced by run-h200.sh and run-mi300x.sh: the benchmark cases, written as TrainingPlans for
# one GPU kind, and the loop that benchmarks each with one backend and projects it analytic
# and calibrated. Uses OUT, PRIMUS, RUNS, WARMUP and CASES from the calling script.

plan() { # plan gpu name model precision parallelism
  cat > "$OUT/$2.plan.yaml" <<YAML
apiVersion: primus.dev/v1alpha1
kind: TrainingPlan
metadata: {name: $2}
spec:
  model: {preset: $3}
  cluster: {gpu: $1, gpus: 64, gpusPerNode: 8}
  training: {seqLength: 8192, globalBatchSize: 256, precision: $4}
  parallelism: $5
YAML
}

write_plans() { # write_plans gpu
  # Llama 3.1 8B, TP 2 (TP collectives inside the node), DP over the rest.
  plan "$1" llama8b-bf16 llama3.1-8b bf16 "{tp: 2, pp: 1, sequenceParallel: true}"
  plan "$1" llama8b-fp8 llama3.1-8b fp8 "{tp: 2, pp: 1, sequenceParallel: true}"
  # Qwen3-30B-A3B: 128 experts, EP 8 in the node (16 local experts each), PP 2 dropped by the
  # downscale.
  plan "$1" qwen3-30b-a3b-bf16 qwen3-30b-a3b bf16 "{tp: 1, pp: 2, ep: 8}"
}

run_cases() { # run_cases backend: sets status to 1 when a case fails
  local c
  status=0
  for c in $CASES; do
    echo "== bench $c"
    if "$PRIMUS" bench -f "$OUT/$c.plan.yaml" --backend "$1" --runs "$RUNS" --warmup "$WARMUP" \
         -o "$OUT/$c.report.json" --compare > "$OUT/$c.compare.txt"; then
      cat "$OUT/$c.compare.txt"
      {
        echo "### analytic"
        "$PRIMUS" project -f "$OUT/$c.plan.yaml"
        echo
        echo "### calibrated by $c.report.json"
        "$PRIMUS" project -f "$OUT/$c.plan.yaml" --calibration "$OUT/$c.report.json"
      } > "$OUT/$c.project.txt" 2>&1 || status=1
      cat "$OUT/$c.project.txt"
    else
      echo "bench $c failed"
      status=1
    fi
  done
}
