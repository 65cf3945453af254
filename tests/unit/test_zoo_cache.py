"""The zoo's shared model cache under concurrent writers: ``write_model`` never
lets a reader see a half-written file (a new user's `bench --against-e` child
read an empty config.json while another stepwarm process rewrote it), leaves a
file that holds the right bytes alone, and still repairs an edited one."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

from stepwarm.zoo import ZOO, write_model

WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from stepwarm.zoo import write_model
    root, until = Path(sys.argv[1]), float(sys.argv[2])
    config = root / "tiny-qwen2-vl" / "config.json"
    (root / "go").write_text("")
    while time.time() < until:
        # another version's config put in place (atomically: valid JSON), so
        # that write_model has to write config.json again
        (root / "other.json").write_text('{"other": true}')
        os.replace(root / "other.json", config)
        write_model("tiny-qwen2-vl", root=root)
""")


def test_a_reader_never_sees_a_half_written_config_while_another_process_writes(tmp_path):
    model_dir = write_model("tiny-qwen2-vl", root=tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(time.time() + 3)])
    while not (tmp_path / "go").exists():
        time.sleep(0.01)
    reads = bad = 0
    while writer.poll() is None:
        try:
            json.loads((model_dir / "config.json").read_text())
        except ValueError:
            bad += 1
        reads += 1
    assert writer.returncode == 0
    assert reads > 100 and bad == 0, (reads, bad)
    assert json.loads((model_dir / "config.json").read_text()) == ZOO["tiny-qwen2-vl"].config
    assert [p.name for p in model_dir.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_a_right_file_is_left_alone_and_an_edited_one_repaired(tmp_path):
    model_dir = write_model("tiny-llama", root=tmp_path)
    config = model_dir / "config.json"
    tokenizer = model_dir / "tokenizer.json"
    before = (config.stat().st_ino, tokenizer.stat().st_ino, tokenizer.stat().st_mtime_ns)
    write_model("tiny-llama", root=tmp_path)
    assert (config.stat().st_ino, tokenizer.stat().st_ino, tokenizer.stat().st_mtime_ns) == before
    config.write_text('{"architectures": ["Edited"]}')
    write_model("tiny-llama", root=tmp_path)
    assert json.loads(config.read_text()) == ZOO["tiny-llama"].config
    assert oct(config.stat().st_mode & 0o777) == "0o644"
