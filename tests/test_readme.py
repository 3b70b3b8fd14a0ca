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

import csv
import json
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


def test_the_quickstart_grid_numbers_are_its_kept_runs():
    """README's "One sweep and its report" quotes the quickstart grid's validation range and its
    best two configurations; they are the kept results of that sweep
    (docs/results/quickstart_grid/results.csv, from `pl-privfed sweep
    configs/sweeps/quickstart_grid.yaml --batch`, the run directories and times left out)."""
    kept = ROOT / "docs" / "results" / "quickstart_grid" / "results.csv"
    rows = [r for r in csv.DictReader(kept.open()) if r["status"] == "finished"]
    assert len(rows) == 8
    text = " ".join(README.read_text(encoding="utf-8").split())
    quoted = re.search(
        r"validation accuracy (\d+)–(\d+) %; the best two \(γ = ([\d.]+) with server "
        r"normalization, β = ([\d.]+) or ([\d.]+)\) ([\d.]+) % validation, ([\d.]+) % and "
        r"([\d.]+) % test",
        text,
    )
    assert quoted, "README's quickstart grid sentence changed: update this test with it"
    low, high, step, beta_a, beta_b, best_val, test_a, test_b = quoted.groups()
    val = [100 * float(r["final_val_accuracy"]) for r in rows]
    assert (int(low), int(high)) == (int(min(val)), int(max(val)))
    best = sorted(rows, key=lambda r: float(r["final_val_accuracy"]), reverse=True)[:2]
    assert {(r["step_size"], r["server_normalization"]) for r in best} == {(step, "true")}
    assert sorted(r["beta"] for r in best) == sorted([beta_a, beta_b])
    assert {f"{100 * float(r['final_val_accuracy']):.1f}" for r in best} == {best_val}
    by_beta = {r["beta"]: f"{100 * float(r['final_test_accuracy']):.1f}" for r in best}
    assert [by_beta[beta_a], by_beta[beta_b]] == [test_a, test_b]


def test_the_quickstart_sweep_against_one_point_is_its_kept_benchmark():
    """README's quickstart sweep, batched without a flag, against one of its points run alone
    (issue 49: at most three times): the largest ratio of the kept benchmark
    (docs/results/benchmarks/sweep_vs_point.json, `benchmarks/run_cpu.py --only
    sweep_vs_point`) is what the README says, and within three."""
    kept = json.loads((ROOT / "docs/results/benchmarks/sweep_vs_point.json").read_text())
    ratios = [row[3] for row in kept["tables"]["ratio"]["rows"]]
    assert max(ratios) <= 3.0, ratios
    text = " ".join(README.read_text(encoding="utf-8").split())
    stated = re.search(r"the whole sweep takes ([\d.]+) times one of its points", text)
    assert stated and float(stated.group(1)) == round(max(ratios), 1), (stated, ratios)
