"""``pl-privfed demo``: what the package is for, in under a minute on a laptop CPU.

Three runs on scikit-learn's embedded handwritten digits (1,797 real 8×8 images, no download),
split over 5 clients with 2 digit classes each:

1. **private**: FedAvg with per-example clipping and local Gaussian noise (paper 003 Algorithm 1
   with Corollary I's noise), one full-batch local step per round; record-level local DP at a
   certified ε = 8 (δ = 1e-5) against the server, which sees every message and who sent it
   (``configs/demo/fedavg_private.yaml``);
2. **no noise**: the same run without the noise, to show what the privacy costs;
3. **second algorithm**: PORTER-DP (paper 001), decentralized with compressed gossip, at the same
   privacy unit, neighbouring relation and certified ε (``configs/demo/porter_private.yaml``).

Every run goes through the ``pl-privfed fit`` command in this process: the command passes itself
in as the ``runner`` (:func:`pl_privfed.cli.main`; this module does not import the command, which
imports it). The certified ε is the one the package's accountant
(:class:`~pl_privfed.privacy.PrivacyAccountant`, dp-accounting's PLD) reports in each run's
``summary.json``. The demo prints a table and saves ``demo.png`` (validation accuracy
and validation loss against rounds; the table's test numbers are measured once, for the final
model) and ``demo.csv``.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

__all__ = ["DEMO_RUNS", "DemoRun", "Runner", "find_configs", "main", "run_demo"]

#: What runs one fit: the ``pl-privfed`` command's arguments in (``["fit", "--config", ...]``),
#: the fit done when it returns (:func:`pl_privfed.cli.main`).
Runner = Callable[[list[str]], object]


@dataclass(frozen=True)
class DemoRun:
    """One run of the demo: a name, what it is, its config and extra command-line arguments."""

    name: str
    label: str
    config: str
    overrides: tuple[str, ...] = ()


DEMO_RUNS = (
    DemoRun("private", "FedAvg, per-example clipping + local noise", "fedavg_private.yaml"),
    DemoRun(
        "no_noise",
        "the same, without noise",
        "fedavg_private.yaml",
        ("--model.algorithm.init_args.noise", "null"),
    ),
    DemoRun(
        "porter_private", "PORTER-DP: no server, 25 % sparsified gossip", "porter_private.yaml"
    ),
)


def find_configs(configs: str | Path | None = None) -> Path:
    """The directory of the demo configs: ``configs`` if given, else ``configs/demo`` in the
    working directory, else beside the package (a source checkout)."""
    candidates = (
        [Path(configs)]
        if configs is not None
        else [Path("configs/demo"), Path(__file__).resolve().parents[1] / "configs" / "demo"]
    )
    for folder in candidates:
        if all((folder / run.config).is_file() for run in DEMO_RUNS):
            return folder
    raise FileNotFoundError(
        f"the demo configs ({', '.join(sorted({r.config for r in DEMO_RUNS}))}) are not in "
        f"{' or '.join(str(c) for c in candidates)}; run from a pl-privfed checkout or pass "
        "--configs <dir>"
    )


def _curves(folder: Path) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = {}
    with (folder / "curves.csv").open() as f:
        for row in csv.DictReader(f):
            curves.setdefault(row["metric"], []).append((int(row["round"]), float(row["value"])))
    return curves


def _last(curves: dict[str, list[tuple[int, float]]], key: str) -> float | None:
    points = curves.get(key)
    return points[-1][1] if points else None


def _bits_per_client(summary: dict[str, Any]) -> float | None:
    """Bits one client (agent) sent over the run: every channel but the server's broadcast."""
    totals = summary.get("communication_total_bits") or {}
    clients = (summary.get("data") or {}).get("num_clients")
    sent = sum(v for k, v in totals.items() if k != "server_to_client")
    return sent / clients if clients else None


