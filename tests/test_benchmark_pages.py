"""docs/performance.md's benchmark tables are what their kept artefacts render.

``benchmarks/results_pages.py`` (with ``benchmarks/bench_artefact.py``) renders every
``<!-- bench:<name>/<table> begin -->`` block of docs/performance.md from
``docs/results/benchmarks/<name>.json`` (written by the benchmark's ``--json``;
``benchmarks/run_cpu.py`` runs them all); these tests fail when a block drifts from
its artefact, when an artefact does not name its machine and load, or when a block names a table
no artefact holds. In-process and file-only: no benchmark runs here.
"""

import json
import re
from pathlib import Path

import pytest
from helpers.benchmarks import benchmark_module

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "performance.md"
ARTEFACTS = REPO / "docs" / "results" / "benchmarks"


def _artefact_module():
    """benchmarks/bench_artefact.py (what results_pages.py renders the page with)."""
    return benchmark_module("bench_artefact")


def _artefacts() -> list[Path]:
    return sorted(ARTEFACTS.glob("**/*.json"))


def test_the_performance_page_is_what_the_artefacts_render():
    bench = _artefact_module()
    text = PAGE.read_text(encoding="utf-8")
    blocks = list(bench.BLOCK.finditer(text))
    assert blocks, "docs/performance.md has no generated benchmark block"
    assert bench.performance_page(text, ARTEFACTS) == text, (
        "docs/performance.md's benchmark tables differ from their artefacts: run "
        "`python benchmarks/results_pages.py --performance`"
    )
    assert "Not measured:" not in text, "a benchmark block has no artefact: run_cpu.py --only"
    # every begin marker closes (an unclosed one would be left alone by the renderer)
    begins = re.findall(r"<!-- bench:(\S+) begin -->", text)
    assert len(begins) == len(blocks), "a benchmark block without its end marker"
    # every CPU artefact is shown somewhere on the page
    shown = {m["name"] for m in blocks}
    kept = {p.stem for p in ARTEFACTS.glob("*.json")}
    assert kept <= shown, f"artefacts not shown in docs/performance.md: {sorted(kept - shown)}"


@pytest.mark.parametrize("path", _artefacts(), ids=lambda p: p.relative_to(ARTEFACTS).as_posix())
def test_each_artefact_names_its_machine_and_load(path):
    data = json.loads(path.read_text(encoding="utf-8"))
    bench = _artefact_module()
    required = bench.REQUIRED
    assert not [k for k in required if k not in data], f"{path.name} lacks {required}"
    machine = data["machine"]
    assert all(machine.get(k) for k in bench.MACHINE), machine
    assert isinstance(machine["logical_cores"], int) and machine["torch_threads"] >= 1
    for key in ("load_start", "load_end"):
        assert len(data[key]) == 3 and all(x >= 0 for x in data[key]), (key, data[key])
    assert data["command"].startswith(f"python benchmarks/{data['benchmark']}.py")
    assert "--json docs/results/benchmarks/" in data["command"], "not written by run_cpu.py"
    assert data["date_utc"].endswith("+00:00")
    assert data["tables"] and all(
        len(row) == len(t["columns"]) for t in data["tables"].values() for row in t["rows"]
    )


def test_a_block_renders_the_artefact_cells_and_its_machine(tmp_path):
    """The renderer itself, on a small artefact written by the benchmarks' own helper."""
    bench = _artefact_module()
    art = bench.Artefact("demo", argv=["--clients", "10"])
    rows = art.table("t", ["system", "s/round", "n", "equal"])
    rows += [["loop", 0.0123456, 1000, True], ["package", float("nan"), 10, False]]
    art.note("t", "same parameters", True)
    art.write(tmp_path / "demo.json")
    data = json.loads((tmp_path / "demo.json").read_text())
    assert data["tables"]["t"]["rows"][1][1] is None  # NaN kept as null, strict JSON
    page = "x\n<!-- bench:demo/t begin -->\nstale\n<!-- bench:demo/t end -->\ny\n"
    out = bench.performance_page(page, tmp_path)
    assert "stale" not in out and out.startswith("x\n") and out.endswith("y\n")
    assert "| loop | 0.01235 | 1,000 | yes |" in out
    assert "| package | – | 10 | no |" in out
    assert "same parameters: yes." in out
    assert "`python benchmarks/demo.py --clients 10`" in out
    assert f"{data['machine']['logical_cores']} logical cores" in out
    assert "load average" in out
    data["size"] = "tiny"  # as run_cpu.py --tiny marks it
    (tmp_path / "demo.json").write_text(json.dumps(data))
    assert "A check run at a tiny size, not a measurement" in bench.performance_page(page, tmp_path)
    missing = bench.performance_page(page.replace("demo/t", "demo/missing"), tmp_path)
    assert "Not measured: no table `missing` in `docs/results/benchmarks/demo.json`" in missing


def test_the_peers_targets_are_read_off_the_rows():
    """benchmarks/peers.py says issue 12's targets under its table from its own rows."""
    peers = benchmark_module("peers")

    def row(workload, nt, system, seconds, peak, own=None):
        cells = dict.fromkeys(peers.COLUMNS)
        cells.update(
            {
                "model": "mlp",
                "workload": workload,
                "n × T": nt,
                "system": system,
                "s/round": seconds,
                "peak MB": peak,
                "own work / gradients": own,
            }
        )
        return [cells[c] for c in peers.COLUMNS]

    rows = [
        row("fedavg", "100 × 1", "loop", 1.0, 1000),
        row("fedavg", "100 × 1", "package", 0.5, 1000, own=0.2),
        row("fedavg", "100 × 1", "fit", 0.6, 1600),
        row("alpha_normec", "100 × 1", "loop", 1.0, 1000),
        row("alpha_normec", "100 × 1", "package", 0.8, 1000, own=0.4),
        row("alpha_normec", "100 × 1", "fit", 1.2, 1000),
        row("per_example_dp", "10 × 1", "opacus", 9.0, 1000),
        row("per_example_dp", "10 × 1", "opacus_ghost", 2.0, 1000),
        row("per_example_dp", "10 × 1", "package", 1.0, 1000),
        row("per_example_dp", "10 × 1", "fit", 3.0, 1000),
    ]
    notes = peers.target_notes(rows)
    assert notes["fit ≤ 1.0× the loop (FedAvg, α-NormEC)"] == "met in 1 of 2 cells (0.60–1.20×)"
    # against Opacus with ghost clipping, the faster peer, where both ran
    assert notes["package and fit ≤ 1.0× Opacus ghost clipping, else Opacus (per-example DP)"] == (
        "met in 1 of 2 cells (0.50–1.50×)"
    )
    assert notes["peak memory ≤ 1.5× the peer's"] == "met in 5 of 6 cells (1.00–1.60×)"
    assert notes["α-NormEC's own work ≤ 0.15 of the gradients at 100 clients"] == (
        "met in 0 of 1 cells (0.40–0.40×)"
    )
    assert notes["fit ≤ 1.05× package at 100 × 1 (the CLI's overhead)"] == (
        "met in 0 of 2 cells (1.20–1.50×)"
    )
    assert peers.target_notes(rows[:3]).keys() == {
        "fit ≤ 1.0× the loop (FedAvg, α-NormEC)",
        "peak memory ≤ 1.5× the peer's",
        "fit ≤ 1.05× package at 100 × 1 (the CLI's overhead)",
    }
