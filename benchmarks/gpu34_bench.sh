#!/usr/bin/env bash
# stepwarm bench on a lent H200 (vLLM 0.34, carried as ../shared/gpu/README.md says), issue 45:
# the Llama-3.1-8B shape, A = vLLM's default attention backend (FlashAttention 3) against
# B = TRITON_ATTN, interleaved rounds; `mixed-prefill-decode` and the decode sweep
# (benchmarks/scenarios/decode-sweep.toml), each twice (run 1, then run 2), one bench at a
# time and nothing else on the device. In the foreground (one device call each, so a machine
# taken back between calls loses nothing already returned); JSON, CSV, SVG and logs into $OUT.
#   bash benchmarks/gpu34_bench.sh mpd [PLOT_WHEELS_DIR]     (the kit's first call: install too)
#   bash benchmarks/gpu34_bench.sh sweep
#   bash benchmarks/gpu34_bench.sh resample                  (the _resample_kernel probe, EAGLE V2)
set -uo pipefail
OUT=${OUT:-/tmp/out}
M=llama-3.1-8b-l2
E=(-e gpu_memory_utilization=0.15 -e kv_cache_memory_bytes=4000000000 -e max_num_batched_tokens=16384)
B=(--against-e 'attention_backend="TRITON_ATTN"')
if [ -d .gpu34/k ]; then . .gpu34/k/install-034.sh || exit 1; else . /root/s34/k/install-034.sh || exit 1; fi
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site34 /root/s34/k/stepwarm-*.whl 2>&1 | grep -v "already exists" || true
[ -n "${2:-}" ] && { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site34 "$2"/*.whl 2>&1 | grep -v "already exists"; }
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
bench() {  # NAME SCENARIO REPEAT WARMUP
  for run in 1 2; do
    timeout 280 python3 -m stepwarm bench "$2" --model $M "${E[@]}" --repeat "$3" --warmup "$4" --rounds 3 "${B[@]}" \
      --json "$OUT/$1-run$run.json" --csv "$OUT/$1-run$run.csv" --plot "$OUT/$1-run$run.svg" > "$OUT/$1-run$run.log" 2>&1
    echo "rc $?" >> "$OUT/$1-run$run.log"
    grep -v "WARNING\|^W1\|^\[" "$OUT/$1-run$run.log" | tail -n 14
  done
}
case "${1:-}" in
  mpd) nvidia-smi -L; bench mpd mixed-prefill-decode 30 5 ;;
  sweep) bench sweep benchmarks/scenarios/decode-sweep.toml 20 3 ;;
  resample) timeout 400 python3 benchmarks/gpu_probe_resample.py > "$OUT/resample.log" 2>&1; echo "rc $?" >> "$OUT/resample.log"; tail -n 20 "$OUT/resample.log" ;;
  *) echo "usage: $0 mpd [PLOT_WHEELS_DIR] | sweep | resample" >&2; exit 2 ;;
esac
