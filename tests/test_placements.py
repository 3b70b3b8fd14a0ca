"""Noise placements (``DPNoise.placement``): local, central and distributed noise.

* Exact iterates (float64) of every server-based algorithm that takes central or distributed
  noise, against plain-loop references written from the placements' definitions: central — the
  clients send clean messages, the trusted aggregator adds one ``N(0, σ² I)`` to their sum from
  its own stream ``(seed, STREAM_CENTRAL_NOISE, k)``; distributed — every sender adds a share
  ``N(0, σ²/t · I)`` (``draws: per_client``: from its own stream; ``aggregate``: their sum drawn
  once from ``(seed, STREAM_SERVER_NOISE, k)``), and a round with fewer than ``t`` senders is
  aborted (the server receives zeros). The references share nothing with the package but those
  keyed streams (tests/helpers/noise.py) and the cohort stream ``(sampling seed, STREAM_SAMPLING, k)``.
* Aborted rounds through a FederatedModule run and its ledger.
* Empirical sensitivity of the noised sum on neighbouring datasets.
* Refusals, per-adversary accounting against dp-accounting, calibration, the ledger's checkpoint.

Quadratic clients: client ``i`` holds ``b_{i,t,s}`` (local minibatch ``t``, example ``s``),
``f_{i,t,s}(x) = ½||x − b_{i,t,s}||²``.
"""

import math
from collections import namedtuple

import dp_accounting
import pytest
import pytorch_lightning as pl
import torch
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from helpers.noise import server_noise, share_noise, share_noise_sum

from pl_privfed import FederatedModule
from pl_privfed.algorithms import (
    AlphaNormEC,
    Clip21,
    DistributedDPSGD,
    DPFedAvg,
    FedAlphaNormEC,
    FedAvgPerSampleClipping,
    FedAvgPerUpdateClipping,
    LocalGD,
    LocalSGD,
    SoteriaFL,
)
from pl_privfed.datamodules import QuadraticDataModule
from pl_privfed.engine import ClientChunk, MessageStage, run_round
from pl_privfed.models import HalfSquaredError, QuadraticModel
from pl_privfed.operators import Clip
from pl_privfed.privacy import DistributedNoise, DPNoise, PrivacyLedger, paper_noise_std, plan
from pl_privfed.rng import STREAM_SAMPLING, keyed_generator
from pl_privfed.sampling import BernoulliSampler, FixedSizeSampler, PoissonSampler

DT = torch.float64
ROUNDS = 4
N = 5
CHUNKS = [1, "all"]
ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE


def data(n=N, t=3, b=2, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = (
        torch.randn(n, t, b, d, generator=g, dtype=DT) * 2
        + torch.randn(n, 1, 1, d, generator=g, dtype=DT) * 3
    )
    x0 = torch.randn(d, generator=g, dtype=DT)
    return centers, x0


def oracle(centers):
    """``grad_fn(params, per_example=False, step=None, clients=None)`` of the quadratic clients."""

    def grad_fn(params, per_example=False, step=None, clients=None):
        c = centers if clients is None else centers[clients]
        c = c.flatten(1, 2) if step is None else c[:, step]  # [m, B', d]
        p = params.unsqueeze(0) if params.dim() == 1 else params
        per = p.unsqueeze(1) - c
        return per if per_example else per.mean(1)

    return grad_fn


def run(alg, centers, x0, rounds=ROUNDS, chunk=None):
    """The iterates and the metrics of ``rounds`` rounds of ``alg`` (float64)."""
    alg.setup(num_clients=centers.shape[0], dim=centers.shape[-1], num_rounds=rounds, dtype=DT)
    x, xs, metrics = x0.clone(), [], []
    for _ in range(rounds):
        result = run_round(alg, x, oracle(centers), chunk_size=chunk)
        x = result.params
        xs.append(x.clone())
        metrics.append(result.metrics)
    return xs, metrics


def aborting(t):
    """Distributed noise with ``t`` that runs even where rounds may abort (``allow_aborts``):
    the tests of the abort mechanics, and of accounting on cohorts small enough to abort, which
    the abort refusal would otherwise stop before training."""
    return DistributedNoise(t, allow_aborts=True)


def ledger_of(alg, rounds):
    """A run's ledger for ``alg`` (set up) with ``rounds`` released rounds accounted."""
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], rounds)
    for k in range(rounds):
        ledger.account(k)
    return ledger


def rdp_golden(relation, event, count, delta=1e-5, orders=None):
    acc = RdpAccountant(orders=orders, neighboring_relation=relation)
    acc.compose(dp_accounting.SelfComposedDpEvent(event, count))
    return acc.get_epsilon(delta)


def pld_golden(event, count, delta=1e-5):
    """dp-accounting's PLD accountant (the ε of ``accountant: auto``), for an event whose noise
    multiplier is per the relation's sensitivity already (so a sensitivity-1 add/remove event)."""
    acc = PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4)
    acc.compose(dp_accounting.SelfComposedDpEvent(event, count))
    return acc.get_epsilon(delta)


# ---------------------------------------------------------------------------- plain references
#: a reference's noise: placement, σ (of the sum), t, draws, seed
Noise = namedtuple("Noise", "placement std t draws seed")


def vnorm(v):
    return math.sqrt(sum(c * c for c in v))


def clip(v, tau):
    nv = vnorm(v)
    return [c * min(1.0, tau / nv) for c in v] if nv > 0 else list(v)


def smoothed(v, alpha):
    s = alpha + vnorm(v)
    return [c / s for c in v] if s > 0 else [0.0] * len(v)


def add(a, b):
    return [p + q for p, q in zip(a, b, strict=True)]


