"""Server optimizers (pl_privfed/algorithms/server_opt.py): exact iterates against plain loops.

Quadratic clients f_i(x) = ½||x − b_i||² (∇f_i(x) = x − b_i), float64. The references are
plain loops over clients and coordinates written from the papers (Reddi et al. 2021,
Algorithm 2; Hsu et al. 2019's server momentum; paper 002 Algorithm 1; paper 003 Algorithm 2;
paper 004 §3), sharing nothing with the package but the noise's keyed streams
(tests/_noise.py). Every algorithm family checked takes the optimizer at its server step, on
the pseudo-update Δ in Reddi et al.'s sign convention (the direction the model moves).
"""

import inspect
import json
import math
import re
from pathlib import Path

import pytest
import torch
from helpers.noise import noise_sum, server_noise
from helpers.training import short_fit

from pl_privfed.algorithms import (
    BEER,
    EF21,
    PORTER,
    AlphaNormEC,
    Clip21,
    DistributedDPSGD,
    DPFedAvg,
    ErrorFeedback,
    FedAdagrad,
    FedAdam,
    FedAlphaNormEC,
    FedAvgPerSampleClipping,
    FedAvgPerUpdateClipping,
    FedYogi,
    ServerMomentum,
    ServerSGD,
    SoteriaFL,
)
from pl_privfed.cli import main
from pl_privfed.engine import run_round
from pl_privfed.grid.points import rebuild_algorithm
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise, PrivacyLedger

DT = torch.float64
ROUNDS = 12
REPO = Path(__file__).resolve().parents[1]

#: (name, factory, reference optimizer's hyperparameters); every optimizer with non-default values
OPTIMIZERS = {
    "sgd": (lambda: ServerSGD(), {}),
    "momentum": (lambda: ServerMomentum(momentum=0.7), {"momentum": 0.7}),
    "adagrad": (lambda: FedAdagrad(beta1=0.6, tau=0.05), {"beta1": 0.6, "tau": 0.05}),
    "yogi": (
        lambda: FedYogi(beta1=0.8, beta2=0.9, tau=0.02),
        {"beta1": 0.8, "beta2": 0.9, "tau": 0.02},
    ),
    "adam": (
        lambda: FedAdam(beta1=0.5, beta2=0.8, tau=0.1),
        {"beta1": 0.5, "beta2": 0.8, "tau": 0.1},
    ),
}


