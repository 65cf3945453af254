#!/usr/bin/env bash
# vLLM 0.34.0 on a lent H200: the tight-memory run alone, then `stepwarm coverage`
# jobs beside the one-GPU GPU lane (vllm serve + policy tests), in the background,
# over several device calls. vLLM 0.34 is carried as ../shared/gpu/README.md says
# ("vLLM 0.34.0 on the H200": prepare-034.sh, 8 pieces, then the kit .gpu34/k, with
# stepwarm's wheel rebuilt from this tree: python3 -m pip wheel -q --no-deps -w .gpu34/k .).
#   call 9:  carry .gpu34/k [.gpu34/fi]   bash benchmarks/gpu34.sh start A.jsonl B.jsonl [PARALLEL] [LANE]
# A runs alone (one job at a time; '-' for none), then B, PARALLEL jobs at a time. LANE: 'beside'
# (default: the one-GPU lane beside B), 'alone' (after A, before B: vLLM's memory check fails
# when another engine frees memory while it profiles), 'none'. With .gpu34/fi carried
# (benchmarks/gpu34_install_flashinfer.sh's bundle) FlashInfer is unpacked into /tmp/sitefi but
# not put on the path: a job that wants it says so in its env (PYTHONPATH, VLLM_USE_FLASHINFER_SAMPLER=1).
#   call 10+:                 bash benchmarks/gpu34.sh wait SECONDS
# `wait` sleeps until everything ends or SECONDS pass, then packs the results so far
# into $OUT/gpu34.tar.gz and prints progress.
set -uo pipefail
R=/tmp/stepwarm-034
case "${1:-}" in
  start)
    A=$2; B=$3; PARALLEL=${4:-4}; LANE=${5:-beside}
    . .gpu34/k/install-034.sh || exit 1
    # vLLM's multimodal hasher imports blake3 (Whisper, Qwen2.5-VL): the kit carries its cp312 wheel
    # (python3 -m pip download --no-deps blake3==1.0.11 --python-version 3.12 --only-binary=:all:
    #  --platform manylinux_2_17_x86_64 -d .gpu34/k). Call `start` in a fresh shell: sourcing
    # install-034.sh twice in one shell copies over the NCCL stub it preloads (a segfault).
    for w in .gpu34/k/blake3-*.whl; do [ -f "$w" ] && { python3 -m pip install -q --no-index --no-deps --target /tmp/site34 "$w" || exit 1; }; done
    if [ -d .gpu34/fi ]; then ( . .gpu34/fi/install-fi.sh .gpu34/fi ) || exit 1; ls -d /tmp/sitefi/flashinfer/data/aot/*; fi
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site34 /root/s34/k/stepwarm-*.whl || exit 1
    mkdir -p $R/out && cp -r benchmarks/traffic $R/ && cp "$B" $R/b.jsonl
    if [ "$A" = - ]; then : > $R/a.jsonl; else cp "$A" $R/a.jsonl; fi
    cp benchmarks/coverage_jobs.py $R/
    nvidia-smi -L
    python3 -c "import vllm, torch, triton, stepwarm; print('vllm', vllm.__version__, 'torch', torch.__version__, 'triton', triton.__version__, 'stepwarm from', stepwarm.__file__)"
    export PYTHONUNBUFFERED=1 STEPWARM_LANE_RECORD=$R/out/lane.jsonl
    REPO=$PWD
    LANE_CMD="cd $REPO && python3 -m pytest -p no:cacheprovider -v -rA tests/gpu/test_serve.py tests/gpu/test_policy.py tests/gpu/test_release_facts.py > $R/out/lane.log 2>&1; echo lane rc \$? >> $R/out/lane.log"
    case "$LANE" in beside) BESIDE="($LANE_CMD) &"; ALONE=: ;; alone) BESIDE=:; ALONE="($LANE_CMD)" ;; *) BESIDE=:; ALONE=: ;; esac
    setsid nohup bash -c "
      [ -s $R/a.jsonl ] && { cd $R && python3 coverage_jobs.py a.jsonl --results $R/out/a --parallel 1 > $R/a.log 2>&1; }
      $ALONE
      $BESIDE
      cd $R && python3 coverage_jobs.py b.jsonl --results $R/out/b --parallel $PARALLEL > $R/b.log 2>&1
      wait; echo all done > $R/done" > $R/runner.log 2>&1 < /dev/null &
    sleep 3; cat $R/runner.log
    ;;
  wait)
    END=$(( $(date +%s) + ${2:-500} ))
    while [ "$(date +%s)" -lt "$END" ] && [ ! -f $R/done ]; do sleep 5; done
    for p in $R/out/a/progress.json $R/out/b/progress.json; do [ -f $p ] && python3 -c "
import json,sys; d=json.load(open('$p'))
print('$p', json.dumps(d)[:1500])"; done
    tail -3 $R/a.log $R/b.log $R/out/lane.log 2>/dev/null
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    mkdir -p "${OUT:-/tmp/out}"
    tar -czf "${OUT:-/tmp/out}/gpu34.tar.gz" -C $R out a.log b.log
    ls -la "${OUT:-/tmp/out}"
    ;;
  *) echo "usage: $0 start A.jsonl B.jsonl [PARALLEL] | wait SECONDS" >&2; exit 2 ;;
esac
