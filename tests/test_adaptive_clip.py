"""Adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021): exact iterates of the
three client-level families that take it against plain-loop references (clip, indicator, noised
centred count with the count's own keyed draw, geometric update, server step), the noise split
and the certified ε against independent dp-accounting computations, resume, and the refusals."""

import math

import dp_accounting as dpa
import pytest
import torch

from pl_privfed.algorithms import DistributedDPSGD, DPFedAvg, FedAvgPerUpdateClipping
from pl_privfed.engine import run_round
from pl_privfed.operators import AdaptiveClip
from pl_privfed.operators.adaptive import adaptive_noise_multiplier
from pl_privfed.privacy import BandedMFNoise, DPNoise, PrivacyLedger, TreeNoise
from pl_privfed.rng import (
    STREAM_CENTRAL_NOISE,
    STREAM_CLIP_COUNT,
    STREAM_SAMPLING,
    STREAM_SERVER_NOISE,
    stream_key,
)
from pl_privfed.sampling import CyclicSampler, PoissonSampler

DT = torch.float64
SEED, ROUNDS, N, D = 5, 6, 12, 3


def problem():
    g = torch.Generator().manual_seed(1)
    return torch.randn(N, D, generator=g, dtype=DT) * 2, torch.randn(D, generator=g, dtype=DT)


def grad_fn_for(b):
    def grad_fn(params, clients=None):
        rows = b if clients is None else b[clients]
        return (params.unsqueeze(0) if params.dim() == 1 else params) - rows

    return grad_fn


def run(alg, b, x0, rounds=ROUNDS):
    alg.setup(num_clients=N, dim=D, num_rounds=rounds, dtype=DT)
    x, xs, metrics = x0.clone(), [], []
    for _ in range(rounds):
        result = run_round(alg, x, grad_fn_for(b))
        x = result.params
        xs.append(x.clone())
        metrics.append(result.metrics)
    return xs, metrics


# ---------------------------------------------------------------------------- plain references
def gen(*key):
    return torch.Generator().manual_seed(stream_key(SEED, *key))


def normal(std, *key):
    return [v * std for v in torch.randn(D, generator=gen(*key), dtype=DT).tolist()]


def count_noise(std, k):
    return float(torch.randn((), generator=gen(STREAM_CLIP_COUNT, k), dtype=DT)) * std


def poisson_cohort(k, q):
    u = torch.rand(N, generator=gen(STREAM_SAMPLING, k)).tolist()
    return [i for i in range(N) if u[i] < q]


def reference(b, x0, *, family, z, count_std, placement, q, c0, gamma, eta_c, step, local):
    """The paper's round (Andrew et al.: DP-FedAvg with the geometric quantile update; the
    centred count of tensorflow_privacy's QuantileEstimatorQuery), written out."""
    m = q * N  # expected cohort
    z_delta = (z**-2 - (2 * count_std) ** -2) ** -0.5 if z else 0.0
    x, c, out = list(x0), c0, []
    for k in range(ROUNDS):
        senders = poisson_cohort(k, q) if q < 1 else list(range(N))
        total, unclipped = [0.0] * D, 0
        for i in senders:
            g = [x[j] - b[i][j] for j in range(D)]
            u = [local * v for v in g] if family != "per_update" else [-local * v for v in g]
            norm = math.sqrt(sum(v * v for v in u))
            unclipped += 1 if norm <= c else 0  # b_i = 1[‖Δ_i‖ ≤ C]
            s = min(1.0, c / norm) if norm > 0 else 1.0
            total = [t + s * v for t, v in zip(total, u, strict=True)]
        std = z_delta * c  # the update's noise follows C_t
        xi = 0.0
        if z and placement == "central":
            noise = normal(std, STREAM_CENTRAL_NOISE, k)
            xi = count_noise(count_std, k)
        elif z:  # local noise drawn as the senders' sum
            noise = normal(std * math.sqrt(len(senders)), STREAM_SERVER_NOISE, k)
            xi = count_noise(count_std * math.sqrt(len(senders)), k)
        else:
            noise = [0.0] * D
        total = [t + e for t, e in zip(total, noise, strict=True)]
        fraction = min(1.0, max(0.0, (unclipped - 0.5 * len(senders) + xi) / m + 0.5))
        c = c * math.exp(-eta_c * (fraction - gamma))
        sign = 1.0 if family == "per_update" else -1.0
        x = [x[j] + sign * step * total[j] / m for j in range(D)]
        out.append((list(x), c))
    return out


