#!/usr/bin/env bash
# The long property profile (20 000 examples per property) split over many
# cores: every property test runs as STEPWARM_SHARDS slices of 20 000/shards
# examples, each with its own --hypothesis-seed, JOBS at a time. The mutation
# tests (fixed settings) run once. Prints one line per slice and a summary;
# logs go to $SHARD_DIR (default /tmp/stepwarm-shards). A slice already
# recorded as passed there is not run again, so a run cut short resumes.
# Exit 1 if any slice failed.
#   STEPWARM_SHARDS=16 JOBS=16 bash benchmarks/property_shards.sh
set -uo pipefail
SHARDS=${STEPWARM_SHARDS:-8}
JOBS=${JOBS:-$(nproc)}
OUTDIR=${SHARD_DIR:-/tmp/stepwarm-shards}
PY=${PYTHON:-python3}
mkdir -p "$OUTDIR"
export STEPWARM_SHARDS=$SHARDS HYPOTHESIS_PROFILE=shard
mapfile -t TESTS < <($PY -m pytest -q --collect-only -p no:cacheprovider tests/property 2>/dev/null \
  | grep '::' | grep -v test_mutations)
touch "$OUTDIR/slices.txt"
{
  for s in $(seq 1 "$SHARDS"); do for t in "${TESTS[@]}"; do echo "$t $s"; done; done
  echo "tests/property/test_mutations.py 0"
} | while read -r t s; do
  grep -qxF "rc=0 $t seed=$s" <(sed -E 's/^(rc=0) [0-9]+s /\1 /' "$OUTDIR/slices.txt") || echo "$t $s"
done | START=$(date +%s) xargs -P "$JOBS" -L 1 bash -c '
  t=$0; s=$1; log="'"$OUTDIR"'/$(echo "$t" | tr "/:[]" "____")-$s.log"
  a=$(date +%s); '"$PY"' -m pytest -q -p no:cacheprovider "$t" --hypothesis-seed="$s" >"$log" 2>&1
  rc=$?; echo "rc=$rc $(( $(date +%s) - a ))s $t seed=$s" | tee -a "'"$OUTDIR"'/slices.txt"'
echo "slices: $(wc -l < "$OUTDIR/slices.txt") of $(( ${#TESTS[@]} * SHARDS + 1 )), failed: $(grep -vc '^rc=0' "$OUTDIR/slices.txt")"
! grep -q -v '^rc=0' "$OUTDIR/slices.txt"