def local_grad(C, i, y, step):
    """∇ of client i's mean loss on local minibatch ``step`` (all its data when None)."""
    rows = [s for t in C[i] for s in t] if step is None else C[i][step]
    return [sum(y[j] - r[j] for r in rows) / len(rows) for j in range(len(y))]


def local_steps(C, i, x, lr, steps, minibatches):
    """Plain local (S)GD from ``x``: ``(y, Σ_j g_j)``."""
    y, gsum = list(x), [0.0] * len(x)
    for s in range(steps):
        g = local_grad(C, i, y, s if minibatches else None)
        gsum = add(gsum, g)
        y = [a - lr * b for a, b in zip(y, g)]
    return y, gsum


def cohort(n, seed, k, kind, rate):
    """Round ``k``'s cohort from the stream ``(seed, STREAM_SAMPLING, k)`` and the server's
    denominator: Poisson at ``rate`` (fixed denominator ``rate·n``), a fixed-size cohort of
    ``rate`` clients, or everyone."""
    gen = keyed_generator(seed, STREAM_SAMPLING, k)
    if kind == "fixed":
        return sorted(torch.randperm(n, generator=gen).tolist()[:rate]), float(rate)
    if kind == "poisson":
        mask = torch.rand(n, generator=gen).lt(rate).tolist()
        return [i for i in range(n) if mask[i]], rate * n
    return list(range(n)), float(n)


def receive(total, senders, k, noise):
    """What the server receives of ``total = Σ_{i ∈ senders} Δ_i`` in round ``k``, and whether
    the round was aborted."""
    d = len(total)
    if noise.placement == "central":  # the aggregator's one draw on the sum, whoever sent
        return add(total, server_noise(noise.seed, k, d, noise.std)), False
    assert noise.placement == "distributed"
    if len(senders) < noise.t:  # too few shares: nothing is released
        return [0.0] * d, True
    if noise.draws == "per_client":
        for i in senders:
            total = add(total, share_noise(noise.seed, k, i, d, noise.std, noise.t))
        return total, False
    return add(total, share_noise_sum(noise.seed, k, len(senders), d, noise.std, noise.t)), False


def ref_dpsgd(C, x0, noise, *, tau, scale, gamma):
    n, d = len(C), len(x0)
    x, out = list(x0), []
    for k in range(ROUNDS):
        total = [0.0] * d
        for i in range(n):
            total = add(total, [scale * c for c in clip(local_grad(C, i, x, None), tau)])
        total, aborted = receive(total, list(range(n)), k, noise)
        x = [x[j] - gamma * total[j] / n for j in range(d)]
        out.append((x, aborted))
    return out


def ref_error_feedback(C, x0, noise, *, psi, beta, gamma, sn):
    """EF21 with zero memories: the client's g_i takes the clean Δ_i, the server's ĝ the sum
    it receives."""
    n, d = len(C), len(x0)
    x, out = list(x0), []
    g = [[0.0] * d for _ in range(n)]
    ghat = [0.0] * d
    for k in range(ROUNDS):
        total = [0.0] * d
        for i in range(n):
            delta = psi([a - b for a, b in zip(local_grad(C, i, x, None), g[i])])
            g[i] = [a + beta * b for a, b in zip(g[i], delta)]  # clean
            total = add(total, delta)
        total, aborted = receive(total, list(range(n)), k, noise)
        ghat = [ghat[j] + beta / n * total[j] for j in range(d)]  # noised
        ng = vnorm(ghat)
        step = ([c / ng for c in ghat] if ng > 0 else [0.0] * d) if sn else ghat
        x = [x[j] - gamma * step[j] for j in range(d)]
        out.append((x, aborted))
    return out


def ref_fed_normec(C, x0, noise, *, eta, gamma, beta, alpha, steps, p, sampling_seed):
    """Fed-α-NormEC as written (every client computes and updates v_i, the sampled ones
    transmit, the server weighs the sum by 1/p), with server normalization."""
    n, d = len(C), len(x0)
    x, out = list(x0), []
    v = [[0.0] * d for _ in range(n)]
    vhat = [0.0] * d
    for k in range(ROUNDS):
        chosen, _ = cohort(n, sampling_seed, k, "poisson", p)
        total = [0.0] * d
        for i in range(n):
            _, gsum = local_steps(C, i, x, gamma / steps, steps, False)
            pseudo = [c / steps for c in gsum]
            delta = smoothed([a - b for a, b in zip(pseudo, v[i])], alpha)  # line 5
            v[i] = [a + beta * b for a, b in zip(v[i], delta)]  # line 6, clean
            if i in chosen:
                total = add(total, delta)
        total, aborted = receive(total, chosen, k, noise)
        vhat = [vhat[j] + beta / n * total[j] / p for j in range(d)]  # line 11
        nv = vnorm(vhat)
        x = [x[j] - eta * (vhat[j] / nv if nv > 0 else 0.0) for j in range(d)]
        out.append((x, aborted))
    return out


def ref_dp_fedavg(C, x0, noise, *, eta, gamma, tau, scale, steps, sampler, rate, sampling_seed):
    n, d = len(C), len(x0)
    x, out = list(x0), []
    for k in range(ROUNDS):
        chosen, denom = cohort(n, sampling_seed, k, sampler, rate)
        total = [0.0] * d
        for i in chosen:
            _, gsum = local_steps(C, i, x, gamma / steps, steps, False)
            update = [gamma / steps * c for c in gsum]  # x − T_i(x)
            total = add(total, [scale * c for c in clip(update, tau)])
        total, aborted = receive(total, chosen, k, noise)
        x = [x[j] - eta * total[j] / denom for j in range(d)]
        out.append((x, aborted))
    return out