CASES = {
    # family, q, placement, noise multiplier z
    "dp_fedavg_central": ("dp_fedavg", 0.5, "central", 1.5),
    "dp_fedavg_local": ("dp_fedavg", 0.5, "local", 1.5),
    "per_update_central": ("per_update", 0.5, "central", 1.5),
    "dpsgd_central": ("dpsgd", 1.0, "central", 1.5),
    "dpsgd_nonprivate": ("dpsgd", 1.0, "central", 0.0),
}


def make(family, q, clip, noise, step, local):
    sampler = PoissonSampler(q) if q < 1 else None
    if family == "dp_fedavg":
        return DPFedAvg(
            step, local, operator=clip, sampler=sampler, noise=noise, sampling_seed=SEED
        )
    if family == "per_update":
        return FedAvgPerUpdateClipping(
            step, local, sampler=sampler, noise=noise, sampling_seed=SEED, adaptive_clip=clip
        )
    return DistributedDPSGD(step, operator=clip, noise=noise)


@pytest.mark.parametrize("name", list(CASES))
def test_exact_iterates_against_plain_loops(name):
    family, q, placement, z = CASES[name]
    step, local, c0, gamma, eta_c, count_std = 0.7, 0.9, 0.8, 0.5, 0.3, 2.0
    clip = AdaptiveClip(c0, gamma, eta_c, count_stddev=count_std)
    noise = DPNoise(noise_multiplier=z, placement=placement, seed=SEED) if z else None
    alg = make(family, q, clip, noise, step, local)
    b, x0 = problem()
    xs, metrics = run(alg, b, x0)
    # central noise under add/remove (the models' relation): σ = z·C_0; local: replace-one
    relation = 2.0 if placement == "local" and z else 1.0
    ref = reference(
        b.tolist(),
        x0.tolist(),
        family=family,
        z=z * relation,
        count_std=count_std,
        placement=placement,
        q=q,
        c0=c0,
        gamma=gamma,
        eta_c=eta_c,
        step=step,
        local=local if family != "dpsgd" else 1.0,
    )
    norms = [c0] + [c for _, c in ref]
    for k, (x, (r, c)) in enumerate(zip(xs, ref, strict=True)):
        torch.testing.assert_close(x, torch.tensor(r, dtype=DT), rtol=1e-12, atol=1e-12)
        assert float(metrics[k]["clip_norm"]) == pytest.approx(norms[k], rel=1e-13)
        assert math.isclose(c, norms[k + 1], rel_tol=1e-13)
    assert float(alg.clip_norm) == pytest.approx(norms[-1], rel=1e-13)
    assert len(set(round(c, 9) for c in norms)) > 2  # the norm moved


def test_resume_continues_exactly():
    """``C_t`` is the buffer ``clip_norm``: a run restored from its state after 3 rounds ends
    where the uninterrupted run does."""

    def fresh():
        clip = AdaptiveClip(0.5, 0.5, 0.2, count_stddev=1.5)
        noise = DPNoise(noise_multiplier=1.2, placement="central", seed=SEED)
        return make("dp_fedavg", 0.5, clip, noise, 0.7, 0.9)

    b, x0 = problem()
    whole, _ = run(fresh(), b, x0)
    first = fresh()
    part, _ = run(first, b, x0, rounds=3)
    state = {k: v.clone() for k, v in first.state_dict().items()}
    assert "clip_norm" in state
    second = fresh()
    second.setup(num_clients=N, dim=D, num_rounds=ROUNDS, dtype=DT)
    second.load_state_dict(state)
    x = part[-1]
    for _ in range(ROUNDS - 3):
        x = run_round(second, x, grad_fn_for(b)).params
    torch.testing.assert_close(x, whole[-1], rtol=0, atol=0)


