"""The PLD accountant (``accountant: pld``, and ``auto``, for every history): golden values against dp-accounting computed independently here, the
Zhu-Dong-Wang dominating pair for sampling without replacement, and calibration with it."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from pl_privfed.algorithms import AlphaNormEC, SoteriaFL
from pl_privfed.privacy import (
    DPNoise,
    Mechanism,
    PrivacyAccountant,
    PrivacyLedger,
    ReleaseKey,
    calibrate_noise_multiplier,
    calibrate_noise_std,
)
from pl_privfed.privacy.pld import wor_pld

DELTA = 1e-5


@pytest.mark.parametrize(
    ("sigma", "rate", "steps", "delta"),
    [
        (1.0, 0.1, 100, 1e-5),
        (1.2863, 0.1, 300, 1e-5),  # mnist_dp_fedavg_clip's noise, rate and rounds
        (0.8, 0.01, 500, 1e-6),
        (5.0, 1.0, 50, 1e-5),
        (10.40625, 1.0, 300, 1e-5),  # the distributed configurations' server-side multiplier
        (2.0, 1.0, 1, 1e-3),
    ],
)
def test_auto_is_pld_and_matches_dp_accounting(sigma, rate, steps, delta):
    """Golden values: ``auto`` (and ``pld``) is dp-accounting's own ``PLDAccountant`` on the
    equivalent ``DpEvent`` (a Poisson-subsampled Gaussian self-composed, add/remove, or a plain
    Gaussian), below Opacus's RDP bound, which it reports beside it."""
    reference = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.GaussianDpEvent(sigma)
    if rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(rate, event)
    reference.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    expected = reference.get_epsilon(delta)
    for name in ("auto", "pld"):
        acc = PrivacyAccountant(name)
        acc.step(noise_multiplier=sigma, sample_rate=rate, num_steps=steps)
        assert acc.method == "pld" and acc.library == "dp-accounting PLD"
        epsilon = acc.get_epsilon(delta)
        if rate < 1:  # the same PLD, composed the same way
            assert epsilon == pytest.approx(expected, rel=1e-9)
        else:  # the exact Gaussian ε; dp-accounting's discretized PLD is a hair above it
            assert expected - 1e-6 <= epsilon <= expected
            assert epsilon == pytest.approx(expected, rel=1e-7)
        # the coarse bound logged before the last round is an upper bound, and close
        assert epsilon <= acc.get_epsilon_upper(delta) <= epsilon * 1.02 + 1e-9
        rdp = PrivacyAccountant("rdp")
        rdp.step(noise_multiplier=sigma, sample_rate=rate, num_steps=steps)
        assert acc.get_epsilon_rdp(delta) == rdp.get_epsilon(delta)
        assert epsilon < acc.get_epsilon_rdp(delta)


def test_gaussian_histories_compose_exactly():
    """Unsampled releases at different noise compose as one Gaussian (μ² = Σ K/σ²): the same ε
    as dp-accounting's PLD accountant on the composed events."""
    acc = PrivacyAccountant()
    acc.step(noise_multiplier=3.0, sample_rate=1.0, num_steps=20)
    acc.step(noise_multiplier=6.0, sample_rate=1.0, num_steps=40)
    reference = dp_accounting.pld.PLDAccountant()
    reference.compose(dp_accounting.GaussianDpEvent(3.0), 20)
    reference.compose(dp_accounting.GaussianDpEvent(6.0), 40)
    assert acc.get_epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-6)
    assert acc.get_epsilon(DELTA) <= reference.get_epsilon(DELTA)


