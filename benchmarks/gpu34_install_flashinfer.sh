#!/usr/bin/env bash
# Kept from run s24 (campaigns/results/README.md): the device side of the FlashInfer kit. The bundle
# (.gpu34/fi/fi.tar.zst, 22 MB, not in the repo) is flashinfer-python 0.7.4 unpacked with --no-deps, its
# data/csrc subfolders other than nv_internal, generated, cake_device_helpers, xqa and fmha_v2 dropped,
# and its sampling module compiled ahead here for sm_90a (nvcc 13.0) as flashinfer/data/aot/sampling/sampling.so.
# FlashInfer 0.7.4 (slimmed) for vLLM 0.34's FlashInfer top-k/top-p sampler, on the H200 image.
# Source it AFTER .gpu34/k/install-034.sh (which puts /tmp/site34 on PYTHONPATH):
#   . .gpu34/k/install-034.sh && . .gpu34/fi/install-fi.sh [DIR] && ...
# DIR (default .gpu34/fi) holds fi.tar.zst or its pieces fi.tar.zst.00, .01, ... and fi.sha256.
# Later calls on the warm machine without carrying DIR: `. /root/sfi/install-fi.sh` (unpacks nothing again).
# Set FI_NO_AOT=1 before sourcing to drop the bundled prebuilt sm_90a sampling.so and force nvcc JIT.
_FI_SRC=${1:-.gpu34/fi}
_FI_KEEP=/root/sfi
mkdir -p $_FI_KEEP
[ -f "$_FI_SRC/install-fi.sh" ] && cp -p "$_FI_SRC/install-fi.sh" $_FI_KEEP/ 2>/dev/null
if [ ! -d /tmp/sitefi/flashinfer ]; then
  if [ -f "$_FI_SRC/fi.tar.zst" ]; then
    _FI_TAR="$_FI_SRC/fi.tar.zst"
  else
    cat "$_FI_SRC"/fi.tar.zst.[0-9][0-9] > /tmp/fi.tar.zst || { echo "install-fi: no bundle in $_FI_SRC" >&2; return 1; }
    _FI_TAR=/tmp/fi.tar.zst
  fi
  if [ -f "$_FI_SRC/fi.sha256" ]; then
    echo "$(cat "$_FI_SRC/fi.sha256")  $_FI_TAR" | sha256sum -c --quiet || { echo "install-fi: sha256 mismatch" >&2; return 1; }
  fi
  mkdir -p /tmp/sitefi
  if command -v zstd >/dev/null 2>&1; then
    zstd -d -q -c "$_FI_TAR" | tar -x -C /tmp/sitefi || return 1
  else
    LD_LIBRARY_PATH=/root/s34/k /root/s34/k/zstd -d -q -c "$_FI_TAR" | tar -x -C /tmp/sitefi || return 1
  fi
  rm -f /tmp/fi.tar.zst
fi
[ "${FI_NO_AOT:-0}" = 1 ] && rm -rf /tmp/sitefi/flashinfer/data/aot

export PYTHONPATH=/tmp/sitefi${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=1
# FlashInfer's JIT cache: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/0.7.4/<arch, 90a on H100/H200>/cached_ops/
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws
mkdir -p $FLASHINFER_WORKSPACE_BASE
# Hopper only (H100/H200): pin the target so flashinfer's arch detection cannot come up empty.
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0}

# nvcc for the JIT (vLLM's has_flashinfer() also needs it, plus `ninja` on PATH).
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
elif command -v nvcc >/dev/null 2>&1; then
  export CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
else
  echo "install-fi: WARNING no nvcc found; only the bundled prebuilt sampling.so can work" >&2
fi
[ -n "$CUDA_HOME" ] && export PATH=$CUDA_HOME/bin:$PATH
if ! command -v ninja >/dev/null 2>&1; then
  _FI_NINJA=$(python3 -c 'import ninja,os; print(ninja.BIN_DIR)' 2>/dev/null)
  [ -n "$_FI_NINJA" ] && [ -x "$_FI_NINJA/ninja" ] && export PATH=$PATH:$_FI_NINJA
  command -v ninja >/dev/null 2>&1 || echo "install-fi: WARNING no ninja on PATH: vLLM will report FlashInfer disabled" >&2
fi
# The sampling kernels #include <curand.h>/<curand_kernel.h>; a toolkit without curand's headers
# gets them from the image's pip nvidia-curand (nvidia/cu13/include), searched after the toolkit's.
if [ -n "$CUDA_HOME" ] && [ ! -f "$CUDA_HOME/include/curand.h" ]; then
  _FI_INC=$(python3 -c 'import nvidia,os
for p in nvidia.__path__:
    for s in ("cu13/include","curand/include"):
        if os.path.isfile(os.path.join(p,s,"curand.h")): print(os.path.join(p,s)); raise SystemExit' 2>/dev/null)
  if [ -n "$_FI_INC" ]; then
    export FLASHINFER_EXTRA_CUDAFLAGS="${FLASHINFER_EXTRA_CUDAFLAGS:+$FLASHINFER_EXTRA_CUDAFLAGS }-isystem $_FI_INC"
  else
    echo "install-fi: WARNING curand.h not found; the sampling JIT will fail (prebuilt .so still usable)" >&2
  fi
fi
unset _FI_SRC _FI_KEEP _FI_TAR _FI_NINJA _FI_INC
