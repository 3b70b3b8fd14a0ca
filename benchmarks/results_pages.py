"""Regenerate the results pages, ``docs/results/``, from the kept artefacts (``make results``).

The frontier pages are drawn from the runs kept in ``docs/frontier_runs/`` (one folder per
sweep: its ``results.csv`` and its runs' summaries, ``summaries.jsonl``, as ``pl-privfed compare
--frontier --keep-runs`` writes them) by :func:`pl_privfed.report.frontier`, exactly as ``make frontier-mnist`` draws them
from a fresh sweep: one folder per group (``frontier.md``, ``frontier.csv``, ``frontier.png``)
and ``docs/results/frontier.md``, one table per group with every method's selected test accuracy
at each ε. That table is also written between the markers ``<!-- results:frontier begin -->``
and ``<!-- results:frontier end -->`` of ``docs/privacy.md``, so the privacy page leads with the
current frontier and cannot drift from its record (``tests/test_frontier.py`` regenerates every
page into a temporary folder and compares).

Usage::

    python benchmarks/results_pages.py                # docs/results/ and docs/privacy.md's block
    python benchmarks/results_pages.py --out /tmp/r   # elsewhere (the privacy page untouched)
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from collections.abc import Sequence
from pathlib import Path

from pl_privfed.report import frontier

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "docs" / "frontier_runs"
RESULTS = REPO / "docs" / "results"
PRIVACY = REPO / "docs" / "privacy.md"
BEGIN, END = "<!-- results:frontier begin -->", "<!-- results:frontier end -->"

#: each family's label in the frontier tables (the sweep file's stem without ``frontier_mnist_``)
LABELS = {
    "dp_fedavg_clip": "DP-FedAvg, clipping (η × Φ tuned), central, 1,000 clients",
    "dp_fedavg_per_update": "FedAvg, per-update clipping, central, 1,000 clients",
    "dpsgd": "DP-SGD, central, 1,000 clients",
    "dp_fed_alpha_normec": "DP-Fed-α-NormEC (η × β tuned), central, 1,000 clients",
    "dpsgd_distributed": (
        "distributed DP-SGD, noise shares under secure aggregation, 10,000 clients"
    ),
    "dp_alpha_normec": "DP-α-NormEC (γ × β tuned), distributed, 10,000 clients",
    "dp_alpha_normec_no_sn": (
        "DP-α-NormEC without server normalization (γ × β tuned), distributed, 10,000 clients"
    ),
    "dp_clip21": "DP-Clip21 (γ × τ tuned), distributed, 10,000 clients",
    "dp_fedavg_per_sample": "FedAvg, per-example clipping, local noise, 10 clients",
    "porter_dp": "PORTER-DP, local noise, 10 agents (gossip)",
    "soteriafl": "SoteriaFL, local noise, 10 clients",
}

#: the results folder's frontier groups: (title, families), each family's private sweep and
#: its non-private twin kept in ``docs/frontier_runs/``
GROUPS = {
    "frontier_mnist_client": (
        "Client-level DP on MNIST (one client's whole data protected)",
        [
            "dp_fedavg_clip",
            "dp_fedavg_per_update",
            "dpsgd",
            "dp_fed_alpha_normec",
            "dpsgd_distributed",
            "dp_alpha_normec",
            "dp_alpha_normec_no_sn",
            "dp_clip21",
        ],
    ),
    "frontier_mnist_record": (
        "Record-level DP on MNIST (one training image protected)",
        ["dp_fedavg_per_sample", "porter_dp", "soteriafl"],
    ),
}

#: groups whose runs were not kept, only their ``frontier.csv`` (in ``docs/results/<group>/``):
#: the results page tabulates that file; its rows cannot be drawn again from runs
TABLE_ONLY = {
    "frontier_a9a_record": (
        "Record-level DP on a9a, SoteriaFL over 1,000 clients, one record each a round, 1,000 "
        "rounds (`make frontier-a9a`, run on a 2-core Intel Xeon CPU; its runs were not kept, "
        "so this table is read from its `frontier.csv`, not drawn again; the majority class is "
        "76.4 % of the test set)"
    ),
}

SETTING = (
    "MNIST, multinomial logistic regression, 300 rounds, label-skewed splits "
    "(`configs/private/`); every family's own sweep `configs/sweeps/frontier_mnist_<family>.yaml` "
    "at target ε ∈ {0.5, 1, 2, 4, 8} (δ = 1e-5) and its non-private twin, three seeds per "
    "configuration, run with `make frontier-mnist` on this project's 2-core AMD EPYC CPU (no "
    "GPU) and kept in [`docs/frontier_runs/`](../frontier_runs/)."
)


def _short(selected: str) -> str:
    """The selected knobs, compactly (``step_size=0.5 threshold=0.3`` → ``step 0.5, threshold
    0.3``)."""
    pairs = (item.split("=", 1) for item in selected.split())
    return ", ".join(f"{'step' if k == 'step_size' else k.replace('_', ' ')} {v}" for k, v in pairs)


def _cell(row: dict[str, str], best: bool) -> str:
    """One method at one ε: test accuracy (mean over seeds, %) and the selected knobs."""
    acc = f"{float(row['final_test_accuracy_mean']):.1f}"
    return f"{f'**{acc}**' if best else acc} ({_short(row['selected'])})"


def best_table(rows: Sequence[dict[str, str]]) -> list[str]:
    """From a ``frontier.csv``'s rows: one row per method, one column per target ε and the
    non-private twin, each cell the selected configuration's mean test accuracy (%) with the
    selected knobs; the best mean at each private ε in bold."""
    private = [r for r in rows if r["private"] == "true" and r["final_test_accuracy_mean"]]
    targets = sorted({r["target_epsilon"] for r in private}, key=float)
    by = {(r["method"], r["target_epsilon"] if r["private"] == "true" else None): r for r in rows}
    methods = list(dict.fromkeys(r["method"] for r in rows))
    best = {}
    for t in targets:
        at = [r for r in private if r["target_epsilon"] == t]
        best[t] = max(at, key=lambda r: float(r["final_test_accuracy_mean"]))["method"]
    columns = ["method", "ε against", *(f"ε = {t}" for t in targets), "no noise"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for m in methods:
        adversary = next((r["adversary"] for r in private if r["method"] == m), "")
        cells = [_cell(by[m, t], best[t] == m) if (m, t) in by else "" for t in targets]
        twin = by.get((m, None))
        cells.append(_cell(twin, False) if twin and twin["final_test_accuracy_mean"] else "")
        lines.append("| " + " | ".join([m, adversary, *cells]) + " |")
    return lines


def _spread(rows: Sequence[dict[str, str]]) -> float:
    """The widest 95 % half-width of a selected private point's test accuracy (points)."""
    widths = [float(r["final_test_accuracy_half_width"] or "nan") for r in rows]
    return max((w for w, r in zip(widths, rows) if r["private"] == "true" and math.isfinite(w)),
               default=float("nan"))  # fmt: skip


