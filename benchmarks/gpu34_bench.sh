#!/usr/bin/env bash
# stepwarm bench on the H200 (vLLM 0.34): mixed-prefill-decode on the Llama-3.1-8B shape, vLLM's
# default attention backend (A) against TRITON_ATTN (B), interleaved; JSON and CSV into $1.
OUTDIR=${1:-/tmp/out}
exec timeout 420 python3 -m stepwarm bench mixed-prefill-decode --model llama-3.1-8b-l2 \
  -e gpu_memory_utilization=0.15 -e kv_cache_memory_bytes=4000000000 \
  --repeat 30 --warmup 5 --rounds 3 --against-e 'attention_backend="TRITON_ATTN"' \
  --json "$OUTDIR/bench-8b-mpd.json" --csv "$OUTDIR/bench-8b-mpd.csv"