def ref_per_update(C, x0, noise, *, eta_l, eta_g, c, steps, sampler, rate, sampling_seed):
    n, d = len(C), len(x0)
    x, out = list(x0), []
    for k in range(ROUNDS):
        chosen, denom = cohort(n, sampling_seed, k, sampler, rate)
        total = [0.0] * d
        for i in chosen:
            y, _ = local_steps(C, i, x, eta_l, steps, True)
            total = add(total, clip([y[j] - x[j] for j in range(d)], c))
        total, aborted = receive(total, chosen, k, noise)
        x = [x[j] + eta_g * total[j] / denom for j in range(d)]
        out.append((x, aborted))
    return out


# ---------------------------------------------------------------------------- exact iterates
Z = 0.3  # the noise multiplier of every exact run
SEED = 7  # the noise seed

#: name -> (algorithm factory taking the noise, t, Φ, relation factor of the headline for
#: central noise, the reference, rounds aborted under distributed noise)
#: Distributed noise's headline is the server (replace-one: σ = z·2Φ); central noise's the
#: models (add/remove: σ = z·Φ; a fixed-size cohort: replace-one, σ = z·2Φ).
CASES = {
    "dpsgd_clip": (
        lambda noise: DistributedDPSGD(0.1, Clip(0.6), scale=2.0, noise=noise),
        3,
        1.2,
        1,
        lambda C, x0, nz: ref_dpsgd(C, x0, nz, tau=0.6, scale=2.0, gamma=0.1),
        [],
    ),
    "clip21": (
        lambda noise: Clip21(0.1, clip_threshold=0.8, noise=noise),
        4,
        0.8,
        1,
        lambda C, x0, nz: ref_error_feedback(
            C, x0, nz, psi=lambda v: clip(v, 0.8), beta=1.0, gamma=0.1, sn=False
        ),
        [],
    ),
    "alpha_normec": (
        lambda noise: AlphaNormEC(0.05, beta=0.4, alpha=0.5, noise=noise),
        4,
        1.0,
        1,
        lambda C, x0, nz: ref_error_feedback(
            C, x0, nz, psi=lambda v: smoothed(v, 0.5), beta=0.4, gamma=0.05, sn=True
        ),
        [],
    ),
    "fed_alpha_normec_p05": (
        lambda noise: FedAlphaNormEC(
            0.05,
            local_step_size=0.3,
            beta=0.4,
            alpha=0.5,
            local_solver=LocalGD(2),
            participation_prob=0.5,
            noise=noise,
            sampling_seed=3,
        ),
        2,
        1.0,
        1,
        lambda C, x0, nz: ref_fed_normec(
            C, x0, nz, eta=0.05, gamma=0.3, beta=0.4, alpha=0.5, steps=2, p=0.5, sampling_seed=3
        ),
        [1, 2],  # cohorts of 3, 1, 1, 4 clients
    ),
    "dp_fedavg_poisson": (
        lambda noise: DPFedAvg(
            0.3,
            local_step_size=0.2,
            operator=Clip(0.7),
            scale=2.0,
            local_solver=LocalGD(2),
            sampler=PoissonSampler(0.4),
            noise=noise,
            sampling_seed=0,
        ),
        2,
        1.4,
        1,
        lambda C, x0, nz: ref_dp_fedavg(
            C,
            x0,
            nz,
            eta=0.3,
            gamma=0.2,
            tau=0.7,
            scale=2.0,
            steps=2,
            sampler="poisson",
            rate=0.4,
            sampling_seed=0,
        ),
        [1, 2],  # cohorts of 2, 1, 0, 2 clients (central noise still noises round 2's sum)
    ),
    "dp_fedavg_fixed": (
        lambda noise: DPFedAvg(
            0.3,
            local_step_size=0.2,
            operator=Clip(0.7),
            scale=2.0,
            local_solver=LocalGD(2),
            sampler=FixedSizeSampler(3),
            noise=noise,
            sampling_seed=1,
        ),
        3,
        1.4,
        2,
        lambda C, x0, nz: ref_dp_fedavg(
            C,
            x0,
            nz,
            eta=0.3,
            gamma=0.2,
            tau=0.7,
            scale=2.0,
            steps=2,
            sampler="fixed",
            rate=3,
            sampling_seed=1,
        ),
        [],
    ),
    "per_update_poisson": (
        lambda noise: FedAvgPerUpdateClipping(
            1.5,
            local_step_size=0.1,
            clip_threshold=0.4,
            local_solver=LocalSGD(3),
            sampler=PoissonSampler(0.5),
            noise=noise,
            sampling_seed=3,
        ),
        2,
        0.4,
        1,
        lambda C, x0, nz: ref_per_update(
            C,
            x0,
            nz,
            eta_l=0.1,
            eta_g=1.5,
            c=0.4,
            steps=3,
            sampler="poisson",
            rate=0.5,
            sampling_seed=3,
        ),
        [1, 2],
    ),
}


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize(
    "placement, draws",
    [
        ("central", "aggregate"),
        ("central", "per_client"),  # draws never matter to the aggregator's one draw
        ("distributed", "aggregate"),
        ("distributed", "per_client"),
    ],
)
@pytest.mark.parametrize("name", list(CASES))
def test_exact_iterates_under_central_and_distributed_noise(name, placement, draws, chunk):
    make, t, bound, central_factor, reference, aborted_rounds = CASES[name]
    distributed = placement == "distributed"
    where = aborting(t) if distributed and aborted_rounds else placement
    noise = DPNoise(
        noise_multiplier=Z,
        seed=SEED,
        draws=draws,
        placement=where,
        min_contributors=t if distributed else None,
    )
    alg = make(noise)
    centers, x0 = data(seed=11)
    xs, metrics = run(alg, centers, x0, chunk=chunk)
    std = Z * bound * (2 if distributed else central_factor)
    assert alg.noise_std == pytest.approx(std, rel=1e-12)
    ref = reference(centers.tolist(), x0.tolist(), Noise(placement, std, t, draws, SEED))
    assert len(xs) == len(ref) == ROUNDS
    for k, (x, (r, _)) in enumerate(zip(xs, ref)):
        torch.testing.assert_close(
            x, torch.tensor(r, dtype=DT), rtol=1e-11, atol=1e-11, msg=f"round {k}"
        )
    aborted = [k for k, (_, a) in enumerate(ref) if a]
    assert aborted == (aborted_rounds if distributed else [])
    assert [k for k, m in enumerate(metrics) if "aborted" in m] == aborted
    assert all(float(metrics[k]["aborted"]) == 1.0 for k in aborted)
    stage = alg.message_stage()
    assert stage.placement.name == placement and stage.noise_std == pytest.approx(std)
    assert stage.client_noise_std == pytest.approx(std / math.sqrt(t) if distributed else 0.0)