def test_tff_round_arithmetic():
    """TensorFlow Federated's adaptive-clip example (``test_tree_adaptive_factory_estimate_clip``
    of differential_privacy_test.py: no noise, update norms 0.5, 1.5, 2.5, C = 1, η_C = 1): the
    first round averages 0.5, 1, 1 and a third of the updates is unclipped, so the norm becomes
    ``exp(−η_C (1/3 − γ))``: TFF's γ = 1 gives its published exp(2/3) ≈ 1.95; here γ = 0.5
    (γ must lie in (0, 1)), exp(1/6)."""
    b = torch.tensor([[-0.5], [-1.5], [-2.5]], dtype=DT)
    alg = DistributedDPSGD(1.0, operator=AdaptiveClip(1.0, 0.5, 1.0))
    alg.setup(num_clients=3, dim=1, num_rounds=2, dtype=DT)
    x = run_round(alg, torch.zeros(1, dtype=DT), grad_fn_for(b)).params
    assert float(x) == pytest.approx(-(0.5 + 1.0 + 1.0) / 3, rel=1e-15)
    assert float(alg.clip_norm) == pytest.approx(math.exp(1 / 6), rel=1e-15)


@pytest.mark.parametrize(
    "gamma, eta_c, published", [(0.5, 0.1, 3.0), (0.2, 0.2, 2.825293600752746)]
)
def test_pfl_geometric_update_figures(gamma, eta_c, published):
    """pfl's published values for the geometric update (apple/pfl-research,
    tests/privacy/test_adaptive_clipping.py at commit 238775c3b9e38bd959620320736437ad7d0b93d8,
    ``test_adaptive_clipping``: initial bound 3, half the updates unclipped, no count noise):
    target 0.5 with step 0.1 keeps 3, target 0.2 with step 0.2 gives 2.825293600752746
    (``3 exp(−0.2 (0.5 − 0.2))``). Here 4 clients, update norms 1, 2 (unclipped at 3) and 4, 5."""
    b = torch.tensor([[-1.0], [-2.0], [-4.0], [-5.0]], dtype=DT)
    alg = DistributedDPSGD(1.0, operator=AdaptiveClip(3.0, gamma, eta_c))
    alg.setup(num_clients=4, dim=1, num_rounds=2, dtype=DT)
    run_round(alg, torch.zeros(1, dtype=DT), grad_fn_for(b))
    assert float(alg.clip_norm) == pytest.approx(published, rel=1e-15)


def test_noise_split_is_tffs_and_composes_to_one_gaussian():
    """``z_Δ = (z^{-2} − (2σ_b)^{-2})^{-1/2}`` (the paper's noise split; TFF's ``adaptive_clip_noise_params``
    with its default σ_b = 0.05·m): the update at ``z_Δ`` and the count at ``2σ_b`` composed by
    dp-accounting's PLD accountant are the single Gaussian at ``z``."""
    z, m = 1.0, 100.0
    sigma_b = 0.05 * m
    z_delta = adaptive_noise_multiplier(z, sigma_b)
    assert z_delta == pytest.approx((1.0 - 1.0 / 100.0) ** -0.5, rel=1e-15)
    assert z_delta > z
    for rounds in (1, 20):
        two = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
        two.compose(dpa.GaussianDpEvent(z_delta), rounds)
        two.compose(dpa.GaussianDpEvent(2 * sigma_b), rounds)
        one = dpa.pld.PLDAccountant(value_discretization_interval=1e-3)
        one.compose(dpa.GaussianDpEvent(z), rounds)
        assert two.get_epsilon(1e-5) == pytest.approx(one.get_epsilon(1e-5), rel=2e-3)
    with pytest.raises(ValueError, match="count_stddev"):
        adaptive_noise_multiplier(2.0, 1.0)


def _ledger_epsilon(alg, noise, rounds):
    ledger = PrivacyLedger(alg.release(), noise, [alg.noise_std], rounds)
    for k in range(rounds):
        ledger.account(k)
    return ledger


