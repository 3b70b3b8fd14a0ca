"""The accountant figures docs/accounting.md quotes that take seconds each to compute (PRV at
large ε, RDP calibrations by bisection, a random search's calibration), computed with the
package's accountants and written to ``docs/results/accounting/figures.json``;
``tests/test_doc_numbers.py`` asserts the page against that file (the cheap figures it
computes itself). Deterministic: no training, no data; about 30 s on the project's 2-core CPU.

Usage::

    python benchmarks/accounting_figures.py            # writes docs/results/accounting/figures.json
    python benchmarks/accounting_figures.py --out x.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_artefact
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from pl_privfed.privacy.calibration import (
    calibrate_noise_multiplier,
    calibrate_noise_std,
    epsilon_of_plan,
)
from pl_privfed.privacy.mechanism import Mechanism
from pl_privfed.privacy.selection import random_search_noise_std

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "accounting" / "figures.json"

#: paper 001's settings (PORTER-DP, SoteriaFL): T = 1000 rounds, δ = 1e-3, b = 1, τ = 1, and
#: each dataset's m as the paper gives it
PORTER = {"a9a": 3256, "MNIST": 6000}
#: the record-level configurations' sample: 256 of the smallest shard's 2,102 images, 300 rounds
RECORD_RATE, RECORD_POPULATION = 256 / 2102, 2102


def porter_rows() -> list[dict]:
    """accounting.md's PORTER-DP table: for each dataset and target ε, σ_p of Theorem 1 and the
    three ε (defensible: replace-one, without replacement, RDP; the papers' convention:
    add/remove, Poisson 1/m, PRV; before: replace-one, Poisson, PRV)."""
    rows = []
    for data, m in PORTER.items():
        for target in (0.01, 0.1):
            sigma = math.sqrt(1000 * math.log(1e3)) / (m * target)
            wor = Mechanism(sigma / 2, 1 / m, sampling="without_replacement", population=m)
            rows.append(
                {
                    "data": data,
                    "target": target,
                    "sigma_p": sigma,
                    "defensible": epsilon_of_plan([(wor, 1000)], 1e-3, "rdp"),
                    "paper_convention": epsilon_of_plan(
                        [(Mechanism(sigma, 1 / m), 1000)], 1e-3, "prv"
                    ),
                    "before": epsilon_of_plan([(Mechanism(sigma / 2, 1 / m), 1000)], 1e-3, "prv"),
                }
            )
    return rows


def record_plan(multiplier: float) -> list[tuple[Mechanism, int]]:
    sample = Mechanism(
        multiplier, RECORD_RATE, sampling="without_replacement", population=RECORD_POPULATION
    )
    return [(sample, 300)]


def figures() -> dict:
    """Every figure, by name (see the module docstring)."""
    rdp_record = calibrate_noise_std(
        target_epsilon=8.0, delta=1e-5, plan=record_plan, accountant="rdp"
    )
    # dp-accounting's remove direction alone, (γP + (1−γ)Q, Q), at the old RDP noise
    one_direction = pld_lib.from_gaussian_mechanism(
        standard_deviation=2.840, sensitivity=1.0, sampling_prob=RECORD_RATE
    ).self_compose(300)

    def cohort(std: float) -> list[tuple[Mechanism, int]]:  # a central Poisson cohort, q = 0.1
        return [(Mechanism(std, 0.1), 300)]

    search = {
        shape: random_search_noise_std(
            target_epsilon=8.0, delta=1e-5, plan=cohort, mean=9, shape=shape
        )
        for shape in ("logarithmic", "poisson")
    }
    return {
        "porter": porter_rows(),
        "rdp_record_calibration": rdp_record,
        "pld_epsilon_at_2840": epsilon_of_plan(record_plan(2.840), 1e-5, "pld"),
        "one_direction_epsilon_at_2840": one_direction.get_epsilon_for_delta(1e-5),
        "prv_calibration_full": calibrate_noise_multiplier(
            target_epsilon=8.0, delta=1e-5, sample_rate=1.0, steps=300, accountant="prv"
        ),
        "search_logarithmic_mean_9": search["logarithmic"],
        "search_poisson_mean_9": search["poisson"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    start, load = time.perf_counter(), bench_artefact.load()
    values = figures()
    record = {
        "command": "python benchmarks/accounting_figures.py",
        "machine": bench_artefact.machine(),
        "load_start": load,
        "load_end": bench_artefact.load(),
        "seconds": round(time.perf_counter() - start, 1),
        "figures": values,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(values, indent=1))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
