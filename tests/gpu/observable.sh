#!/usr/bin/env bash
# The GPU lane's observability check (docs/plugin.md), device side, after
# tests/gpu/run-lane.sh's calls 1-2 installed vLLM into /tmp/site; carry .gpu/sw
# (stepwarm's wheel). Runs, each engine in its own process, one after another:
#   1. tests/e2e/observable_run.py tiny-llama dummy, without and with the plugin
#      (STEPWARM_SCENARIOS=default): unseeded temperature-1 tokens must be equal;
#   2. stepwarm run at gpu_memory_utilization=0.95 with three scenarios: the
#      report's memory fields (free before/after, peak) per scenario.
set -uo pipefail
D=${STEPWARM_GPU_DIR:-.gpu}
OUTDIR=${OUT:-/tmp/stepwarm-observable}
mkdir -p "$OUTDIR"
if [ ! -d /tmp/site/vllm ]; then . "$D/c2/install.sh" || exit 1; fi
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$D"/sw/stepwarm-*.whl || exit 1
nvidia-smi -L
[ "${1:-}" = traffic ] || for mode in without with; do
  if [ $mode = with ]; then export STEPWARM_SCENARIOS=default; else unset STEPWARM_SCENARIOS; fi
  python3 tests/e2e/observable_run.py tiny-llama dummy > "$OUTDIR/observable-$mode.out" 2> "$OUTDIR/observable-$mode.err"
  echo "observable $mode: rc $? $(grep '^RESULT' "$OUTDIR/observable-$mode.out" | python3 -c 'import json,sys; r=json.loads(sys.stdin.read()[7:]); print(r["traffic"], "reports:", None if r["reports"] is None else [(x["plan"], x["ok"]) for x in r["reports"]])')"
done
[ "${1:-}" = traffic ] || { unset STEPWARM_SCENARIOS; python3 -m stepwarm run -s default -s mixed-prefill-decode -s sampler-matrix -e gpu_memory_utilization=0.95 \
  --json "$OUTDIR/run-gmu095.json" > "$OUTDIR/run-gmu095.out" 2> "$OUTDIR/run-gmu095.err"
echo "run gmu 0.95: rc $?"; tail -5 "$OUTDIR/run-gmu095.out"
python3 - "$OUTDIR/run-gmu095.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["scenarios"]:
    print(s["plan"], s["ok"], s.get("memory"))
PY
}
# 3. (argument "traffic") the serving-equality traffic of tests/e2e/test_observable.py
#    (seeded weights; greedy, seeded and unseeded sampled requests, repeats, a batch)
#    on each model given, without and with STEPWARM_SCENARIOS=all.
if [ "${1:-}" = traffic ]; then
  shift
  for m in "$@"; do
    for mode in without with; do
      if [ $mode = with ]; then export STEPWARM_SCENARIOS=all STEPWARM_ON_ERROR=warn; else unset STEPWARM_SCENARIOS STEPWARM_ON_ERROR; fi
      python3 tests/e2e/observable_run.py "$m" traffic > "$OUTDIR/traffic-$m-$mode.out" 2> "$OUTDIR/traffic-$m-$mode.err"
      echo "traffic $m $mode: rc $?"
    done
    python3 - "$OUTDIR/traffic-$m-without.out" "$OUTDIR/traffic-$m-with.out" <<'PY'
import json, sys
a, b = (json.loads([l for l in open(p) if l.startswith("RESULT ")][-1][7:]) for p in sys.argv[1:])
print("equal tokens+cached:", a["traffic"] == b["traffic"], "blocks:", a["num_blocks"], b["num_blocks"],
      "requests:", len(a["traffic"]), "scenarios:", [(r["plan"], r["ok"], bool(r["skipped"])) for r in b["reports"]])
PY
  done
fi