def test_certified_epsilon_is_the_two_releases_composed():
    """Every client, central noise (whoever sees the models, add/remove, no amplification): the
    run's certified ε equals dp-accounting's composition of the two Gaussian releases of every
    round (the update at ``z_Δ = σ_Δ/C_t``, the count at ``σ_b/(1/2)``) and of the single
    Gaussian at ``z``; the run's update noise is ``z_Δ C_t``."""
    rounds, count_std = 5, 2.0
    noise = DPNoise(epsilon=4.0, delta=1e-5, calibration="target", placement="central", seed=SEED)
    clip = AdaptiveClip(0.6, 0.5, 0.2, count_stddev=count_std)
    alg = DistributedDPSGD(0.5, operator=clip, noise=noise)
    b, x0 = problem()
    run(alg, b, x0, rounds=rounds)
    z = alg.noise_std / 0.6
    z_delta = adaptive_noise_multiplier(z, count_std)
    assert alg.message_stage().noise_std == pytest.approx(z_delta * float(alg.clip_norm))
    ledger = _ledger_epsilon(alg, noise, rounds)
    assert ledger.mechanisms(0)[0].noise_multiplier == pytest.approx(z, rel=1e-12)
    certified = ledger.epsilon()
    assert certified == pytest.approx(4.0, abs=0.01)
    two = dpa.pld.PLDAccountant()
    two.compose(
        dpa.ComposedDpEvent([dpa.GaussianDpEvent(z_delta), dpa.GaussianDpEvent(2 * count_std)]),
        rounds,
    )
    one = dpa.pld.PLDAccountant()
    one.compose(dpa.GaussianDpEvent(z), rounds)
    assert certified == pytest.approx(two.get_epsilon(1e-5), rel=2e-3)
    assert certified == pytest.approx(one.get_epsilon(1e-5), rel=2e-3)


def test_certified_epsilon_with_a_secret_cohort():
    """A Poisson cohort at q = 0.5 (amplified against whoever sees the models): the joint
    release of the same cohort's update and count is one Poisson-subsampled Gaussian at ``z``,
    as dp-accounting composes it."""
    rounds, q = 4, 0.5
    noise = DPNoise(epsilon=3.0, delta=1e-5, calibration="target", placement="central", seed=SEED)
    clip = AdaptiveClip(0.6, 0.5, 0.2, count_stddev=3.0)
    alg = make("dp_fedavg", q, clip, noise, 0.5, 0.9)
    b, x0 = problem()
    run(alg, b, x0, rounds=rounds)
    z = alg.noise_std / 0.6
    ledger = _ledger_epsilon(alg, noise, rounds)
    independent = dpa.pld.PLDAccountant()
    independent.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), rounds)
    assert ledger.epsilon() == pytest.approx(independent.get_epsilon(1e-5), rel=2e-3)
    assert ledger.epsilon() == pytest.approx(3.0, abs=0.01)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"target_quantile": 0.0}, "target_quantile"),
        ({"target_quantile": 1.0}, "target_quantile"),
        ({"target_quantile": 1.5}, "target_quantile"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": -0.2}, "learning_rate"),
        ({"initial_norm": 0.0}, "initial_norm"),
        ({"initial_norm": -1.0}, "initial_norm"),
        ({"count_stddev": 0.0}, "count_stddev"),
    ],
)
def test_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AdaptiveClip(**kwargs)


def test_refusals_before_training():
    """Too little count noise for the run's z, and both a fixed and an adaptive clip."""
    noise = DPNoise(noise_multiplier=3.0, placement="central", seed=SEED)
    alg = DistributedDPSGD(0.5, operator=AdaptiveClip(1.0, count_stddev=1.0), noise=noise)
    with pytest.raises(ValueError, match="count_stddev"):
        alg.setup(num_clients=N, dim=D, num_rounds=3, dtype=DT)
    with pytest.raises(ValueError, match="clip_threshold"):
        FedAvgPerUpdateClipping(0.5, 0.5, clip_threshold=1.0, adaptive_clip=AdaptiveClip())


@pytest.mark.parametrize("placement", [BandedMFNoise(2), TreeNoise(4)])
def test_correlated_noise_is_refused_before_training(placement):
    """The noise split and the count's release assume independent noise every round: with a
    correlated placement the run is refused at setup, naming the placement."""
    noise = DPNoise(noise_multiplier=2.0, rounds=4, placement=placement, seed=SEED)
    alg = DPFedAvg(0.5, operator=AdaptiveClip(1.0), sampler=CyclicSampler(2), noise=noise)
    with pytest.raises(ValueError, match=r"noise\.placement=.*AdaptiveClip"):
        alg.setup(num_clients=8, dim=2, num_rounds=4, dtype=DT)