def test_central_noise_is_not_the_clients_noise_sum():
    """The aggregator's draw and the clients' noise sum come from two streams: a central run
    and a local run at the same σ differ, and the central run does not depend on ``draws``."""
    centers, x0 = data(seed=11)

    def final(placement, draws="aggregate"):  # σ = Φ for both (add/remove)
        noise = DPNoise(
            noise_multiplier=1.0,
            seed=SEED,
            placement=placement,
            draws=draws,
            neighbouring="add_remove",
        )
        xs, _ = run(DistributedDPSGD(0.1, Clip(0.6), noise=noise), centers, x0, rounds=1)
        return xs[-1]

    central = final("central")
    assert torch.equal(central, final("central", "per_client"))
    local = final("local")
    assert not torch.allclose(central, local)
    # local draws Σ_i z_i ~ N(0, n σ²) from the clients' noise-sum stream; central N(0, σ²)
    # from its own: both relative to the noiseless step, the ratio is not √n
    clean, _ = run(DistributedDPSGD(0.1, Clip(0.6)), centers, x0, rounds=1)
    a, b = central - clean[-1], local - clean[-1]
    assert not torch.allclose(b, a * math.sqrt(N))


# ---------------------------------------------------------------------------- aborted rounds
def poisson_counts(n, q, seed, rounds):
    return [
        int(torch.rand(n, generator=keyed_generator(seed, STREAM_SAMPLING, k)).lt(q).sum())
        for k in range(rounds)
    ]


def test_distributed_round_with_too_few_senders_releases_nothing():
    """DP-FedAvg, Poisson cohort at q = 0.4 of 5 clients, t = 2: rounds 1 and 2 (cohorts of
    1 and 0) are aborted: the server receives zeros and the model does not move."""
    assert poisson_counts(N, 0.4, 0, ROUNDS) == [2, 1, 0, 2]
    centers, x0 = data(seed=11)
    noise = DPNoise(noise_multiplier=0.5, placement=aborting(2), seed=1)
    alg = DPFedAvg(0.3, 0.2, operator=Clip(0.7), sampler=PoissonSampler(0.4), noise=noise)
    xs, metrics = run(alg, centers, x0)
    before = [x0, *xs[:-1]]
    for k in (1, 2):
        assert float(metrics[k]["aborted"]) == 1.0
        assert float(metrics[k]["aggregate_norm"]) == 0.0  # zeros received
        assert torch.equal(xs[k], before[k])
        assert "noise_to_signal" not in metrics[k]
    for k in (0, 3):
        assert "aborted" not in metrics[k]
        assert float(metrics[k]["aggregate_norm"]) > 0 and not torch.allclose(xs[k], before[k])


