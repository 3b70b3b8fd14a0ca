"""The README is the first hour (issue 31, item 7), no link of README, CHANGELOG or docs/ is
broken, and the reference pages say what is true now (issue 46): no dates or commit hashes (the
dated history is CHANGELOG.md's), and the longest pages stay readable.

The README stays short enough to read before a first run, says on its first screen what a shell
needs (the virtualenv's ``bin`` on ``PATH``; ``PL_PRIVFED_DATA``), and its placeholders are
filled. Every relative link of README.md and docs/*.md names a file that exists and, where it
has an anchor, a heading of that file (GitHub's slug: lower case, punctuation dropped, spaces to
hyphens), so moving a section cannot leave a reader at a dead end.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CHANGELOG = ROOT / "CHANGELOG.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
#: the reference pages: what the package does now, without dates or commit hashes
REFERENCE_PAGES = (
    "algorithms privacy accounting audit engine scaling package callbacks python_api configs"
)
REFERENCE = [README, *(ROOT / "docs" / f"{name}.md" for name in REFERENCE_PAGES.split())]
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*]|\[|\]\([^)]*\)", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_readme_is_the_first_hour():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (at most 200)"
    first_screen = "\n".join(lines[:40])
    assert ".venv/bin" in first_screen and "PATH" in first_screen
    assert "PL_PRIVFED_DATA" in first_screen
    leftovers = [line for line in lines if re.search(r"\b[A-Z]+_RESULT\b|TODO|FIXME", line)]
    assert not leftovers, leftovers


@pytest.mark.parametrize("page", [README, CHANGELOG, *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


@pytest.mark.parametrize("page", REFERENCE, ids=lambda p: p.name)
def test_reference_pages_carry_no_dates_or_commits(page: Path):
    text = LINK.sub("]()", page.read_text(encoding="utf-8"))  # a link's target may name a date
    found = [m.group(0) for pattern in (DATE, COMMIT) for m in pattern.finditer(text)]
    assert not found, f"{page.name}: {found} (dated history belongs in CHANGELOG.md)"


@pytest.mark.parametrize("name", ["privacy", "performance", "engine"])
def test_the_long_pages_stay_short_and_undated(name: str):
    lines = (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 600, f"docs/{name}.md has {len(lines)} lines (at most 600)"
    dated = [line for line in lines if line.startswith("#") and DATE.search(line)]
    assert not dated, dated
