"""A small private sweep run batched (``pl-privfed sweep --batch``: one process per group of
points that differ only in the algorithm's arguments and the seed) against the same sweep run as separate
``pl-privfed fit`` processes: wall time of each, their ratio, the machine's load average around
each, and whether every batched row equals its separate run's (test accuracy, certified ε).

The sweep is ``--config`` at every seed in ``--seeds`` × target ε in ``--epsilons`` × step size
in ``--step-sizes``, ``--rounds`` rounds. Usage::

    python benchmarks/batched_sweep.py                        # DP-FedAvg, digits, 6 points
    python benchmarks/batched_sweep.py --seeds 0 1 2 --epsilons 8   # 3 seeds × 2 step sizes
    python benchmarks/batched_sweep.py --config configs/private/mnist_dp_fedavg_clip.yaml \\
        --rounds 300 --epsilons 0.5 1 2 4 8 --step-sizes 0.17 0.5 1.5
    python benchmarks/batched_sweep.py --separate-sample 3 \
        --sweep configs/sweeps/frontier_mnist_dp_fedavg_clip.yaml   # a shipped file, as shipped
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from bench_artefact import Artefact, add_json_argument  # benchmarks/, the script's own folder

REPO = Path(__file__).resolve().parents[1]


def sweep_file(
    directory: Path, config: str, seeds: list[int], epsilons: list[float], steps: list[float]
) -> Path:
    spec = {
        "name": "batched_sweep_benchmark",
        "method": "grid",
        "metric": {"name": "val/acc", "goal": "maximize"},
        "parameters": {
            "seed": {"values": seeds},
            "model.algorithm.init_args.noise.epsilon": {"values": epsilons},
            "model.algorithm.init_args.step_size": {"values": steps},
        },
        "command": ["${env}", "pl-privfed", "fit", "--config", config, "${args}"],
    }
    path = directory / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run(path: Path, out: Path, rounds: int | None, batch: bool) -> tuple[float, tuple, tuple]:
    """Wall seconds of one sweep, with the load averages before and after (``rounds``
    ``None``: the configs' own rounds and validation interval)."""
    overrides = ["--trainer.logger=false", "--trainer.enable_progress_bar=false",
                 "--trainer.enable_checkpointing=false"]  # fmt: skip
    if rounds is not None:
        overrides += [f"--trainer.max_steps={rounds}", f"--trainer.val_check_interval={rounds}"]
    cmd = [sys.executable, "-m", "pl_privfed.cli", "sweep", str(path), "--out", str(out)]
    cmd += (["--batch"] if batch else []) + ["--", *overrides]
    before = os.getloadavg()
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - start, before, os.getloadavg()


#: the artefact's table (one row a sweep)
COLUMNS = [
    "points",
    "rounds",
    "batched s",
    "separate s",
    "separate: how",
    "batched / separate",
    "load before / after (batched)",
    "batched rows equal separate runs",
]


def sampled(path: Path, tmp_path: Path, args: argparse.Namespace, table: list) -> None:
    """The batched sweep against ``points ×`` the median of ``K`` separate runs of its point
    (seed 0, the largest ε, the middle value of every other axis), whose row must equal the
    batched one."""
    seconds, before, after = run(path, tmp_path / "batched", args.rounds, True)
    print(f"batched: {seconds:.1f} s (load average {before[0]:.2f} before, {after[0]:.2f} "
          "after)", flush=True)  # fmt: skip
    batched = rows(tmp_path / "batched")
    spec = yaml.safe_load(path.read_text())
    point = {name: {"value": middle(name, axis["values"])}
             for name, axis in spec["parameters"].items()}  # fmt: skip
    spec["parameters"] = point
    one = tmp_path / "one.yaml"
    one.write_text(yaml.safe_dump(spec, sort_keys=False))
    times = []
    for k in range(args.separate_sample):
        t, b, a = run(one, tmp_path / f"separate{k}", args.rounds, False)
        times.append(t)
        print(f"separate run of one point ({k + 1}/{args.separate_sample}): {t:.1f} s (load "
              f"average {b[0]:.2f} before, {a[0]:.2f} after)", flush=True)  # fmt: skip
    (single,) = rows(tmp_path / "separate0")
    (same,) = [r for r in batched if all(same_value(r[column(name)], v["value"])
                                         for name, v in point.items())]  # fmt: skip
    equal = (np.float32(float(same["final_test_accuracy"]))
             == np.float32(float(single["final_test_accuracy"]))
             and same["epsilon"] == single["epsilon"])  # fmt: skip
    median = float(np.median(times))
    label = ", ".join(f"{column(name)} {v['value']}" for name, v in point.items())
    print(f"{len(batched)} points: batched {seconds:.1f} s against "
          f"{len(batched)} x {median:.1f} s = {len(batched) * median:.1f} s separate: "
          f"{seconds / (len(batched) * median):.3f}x; its ({label}) "
          f"row equals the separate run (test accuracy {single['final_test_accuracy']}, "
          f"certified eps {single['epsilon']}): {equal}")  # fmt: skip
    how = f"{len(batched)} × the median of {len(times)} runs of ({label}), {median:.1f} s"
    table.append(
        [
            len(batched),
            args.rounds,
            seconds,
            len(batched) * median,
            how,
            seconds / (len(batched) * median),
            f"{before[0]:.2f} / {after[0]:.2f}",
            bool(equal),
        ]
    )


def middle(name: str, values: list) -> object:
    """The separate runs' point on one axis: seed 0, the largest ε, the middle value else."""
    if name == "seed":
        return 0 if 0 in values else values[0]
    if name.endswith("noise.epsilon"):
        return max(values)
    return sorted(values)[len(values) // 2]


def column(name: str) -> str:
    """A sweep parameter's column in ``results.csv`` (the runner's names)."""
    from pl_privfed.sweep.files import column_names

    return column_names([name])[name]


def same_value(cell: str, value: object) -> bool:
    try:
        return float(cell) == float(value)
    except (TypeError, ValueError):
        return cell == str(value)


def rows(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs/algorithms/dp_fedavg_clip.yaml"))
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds per run (default: 30, or the configs' own with --sweep)",
    )
    parser.add_argument(
        "--sweep",
        default=None,
        help="a shipped sweep file (its parameters; the configs' own rounds and "
        "validation unless --rounds): e.g. configs/sweeps/"
        "frontier_mnist_dp_fedavg_clip.yaml with --separate-sample 3",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 8.0])
    parser.add_argument("--step-sizes", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument(
        "--separate-sample", type=int, default=0, metavar="K",
        help="time K separate runs of one point (seed 0, the largest ε, the middle step size) "
        "and take the points × their median as the separate time, instead of running every "
        "point separately (the issue's baseline: N separate runs of one of its points)",
    )  # fmt: skip
    parser.add_argument(
        "--out", default=None, help="keep the sweeps' folders here (default: a temporary folder)"
    )
    add_json_argument(parser)
    args = parser.parse_args()
    record = Artefact("batched_sweep")
    table = record.table("sweep", COLUMNS)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(args.out) if args.out else Path(tmp)
        tmp_path.mkdir(parents=True, exist_ok=True)
        if args.sweep:
            path = tmp_path / "sweep.yaml"
            path.write_text(Path(args.sweep).read_text())
        else:
            args.rounds = 30 if args.rounds is None else args.rounds
            path = sweep_file(tmp_path, args.config, args.seeds, args.epsilons, args.step_sizes)
        if args.separate_sample:
            sampled(path, tmp_path, args, table)
            record.write(args.json)
            return
        times, loads = {}, {}
        for batch in (True, False):
            name = "batched" if batch else "separate"
            seconds, before, after = run(path, tmp_path / name, args.rounds, batch)
            times[name], loads[name] = seconds, (before[0], after[0])
            print(f"{name}: {seconds:.1f} s (load average {before[0]:.2f} before, "
                  f"{after[0]:.2f} after)", flush=True)  # fmt: skip
        batched, separate = rows(tmp_path / "batched"), rows(tmp_path / "separate")
        same = all(
            b["status"] == s["status"] == "finished"
            and np.float32(float(b["final_test_accuracy"]))
            == np.float32(float(s["final_test_accuracy"]))
            and b["epsilon"] == s["epsilon"]
            for b, s in zip(batched, separate, strict=True)
        )
        points = len(batched)
        print(f"{points} points, {args.rounds} rounds: batched / separate = "
              f"{times['batched'] / times['separate']:.2f}; every batched row equals its "
              f"separate run's (test accuracy, certified epsilon): {same}")  # fmt: skip
        load = "{:.2f} / {:.2f}".format(*loads["batched"])
        table.append(
            [
                points,
                args.rounds,
                times["batched"],
                times["separate"],
                "every point run",
                times["batched"] / times["separate"],
                load,
                same,
            ]
        )
        record.write(args.json)


if __name__ == "__main__":
    main()