def test_aborted_rounds_are_counted_and_compose_nothing(tmp_path):
    """Through a FederatedModule run (``allow_aborts``: without it this run is refused): the
    ledger counts the aborted rounds in rounds_aborted and every adversary's accountant
    composes only the rounds that released something; the report, the privacy statement line
    and a warning say that the abort pattern is NOT charged, with the run's probability of an
    abort (against scipy)."""
    from scipy.stats import binom

    from pl_privfed.callbacks.summary import epsilon_line, privacy_plan_line

    n, q, t, rounds, z = 6, 0.3, 2, 12, 0.8
    counts = poisson_counts(n, q, 5, rounds)
    aborted = sum(c < t for c in counts)
    assert 0 < aborted < rounds  # the stream has both kinds of round
    centers = [[1.0, 0.0], [0.0, 1.0], [-1.0, 0.5], [0.3, -0.2], [2.0, 2.0], [-0.5, -1.5]]
    noise = DPNoise(noise_multiplier=z, placement=aborting(t), seed=2)
    alg = DPFedAvg(
        0.3, 0.2, operator=Clip(0.5), sampler=PoissonSampler(q), noise=noise, sampling_seed=5
    )
    module = FederatedModule(QuadraticModel(2, [0.0, 0.0]), alg, criterion=HalfSquaredError())
    trainer = pl.Trainer(
        max_steps=rounds,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    with pytest.warns(UserWarning, match="NOT CHARGED: the abort pattern"):
        trainer.fit(module, datamodule=QuadraticDataModule(centers=centers))
    ledger = module.privacy_ledger
    assert ledger.rounds_aborted == aborted and ledger.rounds_accounted == rounds
    assert set(ledger.accountants) == {"server", "models"}
    for accountant in ledger.accountants.values():
        assert accountant.steps == rounds - aborted
    report = module.privacy_report()
    assert report["rounds_aborted"] == aborted and report["rounds_accounted"] == rounds
    assert report["placement"] == "distributed" and report["min_contributors"] == t
    assert "t=2" in report["trusted"]
    for entry in report["adversaries"].values():
        assert entry["releases"] == rounds - aborted
    # the server: σ/2Φ = z per released round, replace-one, no amplification
    golden = rdp_golden(REPLACE, dp_accounting.GaussianDpEvent(z), rounds - aborted)
    assert report["epsilon_rdp"] == pytest.approx(golden, rel=1e-6)
    pld = pld_golden(dp_accounting.GaussianDpEvent(z), rounds - aborted)
    assert report["epsilon"] == pytest.approx(pld, rel=1e-6)
    assert report["adversary"] == "server"
    per_round = binom.cdf(t - 1, n, q)
    any_round = 1 - (1 - per_round) ** rounds
    assert (
        f"probability {per_round:.3g}, at least one of K={rounds} with probability "
        f"{any_round:.3g}" in report["not_charged"]
    )
    assert "whoever sees the models does not count it and is NOT certified" in report["not_charged"]
    assert "; NOT CHARGED: the abort pattern" in privacy_plan_line(report)
    result = {"epsilon": report["epsilon"], "delta": report["delta"], "privacy": report}
    assert "; NOT certified against whoever sees the models" in epsilon_line(result)
    assert "NOT" not in epsilon_line({**result, "privacy": {**report, "not_charged": None}})


# ---------------------------------------------------------------------------- sensitivities
def _noiseless_step(alg, centers, x0, monkeypatch):
    """One round of ``alg`` with every Gaussian draw replaced by zeros."""
    monkeypatch.setattr(
        MessageStage, "noise_of_sum", lambda self, count, k, keyed, like: torch.zeros_like(like)
    )
    monkeypatch.setattr(
        ClientChunk,
        "normal",
        lambda self, seed, std, extra=0, select=None: torch.zeros(
            self.size if select is None else int(select.sum()), self.ctx.dim, dtype=DT
        ),
    )
    alg.setup(num_clients=centers.shape[0], dim=centers.shape[-1], num_rounds=5, dtype=DT)
    return run_round(alg, x0, oracle(centers), chunk_size=1).params


@pytest.mark.parametrize("placement", ["central", "distributed"])
@pytest.mark.parametrize("sampler", ["poisson", "fixed"])
def test_one_client_moves_the_noised_sum_by_at_most_the_sensitivity(
    placement, sampler, monkeypatch
):
    """DP-FedAvg (Φ = β·τ = 1.4): removing one client's message (its data at x, Ψ(0) = 0) moves
    the noiseless sum by Φ, the add/remove sensitivity, and the average by Φ/B for the fixed
    denominator B (q·N for a Poisson cohort, whoever took part); replacing it by its opposite
    by nearly 2Φ, the replace-one sensitivity (that of a fixed-size cohort's models and of the
    server)."""
    n, d, eta, phi = 6, 3, 0.5, 1.4
    make_sampler = {"poisson": lambda: PoissonSampler(0.5), "fixed": lambda: FixedSizeSampler(4)}
    denominator = {"poisson": 0.5 * n, "fixed": 4.0}[sampler]
    chosen, _ = cohort(n, 5, 0, sampler, 0.5 if sampler == "poisson" else 4)
    assert len(chosen) >= 3  # released with one client's message gone (t = 2)
    j = chosen[0]
    centers = torch.ones(n, 1, 1, d, dtype=DT)
    centers[j] = torch.tensor([1e3, -2e3, 5e2], dtype=DT)  # far outside the clip
    removed, replaced = centers.clone(), centers.clone()
    removed[j] = 0.0  # x − T_j(x) = 0 at x = 0: its message is zero
    replaced[j] = -centers[j]
    x0 = torch.zeros(d, dtype=DT)

    def step(c):
        where = aborting(2) if placement == "distributed" and sampler == "poisson" else placement
        noise = DPNoise(
            noise_multiplier=1.0,
            placement=where,
            seed=3,
            min_contributors=2 if placement == "distributed" else None,
        )
        alg = DPFedAvg(
            eta,
            1.0,
            operator=Clip(0.7),
            scale=2.0,
            sampler=make_sampler[sampler](),
            noise=noise,
            sampling_seed=5,
        )
        return alg, _noiseless_step(alg, c, x0, monkeypatch)

    alg, x = step(centers)
    release = alg.release()
    moved_sum = float(torch.linalg.vector_norm(x - step(removed)[1])) * denominator / eta
    assert moved_sum == pytest.approx(phi, rel=1e-9)
    assert moved_sum <= plan.sensitivity(release, "add_remove") * (1 + 1e-12)
    average = float(torch.linalg.vector_norm(x - step(removed)[1])) / eta
    assert average == pytest.approx(phi / denominator, rel=1e-9)
    swapped = float(torch.linalg.vector_norm(x - step(replaced)[1])) * denominator / eta
    assert 0.99 * 2 * phi < swapped <= plan.sensitivity(release, "replace_one") * (1 + 1e-12)
    # the sensitivities the accounting is given: the models' relation follows the cohort
    models = plan.relation(release, alg.noise, "models")
    assert models == ("add_remove" if sampler == "poisson" else "replace_one")
    assert plan.sensitivity(release, models) == pytest.approx(
        phi * (1 if models == "add_remove" else 2)
    )
    if placement == "distributed":
        assert plan.relation(release, alg.noise, "server") == "replace_one"
        assert plan.sensitivity(release, "replace_one") == pytest.approx(2 * phi)


# ---------------------------------------------------------------------------- refusals
def _setup(alg, n=5):
    alg.setup(num_clients=n, dim=3, num_rounds=5, dtype=DT)


def _central(**kwargs):
    return DPNoise(noise_multiplier=1.0, placement="central", **kwargs)


def _distributed(t, allow_aborts=False, **kwargs):
    where = aborting(t) if allow_aborts else "distributed"
    return DPNoise(noise_multiplier=1.0, placement=where, min_contributors=t, **kwargs)


def _per_sample(noise):
    alg = FedAvgPerSampleClipping(0.1, clip_threshold=1.0, clip_level="example", noise=noise)
    alg.configure_data(batch_size=2, local_batches=1, shuffle=True, client_sizes=[10] * 5)
    _setup(alg)


@pytest.mark.parametrize(
    "factory, message",
    [
        (
            lambda: _setup(
                DPFedAvg(0.1, 0.1, Clip(1.0), sampler=BernoulliSampler(0.5), noise=_central())
            ),
            r"noise\.placement='central' needs a fixed denominator",
        ),
        (
            lambda: _setup(
                DPFedAvg(0.1, 0.1, Clip(1.0), sampler=BernoulliSampler(0.5), noise=_distributed(1))
            ),
            r"noise\.placement='distributed' needs a fixed denominator",
        ),
        (lambda: _per_sample(_central()), r"noise\.placement='central'.*record-level"),
        (lambda: _per_sample(_distributed(2)), r"noise\.placement='distributed'.*record-level"),
        (
            lambda: _setup(
                SoteriaFL(
                    0.1,
                    0.5,
                    clip_threshold=1.0,
                    batch_size=2,
                    local_dataset_size=40,
                    noise=_central(),
                )
            ),
            r"noise\.placement='central'.*record-level",
        ),
        (
            lambda: DPNoise(noise_multiplier=1.0, placement="distributed"),
            r"placement='distributed' needs min_contributors",
        ),
        (
            lambda: DPNoise(noise_multiplier=1.0, min_contributors=3),
            r"min_contributors=3 is for placement='distributed'",
        ),
        (
            lambda: DPNoise(noise_multiplier=1.0, placement="central", min_contributors=3),
            r"min_contributors=3 is for placement='distributed'",
        ),
        (lambda: _distributed(0), "min_contributors must be a positive integer"),
        (lambda: _distributed(True), "min_contributors must be a positive integer"),
        (lambda: DPNoise(noise_multiplier=1.0, placement="server"), "placement must be"),
        (
            lambda: _setup(
                DPFedAvg(0.1, 0.1, Clip(1.0), sampler=FixedSizeSampler(3), noise=_distributed(4))
            ),
            "min_contributors=4 is more than the 3 clients of every round's cohort",
        ),
        (
            lambda: _setup(DistributedDPSGD(0.1, Clip(1.0), noise=_distributed(6))),
            "min_contributors=6 is more than the 5 clients",
        ),
        (
            lambda: _setup(
                DPFedAvg(0.1, 0.1, Clip(1.0), sampler=PoissonSampler(0.5), noise=(_distributed(7)))
            ),
            "min_contributors=7 is more than the 5 clients",
        ),
        (
            lambda: _setup(
                DPFedAvg(
                    0.1,
                    0.1,
                    Clip(1.0),
                    sampler=PoissonSampler(0.5),
                    noise=_central(neighbouring="replace_one"),
                )
            ),
            r"noise\.neighbouring='replace_one'.*Poisson",
        ),
        (
            lambda: _setup(
                DPFedAvg(
                    0.1,
                    0.1,
                    Clip(1.0),
                    sampler=FixedSizeSampler(2),
                    noise=_central(neighbouring="add_remove"),
                )
            ),
            r"noise\.neighbouring='add_remove'.*fixed-size",
        ),
    ],
)
def test_placements_that_do_not_hold_are_refused(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_placements_that_hold_are_accepted():
    """The refusals are specific: the same algorithms set up with the placements that hold."""
    _setup(
        DPFedAvg(
            0.1,
            0.1,
            Clip(1.0),
            sampler=BernoulliSampler(0.5),
            noise=(DPNoise(noise_multiplier=1.0)),
        )
    )  # (local noise: a realized cohort is fine)
    _setup(DPFedAvg(0.1, 0.1, Clip(1.0), sampler=FixedSizeSampler(3), noise=_distributed(3)))
    _setup(DistributedDPSGD(0.1, Clip(1.0), noise=_distributed(5)))
    _setup(
        DPFedAvg(
            0.1,
            0.1,
            Clip(1.0),
            sampler=PoissonSampler(0.5),
            noise=_central(neighbouring="add_remove"),
        )
    )
    _setup(
        DPFedAvg(
            0.1,
            0.1,
            Clip(1.0),
            sampler=PoissonSampler(0.5),
            noise=_distributed(2, True, neighbouring="replace_one"),
        )
    )
    _per_sample(DPNoise(noise_multiplier=1.0))


# ---------------------------------------------------------------------------- accounting
def _dp_fedavg(noise, sampler, n):
    alg = DPFedAvg(0.1, 0.1, operator=Clip(0.5), scale=2.0, sampler=sampler, noise=noise)
    alg.setup(num_clients=n, dim=3, num_rounds=50, dtype=DT)
    return alg


def test_central_poisson_models_epsilon_is_dp_accountings_rdp_and_pld():
    """Central DP-FedAvg with a Poisson cohort at q and noise multiplier z: against whoever
    sees the models, K Poisson-subsampled Gaussians (add/remove, sensitivity Φ = 1 of the sum).
    The ledger's RDP ε (Opacus) is dp-accounting's RDP ε (at integer orders, an upper bound
    Opacus's finer order grid may only improve on: within 1 % here); with ``accountant: prv``
    (Opacus PRV) it is dp-accounting's PLD ε within 1 % (two discretizations of the same privacy
    loss distribution; observed 0.2 %), and the RDP ε is above the PLD ε by less than 15 % (RDP's
    conversion to (ε, δ) is looser; observed 11 %)."""
    q, z, K, n = 0.2, 1.5, 50, 20
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    alg = _dp_fedavg(DPNoise(noise_multiplier=z, placement="central"), PoissonSampler(q), n)
    assert alg.noise_std == pytest.approx(z * 1.0)  # add/remove: σ = z · Φ
    ledger = ledger_of(alg, K)
    assert ledger.adversaries == ["models"] and ledger.headline == "models"
    (mech,) = ledger.mechanisms(0)
    assert mech.noise_multiplier == pytest.approx(z)
    assert (mech.sample_rate, mech.sampling) == (q, "poisson")
    golden = rdp_golden(ADD_REMOVE, event, K, orders=list(range(2, 257)))
    eps = ledger.accountant.get_epsilon_rdp(1e-5)  # the RDP bound beside the PLD ε
    assert golden * 0.99 < eps <= golden * (1 + 1e-9)
    pld = PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4)
    pld.compose(event, K)
    pld_eps = pld.get_epsilon(1e-5)
    # accountant: auto is dp-accounting's PLD itself
    assert ledger.epsilon() == pytest.approx(pld_eps, rel=1e-6)
    assert ledger.epsilon() == ledger.epsilon(adversary="models")
    noise = DPNoise(noise_multiplier=z, placement="central", accountant="prv")
    prv = ledger_of(_dp_fedavg(noise, PoissonSampler(q), n), K)
    assert prv.epsilon() == pytest.approx(pld_eps, rel=0.01)
    assert pld_eps < eps < 1.15 * pld_eps
    report = ledger.report()
    assert report["adversary"] == "models" and list(report["adversaries"]) == ["models"]
    assert report["placement"] == "central" and "aggregator" in report["trusted"]
    assert report["not_charged"] is None  # the ε covers everything the run releases
    models = report["adversaries"]["models"]
    assert models["neighbouring_relation"] == "add_remove" and models["sensitivity"] == 1.0
    assert models["sample_rate"] == q and models["sampling"] == "poisson"
    assert models["releases"] == K and "Poisson" in models["amplification"]


def test_local_and_distributed_server_epsilon_is_unamplified_replace_one():
    """Local DP-FedAvg with a Poisson cohort: the server sees who sends, so its ε is K
    unamplified Gaussians at σ/2Φ (replace-one); distributed noise at the same σ gives the
    server the same ε (it sees the sum, whose noise is σ), and both give the models the Poisson-
    amplified ε at σ/Φ (add/remove)."""
    q, z, K, n = 0.2, 0.9, 50, 20
    local = _dp_fedavg(DPNoise(noise_multiplier=z), PoissonSampler(q), n)
    dist = _dp_fedavg(DPNoise(noise_multiplier=z, placement=aborting(3)), PoissonSampler(q), n)
    assert local.noise_std == dist.noise_std == pytest.approx(z * 2 * 1.0)  # σ = z · 2Φ
    a, b = ledger_of(local, K), ledger_of(dist, K)
    assert a.adversaries == b.adversaries == ["server", "models"]
    golden = rdp_golden(REPLACE, dp_accounting.GaussianDpEvent(z), K)
    assert a.accountant.get_epsilon_rdp(1e-5) == pytest.approx(golden, rel=1e-6)
    assert a.epsilon() == pytest.approx(pld_golden(dp_accounting.GaussianDpEvent(z), K), rel=1e-6)
    assert b.epsilon() == a.epsilon() and b.epsilon(adversary="server") == a.epsilon()
    (server,) = b.mechanisms(0, "server")
    assert server.sample_rate == 1.0 and server.noise_multiplier == pytest.approx(z)
    # the models: add/remove, Φ, Poisson at q: multiplier σ/Φ = 2z
    amplified = rdp_golden(
        ADD_REMOVE,
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(2 * z)),
        K,
        orders=list(range(2, 257)),
    )
    amplified_pld = pld_golden(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(2 * z)), K
    )
    for ledger in (a, b):
        rdp = ledger.accountants["models"].get_epsilon_rdp(1e-5)
        assert amplified * 0.97 < rdp <= amplified * (1 + 1e-9)
        eps = ledger.epsilon(adversary="models")
        assert eps == pytest.approx(amplified_pld, rel=1e-6)
        assert eps < ledger.epsilon()
    report = b.report()
    assert report["adversary"] == "server" and report["placement"] == "distributed"
    assert "the noised sum" in report["adversary_sees"]
    assert report["adversaries"]["server"]["sample_rate"] == 1.0
    assert report["adversaries"]["models"]["sampling"] == "poisson"