@pytest.mark.parametrize(
    ("rate", "steps", "target", "delta"),
    [(0.1, 100, 4.0, 1e-5), (0.05, 200, 2.0, 1e-6), (1.0, 300, 8.0, 1e-5), (1.0, 50, 1.0, 1e-5)],
)
def test_calibration_solves_for_the_pld_target(rate, steps, target, delta):
    """``calibrate_noise_multiplier`` under ``auto``: dp-accounting's PLD ε at the solved noise
    is within the tolerance below the target, with less noise than RDP needs."""
    mult = calibrate_noise_multiplier(
        target_epsilon=target, delta=delta, sample_rate=rate, steps=steps
    )
    reference = dp_accounting.pld.PLDAccountant()
    event = dp_accounting.GaussianDpEvent(mult)
    if rate < 1:
        event = dp_accounting.PoissonSampledDpEvent(rate, event)
    reference.compose(event, steps)
    assert target - 0.011 < reference.get_epsilon(delta) <= target + 1e-6
    rdp = calibrate_noise_multiplier(
        target_epsilon=target, delta=delta, sample_rate=rate, steps=steps, accountant="rdp"
    )
    assert 0.85 * rdp < mult < 0.97 * rdp  # PLD needs 3-15 % less noise for the same ε


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
    alg.configure_data(
        batch_size=2,
        local_batches=1,
        shuffle=True,
        client_sizes=[50] * 4,
        batch_sampling="without_replacement",
    )
    alg.setup(num_clients=4, dim=3, num_rounds=40)
    return alg


@pytest.mark.slow
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


def test_a_checkpoint_calibrated_by_an_older_accountant_is_refused():
    """A run checkpointed while ``auto`` meant RDP for unsampled releases (same settings, RDP's
    noise): an older version's calibration, refused in one line naming both noise levels."""
    alg = AlphaNormEC(0.1, 0.1, 0.01, noise=DPNoise(epsilon=8.0, calibration="target"))
    alg.setup(num_clients=10, dim=5, num_rounds=300)
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 300)
    saved = {**ledger.calibration_record(), "noise_std": 22.109375}  # RDP's σ for this run
    with pytest.raises(ValueError, match="calibrated by an older pl-privfed's accountant") as info:
        ledger.restore(saved)
    assert "22.1094" in str(info.value) and f"{alg.noise_std:.6g}" in str(info.value)
    checkpoint = {}
    ledger.save(checkpoint)
    del checkpoint["privacy_accountants"]  # before the adversaries
    with pytest.raises(ValueError, match="kept no privacy_accountants in its privacy ledger"):
        PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 300).load(checkpoint)


def test_the_epsilon_memo_returns_what_a_fresh_computation_returns(monkeypatch):
    """pld_epsilon keeps each history's ε (reports ask for the same history once per adversary
    and evaluation, and a grid's configurations with the same noise share it): a repeated
    question composes nothing and returns what a fresh computation does, for the coarse bound
    and the exact ε alike."""
    from pl_privfed.privacy import pld

    history = [
        (ReleaseKey(1.2863, 0.1, "poisson", None), 300),
        (ReleaseKey(2.0, 0.1, "poisson", None), 10),
    ]
    pld._history_epsilon.cache_clear()
    exact, coarse = pld.pld_epsilon(history, DELTA), pld.pld_epsilon(history, DELTA, True)
    composed = []
    real = pld._composed_epsilon
    monkeypatch.setattr(pld, "_composed_epsilon", lambda *a: composed.append(a) or real(*a))
    assert pld.pld_epsilon(history, DELTA) == exact and not composed  # remembered
    assert pld.pld_epsilon(history, DELTA, coarse_only=True) == coarse and not composed
    assert pld.pld_epsilon(history, 1e-6) > exact and composed  # another δ is another question
    pld._history_epsilon.cache_clear()  # forgotten: computed again
    assert pld.pld_epsilon(history, DELTA) == exact and coarse < exact * 1.02


