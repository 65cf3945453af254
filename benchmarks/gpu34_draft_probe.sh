#!/usr/bin/env bash
# vLLM 0.34's draft-model speculator on V2 (tiny Llama + 1-layer draft), the traffic of run s30's
# `draft-v2` job: vLLM alone (coverage --baseline), then with stepwarm (fresh caches), to tell
# whether the device-side assert s30 saw on traffic line 27 is stepwarm's. After the kit's pieces:
#   carry .gpu34/k;  bash benchmarks/gpu34_draft_probe.sh SECONDS      (logs and JSON into $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
. .gpu34/k/install-034.sh || exit 1
for w in .gpu34/k/blake3-*.whl; do [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site34 "$w"; done
E=(--model tiny-llama-draft -e max_num_seqs=64 -e max_num_batched_tokens=2048 -e max_model_len=1024
   -e gpu_memory_utilization=0.12 -e kv_cache_memory_bytes=4000000000)
export PYTHONUNBUFFERED=1
( timeout 300 python3 -m stepwarm coverage --baseline "${E[@]}" benchmarks/traffic/speculators.jsonl \
    --json "$OUT/draft-alone.json" > "$OUT/draft-alone.log" 2>&1; echo "rc $?" >> "$OUT/draft-alone.log"
  timeout 300 python3 -m stepwarm coverage "${E[@]}" benchmarks/traffic/speculators.jsonl \
    --json "$OUT/draft-stepwarm.json" > "$OUT/draft-stepwarm.log" 2>&1; echo "rc $?" >> "$OUT/draft-stepwarm.log" ) &
END=$(( $(date +%s) + ${1:-280} ))
while [ "$(date +%s)" -lt "$END" ] && ! grep -q "^rc" "$OUT/draft-stepwarm.log" 2>/dev/null; do sleep 5; done
for f in "$OUT"/draft-*.log; do echo "== $f"; grep -h "assert\|^stepwarm:.*start-up\|^vLLM.*start-up\|^error\|^rc" "$f" | sort | uniq -c | cut -c1-300 | tail -8; done