def test_fixed_cohort_models_epsilon_is_sampling_without_replacement():
    """Central DP-FedAvg with a fixed cohort of B of N: the models' ε is dp-accounting's
    sampled-without-replacement Gaussian (replace-one, sensitivity 2Φ: σ = z·2Φ, multiplier z)."""
    z, K, n, B = 1.2, 40, 20, 5
    alg = _dp_fedavg(DPNoise(noise_multiplier=z, placement="central"), FixedSizeSampler(B), n)
    assert alg.noise_std == pytest.approx(z * 2 * 1.0)
    ledger = ledger_of(alg, K)
    assert ledger.adversaries == ["models"]
    event = dp_accounting.SampledWithoutReplacementDpEvent(n, B, dp_accounting.GaussianDpEvent(z))
    # accountant: auto — PLD (Zhu-Dong-Wang pair) headline, the RDP bound beside it
    rdp = rdp_golden(REPLACE, event, K)
    assert ledger.accountant.get_epsilon_rdp(1e-5) == pytest.approx(rdp, rel=1e-9)
    assert ledger.epsilon() < rdp
    (mech,) = ledger.mechanisms(0)
    assert mech.sampling == "without_replacement" and mech.population == n
    assert mech.sample_rate == pytest.approx(B / n)
    assert mech.noise_multiplier == pytest.approx(z)
    models = ledger.report()["adversaries"]["models"]
    assert models["accountant"].startswith("dp-accounting PLD")
    assert models["epsilon_rdp"] == pytest.approx(rdp, rel=1e-9)
    assert models["neighbouring_relation"] == "replace_one" and models["sensitivity"] == 2.0
    # amplified: below the unsampled Gaussian's ε at the same multiplier
    assert ledger.epsilon() < rdp_golden(REPLACE, dp_accounting.GaussianDpEvent(z), K)


