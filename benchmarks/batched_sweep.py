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


def run(path: Path, out: Path, rounds: int, batch: bool) -> tuple[float, tuple, tuple]:
    """Wall seconds of one sweep, with the load averages before and after."""
    overrides = [f"--trainer.max_steps={rounds}", f"--trainer.val_check_interval={rounds}",
                 "--trainer.logger=false", "--trainer.enable_progress_bar=false",
                 "--trainer.enable_checkpointing=false"]  # fmt: skip
    cmd = [sys.executable, "-m", "pl_privfed.cli", "sweep", str(path), "--out", str(out)]
    cmd += (["--batch"] if batch else []) + ["--", *overrides]
    before = os.getloadavg()
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, before, os.getloadavg()


def sampled(path: Path, tmp_path: Path, args: argparse.Namespace) -> None:
    """The batched sweep against ``points ×`` the median of ``K`` separate runs of its point
    (seed 0, the largest ε, the middle step size), whose row must equal the batched one."""
    seconds, before, after = run(path, tmp_path / "batched", args.rounds, True)
    print(f"batched: {seconds:.1f} s (load average {before[0]:.2f} before, {after[0]:.2f} "
          "after)", flush=True)  # fmt: skip
    batched = rows(tmp_path / "batched")
    epsilon, step = max(args.epsilons), sorted(args.step_sizes)[len(args.step_sizes) // 2]
    point = {"seed": {"value": 0}, "model.algorithm.init_args.noise.epsilon": {"value": epsilon},
             "model.algorithm.init_args.step_size": {"value": step}}  # fmt: skip
    spec = yaml.safe_load(path.read_text())
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
    (same,) = [
        r for r in batched
        if float(r["model.algorithm.init_args.noise.epsilon"]) == epsilon
        and float(r["step_size"]) == step and int(r["seed"]) == 0
    ]  # fmt: skip
    equal = (np.float32(float(same["final_test_accuracy"]))
             == np.float32(float(single["final_test_accuracy"]))
             and same["epsilon"] == single["epsilon"])  # fmt: skip
    median = float(np.median(times))
    print(f"{len(batched)} points, {args.rounds} rounds: batched {seconds:.1f} s against "
          f"{len(batched)} x {median:.1f} s = {len(batched) * median:.1f} s separate: "
          f"{seconds / (len(batched) * median):.3f}x; its (seed 0, eps {epsilon}, step {step}) "
          f"row equals the separate run (test accuracy {single['final_test_accuracy']}, "
          f"certified eps {single['epsilon']}): {equal}")  # fmt: skip


def rows(out: Path) -> list[dict[str, str]]:
    with (out / "results.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs/algorithms/dp_fedavg_clip.yaml"))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 8.0])
    parser.add_argument("--step-sizes", type=float, nargs="+", default=[0.5, 1.0])
    parser.add_argument(
        "--separate-sample", type=int, default=0, metavar="K",
        help="time K separate runs of one point (seed 0, the largest ε, the middle step size) "
        "and take the points × their median as the separate time, instead of running every "
        "point separately (the issue's baseline: N separate runs of one of its points)",
    )  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        path = sweep_file(tmp_path, args.config, args.seeds, args.epsilons, args.step_sizes)
        if args.separate_sample:
            sampled(path, tmp_path, args)
            return
        times = {}
        for batch in (True, False):
            name = "batched" if batch else "separate"
            seconds, before, after = run(path, tmp_path / name, args.rounds, batch)
            times[name] = seconds
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


if __name__ == "__main__":
    main()
