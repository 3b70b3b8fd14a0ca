"""The selection's privacy cost: :mod:`pl_privfed.privacy.selection` (candidate runs composed;
Papernot & Steinke's random-search bound, checked against the theorems computed here) and the
columns ``pl-privfed compare --frontier`` writes from the runs' recorded histories."""

import csv
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_delta, compute_epsilon
from helpers.frontier import EPS, STEP, write_sweep_results

from pl_privfed.cli import main
from pl_privfed.privacy import PrivacyAccountant
from pl_privfed.privacy.selection import (
    composed_epsilon,
    random_search_epsilon,
    repetition_shape,
)
from pl_privfed.report import frontier_points

DELTA = 1e-5
POISSON = [
    {
        "noise_multiplier": 1.2,
        "sample_rate": 0.1,
        "sampling": "poisson",
        "population": None,
        "releases": 40,
    }
]
SHUFFLED = [
    {
        "noise_multiplier": 1.5,
        "sample_rate": 0.05,
        "sampling": "without_replacement",
        "population": 200,
        "releases": 30,
    }
]


def accountant_of(history, times=1, mechanism="auto"):
    acc = PrivacyAccountant(mechanism)
    for r in history:
        acc.step(
            noise_multiplier=r["noise_multiplier"],
            sample_rate=r["sample_rate"],
            num_steps=times * r["releases"],
            sampling=r["sampling"],
            population=r["population"],
        )
    return acc


@pytest.mark.parametrize("history", [POISSON, SHUFFLED], ids=["poisson-rdp", "shuffled-pld"])
def test_composition_is_the_accountant_with_n_times_the_releases(history):
    run = accountant_of(history)
    assert run.history() == history  # what summary.json keeps composes back to the run
    assert composed_epsilon([history], DELTA) == pytest.approx(run.get_epsilon(DELTA))
    nine = composed_epsilon([history] * 9, DELTA)
    assert nine == pytest.approx(accountant_of(history, times=9).get_epsilon(DELTA))
    assert nine > 2 * run.get_epsilon(DELTA)


def single_rdp(history):
    """The candidate's RDP curve as dp-accounting computes it, at the orders the package uses."""
    (r,) = history
    event = dp_accounting.PoissonSampledDpEvent(
        r["sample_rate"], dp_accounting.GaussianDpEvent(r["noise_multiplier"])
    )
    orders = [o for o in RdpAccountant().orders if o >= 1.5]
    acc = RdpAccountant(orders=orders)
    acc.compose(dp_accounting.SelfComposedDpEvent(event, r["releases"]))
    return np.asarray(orders, dtype=float), acc.rdp


def test_random_search_matches_papernot_steinke_theorems_computed_here():
    orders, rdp = single_rdp(POISSON)
    mean = 9.0
    # Thm. 2 (p. 5) with η = 1 (geometric, γ = 1/mean): ε'(λ) = ε(λ) + (1+η) min over λ̂ of
    # [(1 − 1/λ̂) ε(λ̂) + log(1/γ)/λ̂] + log E[K]/(λ − 1), then the RDP-to-(ε, δ) conversion
    gamma = 1 / mean
    c = 2 * min((1 - 1 / lh) * e + math.log(1 / gamma) / lh for lh, e in zip(orders, rdp))
    thm2 = rdp + c + math.log(mean) / (orders - 1)
    thm2 = np.minimum.accumulate(thm2[::-1])[::-1]  # RDP is monotone in the order
    expected = compute_epsilon(orders, thm2, DELTA)[0]
    assert random_search_epsilon(POISSON, DELTA, mean, "geometric") == pytest.approx(expected)
    # Thm. 6 (p. 7), Poisson: ε'(λ) = ε(λ) + μ δ̂ + log μ/(λ − 1), δ̂ the candidate's δ at
    # ε̂ = log(1 + 1/(λ − 1))
    thm6 = np.array(
        [
            e
            + mean * compute_delta(orders, rdp, math.log1p(1 / (lam - 1)))[0]
            + math.log(mean) / (lam - 1)
            for lam, e in zip(orders, rdp)
        ]
    )
    expected = compute_epsilon(orders, thm6, DELTA)[0]
    assert random_search_epsilon(POISSON, DELTA, mean, "poisson") == pytest.approx(expected)
    # far below composing nine candidates, above one run
    one = composed_epsilon([POISSON], DELTA)
    assert (
        one < random_search_epsilon(POISSON, DELTA, mean) < composed_epsilon([POISSON] * 9, DELTA)
    )


def test_bad_random_search_arguments_are_one_value_error():
    assert repetition_shape("Geometric") == 1.0 and repetition_shape("0.5") == 0.5
    with pytest.raises(ValueError, match=r"random search distribution .* got 'binomial'"):
        repetition_shape("binomial")
    with pytest.raises(ValueError, match=r"mean number of candidates >= 1, got 0\.5"):
        random_search_epsilon(POISSON, DELTA, 0.5)


# ------------------------------------------------------------------ compare --frontier's columns
SIGMA = {1.0: 3.0, 8.0: 0.9}  # per target ε: the candidates' noise multiplier, 20 releases each


def history_at(eps):
    return [
        {
            "noise_multiplier": SIGMA[eps],
            "sample_rate": 1.0,
            "sampling": "none",
            "population": None,
            "releases": 20,
        }
    ]


