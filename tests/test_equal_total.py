"""A frontier at equal total ε: the noise calibrated so that a random search over a family's
runs costs the target in total (``calibration: random_search``), checked against dp-accounting
composed independently here; and the expected test accuracy of what that search selects,
checked against a brute-force enumeration of the candidates it may draw."""

import functools
import itertools
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
import yaml
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

from pl_privfed.algorithms import DistributedDPSGD, DPFedAvg
from pl_privfed.callbacks.summary import privacy_plan_line
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise, PrivacyLedger
from pl_privfed.privacy.selection import random_search_noise_std
from pl_privfed.sampling import PoissonSampler
from pl_privfed.sweep import load_sweep

DT = torch.float64
#: the RDP orders of the independent computation (dp-accounting's from 1.5 up, as the package)
ORDERS = [1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256]


def _total(event, mean, shape, delta=1e-5):
    """dp-accounting's RDP ε of a random search over ``event`` (Papernot & Steinke)."""
    acc = RdpAccountant(orders=[o for o in RdpAccountant().orders if o >= 1.5])
    acc.compose(dp_event.RepeatAndSelectDpEvent(event, mean, shape))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(
    ("target", "mean", "distribution", "shape"),
    [(2.0, 9, "logarithmic", 0.0), (8.0, 3, "poisson", math.inf)],
)
def test_random_search_calibration_spends_the_total_against_the_models(
    target, mean, distribution, shape
):
    """Central DP-FedAvg, a Poisson cohort at q, K rounds: the σ solved for a total ε makes
    dp-accounting's RepeatAndSelectDpEvent over K Poisson-subsampled Gaussians at σ/Φ (composed
    here from its events) certify the total, within the solver's 0.01 below it; the run's own
    ε is smaller, and the noise larger than ``calibration: target``'s at the same ε."""
    q, K, n, threshold, scale = 0.2, 30, 20, 0.5, 2.0
    bound = threshold * scale  # Φ = β · τ, the sensitivity of the sum (add/remove)
    noise = DPNoise(
        epsilon=target,
        calibration="random_search",
        search_mean=mean,
        search_distribution=distribution,
        placement="central",
    )
    alg = DPFedAvg(
        0.1, 0.1, operator=Clip(threshold), scale=scale, sampler=PoissonSampler(q), noise=noise
    )
    alg.setup(num_clients=n, dim=3, num_rounds=K, dtype=DT)
    sampled = dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(alg.noise_std / bound)
    )
    total = _total(dp_accounting.SelfComposedDpEvent(sampled, K), mean, shape)
    assert target - 0.011 <= total <= target + 1e-9
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], K)
    for k in range(K):
        ledger.account(k)
    assert ledger.epsilon() < target
    report = ledger.report()
    assert report["calibration"] == "random_search"
    assert report["calibrated_for"]["search_mean"] == mean
    line = privacy_plan_line(report)
    assert f"total ε = {target:g} of a random search over such runs" in line
    assert f"mean {mean:g} candidates" in line
    single = DPFedAvg(
        0.1, 0.1, operator=Clip(threshold), scale=scale, sampler=PoissonSampler(q),
        noise=DPNoise(epsilon=target, calibration="target", placement="central"),
    )  # fmt: off
    single.setup(num_clients=n, dim=3, num_rounds=K, dtype=DT)
    assert alg.noise_std > single.noise_std


def test_random_search_calibration_without_sampling():
    """Central DP-SGD with every client every round: K unsampled Gaussians at σ/Φ."""
    K, target, mean = 40, 4.0, 3
    noise = DPNoise(
        epsilon=target, calibration="random_search", search_mean=mean, placement="central"
    )
    alg = DistributedDPSGD(0.1, Clip(0.6), scale=2.0, noise=noise)
    alg.setup(num_clients=7, dim=3, num_rounds=K, dtype=DT)
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(alg.noise_std / 1.2), K)
    assert target - 0.011 <= _total(event, mean, math.inf) <= target + 1e-9


def test_random_search_noise_std_grows_with_the_mean():
    """More candidates on average cost more: the per-run noise grows with the mean."""
    plan = lambda std: [(__import__("pl_privfed").privacy.Mechanism(std), 10)]  # noqa: E731
    stds = [
        random_search_noise_std(target_epsilon=4.0, delta=1e-5, plan=plan, mean=m, shape=0.0)
        for m in (1.5, 4, 16)
    ]
    assert stds == sorted(stds) and stds[0] < stds[-1]


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"search_mean": 0.5}, "search_mean=0.5"),
        ({"search_mean": None}, "search_mean=None"),
        ({"search_mean": math.nan}, "search_mean=nan"),
        ({"search_mean": 3, "search_distribution": "uniform"}, "search_distribution='uniform'"),
        ({"search_mean": 3, "search_distribution": -1.0}, "search_distribution=-1.0"),
    ],
)
def test_bad_random_search_settings_are_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        DPNoise(epsilon=2.0, calibration="random_search", **settings)