# ---------------------------------------------------------------------------- calibration
def test_target_calibration_solves_against_the_headline_adversary():
    """calibration: target with central noise and a Poisson cohort: the models' ε after K
    rounds is the target (within the solver's 0.01, from below); with distributed noise the
    server's."""
    q, K, n, target = 0.2, 30, 20, 4.0
    central = _dp_fedavg(
        DPNoise(epsilon=target, calibration="target", placement="central"), PoissonSampler(q), n
    )
    central.setup(num_clients=n, dim=3, num_rounds=K, dtype=DT)
    eps = ledger_of(central, K).epsilon()
    assert target - 0.01 <= eps <= target
    assert eps == pytest.approx(target, rel=2.5e-3)
    dist = _dp_fedavg(
        DPNoise(epsilon=target, calibration="target", placement=aborting(2)), PoissonSampler(q), n
    )
    dist.setup(num_clients=n, dim=3, num_rounds=K, dtype=DT)
    ledger = ledger_of(dist, K)
    assert target - 0.01 <= ledger.epsilon(adversary="server") <= target
    assert ledger.epsilon(adversary="models") < target
    # the server sees who took part: no amplification, so far more noise than the central σ
    assert dist.noise_std > 3 * central.noise_std


def test_paper_calibration_sizes_the_noise_of_the_sum():
    """calibration: paper with central noise: σ = paper_noise_std with Φ the sensitivity of the
    sum (every client every round for DP-SGD; the papers' rate q for a Poisson cohort)."""
    eps, K = 8.0, 100
    alg = DistributedDPSGD(
        0.1, Clip(0.6), scale=2.0, noise=DPNoise(epsilon=eps, delta=1e-6, placement="central")
    )
    alg.setup(num_clients=7, dim=3, num_rounds=K, dtype=DT)
    expected = paper_noise_std(sensitivity=1.2, epsilon=eps, delta=1e-6, rounds=K)
    assert alg.noise_std == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(1.2 * math.sqrt(K * math.log(1e6)) / eps)
    fedavg = _dp_fedavg(
        DPNoise(epsilon=eps, placement="central", rounds=K), PoissonSampler(0.3), 10
    )
    expected = paper_noise_std(sensitivity=1.0, epsilon=eps, delta=1e-5, rounds=K, sample_rate=0.3)
    assert fedavg.noise_std == pytest.approx(expected, rel=1e-12)
    # the iterates carry σ on the sum: one round against the reference at that σ
    centers, x0 = data(seed=12)
    xs, _ = run(
        DistributedDPSGD(
            0.1,
            Clip(0.6),
            scale=2.0,
            noise=DPNoise(epsilon=eps, delta=1e-6, placement="central", rounds=K, seed=SEED),
        ),
        centers,
        x0,
        rounds=1,
    )
    sigma = paper_noise_std(sensitivity=1.2, epsilon=eps, delta=1e-6, rounds=K)
    (ref, _), *_ = ref_dpsgd(
        centers.tolist(),
        x0.tolist(),
        Noise("central", sigma, None, "aggregate", SEED),
        tau=0.6,
        scale=2.0,
        gamma=0.1,
    )
    torch.testing.assert_close(xs[0], torch.tensor(ref, dtype=DT), rtol=1e-11, atol=1e-11)


