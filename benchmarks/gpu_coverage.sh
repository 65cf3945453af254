#!/usr/bin/env bash
# `stepwarm coverage --compare` jobs on a lent H200, in the background, over
# several device calls (benchmarks/coverage_jobs.py runs them; docs/benchmarks.md).
# vLLM is carried as ../shared/gpu/README.md says; stepwarm's wheel in .gpu/sw:
#   here:    ../shared/gpu/prepare.sh && python3 -m pip wheel -q --no-deps -w .gpu/sw .
#   call 1:  carry .gpu/c1                  bash .gpu/c1/stash.sh
#   call 2:  carry .gpu/c2                  . .gpu/c2/install.sh
#   call 3:  carry .gpu/c3 .gpu/sw          bash benchmarks/gpu_coverage.sh start JOBS.jsonl [PARALLEL]
#   call 4+: (nothing carried)              bash benchmarks/gpu_coverage.sh wait SECONDS
# `start` installs c3 (vLLM's MoE kernels, the server wheels) and stepwarm, then
# starts the jobs in their own process session (setsid: they outlive the call
# while the machine is held); `wait` sleeps until the jobs end or SECONDS pass,
# then packs every result so far into $OUT/coverage.tar.gz and prints progress.
set -uo pipefail
D=${STEPWARM_GPU_DIR:-.gpu}
RESULTS=/tmp/stepwarm-coverage
case "${1:-}" in
  start)
    JOBS=$2; PARALLEL=${3:-3}
    [ -d /tmp/site/vllm ] || { . "$D/c2/install.sh" || exit 1; }
    export PYTHONPATH=/tmp/site
    if [ -d "$D/c3" ] && [ ! -d /tmp/site/uvicorn ]; then . "$D/c3/install-serve.sh" || exit 1; fi
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$D"/sw/*.whl || exit 1  # stepwarm, and blake3 (multimodal models) where carried
    mkdir -p $RESULTS && cp -r benchmarks/traffic $RESULTS/ && cp "$JOBS" $RESULTS/jobs.jsonl
    cp benchmarks/coverage_jobs.py $RESULTS/
    nvidia-smi -L
    python3 -c "import vllm, stepwarm; print('vllm', vllm.__version__, 'stepwarm from', stepwarm.__file__)"
    # the jobs read their traffic files relative to $RESULTS
    (cd $RESULTS && PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 \
      setsid nohup python3 coverage_jobs.py jobs.jsonl --results $RESULTS/out --parallel "$PARALLEL" \
      >$RESULTS/runner.log 2>&1 < /dev/null &)
    sleep 5; cat $RESULTS/runner.log; cat $RESULTS/out/progress.json 2>/dev/null
    ;;
  wait)
    END=$(( $(date +%s) + ${2:-500} ))
    # the bracket keeps pgrep from matching a calling shell's own command line
    # (one that names the runner, e.g. `wait 400; pgrep ... || probe`)
    while [ "$(date +%s)" -lt "$END" ] && pgrep -f '[c]overage_jobs\.py' >/dev/null; do sleep 5; done
    cat $RESULTS/out/progress.json; tail -3 $RESULTS/runner.log
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    mkdir -p "${OUT:-/tmp/out}"
    tar -czf "${OUT:-/tmp/out}/coverage.tar.gz" -C $RESULTS out
    ls -la "${OUT:-/tmp/out}"
    ;;
  *) echo "usage: $0 start JOBS.jsonl [PARALLEL] | wait SECONDS" >&2; exit 2 ;;
esac
