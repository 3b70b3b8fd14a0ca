"""The PLD accountant (``accountant: pld``, and ``auto`` where releases are sampled without
replacement): golden values against dp-accounting computed independently here, the
Zhu-Dong-Wang dominating pair for sampling without replacement, and calibration with it."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from pl_privfed.algorithms import SoteriaFL
from pl_privfed.privacy import (
    DPNoise,
    Mechanism,
    PrivacyAccountant,
    PrivacyLedger,
    calibrate_noise_std,
)
from pl_privfed.privacy.pld import wor_pld

DELTA = 1e-5


@pytest.mark.parametrize(("sigma", "rate", "steps"), [(1.0, 0.1, 100), (5.0, 1.0, 50)])
def test_poisson_and_unsampled_match_dp_accounting(sigma, rate, steps):
    acc = PrivacyAccountant("pld")
    acc.step(noise_multiplier=sigma, sample_rate=rate, num_steps=steps)
    reference = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.GaussianDpEvent(sigma)
    if rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(rate, event)
    reference.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    assert acc.get_epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-9)
    assert acc.get_epsilon(DELTA) < acc.get_epsilon_rdp(DELTA)
    assert acc.library == "dp-accounting PLD"
    # auto stays on Opacus RDP without sampling without replacement
    auto = PrivacyAccountant()
    auto.step(noise_multiplier=sigma, sample_rate=rate, num_steps=steps)
    assert auto.method == "rdp"
    assert auto.get_epsilon(DELTA) == pytest.approx(acc.get_epsilon_rdp(DELTA), rel=1e-12)


def test_wor_profile_is_the_remove_pairs_for_positive_epsilon():
    """Zhu, Dong & Wang 2022: for ε ≥ 0 the dominating pair of one release sampled without
    replacement is R = (γ N(1, σ²) + (1−γ) N(0, σ²), N(0, σ²)); the symmetric PLD keeps R's
    δ(ε) there, and is at least as large as both of dp-accounting's Poisson directions."""
    sigma, gamma = 1.2, 0.05
    sym = wor_pld(sigma, gamma)
    remove = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=gamma)
    for eps in (0.0, 0.05, 0.2, 0.5, 1.0):
        assert sym.get_delta_for_epsilon(eps) == pytest.approx(
            remove.get_delta_for_epsilon(eps), rel=1e-6, abs=1e-15
        )
    composed = sym.self_compose(200).get_epsilon_for_delta(DELTA)
    assert composed >= remove.self_compose(200).get_epsilon_for_delta(DELTA)


def _explicit_symmetric_pair(sigma, gamma, width=1e-3):
    """The symmetric dominating pair written out as two discrete distributions on a grid of x
    (independently of :func:`wor_pld`): on x > 1/2 the pair R, on x < 1/2 R reversed and
    reflected (x ↦ 1 − x), and the remaining mass on one extra outcome of loss 0."""
    x = np.arange(0.5 + width / 2, 0.5 + 14 * sigma, width)
    q = stats.norm.pdf(x, 0, sigma) * width
    p = gamma * stats.norm.pdf(x, 1, sigma) * width + (1 - gamma) * q
    upper = {("hi", i): math.log(v) for i, v in enumerate(p) if v > 0}
    lower = {("hi", i): math.log(v) for i, v in enumerate(q) if v > 0}
    upper.update({("lo", i): math.log(v) for i, v in enumerate(q) if v > 0})
    lower.update({("lo", i): math.log(v) for i, v in enumerate(p) if v > 0})
    rest = 1 - p.sum() - q.sum()
    upper["zero"] = lower["zero"] = math.log(rest)
    return pld_lib.from_two_probability_mass_functions(lower, upper)


def test_wor_matches_an_independent_construction_and_is_below_rdp():
    sigma, size, population, steps = 1.2, 50, 1000, 100
    acc = PrivacyAccountant("pld")
    acc.step(
        noise_multiplier=sigma,
        sample_rate=size / population,
        num_steps=steps,
        sampling="without_replacement",
        population=population,
    )
    eps = acc.get_epsilon(DELTA)
    independent = _explicit_symmetric_pair(sigma, size / population)
    reference = independent.self_compose(steps).get_epsilon_for_delta(DELTA)
    assert eps == pytest.approx(reference, rel=0.02)
    assert eps < 0.75 * acc.get_epsilon_rdp(DELTA)  # RDP is loose here
    assert "Zhu-Dong-Wang" in acc.library
    auto = PrivacyAccountant()
    auto.load_state_dict(acc.state_dict())  # the history is a checkpointable list
    assert auto.method == "pld" and auto.get_epsilon(DELTA) == eps


def test_calibration_targets_the_pld_epsilon():
    """calibration: target under ``auto`` solves for the PLD ε: the ε certified at that noise
    is within the tolerance below the target, and RDP's bound there far above it."""
    size, population, steps, target = 100, 1000, 50, 4.0

    def plan(std):
        mech = Mechanism(std, size / population, sampling="without_replacement", population=1000)
        return [(mech, steps)]

    pld_std = calibrate_noise_std(target_epsilon=target, delta=DELTA, plan=plan)
    acc = PrivacyAccountant()
    acc.step_mechanism(plan(pld_std)[0][0], num_steps=steps)
    assert target - 0.011 < acc.get_epsilon(DELTA) <= target
    # RDP would need more noise: its bound at this noise is well above the target
    assert acc.get_epsilon_rdp(DELTA) > 1.3 * target


def test_unknown_accountant_is_refused():
    with pytest.raises(ValueError, match="accountant"):
        PrivacyAccountant("gdp")


def _soteria(accountant):
    noise = DPNoise(epsilon=2.0, calibration="target", accountant=accountant)
    alg = SoteriaFL(0.1, 0.5, clip_threshold=1.0, batch_size=2, noise=noise)
    alg.configure_data(batch_size=2, local_batches=1, shuffle=True, client_sizes=[50] * 4,
                       batch_sampling="without_replacement")  # fmt: skip
    alg.setup(num_clients=4, dim=3, num_rounds=40)
    return alg


def test_ledger_checkpoint_keeps_the_pld_and_refuses_an_rdp_calibration():
    """A record-level run's ledger under ``auto``: the report has the PLD ε and the RDP bound
    beside it, a checkpoint restores the same ε, and a checkpoint calibrated with RDP (before
    ``auto``) is refused on resume, naming the accountant."""
    alg = _soteria("auto")
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 40)
    for k in range(10):
        ledger.account(k)
    report = ledger.report()
    assert report["accounting"]["accountant"].startswith("dp-accounting PLD")
    assert report["epsilon"] < report["epsilon_rdp"]
    checkpoint = {"global_step": 10}
    ledger.save(checkpoint)
    again = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 40)
    again.load(checkpoint)
    assert again.epsilon() == ledger.epsilon() and again.rounds_accounted == 10
    old = _soteria("rdp")
    saved = {}
    PrivacyLedger(old.release(), old.noise, [old.noise_std], 40).save(saved)
    with pytest.raises(ValueError, match="accountant: 'rdp' -> 'auto'"):
        PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 40).load(saved)