# ---------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("sampler", ["poisson", "fixed"])
def test_ledger_checkpoint_restores_every_adversary_and_the_aborted_rounds(sampler):
    n = 10
    make = {"poisson": lambda: PoissonSampler(0.3), "fixed": lambda: FixedSizeSampler(4)}[sampler]
    alg = _dp_fedavg(_distributed(2, allow_aborts=True), make(), n)
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 50)
    released = [True, False, True, True, False, True, False]
    for k, r in enumerate(released):
        ledger.account(k, released=r)
    checkpoint = {}
    ledger.save(checkpoint)
    assert set(checkpoint["privacy_accountants"]) == {"server", "models"}
    fresh = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 50)
    assert fresh.load(checkpoint) is None  # the same σ
    assert fresh.rounds_aborted == ledger.rounds_aborted == 3
    assert fresh.rounds_accounted == ledger.rounds_accounted == len(released)
    for adversary in ("server", "models"):
        assert fresh.accountants[adversary].steps == 4
        assert fresh.accountants[adversary].library == ledger.accountants[adversary].library
        assert fresh.epsilon(adversary=adversary) == ledger.epsilon(adversary=adversary) > 0
    if sampler == "fixed":  # the models' history is a sampled-without-replacement one
        assert fresh.accountants["models"].library.startswith("dp-accounting")
    assert fresh.report()["rounds_aborted"] == 3
    assert (
        fresh.epsilon() == ledger.epsilon(adversary="server") != ledger.epsilon(adversary="models")
    )
    fresh.account(len(released))  # and goes on composing
    assert fresh.accountants["models"].steps == fresh.accountants["server"].steps == 5
