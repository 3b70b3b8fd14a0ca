"""Privacy kinds as types (client-level and record-level releases), the one release key, the
one exact-Gaussian ε and the bounded caches of the accounting."""

from __future__ import annotations

import dataclasses
import math

import pytest
import scipy.stats
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

from pl_privfed.privacy import (
    ClientLevel,
    DPNoise,
    LocalNoise,
    Mechanism,
    NoisePlacement,
    PrivacyAccountant,
    RecordLevel,
    RecordUse,
    Release,
    ReleaseKey,
    accounting,
    level_of,
    plan,
    pld,
)
from pl_privfed.privacy.selection import merged_releases

DELTA = 1e-5
CLIENTS = Release("client-level DP", 1.0, participation=0.2, cohort="poisson", clients=50)
FIXED = Release(
    "client-level DP", 1.0, participation=0.1, cohort="fixed", clients=40, cohort_size=4.0
)


def records(batch_sampling="without_replacement", positions=10, population=100, **kw):
    use = RecordUse(positions, population, batch_sampling, release_size=10, paper_rate=0.1, **kw)
    return Release(
        "example-level local DP",
        0.5,
        sensitivity=0.05,
        participation=0.5,
        cohort="poisson",
        clients=20,
        records=use,
    )


# ---------------------------------------------------------------------------- the kinds
def test_the_declaration_decides_the_kind():
    assert isinstance(level_of(CLIENTS), ClientLevel) and level_of(CLIENTS).name == "client"
    release = records()
    level = level_of(release)
    assert isinstance(level, RecordLevel) and level.name == "record"
    assert level.records is release.records and level.release is release


@pytest.mark.parametrize(
    "placement, expected",
    [
        ("local", ["server", "models"]),
        ("central", ["models"]),
        ("distributed", ["server", "models"]),
    ],
)
def test_a_client_level_release_takes_its_adversaries_from_the_placement(placement, expected):
    kw = {"min_contributors": 2} if placement == "distributed" else {}
    noise = DPNoise(noise_multiplier=1.0, placement=placement, **kw)
    assert level_of(CLIENTS).adversaries(noise) == expected
    trusted = level_of(CLIENTS).trusted(noise)
    assert (trusted is None) == (placement == "local")


def test_a_record_level_release_reports_both_adversaries_and_trusts_nothing():
    level, noise = level_of(records()), DPNoise(noise_multiplier=1.0)
    assert level.adversaries(noise) == ["server", "models"]
    assert level.trusted(noise) is None and level.not_charged(noise, 10) is None
    assert level.unit(noise) == "example-level local DP"  # no placement phrase: always local
    assert "post-processing" in level.sees(noise, "models")
    assert level.sees(noise, "server") == "the server: every noised message and its sender"


def test_the_relations_of_each_kind():
    plain = DPNoise(noise_multiplier=1.0)
    client = level_of(CLIENTS)
    assert client.relation(plain, "server") == "replace_one"  # it knows who takes part
    assert client.relation(plain, "models") == "add_remove"  # a client present or not
    assert level_of(FIXED).relation(plain, "models") == "replace_one"  # without replacement
    chosen = DPNoise(noise_multiplier=1.0, neighbouring="add_remove")
    assert client.relation(chosen, "server") == "add_remove"  # the headline's is the run's
    assert client.relation(chosen, "models") == "add_remove"
    headline_models = DPNoise(noise_multiplier=1.0, placement="central", neighbouring="replace_one")
    assert client.relation(headline_models, "models") == "replace_one"
    record = level_of(records())
    assert record.relation(plain, "server") == record.relation(plain, "models") == "replace_one"
    assert record.relation(chosen, "models") == "add_remove"  # for both adversaries


def test_client_level_mechanisms_amplify_only_against_the_models():
    noise = DPNoise(noise_multiplier=1.0)
    server = level_of(CLIENTS).mechanisms(noise, 3.0, 2.0, 0, "server")
    assert [(m.noise_multiplier, m.sample_rate, m.sampling) for m in server] == [(1.5, 1.0, "none")]
    (models,) = level_of(CLIENTS).mechanisms(noise, 3.0, 1.0, 5, "models")
    assert (models.noise_multiplier, models.sample_rate, models.sampling) == (3.0, 0.2, "poisson")
    (fixed,) = level_of(FIXED).mechanisms(noise, 3.0, 2.0, 0, "models")
    assert fixed.key() == ReleaseKey(1.5, 4 / 40, "without_replacement", 40)
    assert not level_of(CLIENTS).round_dependent


