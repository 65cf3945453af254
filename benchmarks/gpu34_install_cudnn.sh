#!/usr/bin/env bash
# cuDNN 9.24 for vLLM 0.34's torch 2.14 on the lent GPU (the image's cuDNN 9.19 makes torch 2.14 refuse
# conv layers: Whisper's audio encoder, Qwen2.5-VL's patch embedding). Built on the CPU machine:
#   python3 -m pip download --no-deps nvidia-cudnn-cu13==9.24.0.43 (553 MB), unzipped, the cubins of
#   other GPUs zeroed (../shared/gpu/fatbin_keep.py: 260 MB of the 922 MB), nvidia/cudnn/lib and
#   include packed as .gpu34/cudnn/cudnn.tar.zst (zstd -15, 251 MB), split into 60 MB pieces
#   .gpu34/cudnn/pNN/cudnn.NN, its sha256 in .gpu34/cudnn/cudnn.sha256.
# Device side: one call per piece (carry .gpu34/cudnn/pNN, command
#   `mkdir -p /root/scudnn && mv .gpu34/cudnn/pNN/cudnn.* /root/scudnn/`), after vLLM 0.34's kit;
# the last piece's call also carries .gpu34/cudnn/cudnn.sha256 (cp it into /root/scudnn). Then, after
# `. .gpu34/k/install-034.sh` (or /root/s34/k/install-034.sh):   . benchmarks/gpu34_install_cudnn.sh
# It unpacks into /tmp/site34/nvidia/cudnn/lib, where torch 2.14's RPATH ($ORIGIN/../../nvidia/cudnn/lib)
# and its preload look first (/tmp/site34 leads PYTHONPATH), and prints the cuDNN torch loads.
_CD=/root/scudnn
if [ ! -f /tmp/site34/nvidia/cudnn/lib/libcudnn.so.9 ]; then
  cat $_CD/cudnn.[0-9][0-9] > /tmp/cudnn.tar.zst || return 1
  if [ -f $_CD/cudnn.sha256 ]; then
    echo "$(cat $_CD/cudnn.sha256)  /tmp/cudnn.tar.zst" | sha256sum -c --quiet || { echo "install-cudnn: sha256 mismatch" >&2; return 1; }
  fi
  _Z=$(command -v zstd || echo /root/s34/k/zstd)
  mkdir -p /tmp/site34 && LD_LIBRARY_PATH=/root/s34/k "$_Z" -d -q -c /tmp/cudnn.tar.zst | tar -x -C /tmp/site34 || return 1
  rm -f /tmp/cudnn.tar.zst
fi
python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