def overview(groups: dict[str, list[dict[str, str]]]) -> str:
    """The tables of ``docs/results/frontier.md`` (also docs/privacy.md's leading block)."""
    lines = []
    for name, rows in groups.items():
        title = GROUPS[name][0] if name in GROUPS else TABLE_ONLY[name]
        table = "frontier.md" if name in GROUPS else "frontier.csv"
        lines += [
            f"**{title}**: test accuracy (%) of the configuration selected on "
            "validation at each ε (mean over 3 seeds; in brackets the selected step size and "
            "knob; the best mean at each ε in bold, though 95 % intervals can overlap: the "
            f"widest here is ± {_spread(rows):.1f} points). The full table with intervals, the "
            f"certified ε and the ε with selection: [{name}](results/{name}/{table}).",
            "",
            *best_table(rows),
            "",
        ]
    return "\n".join(lines).strip("\n")


def regenerate(out: Path = RESULTS, record: Path = RECORD) -> str:
    """Write every results page into ``out``; return the tables of its ``frontier.md`` (the
    block docs/privacy.md shows)."""
    out.mkdir(parents=True, exist_ok=True)
    groups = {}
    for name, (_, families) in GROUPS.items():
        files, labels = [], []
        for family in families:
            for stem in (f"frontier_mnist_{family}", f"frontier_mnist_{family}_nonprivate"):
                files.append(record / stem)
                labels.append(LABELS[family])
        written = frontier(files, out / name, labels=labels)
        with written[1].open(newline="", encoding="utf-8") as f:
            groups[name] = list(csv.DictReader(f))
    for name in TABLE_ONLY:
        kept = RESULTS / name / "frontier.csv"
        if out.resolve() != RESULTS.resolve():
            (out / name).mkdir(exist_ok=True)
            (out / name / "frontier.csv").write_bytes(kept.read_bytes())
        with kept.open(newline="", encoding="utf-8") as f:
            groups[name] = list(csv.DictReader(f))
    block = overview(groups)
    page = "# Results: the privacy–utility frontier\n\n" + SETTING + "\n\n"
    page += "Regenerated by `make results` (`benchmarks/results_pages.py`); do not edit.\n\n"
    (out / "frontier.md").write_text(page + block.replace("(results/", "(") + "\n")
    return block


def write_privacy_block(block: str, page: Path = PRIVACY) -> None:
    """Replace the generated block of ``page`` (between the markers) with ``block``."""
    text = page.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page}: no {BEGIN} ... {END} block to regenerate")
    page.write_text(pattern.sub(lambda _: f"{BEGIN}\n{block}\n{END}", text), encoding="utf-8")


def privacy_block(page: Path = PRIVACY) -> str:
    """The generated block of ``page`` as it stands."""
    text = page.read_text(encoding="utf-8")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    block = regenerate(args.out)
    if args.out.resolve() == RESULTS.resolve():
        write_privacy_block(block)
    print(f"results pages written to {args.out}")


if __name__ == "__main__":
    main()
