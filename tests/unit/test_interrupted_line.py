"""``run``'s Ctrl-C line is wrapped as its other lines (COLUMNS=80, piped)."""

from __future__ import annotations

from stepwarm.cli import print_interrupted


def test_the_interrupted_line_wraps_at_80_columns(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    print_interrupted("scenario long step 45/402 (decode, decode a)",
                      "cleanup ran, the runner holds no stepwarm request", ["default"])
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "interrupted: scenario long step 45/402 (decode, decode a); cleanup ran, the\n"
        "             runner holds no stepwarm request; not run: default.\n")
    assert max(len(line) for line in err.splitlines()) <= 80
