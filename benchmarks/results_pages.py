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

The frontier at equal *total* ε (the tuning paid for) is drawn from every kept sweep named
``total_*`` (``configs/sweeps/total_<family>.yaml``, run with ``calibration: random_search``) by
:func:`pl_privfed.report.total_files.total_frontier` into ``docs/results/frontier_total/``, each
family labelled by its sweep file's ``description`` and its non-private twin
(``frontier_<family>_nonprivate``, where kept) drawn as the reference band: a new family is one
sweep file and its kept runs away. Its table and the winners per total ε lead the frontier
section of ``docs/privacy.md`` (between ``<!-- results:total begin -->`` and ``<!--
results:total end -->``).

The benchmarks' tables of ``docs/performance.md`` are rendered from their kept artefacts,
``docs/results/benchmarks/<name>.json`` (written by each benchmark's ``--json``; all of them at
once by ``benchmarks/run_cpu.py``), between ``<!-- bench:<name>/<table> begin -->`` and
``<!-- bench:<name>/<table> end -->`` (:func:`bench_artefact.performance_page`, with the
machine and load line).

Usage::

    python benchmarks/results_pages.py                # docs/results/, privacy.md's and performance.md's blocks
    python benchmarks/results_pages.py --out /tmp/r   # elsewhere (the docs pages untouched)
    python benchmarks/results_pages.py --performance  # only docs/performance.md's blocks
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_artefact

from pl_privfed.report import frontier
from pl_privfed.report.frontier_files import short_label
from pl_privfed.report.random_search import TotalPoint, total_epsilon_points
from pl_privfed.report.total_files import total_frontier, winners

REPO = Path(__file__).resolve().parents[1]
RECORD = REPO / "docs" / "frontier_runs"
RESULTS = REPO / "docs" / "results"
PRIVACY = REPO / "docs" / "privacy.md"
PERFORMANCE = REPO / "docs" / "performance.md"
#: the benchmarks' kept artefacts (``--json`` of each benchmark; ``benchmarks/run_cpu.py``)
BENCHMARKS = RESULTS / "benchmarks"
SWEEPS = REPO / "configs" / "sweeps"
BEGIN, END = "<!-- results:frontier begin -->", "<!-- results:frontier end -->"
TOTAL_BEGIN, TOTAL_END = "<!-- results:total begin -->", "<!-- results:total end -->"
PAPER_EXPERIMENTS = REPO / "docs" / "paper_experiments.md"
CLAIMS_BEGIN, CLAIMS_END = "<!-- results:claims-d begin -->", "<!-- results:claims-d end -->"
#: paper 002's claims D1 and D2 at equal total ε: the four 10,000-client distributed families
#: (kept sweep ``total_<family>``, column heading) and the comparisons the claims make
CLAIM_FAMILIES = {
    "dp_alpha_normec": "DP-α-NormEC, with server normalization",
    "dp_alpha_normec_no_sn": "DP-α-NormEC, without server normalization",
    "dp_clip21": "DP-Clip21",
    "dpsgd_distributed": "distributed DP-SGD",
}
CLAIM_GAPS = (
    ("D2", "dp_alpha_normec", "dp_alpha_normec_no_sn"),
    ("D1", "dp_alpha_normec_no_sn", "dp_clip21"),
    ("D1", "dp_alpha_normec", "dp_clip21"),
    ("—", "dp_alpha_normec", "dpsgd_distributed"),
)
#: the results folder of the frontier at equal total ε
TOTAL = "frontier_total"

#: each family's label in the frontier tables (the sweep file's stem without ``frontier_``)
LABELS = {
    "mnist_dp_fedavg_clip": "DP-FedAvg, clipping (η × Φ tuned), central, 1,000 clients",
    "mnist_dp_fedavg_adaptive_clip": "DP-FedAvg, adaptive clipping (η tuned), central, 1,000 clients",
    "mnist_dp_fedavg_bandmf": "DP-FedAvg, banded MF, cyclic cohorts (η tuned), central, 1,000 clients",
    "mnist_dp_fedadam": "DP-FedAdam (η × τ tuned), central, 1,000 clients",
    "mnist_cnn_dp_fedavg": "DP-FedAvg, clipping, small CNN (11 k parameters), central, 1,000 clients",
    "mnist_dp_fedavg_per_update": "FedAvg, per-update clipping, central, 1,000 clients",
    "mnist_dpsgd": "DP-SGD, central, 1,000 clients",
    "mnist_dp_fed_alpha_normec": "DP-Fed-α-NormEC (η × β tuned), central, 1,000 clients",
    "mnist_dpsgd_distributed": (
        "distributed DP-SGD, noise shares under secure aggregation, 10,000 clients"
    ),
    "mnist_dp_alpha_normec": "DP-α-NormEC (γ × β tuned), distributed, 10,000 clients",
    "mnist_dp_alpha_normec_no_sn": (
        "DP-α-NormEC without server normalization (γ × β tuned), distributed, 10,000 clients"
    ),
    "mnist_dp_clip21": "DP-Clip21 (γ × τ tuned), distributed, 10,000 clients",
    "mnist_dp_fedavg_per_sample": "FedAvg, per-example clipping, local noise, 10 clients",
    "mnist_porter_dp": "PORTER-DP, local noise, 10 agents (gossip)",
    "mnist_soteriafl": "SoteriaFL, local noise, 10 clients",
    "a9a_soteriafl": "SoteriaFL, local noise, a9a, 1,000 clients",
}

