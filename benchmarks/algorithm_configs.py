"""Run every shipped algorithm config (``configs/algorithms/*.yaml`` and the quickstart) through
``pl-privfed fit`` and print docs/configs.md's table: validation accuracy (what a selection reads),
test accuracy of the final model, ε (defensible, and the papers' convention), ``fit`` time from
``summary.json`` and the whole command's wall time.

    .venv/bin/python benchmarks/algorithm_configs.py                 # all configs, one seed
    .venv/bin/python benchmarks/algorithm_configs.py --only beer ef21 --threads 1

Each run gets its own directory under ``--out`` (default a temporary one). Nothing here is a
test: it measures, on the machine it runs on, what docs/configs.md reports.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def configs(only: list[str] | None) -> list[Path]:
    paths = [
        ROOT / "configs" / "quickstart.yaml",
        *sorted((ROOT / "configs/algorithms").glob("*.yaml")),
    ]
    if only:
        paths = [p for p in paths if p.stem in only]
    return paths


def run(config: Path, out: Path, threads: int | None) -> dict:
    run_dir = out / config.stem
    env = {**os.environ, "WANDB_MODE": "offline"}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "pl_privfed.cli", "fit", "--config", str(config),
           f"--output_dir={run_dir}", f"--trainer.default_root_dir={run_dir}",
           "--trainer.logger=false", "--trainer.enable_progress_bar=false"]  # fmt: skip
    (run_dir / "summary.json").unlink(missing_ok=True)  # an earlier benchmark's: run anew
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"config": config.stem, "error": done.stderr.strip().splitlines()[-1:]}
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"config": config.stem, "summary": summary, "wall": wall}


def pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def row(result: dict) -> str:
    if "error" in result:
        return f"| `{result['config']}` | failed: {result['error']} | | | | |"
    s = result["summary"]
    eps = "—"
    if s.get("epsilon") is not None:
        eps = f"{s['epsilon']:.3g} ({s['epsilon_paper_convention']:.3g})"
    return (f"| `{result['config']}` | {pct(s.get('final_val_accuracy'))} | "
            f"{pct(s.get('final_test_accuracy'))} | {eps} | {s['wall_time_s']:.1f} s | "
            f"{result['wall']:.1f} s |")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="config stems to run (default: all)")
    parser.add_argument("--out", type=Path, help="directory for the runs (default: temporary)")
    parser.add_argument("--threads", type=int, help="OMP/MKL threads of each run")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="pl_privfed_configs_"))
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"threads={args.threads or 'default'}, load average at start {load:.2f}; runs in {out}")  # fmt: skip
    print("| config | val accuracy | test accuracy | ε (papers' convention) | fit time | command |")
    print("|---|---|---|---|---|---|")
    for config in configs(args.only):
        print(row(run(config, out, args.threads)), flush=True)


if __name__ == "__main__":
    main()