def test_configurations_that_differ_in_their_noise_seed_share_one_calibration(monkeypatch):
    """calibration: target solves σ once per process for the same releases, noise settings and
    rounds; the noise's seed keys the draws, not σ, so a sweep's seeds share the solution."""
    from pl_privfed.privacy import plan

    solved = []
    plan._solve_once.cache_clear()
    monkeypatch.setattr(
        plan, "calibrate_noise_std", lambda **kw: solved.append(kw) or calibrate_noise_std(**kw)
    )
    stds = []
    for seed, epsilon in ((0, 8.0), (1, 8.0), (2, 8.0), (0, 4.0)):
        noise = DPNoise(epsilon=epsilon, calibration="target", seed=seed)
        alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=noise)
        alg.setup(dim=5, num_clients=10, num_rounds=20)
        stds.append(plan.calibrate(alg.release(), noise, 20))  # remembered since setup
    assert [kw["target_epsilon"] for kw in solved] == [8.0, 4.0]
    assert stds[0] == stds[1] == stds[2] < stds[3]


@pytest.mark.parametrize(
    "placement, sampler",
    [("central", "poisson"), ("distributed", "fixed"), ("local", None)],
)
def test_configurations_that_differ_in_their_bound_share_one_calibration(
    monkeypatch, placement, sampler
):
    """The accounting sees σ only through σ / sensitivity, and every sensitivity is a
    multiple of Φ: calibration: target solves once for Φ = 1 and scales, so a frontier's
    clipping thresholds share a solve, and every threshold's σ certifies the target."""
    from pl_privfed.algorithms import DPFedAvg
    from pl_privfed.operators import Clip
    from pl_privfed.privacy import plan
    from pl_privfed.sampling import FixedSizeSampler, PoissonSampler

    solved = []
    plan._solve_once.cache_clear()
    monkeypatch.setattr(
        plan, "calibrate_noise_std", lambda **kw: solved.append(kw) or calibrate_noise_std(**kw)
    )
    stds, epsilons = {}, {}
    for threshold in (0.3, 1.0, 3.0):
        kind = {"poisson": lambda: PoissonSampler(0.2), "fixed": lambda: FixedSizeSampler(4)}
        noise = DPNoise(
            epsilon=4.0,
            calibration="target",
            placement=placement,
            min_contributors=4 if placement == "distributed" else None,
        )
        alg = DPFedAvg(
            0.5, operator=Clip(threshold), noise=noise, sampler=kind[sampler]() if sampler else None
        )
        alg.setup(dim=5, num_clients=20, num_rounds=30)
        stds[threshold] = plan.calibrate(alg.release(), noise, 30)  # remembered since setup
        ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 30)
        for r in range(30):
            ledger.account(r)
        epsilons[threshold] = ledger.epsilon()
    assert len(solved) == 1
    start = solved[0]["start"]  # a power of two, at the unit release's sensitivity
    assert math.log2(start) == round(math.log2(start)) and 0.5 <= start <= 4
    assert stds[0.3] == pytest.approx(0.3 * stds[1.0], rel=1e-12)
    assert stds[3.0] == pytest.approx(3.0 * stds[1.0], rel=1e-12)
    for epsilon in epsilons.values():  # each certifies the target, to the solver's tolerance
        assert epsilon == pytest.approx(epsilons[1.0], rel=1e-9) and epsilon <= 4.0 * 1.001


def test_calibration_starts_near_the_sensitivity_and_any_power_of_two_start_agrees():
    """The bisection's bracket (hence σ) is the same from any power-of-two start, and a start
    at the sensitivity keeps it from probing tiny noise multipliers, whose PLDs are huge: a
    record-level SoteriaFL run at ε = 0.5 (sensitivity 512× its start) ran out of 23 GB."""
    probes = []

    def plan(std):
        probes.append(std / 512.0)  # the noise multiplier the accountant sees
        return [(Mechanism(std / 512.0, 0.1), 50)]

    near = calibrate_noise_std(target_epsilon=0.5, delta=DELTA, plan=plan, start=512.0)
    assert min(probes) >= 0.5  # never below half the multiplier it started at
    probes.clear()
    far = calibrate_noise_std(target_epsilon=0.5, delta=DELTA, plan=plan, start=2.0**12)
    assert far == near