#: the results folder's frontier groups: (title, families), each family's private sweep and
#: its non-private twin kept in ``docs/frontier_runs/``
GROUPS = {
    "frontier_mnist_client": (
        "Client-level DP on MNIST (one client's whole data protected)",
        [
            "mnist_dp_fedavg_clip",
            "mnist_dp_fedavg_adaptive_clip",
            "mnist_dp_fedavg_bandmf",
            "mnist_dp_fedadam",
            "mnist_cnn_dp_fedavg",
            "mnist_dp_fedavg_per_update",
            "mnist_dpsgd",
            "mnist_dp_fed_alpha_normec",
            "mnist_dpsgd_distributed",
            "mnist_dp_alpha_normec",
            "mnist_dp_alpha_normec_no_sn",
            "mnist_dp_clip21",
        ],
    ),
    "frontier_mnist_record": (
        "Record-level DP on MNIST (one training image protected)",
        ["mnist_dp_fedavg_per_sample", "mnist_porter_dp", "mnist_soteriafl"],
    ),
    "frontier_a9a_record": (
        "Record-level DP on a9a, SoteriaFL over 1,000 clients, one record each a round, 1,000 "
        "rounds (`make frontier-a9a`)",
        ["a9a_soteriafl"],
    ),
}

SETTING = (
    "MNIST, multinomial logistic regression, 300 rounds, label-skewed splits "
    "(`configs/private/`); every family's own sweep `configs/sweeps/frontier_mnist_<family>.yaml` "
    "at target ε ∈ {0.5, 1, 2, 4, 8} (δ = 1e-5) and its non-private twin, three seeds per "
    "configuration, run with `make frontier-mnist` on this project's 2-core AMD EPYC CPU (no "
    "GPU) and kept in [`docs/frontier_runs/`](../frontier_runs/). The a9a group: SoteriaFL "
    "(`configs/private/a9a_soteriafl.yaml`: logistic regression, 1,000 clients, one record each "
    "a round, 1,000 rounds) by `configs/sweeps/frontier_a9a_soteriafl.yaml` and its twin, run "
    "with `make frontier-a9a` on the project's 2-core Intel Xeon CPU and kept there too."
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
        title = GROUPS[name][0]
        lines += [
            f"**{title}**: test accuracy (%) of the configuration selected on "
            "validation at each ε (mean over 3 seeds; in brackets the selected step size and "
            "knob; the best mean at each ε in bold, though 95 % intervals can overlap: the "
            f"widest here is ± {_spread(rows):.1f} points). The full table with intervals, the "
            f"certified ε and the ε with selection: [{name}](results/{name}/frontier.md).",
            "",
            *best_table(rows),
            "",
        ]
    return "\n".join(lines).strip("\n")


def total_families(record: Path = RECORD) -> list[tuple[Path, str, Path | None]]:
    """The kept equal-total-ε sweeps: ``(folder, label, non-private twin or None)`` each, the
    label the sweep file's ``description`` (else the folder's name)."""
    families = []
    for folder in sorted(record.glob("total_*")):
        sweep = SWEEPS / f"{folder.name}.yaml"
        spec = yaml.safe_load(sweep.read_text()) if sweep.is_file() else {}
        label = str(spec.get("description") or folder.name)
        twin = record / f"frontier_{folder.name.removeprefix('total_')}_nonprivate"
        families.append((folder, label, twin if twin.is_dir() else None))
    return families


def _total_cell(p: TotalPoint, lead: bool) -> str:
    value = f"{100 * p.test.mean:.1f}"
    value = f"**{value}**" if lead else value
    half = p.test.half_width
    return value + (f" ± {100 * half:.1f}" if math.isfinite(half) else "")


def total_overview(points: Sequence[TotalPoint]) -> str:
    """The equal-total-ε table (one row per method, one column per total ε; the expected test
    accuracy of its random search, mean ± 95 % half-width over seeds, the best mean per setting
    in bold) and, per setting and total ε, which method leads and which it does not beat
    clearly (intervals overlapping)."""
    if not points:
        return ""
    targets = sorted({p.target for p in points})
    methods = list(dict.fromkeys(p.method for p in points))
    settings = {m: next((p.clients, p.adversary) for p in points if p.method == m) for m in methods}
    leads: dict[tuple, list[str]] = {}
    for setting in dict.fromkeys(settings.values()):
        mine = [p for p in points if settings[p.method] == setting]
        for target, ranked in winners(mine).items():
            leads[setting, target] = ranked
    by = {(p.method, p.target): p for p in points}
    columns = [
        "method",
        "ε against",
        "search: K of the grid",
        *(f"total ε = {t:g}" for t in targets),
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for m in methods:
        first = next(p for p in points if p.method == m)
        cells = [
            _total_cell(by[m, t], leads.get((settings[m], t), [None])[0] == m)
            if (m, t) in by
            else ""
            for t in targets
        ]
        search = f"{first.distribution}, mean {first.mean:g} of {first.candidates}"
        lines.append("| " + " | ".join([m, first.adversary, search, *cells]) + " |")
    said = []
    for setting in dict.fromkeys(settings.values()):
        clients, adversary = setting
        who = "whoever sees the models" if adversary == "models" else "the server"
        run = [m for m in methods if settings[m] == setting]
        parts = []
        for target in targets:
            if (setting, target) not in leads:
                continue
            lead, *tied = leads[setting, target]
            name = short_label(lead, setting)
            if len(run) == 1:
                parts.append(f"ε = {target:g}: {name} (the only family run)")
            elif tied:
                level = " and ".join(f"*{short_label(t, setting)}*" for t in tied)
                parts.append(
                    f"ε = {target:g}: **{name}**, level with {level} (95 % intervals overlap)"
                )
            else:
                parts.append(f"ε = {target:g}: **{name}**, clear of the others")
        said.append(f"- {clients:,} clients, ε against {who}: " + "; ".join(parts) + ".")
    seeds = sorted({p.test.n for p in points})
    return "\n".join(
        [
            "**The frontier at equal total ε (the hyperparameter search paid for)**: expected "
            "test accuracy (%) of what a private random search over each family's grid selects "
            "on validation (Papernot & Steinke's random search: K candidates, K logarithmic "
            "with mean the grid's size, drawn uniformly from the grid; every run calibrated so "
            "that the whole search costs the total ε against the adversary named, at δ = "
            f"1e-5), mean ± 95 % half-width over {'/'.join(map(str, seeds))} seeds (one search "
            "each), the best mean in bold. Figure and full table (the ε of one run, the "
            f"configuration most likely released): [{TOTAL}](results/{TOTAL}/total.md).",
            "",
            *lines,
            "",
            "Which family wins once its tuning is paid for (the best mean; level with those "
            "whose interval overlaps it):",
            "",
            *said,
        ]
    )


def claims_block(record: Path = RECORD) -> str:
    """Paper 002's claims D1 and D2 at equal total ε (docs/paper_experiments.md's generated
    block): the expected test accuracy of each 10,000-client distributed family's random
    search (mean ± 95 % half-width over seeds, as in docs/privacy.md's leading table, the best
    mean per total ε in bold), then the gaps each claim reads, with whether the two 95 %
    intervals are disjoint. A family whose ``total_*`` sweep is not kept reads "not run"."""
    kept = {f: record / f"total_mnist_{f}" for f in CLAIM_FAMILIES}
    kept = {f: folder for f, folder in kept.items() if folder.is_dir()}
    points = total_epsilon_points(list(kept.values()), labels=list(kept)) if kept else []
    by = {(p.method, p.target): p for p in points}
    targets = sorted({p.target for p in points})
    sizes = {p.method: p.candidates for p in points}
    heads = [
        f"{CLAIM_FAMILIES[f]} ({sizes[f]} configurations)" if f in sizes else CLAIM_FAMILIES[f]
        for f in CLAIM_FAMILIES
    ]
    lines = ["| total ε | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 1)]
    for t in targets:
        here = [by[f, t] for f in CLAIM_FAMILIES if (f, t) in by]
        lead = max(here, key=lambda p: p.test.mean) if here else None
        cells = [
            _total_cell(by[f, t], by[f, t] is lead) if (f, t) in by else "not run"
            for f in CLAIM_FAMILIES
        ]
        lines.append(f"| {t:g} | " + " | ".join(cells) + " |")
    gaps = ["| claim | comparison | " + " | ".join(f"total ε = {t:g}" for t in targets) + " |"]
    gaps.append("|" + "---|" * (len(targets) + 2))
    for claim, a, b in CLAIM_GAPS:
        cells = []
        for t in targets:
            if (a, t) not in by or (b, t) not in by:
                cells.append("not run")
                continue
            pa, pb = by[a, t], by[b, t]
            gap = 100 * (pa.test.mean - pb.test.mean)
            cells.append(f"{gap:+.1f} ({'overlap' if pa.test.overlaps(pb.test) else 'disjoint'})")
        comparison = f"{CLAIM_FAMILIES[a]} − {CLAIM_FAMILIES[b]}"
        gaps.append(f"| {claim} | {comparison} | " + " | ".join(cells) + " |")
    seeds = "/".join(map(str, sorted({p.test.n for p in points}))) or "no"
    return "\n".join(
        [
            "Expected test accuracy (%) of what each family's random search releases at total "
            f"ε, mean ± 95 % half-width over {seeds} seeds (the best mean in bold), from the "
            "runs kept in `docs/frontier_runs/total_mnist_<family>/` (`make results`):",
            "",
            *lines,
            "",
            "The gaps the claims read (points of expected test accuracy, first minus second; "
            "whether the two 95 % intervals over seeds overlap or are disjoint):",
            "",
            *gaps,
        ]
    )


def regenerate_total(out: Path = RESULTS, record: Path = RECORD) -> str:
    """Write the equal-total-ε pages into ``out / TOTAL``; return their overview."""
    families = total_families(record)
    if not families:
        return ""
    folders = [f for f, _, _ in families]
    labels = [label for _, label, _ in families]
    twins = [(t, label) for _, label, t in families if t is not None]
    total_frontier(
        folders,
        out / TOTAL,
        nonprivate=[t for t, _ in twins],
        labels=labels,
        nonprivate_labels=[label for _, label in twins],
    )
    return total_overview(total_epsilon_points(folders, labels=labels))


def total_overview_of(record: Path = RECORD) -> str:
    """The equal-total-ε overview of the kept runs (docs/privacy.md's leading block)."""
    families = total_families(record)
    folders, labels = [f for f, _, _ in families], [label for _, label, _ in families]
    return total_overview(total_epsilon_points(folders, labels=labels)) if families else ""


def regenerate(out: Path = RESULTS, record: Path = RECORD) -> str:
    """Write every results page into ``out``; return the tables of its ``frontier.md`` (the
    block docs/privacy.md shows)."""
    out.mkdir(parents=True, exist_ok=True)
    groups = {}
    for name, (_, families) in GROUPS.items():
        files, labels = [], []
        for family in families:
            for stem in (f"frontier_{family}", f"frontier_{family}_nonprivate"):
                files.append(record / stem)
                labels.append(LABELS[family])
        written = frontier(files, out / name, labels=labels)
        with written[1].open(newline="", encoding="utf-8") as f:
            groups[name] = list(csv.DictReader(f))
    block = overview(groups)
    total = regenerate_total(out, record)
    page = "# Results: the privacy–utility frontier\n\n" + SETTING + "\n\n"
    page += "Regenerated by `make results` (`benchmarks/results_pages.py`); do not edit.\n\n"
    both = (total + "\n\n" if total else "") + block
    (out / "frontier.md").write_text(page + both.replace("(results/", "(") + "\n")
    return block


def write_privacy_block(
    block: str, page: Path = PRIVACY, begin: str = BEGIN, end: str = END
) -> None:
    """Replace the generated block of ``page`` (between the markers) with ``block``."""
    text = page.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page}: no {begin} ... {end} block to regenerate")
    page.write_text(pattern.sub(lambda _: f"{begin}\n{block}\n{end}", text), encoding="utf-8")


def privacy_block(page: Path = PRIVACY, begin: str = BEGIN, end: str = END) -> str:
    """The generated block of ``page`` as it stands."""
    text = page.read_text(encoding="utf-8")
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def write_performance_page(page: Path = PERFORMANCE, folder: Path = BENCHMARKS) -> None:
    """Render docs/performance.md's benchmark blocks from the kept artefacts."""
    text = page.read_text(encoding="utf-8")
    page.write_text(bench_artefact.performance_page(text, folder), encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--performance", action="store_true", help="only docs/performance.md's benchmark tables"
    )
    args = parser.parse_args(argv)
    if args.performance:
        write_performance_page()
        print(f"benchmark tables of {PERFORMANCE} rendered from {BENCHMARKS}")
        return
    block = regenerate(args.out)
    if args.out.resolve() == RESULTS.resolve():
        write_privacy_block(block)
        write_privacy_block(total_overview_of(RECORD), begin=TOTAL_BEGIN, end=TOTAL_END)
        write_privacy_block(
            claims_block(RECORD), page=PAPER_EXPERIMENTS, begin=CLAIMS_BEGIN, end=CLAIMS_END
        )
        write_performance_page()
    print(f"results pages written to {args.out}")


if __name__ == "__main__":
    main()
