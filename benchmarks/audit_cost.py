"""What the audit's canaries cost in test accuracy, on the shipped private configs.

Each config runs as shipped (its rounds, seed 0) twice through the CLI: without an audit and
with ``--trainer.callbacks+=pl_privfed.callbacks.PrivacyAudit`` (100 canaries on the real
path). One Markdown row per config: the final test accuracy of each run and the difference
(without − with, in points: what the canaries cost), and the audited run's certified ε.
``--summary FILE`` prints the rows of kept output files (several concatenated) as one table.
Usage::

    PL_PRIVFED_DATA=../shared/data python benchmarks/audit_cost.py configs/private/*.yaml
    python benchmarks/audit_cost.py --summary docs/results/audit_shipped/accuracy_cost.txt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEADER = (
    "| config | test accuracy without the audit | with it | cost (points) | certified ε (models) |"
    "\n|---|---|---|---|---|"
)


def run(config: Path, audited: bool) -> dict:
    """One CLI run of ``config`` as shipped, validated as shipped, with or without the audit
    (``audit_breaks.run_config``): its ``summary.json``."""
    from audit_breaks import run_config  # beside this script: on sys.path when it runs

    return run_config(config, None, audited=audited, validate=True)


def row(config: str, plain: dict, audited: dict) -> str:
    a, b = plain["final_test_accuracy"], audited["final_test_accuracy"]
    cert = audited["privacy"]["audit"]["certified_epsilon"]
    return f"| `{config}` | {100 * a:.2f} % | {100 * b:.2f} % | {100 * (a - b):+.2f} | {cert:.2f} |"


def summary(text: str) -> str:
    """The rows of kept output (``| `config` | ...`` lines, without their time), in the order
    kept, as one table."""
    rows = [line.split(" <!--")[0] for line in text.splitlines() if line.startswith("| `")]
    return "\n".join([HEADER, *rows])


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", type=Path, help="configs to run")
    parser.add_argument("--summary", type=Path, default=None, help="one table of kept output")
    args = parser.parse_args(argv)
    if args.summary is not None:
        print(summary(args.summary.read_text(encoding="utf-8")))
        return
    print(HEADER, flush=True)
    for config in args.configs:
        start = time.perf_counter()
        plain, audited = run(config, False), run(config, True)
        seconds = time.perf_counter() - start
        print(f"{row(config.stem, plain, audited)} <!-- {seconds:.0f} s -->", flush=True)


if __name__ == "__main__":
    main_()