def problem(n=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(n, d, generator=g, dtype=DT) * 3
    x0 = torch.randn(d, generator=g, dtype=DT)
    return b, x0


def grad_fn_for(b):
    def grad_fn(params, clients=None, **_):
        rows = b if clients is None else b[clients]
        return (params.unsqueeze(0) if params.dim() == 1 else params) - rows

    return grad_fn


def run(alg, b, x0, rounds=ROUNDS, chunk=None, setup=True):
    if setup:
        alg.setup(num_clients=b.shape[0], dim=b.shape[1], num_rounds=ROUNDS, dtype=DT)
    x, xs = x0.clone(), []
    for _ in range(rounds):
        x = run_round(alg, x, grad_fn_for(b), chunk_size=chunk).params
        xs.append(x.clone())
    return xs


# ---------------------------------------------------------------------------- plain references
def sign(a):
    return (a > 0) - (a < 0)


class RefOptimizer:
    """The server's step x + η u_t(Δ) written coordinate by coordinate (module docstring)."""

    def __init__(self, kind, d, momentum=0.0, beta1=0.0, beta2=0.0, tau=1.0):
        self.kind, self.mu, self.b1, self.b2, self.tau = kind, momentum, beta1, beta2, tau
        self.m = [0.0] * d  # m_{-1} = 0
        self.v = [tau * tau] * d  # v_{-1} = τ² (Reddi et al. Algorithm 2, line 1)

    def step(self, x, delta, eta):
        if self.kind == "sgd":
            return [x[j] + eta * delta[j] for j in range(len(x))]
        if self.kind == "momentum":  # FedAvgM: m = μ m + Δ, x + η m
            self.m = [self.mu * self.m[j] + delta[j] for j in range(len(x))]
            return [x[j] + eta * self.m[j] for j in range(len(x))]
        out = []
        for j in range(len(x)):
            self.m[j] = self.b1 * self.m[j] + (1 - self.b1) * delta[j]
            sq = delta[j] * delta[j]
            if self.kind == "adagrad":
                self.v[j] = self.v[j] + sq
            elif self.kind == "yogi":
                self.v[j] = self.v[j] - (1 - self.b2) * sq * sign(self.v[j] - sq)
            else:  # adam
                self.v[j] = self.b2 * self.v[j] + (1 - self.b2) * sq
            out.append(x[j] + eta * self.m[j] / (math.sqrt(self.v[j]) + self.tau))
        return out


def norm(v):
    return math.sqrt(sum(c * c for c in v))


def clip(v, c):
    nv = norm(v)
    return [a * min(1.0, c / nv) for a in v] if nv > 0 else list(v)


def smoothed(v, alpha):
    return [a / (alpha + norm(v)) for a in v]


def ref_dp_fedavg(b, x0, opt, eta, gamma, c, beta, std, seed):
    """Paper 004 §3, every client, one local step: Δ = −(1/n) Σ_i (β clip_c(γ∇f_i(x)) + z_i)."""
    n, d = b.shape
    b, x, out = b.tolist(), x0.tolist(), []
    for k in range(ROUNDS):
        total = [0.0] * d
        for i in range(n):
            sent = clip([gamma * (x[j] - b[i][j]) for j in range(d)], c)
            total = [total[j] + beta * sent[j] for j in range(d)]
        if std > 0:  # the clients' noises, drawn as their sum
            z = noise_sum(seed, k, n, d, std)
            total = [total[j] + z[j] for j in range(d)]
        x = opt.step(x, [-total[j] / n for j in range(d)], eta)
        out.append(torch.tensor(x, dtype=DT))
    return out


def ref_per_update(b, x0, opt, eta_g, eta_l, c):
    """Paper 003 Algorithm 2, one local step: Δ = (1/n) Σ_i clip_c(−η_l ∇f_i(x)) (line 14)."""
    n, d = b.shape
    b, x, out = b.tolist(), x0.tolist(), []
    for _ in range(ROUNDS):
        total = [0.0] * d
        for i in range(n):
            sent = clip([-eta_l * (x[j] - b[i][j]) for j in range(d)], c)
            total = [total[j] + sent[j] for j in range(d)]
        x = opt.step(x, [total[j] / n for j in range(d)], eta_g)
        out.append(torch.tensor(x, dtype=DT))
    return out


def ref_dpsgd_central(b, x0, opt, gamma, c, std, seed):
    """Paper 002 eq. (2) with a trusted aggregator's noise: Δ = −(Σ_i clip_c(∇f_i) + z)/n."""
    n, d = b.shape
    b, x, out = b.tolist(), x0.tolist(), []
    for k in range(ROUNDS):
        total = [0.0] * d
        for i in range(n):
            sent = clip([x[j] - b[i][j] for j in range(d)], c)
            total = [total[j] + sent[j] for j in range(d)]
        z = server_noise(seed, k, d, std)
        x = opt.step(x, [-(total[j] + z[j]) / n for j in range(d)], gamma)
        out.append(torch.tensor(x, dtype=DT))
    return out


def ref_alpha_normec(b, x0, opt, gamma, beta, alpha, sn, std, seed):
    """Paper 002 Algorithm 1 (memories from zero); the optimizer at line 11 on
    Δ = −ĝ/||ĝ|| (or −ĝ), line 10's ĝ as written."""
    n, d = b.shape
    b, x, out = b.tolist(), x0.tolist(), []
    g = [[0.0] * d for _ in range(n)]
    ghat = [0.0] * d
    for k in range(ROUNDS):
        total = [0.0] * d
        for i in range(n):
            delta = smoothed([x[j] - b[i][j] - g[i][j] for j in range(d)], alpha)
            g[i] = [g[i][j] + beta * delta[j] for j in range(d)]
            total = [total[j] + delta[j] for j in range(d)]
        if std > 0:
            z = noise_sum(seed, k, n, d, std)
            total = [total[j] + z[j] for j in range(d)]
        ghat = [ghat[j] + beta / n * total[j] for j in range(d)]
        ng = norm(ghat)
        direction = [a / ng for a in ghat] if sn else ghat
        x = opt.step(x, [-a for a in direction], gamma)
        out.append(torch.tensor(x, dtype=DT))
    return out


def ref_soteria(b, x0, opt, eta, gamma, c):
    """SoteriaFL-SGD without noise and with the identity compressor: v_i = clip_c(∇f_i) − s_i,
    Δ = −(s + v), then s ← s + γ v."""
    n, d = b.shape
    b, x, out = b.tolist(), x0.tolist(), []
    s_i = [[0.0] * d for _ in range(n)]
    s = [0.0] * d
    for _ in range(ROUNDS):
        total = [0.0] * d
        for i in range(n):
            v_i = [a - s_i[i][j] for j, a in enumerate(clip([x[j] - b[i][j] for j in range(d)], c))]
            s_i[i] = [s_i[i][j] + gamma * v_i[j] for j in range(d)]
            total = [total[j] + v_i[j] for j in range(d)]
        v = [a / n for a in total]
        x = opt.step(x, [-(s[j] + v[j]) for j in range(d)], eta)
        s = [s[j] + gamma * v[j] for j in range(d)]
        out.append(torch.tensor(x, dtype=DT))
    return out


def assert_iterates(xs, ref):
    assert len(xs) == len(ref) == ROUNDS
    for k, (a, r) in enumerate(zip(xs, ref)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11, msg=f"round {k}")


def ref_opt(name, d):
    return RefOptimizer(name, d, **OPTIMIZERS[name][1])


# ---------------------------------------------------------------------------- exact iterates
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("chunk", [1, "all"])
def test_dp_fedavg_exact(name, private, chunk):
    b, x0 = problem()
    noise = DPNoise(noise_multiplier=0.4, seed=5, draws="aggregate") if private else None
    alg = DPFedAvg(
        0.3,
        local_step_size=0.5,
        operator=Clip(1.5),
        scale=0.8,
        noise=noise,
        server_optimizer=OPTIMIZERS[name][0](),
    )
    xs = run(alg, b, x0, chunk=chunk)
    std = alg.noise_std  # multiplier × the replace-one sensitivity 2βc (local DP)
    assert std == (pytest.approx(0.4 * 2 * 0.8 * 1.5) if private else 0.0)
    ref = ref_dp_fedavg(b, x0, ref_opt(name, 4), 0.3, 0.5, 1.5, 0.8, std, 5)
    assert_iterates(xs, ref)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fedavg_per_update_clipping_exact(name):
    """Δ already points where the model moves (y_i − x): no sign flip."""
    b, x0 = problem(seed=1)
    alg = FedAvgPerUpdateClipping(
        0.7, local_step_size=0.4, clip_threshold=2.0, server_optimizer=OPTIMIZERS[name][0]()
    )
    xs = run(alg, b, x0)
    assert_iterates(xs, ref_per_update(b, x0, ref_opt(name, 4), 0.7, 0.4, 2.0))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_distributed_dpsgd_central_exact(name):
    b, x0 = problem(seed=2)
    noise = DPNoise(noise_multiplier=0.5, seed=3, placement="central")
    alg = DistributedDPSGD(0.2, Clip(1.0), noise=noise, server_optimizer=OPTIMIZERS[name][0]())
    xs = run(alg, b, x0)
    assert alg.noise_std == pytest.approx(0.5)  # central: sensitivity c = 1 of the sum
    assert_iterates(xs, ref_dpsgd_central(b, x0, ref_opt(name, 4), 0.2, 1.0, alg.noise_std, 3))


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("server_normalization", [True, False])
@pytest.mark.parametrize("chunk", [2, "all"])
def test_alpha_normec_exact(name, server_normalization, chunk):
    b, x0 = problem(seed=3)
    noise = DPNoise(noise_multiplier=0.3, seed=7, draws="aggregate")
    alg = AlphaNormEC(
        0.05,
        beta=0.4,
        alpha=0.5,
        server_normalization=server_normalization,
        noise=noise,
        server_optimizer=OPTIMIZERS[name][0](),
    )
    xs = run(alg, b, x0, chunk=chunk)
    assert alg.noise_std == pytest.approx(0.3 * 2)  # replace-one sensitivity 2 of Norm_α
    ref = ref_alpha_normec(
        b, x0, ref_opt(name, 4), 0.05, 0.4, 0.5, server_normalization, alg.noise_std, 7
    )
    assert_iterates(xs, ref)


@pytest.mark.parametrize("name", ["momentum", "adam"])
def test_fed_alpha_normec_with_p_one_equals_alpha_normec(name):
    """Paper 004 line 147: with p = 1, one local GD step and γ = 1 Fed-α-NormEC is α-NormEC;
    the server optimizer acts at the same place (line 12 / line 11) in both."""
    b, x0 = problem(seed=4)
    fed = FedAlphaNormEC(
        0.05, local_step_size=1.0, beta=0.4, alpha=0.5, server_optimizer=OPTIMIZERS[name][0]()
    )
    ref = ref_alpha_normec(b, x0, ref_opt(name, 4), 0.05, 0.4, 0.5, True, 0.0, 0)
    assert_iterates(run(fed, b, x0), ref)


@pytest.mark.parametrize("name", ["momentum", "yogi"])
def test_soteriafl_exact(name):
    b, x0 = problem(seed=5)
    alg = SoteriaFL(
        0.1, shift_step_size=0.5, clip_threshold=2.0, server_optimizer=OPTIMIZERS[name][0]()
    )
    assert_iterates(run(alg, b, x0), ref_soteria(b, x0, ref_opt(name, 4), 0.1, 0.5, 2.0))


# ---------------------------------------------------------------------------- the default
FAMILIES = {
    "dp_fedavg": lambda opt: DPFedAvg(
        0.3, operator=Clip(1.0), noise=DPNoise(noise_multiplier=0.5, seed=1), server_optimizer=opt
    ),
    "per_sample": lambda opt: FedAvgPerSampleClipping(
        0.2, clip_threshold=1.0, server_optimizer=opt
    ),
    "per_update": lambda opt: FedAvgPerUpdateClipping(0.5, 0.3, 1.0, server_optimizer=opt),
    "dpsgd": lambda opt: DistributedDPSGD(
        0.2, Clip(1.0), noise=DPNoise(noise_multiplier=0.5, seed=2), server_optimizer=opt
    ),
    "alpha_normec": lambda opt: AlphaNormEC(
        0.05, 0.4, 0.5, noise=DPNoise(noise_multiplier=0.3, seed=3), server_optimizer=opt
    ),
    "clip21": lambda opt: Clip21(0.1, 1.5, server_optimizer=opt),
    "ef21": lambda opt: EF21(0.2, server_optimizer=opt),
    "fed_alpha_normec": lambda opt: FedAlphaNormEC(
        0.05, 0.5, 0.4, 0.5, participation_prob=0.6, server_optimizer=opt
    ),
    "soteriafl": lambda opt: SoteriaFL(0.1, 0.5, server_optimizer=opt),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_server_sgd_is_the_default_bit_for_bit(family):
    """No server optimizer, an explicit ServerSGD and server momentum μ = 0 give the same
    iterates to the last bit (float32, as runs train)."""
    g = torch.Generator().manual_seed(11)
    b, x0 = torch.randn(6, 5, generator=g) * 3, torch.randn(5, generator=g)
    runs = []
    for opt in (None, ServerSGD(), ServerMomentum(momentum=0.0)):
        alg = FAMILIES[family](opt)
        alg.setup(num_clients=6, dim=5, num_rounds=ROUNDS)
        x, xs = x0.clone(), []
        for _ in range(ROUNDS):
            x = run_round(alg, x, grad_fn_for(b)).params
            xs.append(x)
        runs.append(torch.stack(xs))
    assert isinstance(FAMILIES[family](None).server_optimizer, ServerSGD)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


@pytest.mark.parametrize(
    "kind",
    [
        DPFedAvg,
        FedAvgPerSampleClipping,
        FedAvgPerUpdateClipping,
        DistributedDPSGD,
        ErrorFeedback,
        AlphaNormEC,
        Clip21,
        EF21,
        FedAlphaNormEC,
        SoteriaFL,
    ],
)
def test_every_server_based_algorithm_takes_one(kind):
    assert "server_optimizer" in inspect.signature(kind).parameters
    assert "server_optimizer:" in inspect.getdoc(kind)


@pytest.mark.parametrize("kind", [PORTER, BEER])
def test_decentralized_algorithms_take_none(kind):
    """PORTER and BEER have no server: no server optimizer."""
    assert "server_optimizer" not in inspect.signature(kind).parameters


# ---------------------------------------------------------------------------- state and resume
@pytest.mark.parametrize("name", ["momentum", "adagrad", "yogi", "adam"])
def test_state_is_buffers_and_resume_continues_exactly(name):
    """The optimizer's m, v are the algorithm's buffers: a state_dict taken after 5 rounds,
    loaded into a fresh algorithm, continues to the uninterrupted run's iterates exactly."""
    b, x0 = problem(seed=6)

    def make():
        noise = DPNoise(noise_multiplier=0.4, seed=9, draws="aggregate")
        return DPFedAvg(
            0.3, operator=Clip(1.0), noise=noise, server_optimizer=OPTIMIZERS[name][0]()
        )

    whole = run(make(), b, x0)
    first = make()
    head = run(first, b, x0, rounds=5)
    state = {k: v.clone() for k, v in first.state_dict().items()}
    keys = {k for k in state if k.startswith("server_optimizer.")}
    expected = {"momentum_buffer"} if name == "momentum" else {"first_moment", "second_moment"}
    assert keys == {f"server_optimizer.{k}" for k in expected}
    resumed = make()
    resumed.setup(num_clients=5, dim=4, num_rounds=ROUNDS, dtype=DT)
    resumed.load_state_dict(state)
    tail = run(resumed, b, head[-1], rounds=ROUNDS - 5, setup=False)
    assert all(torch.equal(a, c) for a, c in zip(head + tail, whole))


def test_a_grid_reaches_the_optimizer_arguments():
    """A grid configuration rebuilt with ``server_optimizer.tau`` gets its own optimizer."""
    base = DPFedAvg(0.1, server_optimizer=FedAdam(beta1=0.5, tau=0.01))
    other = rebuild_algorithm(base, {"server_optimizer.tau": 0.1, "step_size": 0.2})
    assert isinstance(other.server_optimizer, FedAdam)
    assert (other.server_optimizer.tau, other.server_optimizer.beta1, other.step_size) == (
        0.1,
        0.5,
        0.2,
    )
    assert base.server_optimizer.tau == 0.01 and other.server_optimizer is not base.server_optimizer


def test_adaptive_state_starts_at_tau_squared():
    opt = FedYogi(tau=0.25)
    opt.setup(3, "cpu", DT)
    assert torch.equal(opt.second_moment, torch.full((3,), 0.0625, dtype=DT))
    assert torch.equal(opt.first_moment, torch.zeros(3, dtype=DT))
    assert dict(ServerSGD().named_buffers()) == {}


def flower_step(kind, x, m, v, delta, eta, beta_1, beta_2, tau):
    """Flower's ``aggregate_fit`` server lines (adap/flower, flwr/server/strategy/fedadam.py at
    18638bc, fedyogi.py at 05c252a, fedadagrad.py at 187f825: the blocks under ``# m_t``, ``#
    v_t`` and ``new_weights``), transcribed on lists; ``x`` the current weights, ``delta`` the
    averaged update minus them."""
    sgn = [(a > 0) - (a < 0) for a in (vi - di * di for vi, di in zip(v, delta))]
    m = [beta_1 * mi + (1 - beta_1) * di for mi, di in zip(m, delta)]
    if kind == "adam":
        v = [beta_2 * vi + (1 - beta_2) * di * di for vi, di in zip(v, delta)]
    elif kind == "yogi":
        v = [vi - (1.0 - beta_2) * di * di * s for vi, di, s in zip(v, delta, sgn)]
    else:  # adagrad
        v = [vi + di * di for vi, di in zip(v, delta)]
    x = [xi + eta * mi / (math.sqrt(vi) + tau) for xi, mi, vi in zip(x, m, v)]
    return x, m, v


@pytest.mark.parametrize(
    "kind, make",
    [
        ("adam", lambda: FedAdam(beta1=0.5, beta2=0.8, tau=0.1)),
        ("yogi", lambda: FedYogi(beta1=0.8, beta2=0.9, tau=0.02)),
        ("adagrad", lambda: FedAdagrad(beta1=0.0, tau=0.05)),  # Flower's FedAdagrad: β₁ = 0
    ],
)
def test_update_lines_are_flowers_from_a_zero_second_moment(kind, make):
    """The maintained implementation of Reddi et al.'s arXiv v5 (Flower) starts ``v`` at 0;
    with ``v`` zeroed, every iterate equals Flower's lines (the paper's ``v_{−1} = τ²`` start
    is the only difference, test_adaptive_state_starts_at_tau_squared)."""
    opt = make()
    d = 5
    opt.setup(d, "cpu", DT)
    opt.second_moment.zero_()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(d, generator=g, dtype=DT)
    fx, fm, fv = x.tolist(), [0.0] * d, [0.0] * d
    beta_2 = getattr(opt, "beta2", 0.0)
    for k in range(10):
        delta = torch.randn(d, generator=g, dtype=DT) * (0.1 if k % 3 else 2.0)
        delta[k % d] = 0.0  # a zero coordinate: Yogi's sign(v − 0) and Adagrad's v + 0
        x = opt.step(x, delta, 0.7)
        fx, fm, fv = flower_step(kind, fx, fm, fv, delta.tolist(), 0.7, opt.beta1, beta_2, opt.tau)
        torch.testing.assert_close(x, torch.tensor(fx, dtype=DT), rtol=1e-13, atol=1e-14)
        torch.testing.assert_close(
            opt.second_moment, torch.tensor(fv, dtype=DT), rtol=1e-13, atol=0
        )


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: ServerMomentum(momentum=1.0), "momentum must be in [0, 1), got 1.0"),
        (lambda: ServerMomentum(momentum=-0.1), "momentum must be in [0, 1), got -0.1"),
        (lambda: ServerMomentum(momentum=True), "momentum must be a number in [0, 1), got True"),
        (lambda: FedAdam(beta1=1.5), "beta1 must be in [0, 1), got 1.5"),
        (lambda: FedAdam(beta2=float("nan")), "beta2 must be a number in [0, 1), got nan"),
        (lambda: FedYogi(beta2=1.0), "beta2 must be in [0, 1), got 1.0"),
        (lambda: FedAdagrad(tau=0.0), "tau must be a positive finite number, got 0.0"),
        (lambda: FedAdam(tau=-1e-3), "tau must be a positive finite number, got -0.001"),
        (
            lambda: DPFedAvg(0.1, server_optimizer="adam"),
            "server_optimizer must be a ServerOptimizer",
        ),
        (lambda: AlphaNormEC(0.1, 0.1, 0.1, server_optimizer=FedAdam), "server_optimizer must be"),
        (
            lambda: FedAvgPerSampleClipping(0.1, server_step_size=0.0),
            "server_step_size must be a positive finite number, got 0.0",
        ),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(factory, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        factory()


# ---------------------------------------------------------------------------- privacy
@pytest.mark.parametrize(
    "make",
    [
        lambda opt: DPFedAvg(
            0.3,
            operator=Clip(1.0),
            server_optimizer=opt,
            noise=DPNoise(epsilon=4.0, delta=1e-5, placement="central"),
        ),
        lambda opt: AlphaNormEC(
            0.05,
            0.4,
            0.5,
            server_optimizer=opt,
            noise=DPNoise(epsilon=8.0, delta=1e-5, placement="distributed", min_contributors=40),
        ),
        lambda opt: DistributedDPSGD(
            0.2, Clip(1.0), server_optimizer=opt, noise=DPNoise(noise_multiplier=1.1)
        ),
    ],
)
def test_privacy_is_unchanged_by_a_server_optimizer(make):
    """Post-processing: the declaration, the calibrated noise and every adversary's ε after the
    rounds run are the same with and without a server optimizer (whose iterates differ)."""
    g = torch.Generator().manual_seed(12)
    b, x0 = torch.randn(50, 4, generator=g) * 3, torch.randn(4, generator=g)
    reports, finals = [], []
    for opt in (None, FedAdam(), ServerMomentum(), FedYogi(), FedAdagrad()):
        alg = make(opt)
        alg.setup(num_clients=50, dim=4, num_rounds=20)
        ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 20)
        x = x0
        for k in range(20):
            result = run_round(alg, x, grad_fn_for(b))
            ledger.account(k, result.released)
            x = result.params
        reports.append((alg.release(), alg.noise_std, repr(ledger.report())))
        finals.append(x)
    assert all(r == reports[0] for r in reports[1:])
    assert all(not torch.equal(x, finals[0]) for x in finals[1:])


def test_cli_certifies_the_same_epsilon_with_and_without_fedadam(tmp_path, monkeypatch):
    """configs/algorithms/dp_fedadam.yaml (DP-FedAvg with FedAdam, central noise on the
    embedded digits) for 3 rounds through the command, and the same run with the plain server
    step: the same certified ε against every adversary, the same noise, other models."""
    monkeypatch.chdir(tmp_path)
    config = REPO / "configs/algorithms/dp_fedadam.yaml"
    summaries = []
    for extra in ([], ["--model.algorithm.init_args.server_optimizer", "null"]):
        out = tmp_path / ("plain" if extra else "fedadam")
        main(short_fit(config, out, 3, *extra))
        summaries.append(json.loads((out / "summary.json").read_text()))
    adam, plain = summaries
    assert adam["status"] == plain["status"] == "finished" and adam["private"]
    algorithm = adam["config"]["model"]["algorithm"]["init_args"]
    assert algorithm["server_optimizer"]["class_path"] == "pl_privfed.algorithms.FedAdam"
    assert plain["config"]["model"]["algorithm"]["init_args"]["server_optimizer"] is None
    assert adam["epsilon"] == plain["epsilon"] and 7.9 < adam["epsilon"] <= 8.0
    assert adam["privacy"] == plain["privacy"]
    assert adam["final_train_loss"] != plain["final_train_loss"]