def test_search_settings_need_the_random_search_calibration():
    with pytest.raises(ValueError, match="search_mean=3 needs calibration: random_search"):
        DPNoise(epsilon=2.0, calibration="target", search_mean=3)
    with pytest.raises(ValueError, match="needs epsilon"):
        DPNoise(noise_multiplier=1.0, calibration="random_search", search_mean=3)


# ------------------------------------------------- the expected accuracy of what a search selects
@functools.lru_cache
def _pmfs(mean, distribution, kmax=2000):
    """P(K = k) for k = 0..kmax as Papernot & Steinke write it (p. 5 and 7), γ solved here by
    bisection on the mean summed from the same terms (independent of the package's closed
    forms)."""
    if distribution == "poisson":
        return tuple(math.exp(-mean) * mean**k / math.factorial(k) for k in range(60)) + (0.0,) * (
            kmax - 59
        )
    eta = {"logarithmic": 0.0, "geometric": 1.0}.get(distribution, distribution)

    def tnb(gamma):
        # (1-γ)^k Π_{l<k} (l+η) / (k! (γ^-η - 1)); at η = 0: (1-γ)^k / (k log(1/γ))
        terms, ratio = [0.0], 1.0
        for k in range(1, kmax + 1):
            if eta == 0:
                terms.append((1 - gamma) ** k / (k * math.log(1 / gamma)))
            else:
                ratio *= (k - 1 + eta) / k * (1 - gamma)
                terms.append(ratio / (gamma**-eta - 1))
        return terms

    lo, hi = 1e-4, 1.0 - 1e-12
    for _ in range(60):
        mid = (lo + hi) / 2
        m = sum(k * p for k, p in enumerate(tnb(mid)))
        lo, hi = (mid, hi) if m > mean else (lo, mid)
    return tuple(tnb((lo + hi) / 2))


def _pmf(k, mean, distribution):
    return _pmfs(mean, distribution)[k]


@pytest.mark.parametrize("distribution", ["poisson", "logarithmic", "geometric", 0.5])
def test_expected_selected_accuracy_is_the_enumeration_of_every_draw(distribution):
    """Three configurations, two tied on validation: every tuple of K <= 7 candidates drawn
    uniformly (3^K tuples), the best on validation released (a tie broken uniformly), weighted
    by P(K = k); with K = 0 nothing (counted 0). The tail K > 8 is bounded by its mass."""
    from pl_privfed.report.random_search import expected_selected, winner_probabilities

    val = [0.8, 0.9, 0.8]
    test = [0.70, 0.85, 0.75]
    mean, kmax = 1.6, 8
    enumerated, mass = 0.0, 0.0
    for k in range(kmax + 1):
        p = _pmf(k, mean, distribution)
        mass += p
        if k == 0:
            continue
        for draw in itertools.product(range(3), repeat=k):
            top = max(val[i] for i in draw)
            winners = sorted({i for i in draw if val[i] == top})
            enumerated += p / 3**k * sum(test[i] for i in winners) / len(winners)
    tail = 1 - mass
    got = expected_selected(val, test, mean, distribution)
    assert abs(got - enumerated) <= tail + 1e-9
    assert tail < 5e-3
    probabilities = winner_probabilities(val, mean, distribution)
    assert probabilities[0] == pytest.approx(probabilities[2])
    p0 = _pmf(0, mean, distribution)
    assert probabilities.sum() == pytest.approx(1 - p0, abs=1e-9)


def test_expected_selected_accuracy_matches_a_simulated_search():
    """Nine configurations, K logarithmic with mean 9 (a family's grid): 200,000 simulated
    searches (K from the pmf, candidates drawn uniformly, the best on validation) agree with
    the exact expectation within four standard errors; a non-finite validation never wins
    against a finite one, and a diverged run's test accuracy counts 0."""
    from pl_privfed.report.random_search import expected_selected

    rng = np.random.default_rng(0)
    val = [0.5, 0.91, 0.88, math.nan, 0.7, 0.9, 0.89, 0.6, 0.2]
    test = [0.52, 0.90, 0.89, math.nan, 0.72, 0.91, 0.87, 0.61, 0.25]
    ks = np.arange(1, 400)
    pmf = np.array([_pmf(int(k), 9, "logarithmic") for k in ks])
    draws = 200_000
    counts = rng.choice(ks, size=draws, p=pmf / pmf.sum())
    score = np.nan_to_num(np.array(val), nan=-np.inf)
    value = np.nan_to_num(np.array(test), nan=0.0)
    results = np.empty(draws)
    for k in np.unique(counts):
        rows = np.flatnonzero(counts == k)
        picks = rng.integers(0, 9, size=(rows.size, k))
        results[rows] = value[np.take_along_axis(picks, score[picks].argmax(1)[:, None], 1)[:, 0]]
    exact = expected_selected(val, test, 9, "logarithmic")
    assert abs(results.mean() - exact) <= 4 * results.std() / math.sqrt(draws)