@pytest.mark.parametrize("positions, population", [(30, 100), (64, 64), (7, 50)])
def test_a_record_is_charged_its_uses_by_epochs(positions, population):
    """By the end of round k a record has been used at most ⌈(k+1)·positions/population⌉
    times: the rounds' releases add up to exactly that, each unamplified."""
    level = level_of(records("epochs", positions, population, gaussians_per_use=4))
    assert level.round_dependent
    noise = DPNoise(noise_multiplier=1.0)
    total = 0
    for k in range(12):
        mechs = level.mechanisms(noise, 2.0, 0.5, k, "server")
        assert all(m.key() == ReleaseKey(2.0 / (0.5 * 2.0), 1.0, "none", None) for m in mechs)
        total += len(mechs)
        assert total == math.ceil((k + 1) * positions / population)


def test_a_record_sampled_without_replacement_is_one_amplified_release_a_round():
    level, noise = level_of(records()), DPNoise(noise_multiplier=1.0)
    assert not level.round_dependent
    for k in (0, 7):
        (m,) = level.mechanisms(noise, 1.0, 0.05, k, "models")
        assert m.key() == ReleaseKey(1.0 / 0.05, 0.1, "without_replacement", 100)
    (whole,) = level_of(records(positions=100)).mechanisms(noise, 1.0, 0.05, 0, "server")
    assert whole.key() == ReleaseKey(1.0 / 0.05, 1.0, "none", None)


def test_the_papers_rate_and_counts_of_each_kind():
    assert level_of(CLIENTS).paper_rate == 0.2
    assert (
        level_of(CLIENTS).paper_releases_per_round,
        level_of(CLIENTS).paper_gaussians_per_release,
    ) == (1, 1)
    level = level_of(records(paper_releases_per_round=3, paper_gaussians_per_release=2))
    assert level.paper_rate == pytest.approx(0.5 * 0.1)
    assert (level.paper_releases_per_round, level.paper_gaussians_per_release) == (3, 2)
    assert level.paper_problems(NoisePlacement())[0] == (
        "add/remove, although the minibatches have a fixed size"
    )
    (problem,) = level_of(CLIENTS).paper_problems(LocalNoise())[:1]
    assert "does not hold against the server" in problem


def test_each_kind_refuses_what_its_accounting_cannot_hold():
    central = DPNoise(noise_multiplier=1.0, placement="central")
    with pytest.raises(ValueError, match="record-level DP"):
        level_of(records()).check_sum_noise(central)
    level_of(CLIENTS).check_sum_noise(central)  # a Poisson cohort divided by a fixed number
    realized = dataclasses.replace(CLIENTS, cohort="realized")
    with pytest.raises(ValueError, match="fixed denominator"):
        level_of(realized).check_sum_noise(central)
    level_of(CLIENTS).check_data(central)  # nothing to check of a client's data
    with pytest.raises(ValueError, match="replace-one"):
        level_of(records()).check_data(DPNoise(noise_multiplier=1.0, neighbouring="add_remove"))
    big = dataclasses.replace(records(), records=RecordUse(10, 8, "epochs", release_size=9))
    with pytest.raises(ValueError, match="more than once"):
        level_of(big).check_data(DPNoise(noise_multiplier=1.0))


def test_each_kind_says_what_its_epsilon_assumes():
    noise = DPNoise(noise_multiplier=1.0)
    amplification, composition = level_of(records()).amplification(noise, "server", "replace_one")
    assert amplification.startswith("sampling without replacement of 10 of the 100 records")
    assert amplification.endswith("none from client sampling (the server sees who takes part)")
    assert composition == "every round of the run"
    _, by_uses = level_of(records("epochs", 30, 100)).amplification(noise, "server", "replace_one")
    assert by_uses == "a record's uses: at most ⌈k·30/100⌉ by round k"
    server, _ = level_of(CLIENTS).amplification(noise, "server", "replace_one")
    assert "does not amplify against it" in server
    models, _ = level_of(CLIENTS).amplification(noise, "models", "add_remove")
    assert models.startswith("Poisson sampling of clients at rate 0.2")


# ---------------------------------------------------------------------------- one release key
def test_one_release_key_from_a_mechanism_the_accountant_and_a_history_record():
    assert (
        Mechanism(2.0, 1.0, sampling="poisson").key()
        == Mechanism(2.0).key()
        == ReleaseKey(2.0, 1.0, "none", None)
    )
    acc = PrivacyAccountant()
    acc.step(noise_multiplier=1.5, sample_rate=1.0, num_steps=3)
    acc.step(
        noise_multiplier=2.0,
        sample_rate=0.25,
        sampling="without_replacement",
        population=8,
        num_steps=2,
    )
    expected = {
        ReleaseKey(1.5, 1.0, "none", None): 3,
        ReleaseKey(2.0, 0.25, "without_replacement", 8): 2,
    }
    assert acc.releases() == expected
    history = acc.history()  # what summary.json keeps
    assert [Mechanism.from_record(r).key() for r in history] == list(expected)
    assert merged_releases([history]) == expected
    assert merged_releases([history, history]) == {k: 2 * n for k, n in expected.items()}