def run_demo(
    out: str | Path = "logs/demo", configs: str | Path | None = None, *, runner: Runner
) -> list[dict]:
    """Run the demo's three fits into ``out/<name>/`` with ``runner`` (the ``pl-privfed``
    command's :func:`~pl_privfed.cli.main`) and return one result row per run."""
    folder = find_configs(configs)
    out = Path(out)
    rows = []
    for index, run in enumerate(DEMO_RUNS, 1):
        run_dir = out / run.name
        if (run_dir / "summary.json").is_file():  # an earlier demo's run: the demo runs anew
            shutil.rmtree(run_dir)  # (a fit refuses a folder holding another run's summary)
        print(f"[demo {index}/{len(DEMO_RUNS)}] {run.label} ...", flush=True)
        start = time.perf_counter()
        runner(
            [
                "fit",
                "--config",
                str(folder / run.config),
                *run.overrides,
                "--output_dir",
                str(run_dir),
                "--trainer.default_root_dir",
                str(run_dir),
                "--trainer.logger.init_args.save_dir",
                str(run_dir / "logs"),
            ]
        )
        summary = json.loads((run_dir / "summary.json").read_text())
        privacy = summary.get("privacy") or {}
        curves = _curves(run_dir)
        rows.append(
            {
                "run": run.name,
                "algorithm": run.label,
                "privacy_unit": privacy.get("privacy_unit"),
                "neighbouring": privacy.get("neighbouring_relation"),
                "epsilon": summary.get("epsilon"),
                "delta": summary.get("delta"),
                "noise_multiplier": privacy.get("noise_multiplier"),
                "sample_rate": privacy.get("sample_rate"),
                "final_test_accuracy": summary.get("final_test_accuracy"),
                "best_val_accuracy": summary.get("best_val_accuracy"),
                "final_test_loss": summary.get("final_test_loss"),
                "rounds": summary.get("rounds"),
                "bits_per_client": _bits_per_client(summary),
                "seconds": time.perf_counter() - start,
                "curves": curves,
                "dir": str(run_dir),
            }
        )
    return rows


def figure(rows: list[dict]) -> Figure:
    """Validation accuracy and loss against rounds, one line per run (the held-out loss of the
    global model, or of the agents' average for PORTER-DP: the same quantity for every run); the
    table gives the test set's, measured once for the final model."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    panels = [("val/acc", "validation accuracy"), ("val/loss", "validation loss")]
    for i, (key, title) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        for row in rows:
            points = row["curves"].get(key, [])
            if points:
                steps, values = zip(*points)
                eps = row["epsilon"]
                privacy = f"ε = {eps:.2f}" if eps else "no privacy"
                label = f"{row['algorithm']} ({privacy})"
                ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=label)
        ax.set_title(title)
        ax.set_xlabel("communication round")
        ax.grid(alpha=0.3)
        if key == "val/acc":
            ax.set_ylim(0, 1)
            ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Digits, 5 clients × 2 classes; record-level local DP, δ = 1e-5", fontsize=10)
    return fig


def table(rows: list[dict]) -> str:
    """The printed table: one line per run."""
    head = f"{'run':<46} {'ε (δ=1e-5)':>10} {'test acc':>9} {'test loss':>10} {'kbit/client':>12}"
    lines = [head, "-" * len(head)]
    for row in rows:
        eps = f"{row['epsilon']:.2f}" if row["epsilon"] else "—"
        acc = row["final_test_accuracy"]
        loss = row["final_test_loss"]
        bits = row["bits_per_client"]
        lines.append(
            f"{row['algorithm']:<46} {eps:>10} "
            f"{'n/a' if acc is None else f'{100 * acc:.1f} %':>9} "
            f"{'n/a' if loss is None else f'{loss:.3f}':>10} "
            f"{'n/a' if bits is None else f'{bits / 1000:,.0f}':>12}"
        )
    return "\n".join(lines)


def main(
    out: str | Path = "logs/demo", configs: str | Path | None = None, *, runner: Runner
) -> int:
    """``pl-privfed demo [--out DIR] [--configs DIR]`` (parsed by the command): the demo's runs
    into ``out``, every fit run by ``runner`` (the command's), its table and figure."""
    start = time.perf_counter()
    rows = run_demo(out, configs, runner=runner)
    out = Path(out)
    png = out / "demo.png"
    figure(rows).savefig(png, dpi=120)
    with (out / "demo.csv").open("w", newline="") as f:
        keys = [k for k in rows[0] if k != "curves"]
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows({k: row[k] for k in keys} for row in rows)
    private = rows[0]
    print()
    print(
        "pl-privfed demo: 1,797 real handwritten digits (scikit-learn), 5 clients holding 2 digit "
        "classes each,\nmultinomial logistic regression, "
        f"{private['rounds']} communication rounds, one full-batch local step per round."
    )
    print(
        f"Privacy unit: one training image of a client — {private['privacy_unit']}; "
        f"{private['neighbouring']} neighbours.\nThe server (PORTER-DP: the neighbours) sees "
        "every message and who sent it; nothing is sampled, so no amplification is claimed;\n"
        "ε is what the package's accountant (dp-accounting's PLD) certifies for the noise each client "
        "added."
    )
    print()
    print(table(rows))
    print()
    print(f"figure: {png}   table: {out / 'demo.csv'}   runs: {out}/<run>/summary.json")
    print(f"[pl-privfed demo] {time.perf_counter() - start:.0f} s")
    return 0