def test_the_pgf_is_dp_accountings_distribution():
    """γ from the mean agrees with dp-accounting's own solution (the search the calibration
    charged); mean 1 is one candidate; bad settings are refused."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from pl_privfed.report.random_search import (
        candidate_count_pgf,
        truncated_negative_binomial_gamma,
    )

    for shape in (0.0, 0.5, 1.0, 2.0):
        ours = truncated_negative_binomial_gamma(9.0, shape)
        theirs = rdp._gamma_truncated_negative_binomial(shape, 9.0)
        assert ours == pytest.approx(theirs, rel=1e-7)
    assert candidate_count_pgf(1.0, "logarithmic")(0.3) == pytest.approx(0.3)
    assert candidate_count_pgf(4.0, "poisson")(1.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="mean number of candidates must be >= 1"):
        candidate_count_pgf(0.5, "poisson")
    with pytest.raises(ValueError, match="random search distribution"):
        candidate_count_pgf(3.0, "uniform")


# ---------------------------------------------------------------------------- the sweep files
REPO = Path(__file__).resolve().parents[1]
TOTAL_SWEEPS = sorted((REPO / "configs/sweeps").glob("total_*.yaml"))
EPS = "model.algorithm.init_args.noise.epsilon"
NOISE = "model.algorithm.init_args.noise."


def test_total_sweeps_pay_for_their_own_grid():
    """Every equal-total-ε sweep: its family's frontier grid (the same candidate values as
    ``frontier_<family>.yaml``) at total ε ∈ {1, 2, 4, 8} and three seeds, calibrated for a
    logarithmic random search whose mean is the grid's size, labelled by its description."""
    assert TOTAL_SWEEPS, "no configs/sweeps/total_*.yaml"
    for path in TOTAL_SWEEPS:
        sweep = load_sweep(path)
        raw = yaml.safe_load(path.read_text())
        assert sweep.name == path.stem and raw["description"]
        frontier = load_sweep(path.with_name(path.stem.replace("total_", "frontier_", 1) + ".yaml"))
        candidates = {
            k: v
            for k, v in sweep.parameters.items()
            if k not in ("seed", EPS) and not k.startswith(NOISE)
        }
        assert candidates == {
            k: v for k, v in frontier.parameters.items() if k not in ("seed", EPS)
        }
        size = math.prod(len(v) for v in candidates.values())
        assert sweep.parameters[NOISE + "search_mean"] == [size], path.name
        assert sweep.parameters[NOISE + "search_distribution"] == ["logarithmic"]
        assert sweep.parameters[NOISE + "calibration"] == ["random_search"]
        assert sweep.parameters[EPS] == [1.0, 2.0, 4.0, 8.0]
        assert sweep.parameters["seed"] == [0, 1, 2]
        assert sweep.command == frontier.command


def test_total_epsilon_points_of_a_sweep(tmp_path):
    """Written runs of two seeds: each seed's value is the exact expectation over its grid, no
    interval from fewer than three seeds; runs not calibrated for a search are refused."""
    from helpers.frontier import private_sweep, total_sweep

    from pl_privfed.report.random_search import expected_selected, total_epsilon_points

    val = {(1.0, 0.1): 0.80, (1.0, 1.0): 0.70, (8.0, 0.1): 0.82, (8.0, 1.0): 0.86}
    test = {(1.0, 0.1): 0.78, (1.0, 1.0): 0.72, (8.0, 0.1): 0.80, (8.0, 1.0): 0.85}
    path = total_sweep(tmp_path, "total_x", val, test, seeds=2)
    points = total_epsilon_points([path])
    assert [(p.method, p.target) for p in points] == [("total_x", 1.0), ("total_x", 8.0)]
    low = points[0]
    want = expected_selected([0.80, 0.70], [0.78, 0.72], 2, "logarithmic")
    assert low.per_seed["0"] == pytest.approx(want)
    assert low.test.n == 2 and math.isnan(low.test.low) and low.candidates == 2
    assert low.clients == 1000 and low.adversary == "models"
    assert low.best[0][0] == "step_size=0.1"
    with pytest.raises(ValueError, match="not calibrated for a random search"):
        total_epsilon_points([private_sweep(tmp_path / "plain")])


def test_compare_total_epsilon_command(tmp_path, capsys):
    """``pl-privfed compare --total-epsilon``: the table printed, the files written, the twin
    matched to its method by the folders' names; ``--nonprivate`` alone is refused."""
    from helpers.frontier import nonprivate_sweep, total_sweep

    from pl_privfed.cli import main

    val = {(1.0, 0.1): 0.80, (1.0, 1.0): 0.70, (8.0, 0.1): 0.82, (8.0, 1.0): 0.86}
    total = total_sweep(tmp_path, "total_mnist_x", val, val)
    twin = nonprivate_sweep(tmp_path, name="frontier_mnist_x_nonprivate")
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_:
        main(
            ["compare", "--total-epsilon", str(total), "--nonprivate", str(twin), "--out", str(out)]
        )
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    assert str(out / "total.png") in printed and "| mnist_x | 8 |" in printed
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(total), "--out", str(out), "--nonprivate", str(twin)])
    assert exit_.value.code == 2
    assert "--nonprivate goes with --total-epsilon" in capsys.readouterr().err
