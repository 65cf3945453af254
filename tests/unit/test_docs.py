"""The README, docs/ and the campaigns' index: every relative link and anchor
resolves; the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "campaigns" / "README.md"]
README_MAX_LINES = 200

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor in a Markdown file (GitHub numbers repeats -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        a = anchor(heading)
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
    return out


def links(path: Path) -> list[str]:
    """The relative link targets in a Markdown file, code blocks left out."""
    return [t for t in _LINK.findall(_FENCE.sub("", path.read_text()))
            if not re.match(r"[a-z]+:", t)]


def test_anchor_matches_github():
    assert anchor("Coverage: does the first request cost what the second does?") == \
        "coverage-does-the-first-request-cost-what-the-second-does"
    assert anchor("The GPU lane on two H200s (`tests/gpu`, 2026-11-30)") == \
        "the-gpu-lane-on-two-h200s-testsgpu-2026-11-30"


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES


def test_readme_links_every_doc():
    linked = {(ROOT / t.split("#")[0]).resolve() for t in links(ROOT / "README.md")}
    assert [d.name for d in DOCS[1:] if d.resolve() not in linked] == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve(doc: Path):
    broken = []
    for target in links(doc):
        file, _, frag = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(f"{target}: no heading #{frag} in {dest.relative_to(ROOT)}")
    assert broken == []


def test_docs_cli_names_every_option_of_every_command():
    """docs/cli.md is the reference the README points to for every option:
    each command's options appear there (issue 42 item 14)."""
    import typer.main

    from stepwarm.cli import app

    text = (ROOT / "docs" / "cli.md").read_text()
    group = typer.main.get_command(app)
    missing = [f"{name} {'/'.join(param.opts)}"
               for name, command in group.commands.items()  # type: ignore[attr-defined]
               for param in command.params if param.param_type_name == "option"
               and not getattr(param, "hidden", False)  # internal (bench's --child)
               and not any(re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text)
                           for opt in param.opts)]
    assert missing == []


def test_readme_says_where_nox_puts_the_command():
    """After ``nox -s run`` the command is in the run session's virtualenv
    (issue 42 item 13): the README names the path, and the session is ``run``."""
    readme = (ROOT / "README.md").read_text()
    assert ".nox/run/bin/stepwarm" in readme
    assert re.search(r"@nox\.session\s+def run\(", (ROOT / "noxfile.py").read_text())
