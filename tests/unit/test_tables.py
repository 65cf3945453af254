"""Block tables per step (stepwarm.tables, ``show --tables``): exact ids, no engine."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.profile import CacheSpec, RunnerProfile
from stepwarm.scenario import plans_for, tiny_profile
from stepwarm.tables import id_ranges, step_blocks

runner = CliRunner()

#: Full attention + a one-block sliding window, prefix caching and zeroing
#: on: a prefix hit gets a null placeholder in the window group.
WINDOW = RunnerProfile(
    runner="v1", kv_cache_groups=(CacheSpec(kind="full_attention", block_size=16),
                                  CacheSpec(kind="sliding_window", block_size=16,
                                            sliding_window=16)),
    num_blocks=100, max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
    vocab_size=100, zeroes_new_blocks=True, enable_prefix_caching=True)


def _ids(step, request, group):
    (req,) = [r for r in step.requests if r.request == request]
    g = req.groups[group]
    return req.row, g.sent, g.table, g.null, g.hit, g.allocated, g.zeroed


def test_prefix_hit_on_the_tiny_profile():
    prof = tiny_profile()
    steps = step_blocks(plans_for(["prefix-hit"], prof)[0], prof)
    assert [s.kind for s in steps] == ["prefix_hit", "decode", "finish", "prefix_hit", "decode",
                                       "finish", "prefix_hit", "prefill", "decode", "cleanup"]
    # row, sent, table, null positions, hit, allocated, zeroed (no zeroing here)
    assert _ids(steps[0], "hit1[0]", 0) == ("new", (1, 3), (1, 3), (), (1,), (3,), ())
    assert _ids(steps[0], "hit1[1]", 0) == ("new", (2, 4), (2, 4), (), (2,), (4,), ())
    assert _ids(steps[1], "hit1[0]", 0) == ("running", (), (1, 3), (), (), (), ())
    assert steps[2].requests == ()
    assert _ids(steps[3], "hit2", 0) == ("new", (4, 2, 3), (4, 2, 3), (), (4, 2), (3,), ())
    assert _ids(steps[6], "hit3", 0) == ("new", (3, 2), (3, 2), (), (3,), (2,), ())
    assert _ids(steps[7], "hit3", 0) == ("running", (), (3, 2), (), (), (), ())
    assert all(s.new_block_ids_to_zero is None for s in steps)


def test_window_group_nulls_hits_and_zeroing():
    steps = step_blocks(plans_for(["prefix-hit"], WINDOW)[0], WINDOW)
    assert _ids(steps[0], "hit1[0]", 0) == ("new", (1, 5), (1, 5), (), (1,), (5,), (5,))
    assert _ids(steps[0], "hit1[0]", 1) == ("new", (2, 6), (2, 6), (), (2,), (6,), (6,))
    # group-major, requests in schedule order (KVCacheManager.take_new_block_ids)
    assert steps[0].new_block_ids_to_zero == (5, 7, 6, 8)
    # the window skips the hit's first block: a null placeholder at position 0
    assert _ids(steps[3], "hit2", 0) == ("new", (8, 4, 3), (8, 4, 3), (), (8, 4), (3,), (3,))
    assert _ids(steps[3], "hit2", 1) == ("new", (0, 7, 6), (0, 7, 6), (0,), (7,), (6,), (6,))
    assert steps[3].new_block_ids_to_zero == (3, 6)
    # the window's first block (7) is freed and handed to group 0; the
    # runner's copy of group 1 still lists it
    assert _ids(steps[7], "hit3", 0) == ("running", (7,), (6, 3, 7), (), (), (7,), (7,))
    assert _ids(steps[7], "hit3", 1) == ("running", (8,), (7, 4, 8), (), (), (8,), (8,))
    assert steps[7].new_block_ids_to_zero == (7, 8)
    assert steps[8].new_block_ids_to_zero is None


def test_id_ranges():
    assert id_ranges((0, 0, 5, 6, 7, 9, 10)) == "0 0 5-7 9 10"
    assert id_ranges(()) == "-"


def test_show_tables_prints_ids_and_split_counts():
    r = runner.invoke(app, ["show", "--tables", "prefix-hit"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    lines = [" ".join(line.split()) for line in r.stdout.splitlines()]
    # the plan table: allocated / hit / null counts in their own columns
    assert "┃ # ┃ kind ┃ step ┃ requests ┃ tokens ┃ spec ┃ alloc blk ┃ hit blk ┃ null blk ┃ " \
           "held blk ┃ sampled ┃" in lines
    assert "│ 3 │ prefix_hit │ prefix hit hit2 x rest │ hit2 │ 1 │ 0 │ 1 │ 2 │ 0 │ 3 │ 1 │" in lines
    assert "│ 0 │ prefix_hit │ prefix hit hit1[0],hit1[1] x rest │ hit1[0..1] │ 10 │ 0 │ 2 │ 2 │ 0 " \
           "│ 4 │ 2 │" in lines
    # the block table view
    assert ("┃ # ┃ kind ┃ request ┃ row ┃ g ┃ block table (runner) ┃ hit (prefix cache) ┃ "
            "allocated (pool) ┃ null ┃ zeroed ┃") in lines
    assert "│ 0 │ prefix_hit │ hit1[0] │ new │ 0 │ 1 3 │ 1 │ 3 │ 0 │ - │" in lines
    assert "│ │ │ hit1[1] │ new │ 0 │ 2 4 │ 2 │ 4 │ 0 │ - │" in lines
    assert "│ 3 │ prefix_hit │ hit2 │ new │ 0 │ 4 2 3 │ 4 2 │ 3 │ 0 │ - │" in lines
    assert "│ 4 │ decode │ hit2 │ running │ 0 │ 4 2 3 │ - │ - │ 0 │ - │" in lines


def test_show_tables_two_groups_from_a_profile(tmp_path):
    p = tmp_path / "window.json"
    WINDOW.save(p)
    r = runner.invoke(app, ["show", "--tables", "prefix-hit", "--profile", str(p)],
                      env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    lines = [" ".join(line.split()) for line in r.stdout.splitlines()]
    assert "│ 3 │ prefix_hit │ prefix hit hit2 x rest │ hit2 │ 1 │ 0 │ 1/1 │ 2/1 │ 0/1 │ 3/3 │ 1 │" \
        in lines
    assert "│ 3 │ prefix_hit │ hit2 │ new │ 0 │ 8 4 3 │ 8 4 │ 3 │ 0 │ 3 │" in lines
    assert "│ │ │ │ │ 1 │ 0 7 6 │ 7 │ 6 │ 1 │ 6 │" in lines


def test_show_without_tables_prints_no_ids():
    r = runner.invoke(app, ["show", "prefix-hit"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "block table (runner)" not in r.stdout


@pytest.mark.parametrize("width", [80, 100, 200])
def test_show_tables_sizes_columns_to_their_words_and_splits_none(width):
    """At 80 columns and up every cell of the block table view is whole on
    one line (no ``runnin/g``, ``alloca/ted``), and the 80-column view says
    what its short headers stand for (issue 42 item 5)."""
    import io

    from rich.console import Console

    from stepwarm.console import SHORT_BLOCK_HELP, BlockTablesView
    from stepwarm.scenario import plans_for
    from stepwarm.tables import step_blocks

    profile = tiny_profile()
    (plan,) = plans_for(["prefix-hit"], profile)
    view = BlockTablesView("t", step_blocks(plan, profile))
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(view)
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= width
    body = [[c.strip() for c in ln.split("│")[1:-1]] for ln in lines if ln.startswith("│")]
    assert body == view.rows  # one line per row: every cell whole
    header = " ".join(" ".join(lines).split())
    short = width < 100  # the full headers' words need 91 columns here
    assert ("┃ table ┃ hit ┃ alloc ┃" in header) == short and (SHORT_BLOCK_HELP in header) == short
    assert ("(runner)" in header and "(pool)" in header) == (not short)


def test_show_tables_too_narrow_for_the_table_is_lines_of_whole_fields():
    import io

    from rich.console import Console

    from stepwarm.console import BlockTablesView
    from stepwarm.scenario import plans_for
    from stepwarm.tables import step_blocks

    profile = tiny_profile()
    (plan,) = plans_for(["prefix-hit"], profile)
    buf = io.StringIO()
    Console(file=buf, width=60, color_system=None).print(
        BlockTablesView("t", step_blocks(plan, profile)))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 60 and "┃" not in buf.getvalue()
    # each step on a line of its own, its rows under it, indented (issue 42, I)
    assert lines[lines.index("3 prefix_hit"):][:3] == [
        "3 prefix_hit", "  hit2 new g0: table 4 2 3, hit 4 2, alloc 3, null 0,",
        "      zeroed -"]


def test_show_tables_at_80_columns_puts_a_long_kind_on_a_row_above_its_requests():
    """``default``'s ``mixed_prefill_decode`` leaves the short headers' table
    too wide at 80 columns: each step is a row of its own (number and kind),
    its requests' rows under it, every cell whole (issue 42, fourth trial, I)."""
    import io

    from rich.console import Console

    from stepwarm.console import SHORT_BLOCK_HELP, BlockTablesView
    from stepwarm.scenario import plans_for
    from stepwarm.tables import step_blocks

    profile = tiny_profile()
    (plan,) = plans_for(["default"], profile)
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(
        BlockTablesView("t", step_blocks(plan, profile)))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80 and SHORT_BLOCK_HELP in " ".join(" ".join(lines).split())
    body = [[c.strip() for c in ln.split("│")[1:-1]] for ln in lines if ln.startswith("│")]
    assert [r[0] for r in body if r[1] == ""] == [
        "0 prefill", "1 decode", "2 decode", "3 decode", "4 cleanup", "5 prefill",
        "6 mixed_prefill_decode", "7 cleanup"]
    six = [r for r in body[body.index(["6 mixed_prefill_decode", *[""] * 7]) + 1:]][:2]
    assert six == [["mixed_decode", "running", "0", "8", "-", "-", "0", "-"],
                   ["mixed_prefill", "new", "0", "7", "-", "7", "0", "-"]]
    assert "│   mixed_decode " in buf.getvalue()  # indented under its step