# ---------------------------------------------------------------------------- one exact ε
def balle_wang_delta(epsilon: float, sigma: float) -> float:
    """δ(ε) of the Gaussian mechanism of sensitivity 1 and noise std σ (Balle & Wang 2018,
    Thm. 8), by scipy."""
    norm = scipy.stats.norm
    a, b = 1 / (2 * sigma), epsilon * sigma
    return norm.cdf(a - b) - math.exp(epsilon) * norm.cdf(-a - b)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0])
def test_the_exact_gaussian_epsilon(sigma):
    """The ε is on Balle & Wang's curve (δ(ε) ≤ δ, and any smaller ε spends more), at most
    dp-accounting's PLD of the same single Gaussian (a discretization above it, by under 1e-7),
    and at σ = 1, δ = 1e-5 it is 4.37718."""
    epsilon = pld.gaussian_epsilon(sigma, DELTA)
    assert GaussianPrivacyLoss(sigma, sensitivity=1.0).get_delta_for_epsilon(epsilon) <= DELTA
    assert balle_wang_delta(epsilon, sigma) == pytest.approx(DELTA, rel=1e-6)
    assert balle_wang_delta(epsilon * (1 - 1e-6), sigma) > DELTA
    discretized = pld_lib.from_gaussian_mechanism(sigma).get_epsilon_for_delta(DELTA)
    assert epsilon <= discretized <= epsilon * (1 + 1e-7)
    if sigma == 1.0:
        assert epsilon == pytest.approx(4.377178, abs=1e-6)


def test_the_exact_gaussian_epsilon_at_its_ends():
    assert pld.gaussian_epsilon(0.0, DELTA) == math.inf  # no noise
    assert pld.gaussian_epsilon(math.inf, DELTA) == 0.0
    assert pld.gaussian_epsilon(1e308, DELTA) == 0.0  # δ(0) already below δ: nothing searched


def test_unsampled_releases_compose_to_one_exact_gaussian():
    """K releases at σ without sampling are one Gaussian at σ/√K: the PLD accountant's ε is the
    exact one, not a discretization."""
    history = [(ReleaseKey(3.0, 1.0, "none", None), 9)]
    assert pld.pld_epsilon(history, DELTA) == pld.gaussian_epsilon(1.0, DELTA)


# ---------------------------------------------------------------------------- bounded caches
CACHES = [
    pld.release_pld,
    pld.composed_pld,
    pld._history_epsilon,
    accounting._opacus_curve,
    accounting._replace_one_curve,
    plan._solve_once,
]


@pytest.mark.parametrize("cache", CACHES, ids=lambda c: c.__name__)
def test_every_accounting_cache_is_bounded(cache):
    assert isinstance(cache.cache_info().maxsize, int) and cache.cache_info().maxsize > 0


def test_the_pld_cache_forgets_the_least_recently_used():
    pld.release_pld.cache_clear()
    size = pld.release_pld.cache_info().maxsize
    keys = [ReleaseKey(1.0 + i / 10, 0.5, "poisson", None) for i in range(size + 1)]
    for key in keys:
        pld.release_pld(key, pld.COARSE_INTERVAL)
    assert pld.release_pld.cache_info().currsize == size
    misses = pld.release_pld.cache_info().misses
    pld.release_pld(keys[-1], pld.COARSE_INTERVAL)  # kept
    assert pld.release_pld.cache_info().misses == misses
    pld.release_pld(keys[0], pld.COARSE_INTERVAL)  # the first one out
    assert pld.release_pld.cache_info().misses == misses + 1


@dataclasses.dataclass  # not frozen: equal by value, so not hashable
class _Unhashable(NoisePlacement):
    name = "unhashable-test"


def test_calibration_is_kept_per_settings_and_solved_for_an_unhashable_placement():
    """calibration: target's σ is kept per declaration and noise settings (not per seed);
    a placement that cannot be a key is solved every time, to the same σ."""
    plan._solve_once.cache_clear()
    release = Release("client-level DP", 1.0, clients=10)
    noises = [DPNoise(epsilon=2.0, calibration="target", seed=s) for s in (0, 1)]
    stds = [plan.calibrate(release, noise, 50) for noise in noises]
    info = plan._solve_once.cache_info()
    assert stds[0] == stds[1] and (info.misses, info.hits) == (1, 1)
    odd = DPNoise(epsilon=2.0, calibration="target", placement=_Unhashable())
    assert plan.calibrate(release, odd, 50) == stds[0]
    assert plan._solve_once.cache_info().currsize == 1  # not kept
