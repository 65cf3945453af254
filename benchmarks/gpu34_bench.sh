#!/usr/bin/env bash
# stepwarm bench on a lent H200 (vLLM 0.34, carried as ../shared/gpu/README.md says), issue 45:
# the Llama-3.1-8B shape, A = vLLM's default attention backend (FlashAttention 3) against
# B = TRITON_ATTN, interleaved rounds, 3 pairs of processes (PROCESSES=N); `mixed-prefill-decode` and the decode sweep
# (benchmarks/scenarios/decode-sweep.toml), each twice (run 1, then run 2), one bench at a
# time and nothing else on the device. In the foreground (one device call each, so a machine
# taken back between calls loses nothing already returned); JSON, CSV, SVG and logs into $OUT.
# A child that does not answer in CHILD_TIMEOUT s (default 240: s28's run 2 hung at a child's
# engine start) prints its Python stacks into the log and the bench exits 1.
#   bash benchmarks/gpu34_bench.sh mpd [PLOT_WHEELS_DIR]     (the kit's first call: install too)
#   bash benchmarks/gpu34_bench.sh sweep
#   bash benchmarks/gpu34_bench.sh resample                  (the _resample_kernel probe, EAGLE V2)
#   bash benchmarks/gpu34_bench.sh hide                      (benchmarks/gpu_probe_hide_host.py: bench's
#        queued sleep against events around the kernels alone; torch only; `all` runs it first)
#   bash benchmarks/gpu34_bench.sh all [PLOT_WHEELS_DIR]     (HIDE=0: without the probe; mpd run 1, sweep run 1, mpd run 2, sweep run 2,
#        in a new process session: the call returns at once; poll with `bash benchmarks/gpu34_bench.sh poll`,
#        which copies /root/bw/bench.tgz (every JSON, CSV, SVG and log so far, one file) into $OUT)
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
bench() {  # NAME SCENARIO REPEAT WARMUP [RUNS]
  for run in ${5:-1 2}; do
    timeout 580 python3 -m stepwarm bench "$2" --model $M "${E[@]}" --repeat "$3" --warmup "$4" --rounds 3 --processes "${PROCESSES:-3}" "${B[@]}" --child-timeout "${CHILD_TIMEOUT:-240}" \
      --json "$OUT/$1-run$run.json" --csv "$OUT/$1-run$run.csv" --plot "$OUT/$1-run$run.svg" > "$OUT/$1-run$run.log" 2>&1
    echo "rc $?" >> "$OUT/$1-run$run.log"
    grep -v "WARNING\|^W1\|^\[" "$OUT/$1-run$run.log" | tail -n 14
    [ -n "${PACK:-}" ] && tar -czf "$PACK.tmp" -C "$OUT" . && mv "$PACK.tmp" "$PACK"
  done
}
case "${1:-}" in
  mpd) nvidia-smi -L; bench mpd mixed-prefill-decode 30 5 ;;
  sweep) bench sweep benchmarks/scenarios/decode-sweep.toml 20 3 ;;
  resample) timeout 400 python3 benchmarks/gpu_probe_resample.py > "$OUT/resample.log" 2>&1; echo "rc $?" >> "$OUT/resample.log"; tail -n 20 "$OUT/resample.log" ;;
  hide) timeout 120 python3 benchmarks/gpu_probe_hide_host.py --json "$OUT/hide-host.json" > "$OUT/hide-host.log" 2>&1; echo "rc $?" >> "$OUT/hide-host.log"; tail -n 6 "$OUT/hide-host.log" ;;
  all) if [ -z "${BG:-}" ]; then  # again, detached: it outlives this call
         mkdir -p /root/bw; BG=1 OUT=/root/bw/out PACK=/root/bw/bench.tgz setsid nohup bash "$0" all \
           > /root/bw/all.log 2>&1 < /dev/null & sleep 20; cat /root/bw/all.log; exit 0; fi
       nvidia-smi -L; python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
       [ "${HIDE:-1}" = 0 ] || bash "$0" hide
       for run in 1 2; do bench mpd mixed-prefill-decode 30 5 $run
         bench sweep benchmarks/scenarios/decode-sweep.toml 20 3 $run; done; echo "all done" ;;
  poll) cp /root/bw/bench.tgz "$OUT/" 2>/dev/null; cp /root/bw/all.log "$OUT/" 2>/dev/null
        grep -v "WARNING\|^W1\|^\[" /root/bw/all.log | tail -n 60; ls -la /root/bw/out 2>/dev/null ;;
  *) echo "usage: $0 mpd [PLOT_WHEELS_DIR] | sweep | resample | hide | all [PLOT_WHEELS_DIR] | poll" >&2; exit 2 ;;
esac
