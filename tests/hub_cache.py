"""A local Hugging Face cache written by hand, as ``huggingface_hub`` lays it out.

``HF_HOME/hub/models--ORG--NAME/``: ``blobs/<sha256>`` (file contents),
``snapshots/<commit>/<file>`` (relative symlinks to the blobs) and
``refs/<branch>`` (the commit, no newline). What ``hf download`` leaves.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: The commit the fake snapshots are written at.
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_hub_cache(hf_home: Path, repo_id: str, files: Path, commit: str = COMMIT,
                    refs: tuple[str, ...] = ("main",)) -> Path:
    """Put every file of directory ``files`` into ``hf_home``'s hub cache as
    ``repo_id`` at ``commit``, with ``refs`` pointing at it.

    Returns:
        The snapshot directory.
    """
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(files.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / f.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def hub_env(hf_home: Path) -> dict[str, str]:
    """This process's environment with ``HF_HOME`` = ``hf_home``, offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    return {**env, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
