"""Exact iterates of the federated algorithms (papers 003 and 004) against plain-loop references.

Quadratic clients with several samples: client ``i`` holds ``b_{i,t,s}`` (local minibatch ``t``,
example ``s``), ``f_{i,t,s}(x) = ½||x − b_{i,t,s}||²``. The references are loops over clients,
local steps and coordinates written from the papers' pseudocode, sharing nothing with the package
but the definition of the random streams (tests/helpers/noise.py: the cohort of round ``k`` from the
stream ``(sampling seed, k)``, a client's noise from ``(noise seed, k, client, local step)``, or the
sum of the clients' noises drawn once per round). The comparisons run with chunks of one client,
two clients and all of them.
"""

import math

import pytest
import torch
from helpers.noise import client_noise, noise_sum
from helpers.privacy import mechanisms, paper_mechanisms, sensitivity

from pl_privfed.algorithms import (
    AlphaNormEC,
    DistributedDPSGD,
    DPFedAvg,
    FedAlphaNormEC,
    FedAvgPerSampleClipping,
    FedAvgPerUpdateClipping,
    IncrementalGradient,
    LocalGD,
    LocalSGD,
)
from pl_privfed.engine import run_round
from pl_privfed.operators import Clip, SmoothedNormalization
from pl_privfed.privacy import DPNoise, PrivacyAccountant
from pl_privfed.rng import STREAM_SAMPLING, keyed_generator
from pl_privfed.sampling import BernoulliSampler, FixedSizeSampler, PoissonSampler

DT = torch.float64
ROUNDS = 12


