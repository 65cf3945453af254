#!/usr/bin/env bash
# The GPU lane, device side: run from this repo's root on a lent H200 machine
# (docs/gpu-lane.md). Needs vLLM's CUDA build, brought the way
# ../shared/gpu/README.md says, and stepwarm's wheel in .gpu/sw:
#   here:    ../shared/gpu/prepare.sh && python3 -m pip wheel -q --no-deps -w .gpu/sw .
#   call 1:  carry .gpu/c1           command: bash .gpu/c1/stash.sh
#   call 2:  carry .gpu/c2 .gpu/sw   command: bash tests/gpu/run-lane.sh parallel   (2 GPUs: nvidia-h200-x2)
#   call 3:  carry .gpu/c3 .gpu/sw   command: bash tests/gpu/run-lane.sh serve
#   call 4:  carry .gpu/c3 .gpu/sw   command: bash tests/gpu/run-lane.sh dp   (DP=2 + EP, tiny-mixtral:
#            needs c3's MoE kernels; nvidia-h200-x2)
# Calls 2 and 3 go back to back (the machine stays warm ~30 s).
# $1: parallel (tests/gpu/test_parallel.py) | serve (test_serve.py, test_policy.py) |
#     dp (test_data_parallel.py) | all;
# further arguments go to pytest (e.g. -k "tp1 or tp2").
set -uo pipefail
D=${STEPWARM_GPU_DIR:-.gpu}
PART=${1:-all}
shift || true
OUTDIR=${OUT:-/tmp/stepwarm-lane}
mkdir -p "$OUTDIR"
if [ ! -d /tmp/site/vllm ]; then . "$D/c2/install.sh" || exit 1; fi
if [ -d "$D/c3" ] && [ ! -d /tmp/site/uvicorn ]; then . "$D/c3/install-serve.sh" || exit 1; fi
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
# stepwarm installed as a package: its vllm.general_plugins entry point is how vLLM finds it.
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$D"/sw/stepwarm-*.whl || exit 1
# (tests/gpu/lane.py gives every engine start fresh compile caches.)
export STEPWARM_LANE_RECORD="$OUTDIR/lane-$PART.jsonl"
case "$PART" in
  parallel) FILES=(tests/gpu/test_parallel.py) ;;
  serve) FILES=(tests/gpu/test_serve.py tests/gpu/test_policy.py) ;;
  dp) FILES=(tests/gpu/test_data_parallel.py) ;;
  *) FILES=(tests/gpu) ;;
esac
nvidia-smi -L
python3 -c "import vllm, stepwarm; print('vllm', vllm.__version__, 'stepwarm from', stepwarm.__file__)"
python3 -m pytest -p no:cacheprovider -v -rA "${FILES[@]}" "$@" 2>&1 | tee "$OUTDIR/lane-$PART.log"
exit "${PIPESTATUS[0]}"