def sweep_with_histories(
    root, legacy=False, legacy_shuffled=False, misreported=False, rdp_era=False
):
    """2 targets × 2 step sizes × 2 seeds, every run's summary with its history and the ε that
    history certifies; ``legacy_shuffled``: summaries from before histories were kept, of
    releases sampled without replacement (no population: nothing to compose); ``legacy``: such
    summaries of releases without sampling (rebuilt from the mechanism); ``misreported``:
    each run reports twice the ε its history certifies; ``rdp_era``: runs of ``auto`` from when
    it was Opacus's RDP for unsampled releases (the library named in the summary)."""
    mechanism = "rdp" if rdp_era else "auto"
    runs = []
    certified = {e: composed_epsilon([history_at(e)], DELTA, mechanism) for e in SIGMA}
    certified = {e: v * (2 if misreported else 1) for e, v in certified.items()}
    for eps in SIGMA:
        for step in (0.1, 1.0):
            for seed in (0, 1):
                val = 0.8 + (step if eps == 8.0 else -step) / 10 + seed / 100
                accounting = {
                    "noise_multiplier": SIGMA[eps],
                    "sample_rate": 1.0,
                    "sampling": "without_replacement" if legacy_shuffled else "none",
                    "releases": 20,
                }
                if not (legacy or legacy_shuffled):
                    accounting["history"] = history_at(eps)
                if rdp_era:
                    accounting["accountant"] = "Opacus RDP"
                runs.append(
                    (
                        {"seed": seed, EPS: eps, STEP: step},
                        {
                            "final_val_accuracy": val,
                            "final_test_accuracy": val - 0.01,
                            "epsilon": certified[eps],
                            "privacy": {
                                "accounting": accounting,
                                "delta": DELTA,
                                "accountant": "auto",
                            },
                        },
                    )
                )
    return write_sweep_results(root, "frontier_x", runs)


def test_frontier_reports_certified_and_with_selection_epsilons(tmp_path, capsys):
    path = sweep_with_histories(tmp_path)
    at1, at8 = frontier_points([path])
    for point, eps in ((at1, 1.0), (at8, 8.0)):
        one = composed_epsilon([history_at(eps)], DELTA)
        assert point.certified.mean == pytest.approx(one)
        # 2 configurations × 2 seeds read by the selection: 4 runs composed
        assert point.cost.runs == 4 and point.cost.note == ""
        assert point.cost.composed == pytest.approx(
            accountant_of(history_at(eps), times=4).get_epsilon(DELTA)
        )
        assert point.cost.composed > point.certified.mean and math.isnan(point.cost.random_search)
    assert at1.selected == {"step_size": "0.1"} and at8.selected == {"step_size": "1.0"}
    # a summary from before histories were kept: rebuilt from its mechanism, the same charge
    old = frontier_points([sweep_with_histories(tmp_path / "old", legacy=True)])
    assert [p.cost.composed for p in old] == pytest.approx([at1.cost.composed, at8.cost.composed])
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_:
        main(
            ["compare", "--frontier", str(path), "--out", str(out), "--random-search", "geometric"]
        )
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    assert "ε with selection (candidate runs composed)" in printed and "(4 runs)" in printed
    assert "random search (geometric; P&S 2022)" in printed
    with open(out / "frontier.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["selected_step_size"] for r in rows] == ["0.1", "1.0"]
    # one candidate = one configuration with its 2 seeds; mean number of candidates 2
    expected = random_search_epsilon(history_at(8.0) * 2, DELTA, 2, "geometric")
    assert float(rows[1]["epsilon_random_search"]) == pytest.approx(expected, rel=1e-3)
    assert float(rows[1]["epsilon_with_selection"]) == pytest.approx(at8.cost.composed, rel=1e-3)
    assert rows[1]["selection_runs"] == "4" and rows[1]["random_search"] == "geometric"
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(path), "--out", str(out), "--random-search", "poisson"])
    assert (
        exit_.value.code == 2 and "--random-search goes with --frontier" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("legacy_shuffled", "the run's summary.json records no history"),
        (
            "misreported",
            "the history in .* gives ε = .*, not the reported .*: it does not describe",
        ),
    ],
)
def test_a_summary_without_a_usable_history_leaves_the_column_empty_with_a_warning(
    tmp_path, kind, message
):
    with pytest.warns(UserWarning, match=f"no ε with selection: {message}"):
        points = frontier_points([sweep_with_histories(tmp_path, **{kind: True})])
    assert all(math.isnan(p.cost.composed) and p.cost.runs == 4 for p in points)


def test_runs_of_auto_from_its_rdp_days_are_composed_with_rdp(tmp_path):
    """Summaries of ``accountant: auto`` written while auto meant Opacus RDP for unsampled
    releases (their ``accounting.accountant`` says so) are composed with RDP, which gives back
    their reported ε; composed with today's PLD they would be dropped (7-9 % below)."""
    points = frontier_points([sweep_with_histories(tmp_path, rdp_era=True)])
    for point, eps in zip(points, SIGMA, strict=True):
        assert point.cost.note == "" and point.cost.runs == 4
        rdp = accountant_of(history_at(eps), times=4, mechanism="rdp").get_epsilon(DELTA)
        assert point.cost.composed == pytest.approx(rdp)
        assert point.cost.composed > accountant_of(history_at(eps), times=4).get_epsilon(DELTA)