def data(n=5, t=3, b=2, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = (
        torch.randn(n, t, b, d, generator=g, dtype=DT) * 2
        + torch.randn(n, 1, 1, d, generator=g, dtype=DT) * 3
    )
    x0 = torch.randn(d, generator=g, dtype=DT)
    return centers, x0


def oracle(centers):
    """``grad_fn(params, per_example=False, step=None, clients=None)`` of the quadratic clients."""
    calls = []

    def grad_fn(params, per_example=False, step=None, clients=None):
        c = centers if clients is None else centers[clients]
        c = c.flatten(1, 2) if step is None else c[:, step]  # [m, B', d]
        p = params.unsqueeze(0) if params.dim() == 1 else params
        per = p.unsqueeze(1) - c
        calls.append((per_example, step, None if clients is None else clients.tolist()))
        return per if per_example else per.mean(1)

    grad_fn.calls = calls
    return grad_fn


CHUNKS = [1, 2, "all"]


def run(alg, centers, x0, rounds=ROUNDS, chunk=None, **data_kwargs):
    n = centers.shape[0]
    if data_kwargs:  # before setup, as FederatedModule does: the noise calibration reads it
        alg.configure_data(**data_kwargs)
    alg.setup(num_clients=n, dim=centers.shape[-1], num_rounds=rounds, dtype=DT)
    x, xs = x0.clone(), []
    for _ in range(rounds):
        x = run_round(alg, x, oracle(centers), chunk_size=chunk).params
        xs.append(x.clone())
    return xs


def assert_iterates(xs, ref, tol=1e-11):
    assert len(xs) == len(ref)
    for k, (a, r) in enumerate(zip(xs, ref)):
        torch.testing.assert_close(
            a, torch.tensor(r, dtype=DT), rtol=tol, atol=tol, msg=f"round {k}"
        )


# ---------------------------------------------------------------------------- plain references
def vnorm(v):
    return math.sqrt(sum(c * c for c in v))


def smoothed(v, alpha):
    s = alpha + vnorm(v)
    return [c / s for c in v] if s > 0 else [0.0] * len(v)


def clip(v, tau):
    if tau is None:
        return list(v)
    nv = vnorm(v)
    return [c * min(1.0, tau / nv) for c in v] if nv > 0 else list(v)


def local_grad(C, i, y, step):
    """∇ of client i's mean loss on local minibatch `step` (all its data when None)."""
    rows = [s for t in C[i] for s in t] if step is None else C[i][step]
    d = len(y)
    return [sum(y[j] - r[j] for r in rows) / len(rows) for j in range(d)]


def local_steps(C, i, x, lr, steps, minibatches, transform=None):
    """Plain local loop: returns (y, Σ g)."""
    y, gsum = list(x), [0.0] * len(x)
    for s in range(steps):
        g = local_grad(C, i, y, s if minibatches else None)
        if transform is not None:
            g = transform(g)
        gsum = [a + b for a, b in zip(gsum, g)]
        y = [a - lr * b for a, b in zip(y, g)]
    return y, gsum


def sampling(seed, k):
    """The round-``k`` cohort stream."""
    return keyed_generator(seed, STREAM_SAMPLING, k)


def add_noise(total, chosen, k, d, std, seed, draws):
    """``total + Σ_{i ∈ chosen} z_i``: each client's draw, or their sum drawn once."""
    if not std:
        return total
    if draws == "per_client":
        for i in chosen:
            total = [a + b for a, b in zip(total, client_noise(seed, k, i, d, std))]
        return total
    return [a + b for a, b in zip(total, noise_sum(seed, k, len(chosen), d, std))]


def ref_fed_normec(
    C,
    x0,
    *,
    eta,
    gamma,
    beta,
    alpha,
    steps,
    minibatches,
    p,
    practical,
    sn,
    rounds,
    std=0.0,
    noise_seed=0,
    sampling_seed=0,
    init="zeros",
    draws="aggregate",
):
    n, d = len(C), len(x0)
    x = list(x0)

    def pseudo(i):  # (x − T_i(x))/γ = (1/T) Σ_j ∇f_i(x_i^j)
        _, gsum = local_steps(C, i, x, gamma / steps, steps, minibatches)
        return [g / steps for g in gsum] if steps > 1 else gsum

    v = [pseudo(i) if init == "local_update" else [0.0] * d for i in range(n)]
    vhat = [sum(v[i][j] for i in range(n)) / n for j in range(d)]
    out = []
    for k in range(rounds):
        sampled = (
            torch.rand(n, generator=sampling(sampling_seed, k)).lt(p).tolist()
            if p < 1
            else [True] * n
        )
        online = [i for i in range(n) if sampled[i]] if practical else list(range(n))
        total = [0.0] * d
        for i in online:
            delta = smoothed([a - b for a, b in zip(pseudo(i), v[i])], alpha)  # line 5
            v[i] = [a + beta * b for a, b in zip(v[i], delta)]  # line 6
            if sampled[i]:
                total = [a + b for a, b in zip(total, delta)]
        chosen = [i for i in range(n) if sampled[i]]
        total = add_noise(total, chosen, k, d, std, noise_seed, draws)  # line 9: Δ_i + z_i
        q = 1.0 if practical else 1.0 / p  # line 7
        vhat = [vhat[j] + beta / n * (q * total[j]) for j in range(d)]  # line 11
        nv = vnorm(vhat)
        direction = ([c / nv for c in vhat] if nv > 0 else [0.0] * d) if sn else vhat
        x = [x[j] - eta * direction[j] for j in range(d)]  # line 12
        out.append(list(x))
    return out


def ref_sample(n, gen, kind, rate):
    """The cohort of a round from its stream ``gen``, and the server's denominator."""
    if kind is None:
        return list(range(n)), float(n)
    if kind == "fixed":
        perm = torch.randperm(n, generator=gen).tolist()
        chosen = sorted(perm[:rate])
        return chosen, float(rate)
    mask = torch.rand(n, generator=gen).lt(rate).tolist()
    chosen = [i for i in range(n) if mask[i]]
    return chosen, (max(len(chosen), 1) if kind == "bernoulli" else rate * n)


def ref_dp_fedavg(
    C,
    x0,
    *,
    eta,
    gamma,
    psi,
    scale,
    steps,
    minibatches,
    rounds,
    sampler=None,
    rate=None,
    std=0.0,
    noise_seed=0,
    sampling_seed=0,
    draws="aggregate",
):
    n, d = len(C), len(x0)
    x = list(x0)
    out = []
    for k in range(rounds):
        chosen, denom = ref_sample(n, sampling(sampling_seed, k), sampler, rate)
        if not chosen:
            out.append(list(x))
            continue
        total = [0.0] * d
        for i in chosen:
            _, gsum = local_steps(C, i, x, gamma / steps, steps, minibatches)
            update = [gamma / steps * g for g in gsum]  # x − T_i(x)
            msg = [scale * c for c in psi(update)]
            total = [a + b for a, b in zip(total, msg)]
        total = add_noise(total, chosen, k, d, std, noise_seed, draws)
        x = [x[j] - eta * total[j] / denom for j in range(d)]
        out.append(list(x))
    return out


def ref_per_sample(
    C,
    x0,
    *,
    eta,
    c,
    steps,
    minibatches,
    level,
    rounds,
    std=0.0,
    noise_seed=0,
    sampler=None,
    rate=None,
    sampling_seed=0,
):
    n, d = len(C), len(x0)
    x = list(x0)
    out = []
    for k in range(rounds):
        chosen, denom = ref_sample(n, sampling(sampling_seed, k), sampler, rate)
        ys = {i: list(x) for i in chosen}  # line 6
        for s in range(steps):  # line 7
            for i in chosen:
                y = ys[i]
                if level == "example":
                    rows = C[i][s] if minibatches else [r for t in C[i] for r in t]
                    clipped = [clip([y[j] - r[j] for j in range(d)], c) for r in rows]
                    g = [sum(cl[j] for cl in clipped) / len(rows) for j in range(d)]
                else:
                    g = clip(local_grad(C, i, y, s if minibatches else None), c)  # line 8
                if std:  # Corollary I: client i's fresh noise at local step s
                    z = client_noise(noise_seed, k, i, d, std, extra=s)
                    g = [g[j] + z[j] for j in range(d)]
                ys[i] = [y[j] - eta * g[j] for j in range(d)]  # line 9
        x = [x[j] + sum(ys[i][j] - x[j] for i in chosen) / denom for j in range(d)]  # line 13
        out.append(list(x))
    return out


def ref_per_update(
    C,
    x0,
    *,
    eta_l,
    eta_g,
    c,
    steps,
    minibatches,
    rounds,
    std=0.0,
    noise_seed=0,
    sampler=None,
    rate=None,
    sampling_seed=0,
    draws="aggregate",
):
    n, d = len(C), len(x0)
    x = list(x0)
    out = []
    for k in range(rounds):
        chosen, denom = ref_sample(n, sampling(sampling_seed, k), sampler, rate)
        total = [0.0] * d
        for i in chosen:
            y, _ = local_steps(C, i, x, eta_l, steps, minibatches)  # lines 6-9
            delta = clip([y[j] - x[j] for j in range(d)], c)  # lines 10-11
            total = [a + b for a, b in zip(total, delta)]
        total = add_noise(total, chosen, k, d, std, noise_seed, draws)  # Δ_i + z_i
        x = [x[j] + eta_g * total[j] / denom for j in range(d)]  # line 14
        out.append(list(x))
    return out


# ---------------------------------------------------------------------------- Fed-α-NormEC
@pytest.mark.parametrize("participation", ["as_written", "practical"])
@pytest.mark.parametrize("p", [1.0, 0.5])
@pytest.mark.parametrize("solver", ["gd1", "gd3", "sgd3"])
@pytest.mark.parametrize(
    "private, draws", [(False, None), (True, "aggregate"), (True, "per_client")]
)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_fed_alpha_normec_exact(participation, p, solver, private, draws, chunk):
    centers, x0 = data()
    steps = 1 if solver == "gd1" else 3
    local = LocalSGD(3) if solver == "sgd3" else LocalGD(steps)
    noise = DPNoise(noise_multiplier=0.3, seed=5, draws=draws) if private else None
    alg = FedAlphaNormEC(
        step_size=0.05,
        local_step_size=0.3,
        beta=0.4,
        alpha=0.5,
        local_solver=local,
        participation_prob=p,
        participation=participation,
        server_normalization=solver != "gd3",
        noise=noise,
        sampling_seed=9,
    )
    xs = run(alg, centers, x0, chunk=chunk)
    ref = ref_fed_normec(
        centers.tolist(),
        x0.tolist(),
        eta=0.05,
        gamma=0.3,
        beta=0.4,
        alpha=0.5,
        steps=steps,
        minibatches=solver == "sgd3",
        p=p,
        practical=participation == "practical",
        sn=solver != "gd3",
        rounds=ROUNDS,
        std=0.3 * 2 if private else 0.0,
        noise_seed=5,
        sampling_seed=9,
        draws=draws,
    )  # (replace-one sensitivity 2)
    assert_iterates(xs, ref)
    if private:  # the server sees who transmits: no amplification by p against it
        (mech,) = mechanisms(alg)
        assert mech.sample_rate == 1.0 and mech.noise_multiplier == pytest.approx(0.3)
        (paper,) = paper_mechanisms(alg)  # the papers': add/remove, Poisson at p
        assert paper.sample_rate == p and paper.noise_multiplier == pytest.approx(0.6)


def test_fed_alpha_normec_incremental_gradient_and_local_update_init():
    centers, x0 = data(t=4, b=1)  # N = 4 samples per client, one per local step
    alg = FedAlphaNormEC(
        0.1,
        0.2,
        beta=0.3,
        alpha=0.2,
        local_solver=IncrementalGradient(4),
        memory_init="local_update",
        server_normalization=False,
    )
    xs = run(alg, centers, x0, batch_size=1, local_batches=4, shuffle=False, client_sizes=[4] * 5)
    ref = ref_fed_normec(
        centers.tolist(),
        x0.tolist(),
        eta=0.1,
        gamma=0.2,
        beta=0.3,
        alpha=0.2,
        steps=4,
        minibatches=True,
        p=1.0,
        practical=False,
        sn=False,
        rounds=ROUNDS,
        init="local_update",
    )
    assert_iterates(xs, ref)


@pytest.mark.parametrize("server_normalization", [True, False])
@pytest.mark.parametrize("init", [("zeros", "zeros"), ("local_update", "gradient")])
@pytest.mark.parametrize("private", [False, True])
def test_fed_alpha_normec_recovers_alpha_normec(server_normalization, init, private):
    """p = 1, one local step: Algorithm 1 is α-NormEC (paper 004 line 147), bit for bit."""
    centers, x0 = data(t=1)
    noise = (lambda: DPNoise(noise_multiplier=0.7, seed=3)) if private else (lambda: None)
    fed = FedAlphaNormEC(
        0.05,
        local_step_size=0.123,
        beta=0.4,
        alpha=0.5,
        memory_init=init[0],
        server_normalization=server_normalization,
        noise=noise(),
    )
    base = AlphaNormEC(
        0.05,
        beta=0.4,
        alpha=0.5,
        memory_init=init[1],
        server_normalization=server_normalization,
        noise=noise(),
    )
    for a, b in zip(run(fed, centers, x0, rounds=30), run(base, centers, x0, rounds=30)):
        assert torch.equal(a, b)


def test_fed_alpha_normec_paper_noise_and_messages():
    centers, x0 = data()
    alg = FedAlphaNormEC(
        0.05,
        0.1,
        beta=0.01,
        alpha=0.01,
        participation_prob=0.25,
        noise=DPNoise(epsilon=8.0, delta=1e-5, rounds=300),
    )
    alg.setup(num_clients=5, dim=3, num_rounds=300, dtype=DT)
    # σ = p sqrt(K log(1/δ))/ε; the server's β makes it the paper's p β sqrt(K log(1/δ))/ε
    assert alg.noise_std == pytest.approx(0.25 * math.sqrt(300 * math.log(1e5)) / 8.0)
    sent = [run_round(alg, x0, oracle(centers)).messages[0].rows for _ in range(200)]
    assert min(sent) == 0 and max(sent) >= 3  # Bernoulli(p) senders: 0 to 5 per round
    assert sum(sent) / 200 == pytest.approx(0.25 * 5, abs=0.25)


# ---------------------------------------------------------------------------- DP-FedAvg
@pytest.mark.parametrize(
    "sampler, rate", [(None, None), ("fixed", 3), ("bernoulli", 0.5), ("poisson", 0.5)]
)
@pytest.mark.parametrize("op", ["clip", "norm"])
@pytest.mark.parametrize(
    "private, draws", [(False, None), (True, "aggregate"), (True, "per_client")]
)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_dp_fedavg_exact(sampler, rate, op, private, draws, chunk):
    centers, x0 = data(seed=2)
    operator = Clip(0.7) if op == "clip" else SmoothedNormalization(0.01)
    psi = (lambda v: clip(v, 0.7)) if op == "clip" else (lambda v: smoothed(v, 0.01))
    samplers = {
        None: None,
        "fixed": lambda: FixedSizeSampler(3),
        "bernoulli": lambda: BernoulliSampler(0.5),
        "poisson": lambda: PoissonSampler(0.5),
    }
    noise = DPNoise(noise_multiplier=0.2, seed=4, draws=draws) if private else None
    alg = DPFedAvg(
        0.3,
        local_step_size=0.2,
        operator=operator,
        scale=2.0,
        local_solver=LocalGD(2),
        sampler=samplers[sampler] and samplers[sampler](),
        noise=noise,
        sampling_seed=6,
    )
    xs = run(alg, centers, x0, chunk=chunk)
    bound = 2.0 * (0.7 if op == "clip" else 1.0)
    ref = ref_dp_fedavg(
        centers.tolist(),
        x0.tolist(),
        eta=0.3,
        gamma=0.2,
        psi=psi,
        scale=2.0,
        steps=2,
        minibatches=False,
        rounds=ROUNDS,
        sampler=sampler,
        rate=rate,
        std=0.2 * 2 * bound if private else 0.0,
        noise_seed=4,
        sampling_seed=6,
        draws=draws,
    )
    assert_iterates(xs, ref)
    if private:
        (mech,) = mechanisms(alg)
        assert mech.sample_rate == 1.0  # the server sees the cohort
        (paper,) = paper_mechanisms(alg)
        assert paper.sample_rate == {None: 1.0, "fixed": 0.6}.get(sampler, 0.5)


def test_dp_fedavg_without_clipping_one_step_is_distributed_gd():
    centers, x0 = data(t=1, seed=3)
    fedavg = run(DPFedAvg(0.5, local_step_size=0.4), centers, x0)
    gd = run(DistributedDPSGD(0.5 * 0.4), centers, x0)
    for a, b in zip(fedavg, gd):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_dp_fedavg_appendix_d1_baseline():
    """Ψ = Norm_α, one local step, η = γ, p = 1 (paper 004 line 324) with its β."""
    centers, x0 = data(t=1, seed=4)
    alg = DPFedAvg(0.1, local_step_size=0.1, operator=SmoothedNormalization(0.01), scale=0.01)
    xs = run(alg, centers, x0)
    ref = ref_dp_fedavg(
        centers.tolist(),
        x0.tolist(),
        eta=0.1,
        gamma=0.1,
        psi=lambda v: smoothed(v, 0.01),
        scale=0.01,
        steps=1,
        minibatches=False,
        rounds=ROUNDS,
    )
    assert_iterates(xs, ref)


# ---------------------------------------------------------------------------- paper 003
@pytest.mark.parametrize("level", ["minibatch", "example"])
@pytest.mark.parametrize("c", [0.5, None])
@pytest.mark.parametrize("solver", ["gd", "sgd"])
@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_per_sample_clipping_exact(level, c, solver, private, chunk):
    centers, x0 = data(seed=5)
    local = LocalSGD(3) if solver == "sgd" else LocalGD(3)
    noise = DPNoise(noise_multiplier=0.1, seed=8) if private and c else None
    alg = FedAvgPerSampleClipping(
        0.2, clip_threshold=c, local_solver=local, clip_level=level, noise=noise
    )
    xs = run(
        alg,
        centers,
        x0,
        chunk=chunk,
        batch_size=2,
        local_batches=3,
        shuffle=True,
        client_sizes=[6] * 5,
    )
    batch = 2 if solver == "sgd" else 6  # examples per local step: a minibatch, or all of them
    # replace-one: 2c/B per example; the clipped minibatch mean can flip sign: 2c
    sens = 2 * (c or 0) / batch if level == "example" else 2 * (c or 0)
    ref = ref_per_sample(
        centers.tolist(),
        x0.tolist(),
        eta=0.2,
        c=c,
        steps=3,
        minibatches=solver == "sgd",
        level=level,
        rounds=ROUNDS,
        std=0.1 * sens if noise else 0.0,
        noise_seed=8,
    )
    assert_iterates(xs, ref)


def test_per_sample_clipping_with_sampler_and_accounting():
    centers, x0 = data(seed=6)
    alg = FedAvgPerSampleClipping(
        0.2,
        clip_threshold=0.5,
        local_solver=LocalSGD(3),
        clip_level="example",
        sampler=FixedSizeSampler(2),
        noise=DPNoise(noise_multiplier=1.0, seed=1),
        sampling_seed=2,
    )
    xs = run(alg, centers, x0, batch_size=2, local_batches=3, shuffle=True, client_sizes=[6] * 5)
    ref = ref_per_sample(
        centers.tolist(),
        x0.tolist(),
        eta=0.2,
        c=0.5,
        steps=3,
        minibatches=True,
        level="example",
        rounds=ROUNDS,
        std=0.5,
        noise_seed=1,
        sampler="fixed",
        rate=2,
        sampling_seed=2,
    )
    assert_iterates(xs, ref)  # std = 1 × 2c/B
    # the 3 steps walk all 6 examples of a shard: every example used once a round, unamplified
    (mech,) = mechanisms(alg)
    assert mech.sample_rate == 1.0 and mech.noise_multiplier == pytest.approx(1.0)
    paper = paper_mechanisms(alg)  # one release per local step, at rate (2/5)·(2/6)
    assert len(paper) == 3 and paper[0].sample_rate == pytest.approx(0.4 * 2 / 6)
    assert paper[0].noise_multiplier == pytest.approx(2.0)  # add/remove: c/B


def test_per_sample_paper_calibration_counts_local_steps():
    alg = FedAvgPerSampleClipping(
        0.1, clip_threshold=2.0, local_solver=LocalGD(4), noise=DPNoise(epsilon=4.0, delta=1e-5)
    )
    alg.setup(num_clients=3, dim=2, num_rounds=50, dtype=DT)
    # paper 003 line 196 with batch size 1 = N (record rate 1): σ = c sqrt(Rτ log(1/δ))/ε
    assert alg.noise_std == pytest.approx(2.0 * math.sqrt(200 * math.log(1e5)) / 4.0)


def test_per_sample_accounting_follows_how_local_steps_use_the_data():
    """The papers' convention: fresh minibatches, τ releases at rate B/N; a reused batch (local
    GD), one release of τ Gaussians (multiplier/√τ); a fixed order (IG), one release at rate 1.
    The defensible accounting counts an example's uses in the stream of per-epoch permutations
    (one per 40 positions here), without amplification by the shuffling."""
    noise = DPNoise(noise_multiplier=2.0)

    def configured(solver, level="example", **data_kwargs):
        alg = FedAvgPerSampleClipping(
            0.1, clip_threshold=1.0, local_solver=solver, clip_level=level, noise=noise
        )
        alg.configure_data(**data_kwargs)
        alg.setup(num_clients=4, dim=2, num_rounds=10, dtype=DT)
        return alg, paper_mechanisms(alg)

    alg, mechs = configured(
        LocalSGD(5), batch_size=2, local_batches=5, shuffle=True, client_sizes=[40] * 4
    )
    assert len(mechs) == 5 and mechs[0].sample_rate == pytest.approx(2 / 40)
    assert alg.noise_std == pytest.approx(2.0 * 2 * 1.0 / 2)  # multiplier × 2c/B (replace-one)
    assert mechs[0].noise_multiplier == pytest.approx(4.0)  # add/remove: c/B
    # 10 positions a round of 40: an example is used in rounds 0, 4, 8, ... at most
    uses = [len(mechanisms(alg, k)) for k in range(9)]
    assert uses == [1, 0, 0, 0, 1, 0, 0, 0, 1]
    assert mechanisms(alg, 0)[0].noise_multiplier == pytest.approx(2.0)
    alg, mechs = configured(
        LocalGD(4), batch_size=8, local_batches=1, shuffle=True, client_sizes=[40] * 4
    )
    assert len(mechs) == 1 and mechs[0].sample_rate == pytest.approx(8 / 40)
    assert mechs[0].noise_multiplier == pytest.approx(4.0 / 2)  # 4/√4
    assert mechanisms(alg, 0)[0].noise_multiplier == pytest.approx(2.0 / 2)  # replace-one: 2/√4
    alg, mechs = configured(
        IncrementalGradient(10),
        batch_size=1,
        local_batches=10,
        shuffle=False,
        client_sizes=[10] * 4,
    )
    assert len(mechs) == 1 and mechs[0].sample_rate == 1.0
    assert mechs[0].noise_multiplier == pytest.approx(4.0)  # each example used once a round
    assert [len(mechanisms(alg, k)) for k in range(3)] == [1, 1, 1]
    alg, mechs = configured(
        LocalGD(3),
        level="minibatch",
        batch_size=8,
        local_batches=1,
        shuffle=True,
        client_sizes=[40] * 4,
    )
    assert sensitivity(alg) == 2.0  # the clipped mean flips: 2c
    assert mechs[0].noise_multiplier == pytest.approx(2.0 / math.sqrt(3))
    assert mechanisms(alg, 0)[0].noise_multiplier == pytest.approx(2.0 / math.sqrt(3))


@pytest.mark.parametrize("solver", ["sgd", "gd", "ig"])
def test_per_sample_target_calibration_certifies_the_target(solver):
    """With calibration: target the accountant, fed the run's mechanisms, certifies ε."""
    local, data_kwargs = {
        "sgd": (LocalSGD(3), dict(batch_size=2, local_batches=3, shuffle=True)),
        "gd": (LocalGD(3), dict(batch_size=6, local_batches=1, shuffle=True)),
        "ig": (IncrementalGradient(20), dict(batch_size=1, local_batches=20, shuffle=False)),
    }[solver]
    alg = FedAvgPerSampleClipping(
        0.1,
        clip_threshold=1.0,
        local_solver=local,
        clip_level="example",
        noise=DPNoise(epsilon=2.0, delta=1e-5, calibration="target"),
    )
    alg.configure_data(client_sizes=[20] * 3, **data_kwargs)
    alg.setup(num_clients=3, dim=2, num_rounds=30, dtype=DT)
    accountant = PrivacyAccountant()  # the run's: auto (PLD), RDP's bound beside it
    for k in range(30):
        for mech in mechanisms(alg, k):
            accountant.step_mechanism(mech)
    assert 2.0 - 0.011 < accountant.get_epsilon(1e-5) <= 2.0
    assert accountant.get_epsilon_rdp(1e-5) > 2.0


def test_per_example_clipping_bounds_each_example():
    """Replacing one example changes a client's step by at most η · 2c/B, whatever it is: the
    server's average of n clients' steps moves by at most η · 2c/(B n)."""
    centers, x0 = data(n=3, t=1, b=4, seed=7)
    c, eta = 0.3, 0.5
    out = []
    for scale in (1.0, 1e6):
        moved = centers.clone()
        moved[1, 0, 2] *= scale  # client 1's example 2: an outlier
        alg = FedAvgPerSampleClipping(eta, clip_threshold=c, clip_level="example")
        alg.setup(num_clients=3, dim=3, num_rounds=1, dtype=DT)
        grad_fn = oracle(moved)
        per_example = grad_fn(x0, per_example=True)
        clipped = Clip(c)(per_example)
        assert (torch.linalg.vector_norm(clipped, dim=-1) <= c * (1 + 1e-12)).all()
        out.append(run_round(alg, x0, grad_fn, chunk_size=1).params)
    change = torch.linalg.vector_norm(out[0] - out[1])
    assert 0 < change <= eta * 2 * c / 4 / 3 * (1 + 1e-12)


@pytest.mark.parametrize("sampler, rate", [(None, None), ("fixed", 2), ("poisson", 0.6)])
@pytest.mark.parametrize("c", [0.4, None])
@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_per_update_clipping_exact(sampler, rate, c, private, chunk):
    centers, x0 = data(seed=8)
    samplers = {
        None: None,
        "fixed": lambda: FixedSizeSampler(2),
        "poisson": lambda: PoissonSampler(0.6),
    }
    noise = DPNoise(noise_multiplier=0.5, seed=2) if private and c else None
    alg = FedAvgPerUpdateClipping(
        1.5,
        local_step_size=0.1,
        clip_threshold=c,
        local_solver=LocalSGD(3),
        sampler=samplers[sampler] and samplers[sampler](),
        noise=noise,
        sampling_seed=3,
    )
    xs = run(alg, centers, x0, chunk=chunk)
    ref = ref_per_update(
        centers.tolist(),
        x0.tolist(),
        eta_l=0.1,
        eta_g=1.5,
        c=c,
        steps=3,
        minibatches=True,
        rounds=ROUNDS,
        std=0.5 * 2 * c if noise else 0.0,
        noise_seed=2,
        sampler=sampler,
        rate=rate,
        sampling_seed=3,
    )
    assert_iterates(xs, ref)


def test_only_participants_compute():
    centers, x0 = data(seed=9)
    alg = FedAvgPerUpdateClipping(
        1.0, 0.1, 0.5, local_solver=LocalGD(2), sampler=FixedSizeSampler(2)
    )
    alg.setup(num_clients=5, dim=3, num_rounds=1, dtype=DT)
    grad_fn = oracle(centers)
    result = run_round(alg, x0, grad_fn)
    # 2 local steps × the 2 sampled clients (in chunks of any size), never the other 3
    assert sum(len(c) for _, _, c in grad_fn.calls) == 4
    assert len({int(i) for _, _, c in grad_fn.calls for i in c}) == 2
    assert result.messages[0].rows == 2 and result.messages[0].dim == 3
    assert result.messages[1].copies == 2


# ---------------------------------------------------------------------------- validation, state
@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: FedAlphaNormEC(0.1, 0.1, 0.1, 0.01, participation_prob=0.0), "participation_prob"),
        (lambda: FedAlphaNormEC(0.1, 0.1, 0.1, 0.01, participation="some"), "participation"),
        (lambda: FedAlphaNormEC(0.1, -1.0, 0.1, 0.01), "local_step_size"),
        (lambda: FedAlphaNormEC(0.1, 0.1, 0.1, 0.01, memory_init="gradient"), "memory_init"),
        (lambda: DPFedAvg(0.1, 0.1, scale=0.0), "scale"),
        (lambda: FedAvgPerSampleClipping(0.1, clip_level="batch"), "clip_level"),
        (lambda: FedAvgPerUpdateClipping(0.1, 0.1, clip_threshold=-1.0), "threshold"),
        (lambda: FedAvgPerUpdateClipping(0.1, 0.1, local_solver=3), "local_solver"),
        (lambda: LocalGD(0), "steps"),
        (lambda: BernoulliSampler(1.5), "probability"),
        (lambda: FixedSizeSampler(0), "cohort_size"),
        (
            lambda: DPFedAvg(0.1, 0.1, noise=DPNoise(noise_multiplier=1.0)).setup(
                num_clients=2, dim=2, num_rounds=1
            ),
            "bounded",
        ),
        (
            lambda: DPFedAvg(0.1, 0.1, sampler=FixedSizeSampler(3)).setup(
                num_clients=2, dim=2, num_rounds=1
            ),
            "cohort_size=3",
        ),
        (
            lambda: LocalSGD(3).check_data(
                batch_size=2, local_batches=1, shuffle=True, client_sizes=[4]
            ),
            "local_batches",
        ),
        (
            lambda: IncrementalGradient(4).check_data(
                batch_size=1, local_batches=4, shuffle=True, client_sizes=[4]
            ),
            "shuffle",
        ),
        (
            lambda: IncrementalGradient(4).check_data(
                batch_size=1, local_batches=4, shuffle=False, client_sizes=[4, 5]
            ),
            "num_samples",
        ),
    ],
)
def test_validation(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_memories_are_checkpointed_and_streams_need_no_state():
    """The memories are buffers; the noise and sampling streams are keyed by the round
    (``rounds_done``, also a buffer), so a restored state continues exactly."""
    centers, x0 = data(seed=10)

    def make():
        alg = FedAlphaNormEC(
            0.05,
            0.1,
            0.3,
            0.1,
            participation_prob=0.5,
            noise=DPNoise(noise_multiplier=0.5, seed=1),
            sampling_seed=4,
        )
        alg.setup(num_clients=5, dim=3, num_rounds=10, dtype=DT)
        return alg

    a = make()
    x = x0
    for _ in range(3):
        x = run_round(a, x, oracle(centers)).params
    state = a.state_dict()
    b = make()
    b.load_state_dict(state)
    xa, xb = x, x
    for _ in range(3):
        xa = run_round(a, xa, oracle(centers)).params
        xb = run_round(b, xb, oracle(centers)).params
    assert torch.equal(xa, xb)
