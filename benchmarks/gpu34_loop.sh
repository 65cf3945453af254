#!/usr/bin/env bash
# vLLM 0.34.0 on a lent H200, second call set (after the kit is carried, as gpu34.sh says):
# the record -> scenario -> restart loop (issue 41 item 5) on the Qwen3-30B-A3B shape (MoE),
# alone on the device (s23 ran the lane tests, two probes and bench beside it).
#   bash benchmarks/gpu34_loop.sh start      (background; then)   bash benchmarks/gpu34_loop.sh wait SECONDS
# The loop, one engine at a time:
#   1. vLLM alone (coverage --baseline) with STEPWARM_RECORD on traffic A (the built-in lines and
#      long odd-length prompts past the CUDA-graph range): the recording;
#   2. stepwarm scenario from-record: the scenario;
#   3. coverage with only that scenario, fresh caches, traffic A; 4. the same on traffic B
#      (the same distribution, other draws); 5. with LOOP_ALL=1, the same engine with `all` on
#      traffic A (coverage: fresh caches): the start-up the recorded scenario is held to, then `all`
#      on traffic B. LOOP_REC=FILE (a recording carried with the tree): step 1 left out, FILE recorded.
set -uo pipefail
R=/tmp/stepwarm-034b
M=${LOOP_MODEL:-qwen3-30b-a3b-l2}
E=(-e gpu_memory_utilization=0.3 -e kv_cache_memory_bytes=8000000000)
case "${1:-}" in
  start)
    # unpack in a child shell: sourcing install-034.sh twice in one shell copies the kit over
    # the NCCL stub it preloads (s31: cp segfaulted; the stub survived)
    [ -d /tmp/site34/vllm ] || bash -c '. .gpu34/k/install-034.sh' || exit 1
    . /root/s34/k/install-034.sh || exit 1
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site34 /root/s34/k/stepwarm-*.whl || exit 1
    mkdir -p $R/out; cp -r benchmarks/traffic $R/
    export PYTHONUNBUFFERED=1 STEPWARM_LANE_RECORD=$R/out/lane.jsonl
    REPO=$PWD
    setsid nohup bash -c "
      cd $R
      if [ -n \"${LOOP_REC:-}\" ]; then cp $REPO/${LOOP_REC:-} $R/out/moe.rec.jsonl; else
      STEPWARM_RECORD=$R/out/moe.rec.jsonl timeout 500 python3 -m stepwarm coverage --baseline --model $M ${E[*]} traffic/moe-long-a.jsonl --json $R/out/loop-1-record.json > $R/out/loop-1.log 2>&1; echo rc \$? >> $R/out/loop-1.log; fi
      python3 -m stepwarm scenario from-record $R/out/moe.rec.jsonl -o $R/out/recorded.toml --model $M > $R/out/loop-2.log 2>&1; echo rc \$? >> $R/out/loop-2.log
      timeout 500 python3 -m stepwarm coverage --model $M ${E[*]} -s $R/out/recorded.toml traffic/moe-long-a.jsonl --json $R/out/loop-3-a.json > $R/out/loop-3.log 2>&1; echo rc \$? >> $R/out/loop-3.log
      timeout 500 python3 -m stepwarm coverage --model $M ${E[*]} -s $R/out/recorded.toml traffic/moe-long-b.jsonl --json $R/out/loop-4-b.json > $R/out/loop-4.log 2>&1; echo rc \$? >> $R/out/loop-4.log
      if [ -n \"${LOOP_ALL:-}\" ]; then timeout 500 python3 -m stepwarm coverage --model $M ${E[*]} -s all traffic/moe-long-a.jsonl --json $R/out/loop-5-all.json > $R/out/loop-5.log 2>&1; echo rc \$? >> $R/out/loop-5.log
        timeout 500 python3 -m stepwarm coverage --model $M ${E[*]} -s all traffic/moe-long-b.jsonl --json $R/out/loop-6-all-b.json > $R/out/loop-6.log 2>&1; echo rc \$? >> $R/out/loop-6.log; fi
      wait; echo done > $R/done" > $R/runner.log 2>&1 < /dev/null &
    sleep 2; cat $R/runner.log
    ;;
  wait)
    END=$(( $(date +%s) + ${2:-500} ))
    while [ "$(date +%s)" -lt "$END" ] && [ ! -f $R/done ]; do sleep 5; done
    ls -la $R/out; tail -n 2 $R/out/*.log; grep -h "start-up .* s" $R/out/*.log | cut -c1-300
    mkdir -p "${OUT:-/tmp/out}"; tar -czf "${OUT:-/tmp/out}/gpu34b.tar.gz" -C $R out
    ;;
  *) echo "usage: $0 start | wait SECONDS" >&2; exit 2 ;;
esac
