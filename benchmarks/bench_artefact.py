"""The benchmarks' kept artefacts: one JSON file a run, written by ``--json PATH``.

Every benchmark docs/performance.md cites takes ``--json PATH`` (:func:`add_json_argument`) and,
given it, writes an :class:`Artefact`: the command line, the machine (CPU model from
``/proc/cpuinfo``, logical cores, torch threads, torch version), the load average at start and at
end, the UTC date, and the tables it printed (named columns, one row a measured cell, values
unformatted). ``benchmarks/results_pages.py`` renders each table into docs/performance.md
between ``<!-- bench:<artefact>/<table> begin -->`` and ``<!-- bench:<artefact>/<table> end -->``
(:func:`render`), with the machine and load line, so no measured number there is typed by hand;
``tests/test_benchmark_pages.py`` fails when a block differs from what its artefact renders.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from pl_privfed.report.text import markdown

#: what every artefact carries beside its tables (tests/test_benchmark_pages.py checks)
REQUIRED = ("benchmark", "command", "date_utc", "machine", "load_start", "load_end", "tables")
MACHINE = ("cpu", "logical_cores", "torch_threads", "torch")
#: what a block says above a table from ``run_cpu.py --tiny`` (artefact field ``size``)
TINY = (
    "**A check run at a tiny size, not a measurement** (`run_cpu.py --tiny`): "
    "`python benchmarks/run_cpu.py --only {name}` measures it at the documented size."
)
#: what a block says when its artefact or table is missing (a benchmark that failed)
MISSING = (
    "*Not measured: no table `{table}` in `docs/results/benchmarks/{name}.json`; run "
    "`python benchmarks/run_cpu.py --only {name}`.*"
)


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """The machine a measurement ran on, as torch sees it now."""
    import torch

    info = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def add_json_argument(parser) -> None:
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="also write the results as a machine-readable artefact (docs/results/benchmarks/)",
    )


class Artefact:
    """One benchmark run's record; created at the run's start (load, date, command)."""

    def __init__(self, benchmark: str, argv: Sequence[str] | None = None) -> None:
        argv = sys.argv[1:] if argv is None else list(argv)
        self.data: dict = {
            "benchmark": benchmark,
            "command": shlex.join(["python", f"benchmarks/{benchmark}.py", *argv]),
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_start": load(),
            "tables": {},
        }

    def table(self, key: str, columns: Sequence[str], title: str = "") -> list[list]:
        """A new (or the existing) table ``key``; returns its rows, to append cells to."""
        if key not in self.data["tables"]:
            self.data["tables"][key] = {"title": title, "columns": list(columns), "rows": []}
        return self.data["tables"][key]["rows"]

    def note(self, table: str, key: str, value) -> None:
        """A scalar result under table ``table`` (e.g. whether the iterates agreed)."""
        self.data["tables"][table].setdefault("notes", {})[key] = value

    def write(self, path: Path | None, torch_threads: int | None = None) -> None:
        """Write the artefact (nothing when ``path`` is None); the machine and the end load
        are read now, after the benchmark set its threads and ran (``torch_threads``: the
        threads of the processes it started, where those measured, not the driver)."""
        if path is None:
            return
        info = machine()
        if torch_threads is not None:
            info["torch_threads"] = torch_threads
        end = self.data.get("load_end") or load()  # set beforehand: a sitting read from logs
        data = _finite({**self.data, "machine": info, "load_end": end})
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"# artefact written to {path}", flush=True)


def _finite(value):
    """NaN (a cell not measured) as JSON's null; floats to 6 significant digits."""
    if isinstance(value, float):
        return None if value != value else float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


# ------------------------------------------------------------------------- rendering
def cell(value) -> str:
    """One value as the page shows it: 4 significant digits, thousands separated."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "–"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def machine_line(data: dict) -> str:
    """Where and how loaded: the line under every rendered table."""
    m = data["machine"]
    start, end = data["load_start"][0], data["load_end"][0]
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    return (
        f"*{m['cpu']}, {m['logical_cores']} logical cores{gpu}, torch {m['torch']}, "
        f"{m['torch_threads']} torch thread(s) a process; load average {start:.2f} at the "
        f"start, {end:.2f} at the end; `{data['command']}`.*"
    )


def render(data: dict, key: str) -> str:
    """Table ``key`` of an artefact as markdown, with its title, notes and machine line."""
    table = data["tables"][key]
    lines = []
    if table.get("title"):
        lines += [table["title"], ""]
    lines += markdown(table["columns"], ([cell(v) for v in row] for row in table["rows"]))
    if data.get("size") == "tiny":
        lines[:0] = [TINY.format(name=Path(data["command"].split("--json ")[-1]).stem), ""]
    notes = table.get("notes") or {}
    if notes:
        lines += ["", "; ".join(f"{k}: {cell(v)}" for k, v in notes.items()) + "."]
    return "\n".join([*lines, "", machine_line(data)])


def read(folder: Path, name: str) -> dict:
    return json.loads((Path(folder) / f"{name}.json").read_text(encoding="utf-8"))


#: a benchmark table's block in docs/performance.md: artefact name and table key
BLOCK = re.compile(
    r"<!-- bench:(?P<name>[\w.-]+)/(?P<table>[\w.-]+) begin -->\n.*?"
    r"<!-- bench:(?P=name)/(?P=table) end -->",
    re.S,
)


def performance_page(text: str, folder: Path) -> str:
    """``text`` (docs/performance.md) with every benchmark block rendered from its artefact in
    ``folder``; a missing artefact or table is said in its block (:data:`MISSING`)."""

    def block(match: re.Match) -> str:
        name, table = match["name"], match["table"]
        try:
            body = render(read(folder, name), table)
        except (OSError, KeyError):  # tests/test_benchmark_pages.py fails on it
            body = MISSING.format(name=name, table=table)
        return f"<!-- bench:{name}/{table} begin -->\n{body}\n<!-- bench:{name}/{table} end -->"

    return BLOCK.sub(block, text)
