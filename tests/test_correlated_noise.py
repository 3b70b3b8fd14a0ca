"""Correlated noise across rounds (:mod:`pl_privfed.privacy.correlated`): banded matrix
factorization and DP-FTRL's tree aggregation, with cyclic cohorts.

* the realized noise's covariance over rounds is ``σ² C^{-1} C^{-T}`` (a statistical test over
  many coordinates, which rejects independent noise);
* exact iterates of DP-FedAvg with cyclic cohorts and correlated central noise against a
  plain-loop reference (quadratic clients), the noise rebuilt from the keyed rows of ``Z`` by
  forward substitution on a dense ``C``; a resumed run (state_dict) continues exactly;
* sensitivities against brute force over participation patterns and signs;
* ε against dp-accounting's ``GaussianDpEvent`` (banded MF) and
  ``SingleEpochTreeAggregationDpEvent`` (tree restarted every epoch);
* published values: the square-root factorization's binomial coefficients
  (Fichtenberger, Henzinger & Upadhyay 2023) and the tree's depth and per-prefix noise
  (Kairouz et al. 2021: the prefix sum of ``t`` rounds carries popcount(t) node noises);
* the general banded ``C`` (``BandedMFNoise(bands, toeplitz=False)``) against pfl's
  optimization, the banded MF paper's eq. (6) over ``X = CᵀC`` solved independently here;
* published figures, each cited in its test: the optimal loss of the 2 × 2 prefix-sum
  factorization (``φ²``, google-research/federated's tests) for the general banded ``C``; the
  inverse square root's coefficients (jax_privacy's tests) for the banded Toeplitz recursion;
  DP-FTRL's StackOverflow ε (19.74 at z = 1.13, 2.04 at z = 8.83; dp-accounting's and
  tensorflow_privacy's tests) for one tree of 1,600 rounds;
* refusals (distributed shares of correlated noise among them).
"""

import itertools
import math

import dp_accounting
import pytest
import torch
import yaml
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from jsonargparse import ArgumentParser

from pl_privfed.algorithms import DPFedAvg
from pl_privfed.engine import run_round
from pl_privfed.operators import Clip
from pl_privfed.privacy import BandedMFNoise, DPNoise, PrivacyLedger, TreeNoise, plan
from pl_privfed.privacy.correlated import CorrelatedNoiseProcess
from pl_privfed.privacy.factorization import (
    Banded,
    BandedToeplitz,
    TreeAggregation,
    banded_matrix,
    cyclic_patterns,
    cyclic_prefix_sensitivities,
    min_separation_sensitivity,
    optimize_banded,
    optimize_banded_toeplitz,
    sqrt_toeplitz_coefficients,
    toeplitz,
    total_squared_error,
)
from pl_privfed.rng import STREAM_CORRELATED_NOISE, KeyedGenerator, stream_key
from pl_privfed.sampling import CyclicSampler, PoissonSampler

DT = torch.float64
ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


def z_row(seed, row, dim, std):
    """Row ``row`` of ``Z``: the keyed stream ``(seed, STREAM_CORRELATED_NOISE, row)``."""
    gen = torch.Generator().manual_seed(stream_key(seed, STREAM_CORRELATED_NOISE, row))
    return torch.empty(dim, dtype=DT).normal_(0.0, std, generator=gen).tolist()


def forward_substitution(c, rhs):
    """``w`` with ``C w = rhs`` (``C`` lower-triangular, a list of rows; ``rhs`` a list of
    vectors), by plain loops."""
    w = []
    for t in range(len(rhs)):
        row = list(rhs[t])
        for j in range(t):
            row = [a - c[t][j] * b for a, b in zip(row, w[j])]
        w.append([a / c[t][t] for a in row])
    return w


def realized(strategy, rounds, dim, std, seed=3):
    """The noise rows ``[rounds, dim]`` a process draws."""
    proc = CorrelatedNoiseProcess(strategy, rounds, dim)
    keyed, like = KeyedGenerator(), torch.zeros(dim, dtype=DT)
    return torch.stack([proc.draw(t, std, seed, keyed, like) for t in range(rounds)])


# ------------------------------------------------------------------------------- (a) covariance
def _covariance_z(noise, expected):
    """The entries' z-scores of the empirical covariance of ``noise`` (``[n, d]``, ``d`` iid
    columns) against ``expected``: ``Var(x_s x_t) = Σ_ss Σ_tt + Σ_st²`` for a Gaussian."""
    d = noise.shape[1]
    emp = noise @ noise.T / d
    diag = torch.diagonal(expected)
    se = ((torch.outer(diag, diag) + expected.square()) / d).sqrt()
    return (emp - expected) / se


@pytest.mark.parametrize("strategy", [BandedToeplitz(3), Banded(3), TreeAggregation(4)])
def test_realized_noise_covariance_is_sigma_squared_c_inverse_c_inverse_t(strategy):
    n, d, std = 8, 40_000, 1.7
    noise = realized(strategy, n, d, std)
    c_inv = torch.linalg.inv(strategy.matrix(n, n))
    expected = std**2 * c_inv @ c_inv.T
    z = _covariance_z(noise, expected)
    # 36 distinct entries: |z| <= 4.5 for all holds with probability > 0.999 under the model
    assert z.abs().max() < 4.5
    # and the test has power: independent noise of the same per-round variance is rejected
    independent = torch.diag(torch.diagonal(expected))
    assert _covariance_z(noise, independent).abs().max() > 10


# ------------------------------------------------------------------------------- (b) iterates
def centers_and_x0(n=6, d=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 1, d, generator=g, dtype=DT) * 3, torch.randn(d, generator=g, dtype=DT)


def oracle(centers):
    def grad_fn(params, per_example=False, step=None, clients=None):
        c = centers if clients is None else centers[clients]
        c = c.flatten(1, 2) if step is None else c[:, step]
        p = params.unsqueeze(0) if params.dim() == 1 else params
        per = p.unsqueeze(1) - c
        return per if per_example else per.mean(1)

    return grad_fn


def reference(centers, x0, rounds, groups, c_rows, std, seed, eta, gamma, tau):
    """Plain DP-FedAvg with cyclic cohorts and correlated central noise: round ``k``'s cohort
    is ``{i : i mod b = k mod b}``; the server adds ``(C^{-1} Z)_k`` to the sum of the clipped
    updates ``clip(γ (x − b_i), τ)`` and steps ``x ← x − (η/B)(Σ + noise)``, ``B = n/b``."""
    n, d = centers.shape[0], centers.shape[-1]
    cs = centers[:, 0, 0].tolist()
    zs = [z_row(seed, k, d, std) for k in range(rounds)]
    noise = forward_substitution(c_rows, zs)
    x, out = x0.tolist(), []
    for k in range(rounds):
        total = [0.0] * d
        for i in range(n):
            if i % groups != k % groups:
                continue
            u = [gamma * (x[j] - cs[i][j]) for j in range(d)]
            norm = math.sqrt(sum(v * v for v in u))
            u = [v * min(1.0, tau / norm) for v in u]
            total = [a + b for a, b in zip(total, u)]
        total = [a + b for a, b in zip(total, noise[k])]
        x = [x[j] - eta * total[j] / (n // groups) for j in range(d)]
        out.append(x)
    return out


def dp_fedavg(placement, groups, rounds, multiplier=0.7, seed=5):
    noise = DPNoise(noise_multiplier=multiplier, rounds=rounds, placement=placement, seed=seed)
    return DPFedAvg(
        0.3, local_step_size=0.4, operator=Clip(1.5), sampler=CyclicSampler(groups), noise=noise
    )


@pytest.mark.parametrize(
    "placement", [BandedMFNoise(3), BandedMFNoise(3, toeplitz=False), TreeNoise(4)]
)
def test_dp_fedavg_iterates_match_plain_reference_and_resume_exactly(placement):
    centers, x0 = centers_and_x0()
    n, d, rounds, groups = 6, 3, 9, 3
    alg = dp_fedavg(placement, groups, rounds)
    alg.setup(num_clients=n, dim=d, num_rounds=rounds, dtype=DT)
    x, xs, saved = x0.clone(), [], None
    for k in range(rounds):
        x = run_round(alg, x, oracle(centers), chunk_size=2).params
        xs.append(x.clone())
        if k == 4:
            saved = ({key: v.clone() for key, v in alg.state_dict().items()}, x.clone())
    c_rows = placement.strategy().matrix(rounds, rounds).tolist()
    ref = reference(centers, x0, rounds, groups, c_rows, alg.noise_std, 5, 0.3, 0.4, 1.5)
    torch.testing.assert_close(torch.stack(xs), torch.tensor(ref, dtype=DT), rtol=1e-9, atol=1e-9)
    # a fresh algorithm loaded from round 4's state continues exactly
    again = dp_fedavg(placement, groups, rounds)
    again.setup(num_clients=n, dim=d, num_rounds=rounds, dtype=DT)
    again.load_state_dict(saved[0])
    x = saved[1]
    for _ in range(5, rounds):
        x = run_round(again, x, oracle(centers), chunk_size=None).params
    assert torch.equal(x, xs[-1])


def test_general_banded_past_its_horizon_starts_again_exactly():
    """A general banded ``C`` built for 5 rounds, run for 12: the process's noise is ``C^{-1} Z``
    for the block-diagonal ``C`` (the horizon's ``C`` again every 5 rounds), by plain forward
    substitution on the keyed rows."""
    strategy, horizon, rounds, d, std = Banded(3), 5, 12, 4, 1.3
    proc = CorrelatedNoiseProcess(strategy, horizon, d)
    keyed, like = KeyedGenerator(), torch.zeros(d, dtype=DT)
    drawn = torch.stack([proc.draw(t, std, 3, keyed, like) for t in range(rounds)])
    c = strategy.matrix(rounds, horizon)
    block = strategy.block(horizon)
    assert torch.equal(c[5:10, 5:10], block) and torch.equal(c[10:, 10:], block[:2, :2])
    assert not c[5:, :5].any() and not c[10:, :10].any()
    ref = forward_substitution(c.tolist(), [z_row(3, t, d, std) for t in range(rounds)])
    torch.testing.assert_close(drawn, torch.tensor(ref, dtype=DT), rtol=1e-12, atol=1e-12)


def test_process_without_its_state_catches_up_to_the_same_noise():
    """A process asked for round 6 first (no state: rounds 0–5 never drawn here) draws what
    a process that drew every round draws: every row of ``Z`` is keyed."""
    strategy, d = BandedToeplitz(4), 5
    full = realized(strategy, 7, d, 1.0)
    late = CorrelatedNoiseProcess(strategy, 7, d)
    w = late.draw(6, 1.0, 3, KeyedGenerator(), torch.zeros(d, dtype=DT))
    torch.testing.assert_close(w, full[6], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------- (c) sensitivity
def min_sep_patterns(n, sep, k):
    """Every set of at most ``k`` rounds of ``[0, n)`` at least ``sep`` apart (non-empty)."""
    out = []
    for size in range(1, k + 1):
        for combo in itertools.combinations(range(n), size):
            if all(b - a >= sep for a, b in itertools.pairwise(combo)):
                out.append(combo)
    return out


def brute_sensitivity(c, patterns):
    """``max_π max_{s ∈ {±1}^π} ‖Σ_{j∈π} s_j C[:, j]‖`` (for scalar contributions the sup over
    ``|g_j| ≤ 1`` of a convex function is at a vertex): the exact sensitivity for ``d = 1``,
    and for any ``d`` where it equals the all-equal vectors' value."""
    best = 0.0
    for pattern in filter(None, patterns):
        for signs in itertools.product([1.0, -1.0], repeat=len(pattern)):
            v = sum(s * c[:, j] for s, j in zip(signs, pattern))
            best = max(best, float(v.norm()))
    return best


def banded_c(n, bands, general):
    """The optimized ``bands``-banded ``C`` for horizon ``n``: general or Toeplitz."""
    if general:
        return banded_matrix(optimize_banded(n, bands))
    return toeplitz(list(optimize_banded_toeplitz(n, bands)), n)


@pytest.mark.parametrize("general", [False, True])
@pytest.mark.parametrize("bands,sep", [(2, 2), (2, 3), (3, 3)])
def test_banded_sensitivity_is_theorem_2_and_brute_force(bands, sep, general):
    n, k = 8, 3
    c = banded_c(n, bands, general)
    brute = brute_sensitivity(c, min_sep_patterns(n, sep, k))
    assert min_separation_sensitivity(c, sep, k) == pytest.approx(brute, rel=1e-12)
    assert brute <= math.sqrt(k) * float(c.norm(dim=0).max()) + 1e-12  # Theorem 2's bound
    # n = k·sep with unit columns far enough from the end: Theorem 2 with equality, √k
    full = banded_c(k * sep, bands, general)
    assert min_separation_sensitivity(full, sep, k) == pytest.approx(math.sqrt(k), rel=1e-9)
    s2, exact = cyclic_prefix_sensitivities(c, sep)
    assert exact
    assert math.sqrt(s2[-1]) == pytest.approx(brute_sensitivity(c, cyclic_patterns(n, sep)))
    for t in range(n):  # every prefix: the first t + 1 rows
        cyclic = [[j for j in p if j <= t] for p in cyclic_patterns(n, sep)]
        assert math.sqrt(s2[t]) == pytest.approx(brute_sensitivity(c[: t + 1], cyclic))


@pytest.mark.parametrize("restart,groups", [(4, 4), (None, 3), (4, 2)])
def test_tree_sensitivity_is_brute_force_over_cyclic_patterns(restart, groups):
    n = 8
    c = TreeAggregation(restart).matrix(n)
    s2, exact = cyclic_prefix_sensitivities(c, groups)
    assert exact
    assert math.sqrt(s2[-1]) == pytest.approx(brute_sensitivity(c, cyclic_patterns(n, groups)))


def test_wider_band_than_separation_is_refused_by_theorem_2():
    c = toeplitz([0.8, 0.6], 6)
    with pytest.raises(ValueError, match="Theorem 2"):
        min_separation_sensitivity(c, 1, 3)


# ------------------------------------------------------------------------------- (d) ε
def ledger_epsilon(placement, groups, rounds, multiplier, relation=None):
    noise = DPNoise(
        noise_multiplier=multiplier, rounds=rounds, placement=placement, neighbouring=relation
    )
    alg = DPFedAvg(0.1, operator=Clip(2.0), sampler=CyclicSampler(groups), noise=noise)
    alg.setup(num_clients=4 * groups, dim=2, num_rounds=rounds, dtype=DT)
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], rounds)
    for k in range(rounds):
        ledger.account(k)
    return ledger


@pytest.mark.parametrize("toeplitz_c", [True, False])
def test_banded_mf_epsilon_is_one_gaussian_mechanism_by_dp_accounting(toeplitz_c):
    """20 rounds, 4 groups, 4-banded C (unit columns, Toeplitz or general): sensitivity √5 Φ
    over the run, so the run is ``GaussianDpEvent(σ / (√5 Φ))``; the noise multiplier σ/Φ = 2."""
    ledger = ledger_epsilon(BandedMFNoise(4, toeplitz_c), 4, 20, 2.0)
    acc = PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4)
    acc.compose(dp_accounting.GaussianDpEvent(2.0 / math.sqrt(5)))
    assert ledger.epsilon() == pytest.approx(acc.get_epsilon(1e-5), rel=2e-3)
    # the MF papers account the run the same way (add/remove, one Gaussian mechanism)
    assert ledger.epsilon_paper() == pytest.approx(ledger.epsilon(), rel=1e-12)
    rdp = RdpAccountant(neighboring_relation=ADD_REMOVE)
    rdp.compose(dp_accounting.GaussianDpEvent(2.0 / math.sqrt(5)))
    assert ledger.accountant.get_epsilon_rdp(1e-5) == pytest.approx(rdp.get_epsilon(1e-5), rel=2e-2)
    # replace-one: one client's updates swapped, the sensitivity doubles (the noise multiplier
    # is per the relation's sensitivity, so σ doubles and ε stays)
    swapped = ledger_epsilon(BandedMFNoise(4, toeplitz_c), 4, 20, 2.0, relation="replace_one")
    assert swapped.noise_std == pytest.approx(2 * ledger.noise_std)
    assert swapped.report()["sensitivity"] == pytest.approx(2 * ledger.report()["sensitivity"])
    assert swapped.epsilon() == pytest.approx(ledger.epsilon(), rel=1e-9)


def test_tree_restarted_every_epoch_epsilon_is_dp_accountings_tree_event():
    """Kairouz et al.'s DP-FTRL with restarts: 8 groups, a tree of 8 rounds per epoch (every
    client once per tree), 4 epochs: dp-accounting's ``SingleEpochTreeAggregationDpEvent`` composed
    4 times (RDP)."""
    ledger = ledger_epsilon(TreeNoise(8), 8, 32, 3.0)
    # dp-accounting analyses the tree under "replace with a special (zero) record": one client's
    # contributions present or zeroed, what add/remove is for a sum with a fixed denominator
    rdp = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    event = dp_accounting.SingleEpochTreeAggregationDpEvent(3.0, 8)
    rdp.compose(dp_accounting.SelfComposedDpEvent(event, 4))
    assert ledger.accountant.get_epsilon_rdp(1e-5) == pytest.approx(rdp.get_epsilon(1e-5), rel=2e-2)
    pld = PLDAccountant(ADD_REMOVE, value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(3.0 / math.sqrt(4 * 4)))  # depth ⌈log2 9⌉ = 4
    assert ledger.epsilon() == pytest.approx(pld.get_epsilon(1e-5), rel=2e-3)


def test_target_calibration_certifies_the_target():
    noise = DPNoise(epsilon=3.0, calibration="target", rounds=30, placement=BandedMFNoise(5))
    alg = DPFedAvg(0.1, operator=Clip(1.0), sampler=CyclicSampler(5), noise=noise)
    alg.setup(num_clients=10, dim=2, num_rounds=30, dtype=DT)
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], 30)
    for k in range(30):
        ledger.account(k)
    assert 2.9 < ledger.epsilon() <= 3.0 + 1e-6
    report = ledger.report()
    assert report["adversary"] == "models" and report["neighbouring_relation"] == "add_remove"
    assert "cyclic cohorts" in report["accounting"]["amplification"]


# ------------------------------------------------------------------------------- (e) published
def test_square_root_factorization_coefficients_are_binomial():
    """``C = A^{1/2}`` is Toeplitz with ``c_k = binom(2k, k)/4^k`` (Fichtenberger, Henzinger &
    Upadhyay 2023), and ``C² = A``."""
    c = sqrt_toeplitz_coefficients(30)
    closed = torch.tensor([math.comb(2 * k, k) / 4**k for k in range(30)], dtype=DT)
    torch.testing.assert_close(c, closed, rtol=1e-12, atol=0)
    m = toeplitz(c, 30)
    torch.testing.assert_close(m @ m, torch.tril(torch.ones(30, 30, dtype=DT)))


def test_optimized_banded_beats_identity_and_approaches_the_square_root():
    """Full-band optimized Toeplitz C (unit columns) has less error than the normalized square
    root, which it starts from; 1 band is independent noise (C = I, error n(n+1)/2)."""
    n = 32
    assert optimize_banded_toeplitz(n, 1) == (1.0,)
    assert total_squared_error(toeplitz([1.0], n)) == pytest.approx(n * (n + 1) / 2)
    sq = sqrt_toeplitz_coefficients(n)
    sqrt_error = total_squared_error(toeplitz(sq / sq.norm(), n))
    opt_error = total_squared_error(toeplitz(list(optimize_banded_toeplitz(n, n)), n))
    assert opt_error <= sqrt_error and opt_error > 0.8 * sqrt_error
    # docs/privacy.md's figure: MNIST's 300 rounds, 10 bands, 7.5 times less error than C = I
    mnist = toeplitz(list(optimize_banded_toeplitz(300, 10)), 300)
    assert total_squared_error(mnist) == pytest.approx(6045, abs=1)
    assert total_squared_error(toeplitz([1.0], 300)) == 45150
    # and docs/correlated_noise.md's general banded C of the same band: 5,936
    assert total_squared_error(banded_matrix(optimize_banded(300, 10))) == pytest.approx(
        5936, abs=1
    )


def primal_banded_optimum(n, bands):
    """The optimization pfl's ``BandedMatrixFactorizationMechanism`` (and google-research's
    ``primal_optimization``) run, the banded MF paper's eq. (6): minimize ``tr(AᵀA X^{-1})``
    over symmetric ``X`` with unit diagonal and ``X[i, j] = 0`` for ``|i − j| ≥ bands``, from
    ``X = I``; the optimal value (L-BFGS on the free entries, written here independently)."""
    a = torch.tril(torch.ones(n, n, dtype=DT))
    gram = a.T @ a
    mask = torch.tensor([[float(0 < abs(i - j) < bands) for j in range(n)] for i in range(n)])
    y = torch.zeros(n, n, dtype=DT, requires_grad=True)
    opt = torch.optim.LBFGS(
        [y],
        max_iter=2000,
        line_search_fn="strong_wolfe",
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
    )

    def loss():
        x = torch.eye(n, dtype=DT) + mask.to(DT) * (y + y.T) / 2
        return torch.trace(torch.linalg.solve(x, gram))

    def closure():
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)
    return float(loss().detach())


@pytest.mark.parametrize("n,bands", [(12, 3), (16, 4)])
def test_general_banded_solves_the_papers_banded_problem(n, bands):
    """The general banded ``C`` (unit columns, banded, lower-triangular) reaches the optimum of
    the banded MF paper's problem over ``X = CᵀC`` (pfl's optimization), and beats the
    optimized Toeplitz ``C`` of the same band (a special case)."""
    c = banded_matrix(optimize_banded(n, bands))
    torch.testing.assert_close(c.norm(dim=0), torch.ones(n, dtype=DT), rtol=1e-12, atol=0)
    assert not torch.triu(c, 1).any() and not torch.tril(c, -bands).any()
    error = total_squared_error(c)
    assert error == pytest.approx(primal_banded_optimum(n, bands), rel=1e-9)
    assert error < total_squared_error(toeplitz(list(optimize_banded_toeplitz(n, bands)), n))


def test_tree_prefix_noise_counts_the_nodes_of_the_binary_decomposition():
    """Kairouz et al. 2021: the plain estimator's prefix sum over rounds ``0 … t`` is the sum of
    popcount(t + 1) node noises (variance σ² popcount(t + 1)), and each round lies in
    ⌈log2(R + 1)⌉ nodes of a tree of R rounds (dp-accounting's tree depth)."""
    n, d, std = 16, 20_000, 1.0
    prefix = realized(TreeAggregation(), n, d, std).cumsum(0)
    for t in range(n):
        assert prefix[t].var().item() == pytest.approx(bin(t + 1).count("1"), rel=0.05)
    c = TreeAggregation(8).matrix(8)
    assert int(c[:, 0].sum()) == math.ceil(math.log2(8 + 1)) == 4


# ------------------------------------------------------------------------ (f) published figures
def test_general_banded_at_full_band_reaches_the_published_optimum_for_two_rounds():
    """The optimal factorization of the 2 × 2 prefix-sum matrix has loss ``φ²`` (``φ`` the
    golden ratio, 2.618…): google-research/federated, ``multi_epoch_dp_matrix_factorization/
    loops_test.py`` (and ``dp_matrix_factorization/loops_test.py``),
    ``test_factorization_factorizes_target``, commit a5af8c4433c9ee2d2b1565f1bcc68c89e2000a6b,
    with ``loops.compute_loss_w_h``'s loss ``max_j ‖H[:, j]‖² · ‖W‖_F²`` (single participation).
    With ``bands = n = 2`` the general banded ``C`` (``BandedMFNoise(2, toeplitz: false)``) is
    any lower-triangular ``C``, and every positive definite ``X = CᵀC`` has one, so its optimum
    must be that value; the Toeplitz ``C`` is a smaller class and stays above it."""
    phi = (1 + math.sqrt(5)) / 2

    def loss(c):  # compute_loss_w_h with H = C, W = A C^{-1}
        w = torch.tril(torch.ones(2, 2, dtype=DT)) @ torch.linalg.inv(c)
        return float(c.norm(dim=0).max() ** 2 * w.square().sum())

    general = Banded(2).matrix(2)
    assert loss(general) == pytest.approx(phi**2, rel=1e-9)
    assert total_squared_error(general) == pytest.approx(phi**2, rel=1e-9)  # unit columns
    assert loss(BandedToeplitz(2).matrix(2)) > phi**2 + 0.05


class _SquareRootBands(BandedToeplitz):
    """``BandedToeplitz``'s recursion with the square root's first ``bands`` coefficients."""

    def coefficients(self, horizon):
        return tuple(sqrt_toeplitz_coefficients(self.bands).tolist())


def test_banded_toeplitz_recursion_gives_the_published_inverse_square_root():
    """``C^{-1}`` of the square-root factorization has first coefficients ``1, −1/2, −1/8,
    −1/16, −5/128`` (jax_privacy, ``tests/matrix_factorization/toeplitz_test.py``,
    ``test_banded_inverse_square_root_noising_coefs``, commit
    8967688c26d46f3b74bfdfe61ef1f984b887abab): the banded Toeplitz noise recursion
    ``w_t = (Z_t − Σ c_i w_{t−i}) / c_0``, fed the square root's 5 coefficients and an impulse
    ``Z = e_0``, must release exactly those rows (the first 5 coefficients of a lower-triangular
    Toeplitz inverse depend on the first 5 of ``C`` only)."""
    strategy = _SquareRootBands(5)
    recent = torch.zeros(strategy.memory(5), 1, dtype=DT)
    rows = []
    for t in range(5):
        w = strategy.round_noise(t, lambda j: torch.tensor([float(j == 0)], dtype=DT), recent, 5)
        recent = torch.cat([w.unsqueeze(0), recent[:-1]])
        rows.append(float(w))
    assert rows == pytest.approx([1, -1 / 2, -1 / 8, -1 / 16, -5 / 128], abs=1e-15)


@pytest.mark.parametrize(
    "multiplier, published, current", [(1.13, 19.74, 18.71), (8.83, 2.04, 1.77)]
)
def test_one_tree_in_the_stackoverflow_setting_reproduces_the_published_epsilons(
    multiplier, published, current
):
    """DP-FTRL's StackOverflow setting (Kairouz et al., ICML 2021): one tree over 1,600 rounds,
    every client at most once, δ = 1e-6. dp-accounting pins ε < 19.74 at z = 1.13 and ε < 2.04
    at z = 8.83 for it (google/differential-privacy, ``python/dp_accounting/dp_accounting/rdp/
    rdp_privacy_accountant_test.py``, ``test_compute_eps_tree``, as shipped in dp-accounting
    0.6.0; the same figures in tensorflow/privacy's ``tree_aggregation_accountant_test.py`` at
    commit 125f82707abc7201760326ce7492a9c5f2a41828). The two figures are the classic
    RDP-to-DP conversion (Mironov 2017, Prop. 3: ``min_α ρ(α) + log(1/δ)/(α − 1)`` over the
    test's orders) of a tree of depth ``⌊log2 1600⌋ + 1 = 11``, rounded. Here the mechanism
    is ours: ``TreeNoise()`` over 1,600 cyclic groups (each client once), and its ledger's
    releases (their number set by the strategy's exact sensitivity) must give (i) those
    figures under the classic conversion, (ii) the RDP ε of dp-accounting's
    ``SingleEpochTreeAggregationDpEvent(z, 1600)`` under the current one (18.71 and 1.77, the
    figures docs/correlated_noise.md quotes), below them, and (iii) a certified (PLD) ε below
    that."""
    from opacus.accountants.analysis.rdp import compute_rdp

    rounds = 1600
    noise = DPNoise(noise_multiplier=multiplier, rounds=rounds, placement=TreeNoise(), delta=1e-6)
    alg = DPFedAvg(0.1, operator=Clip(1.0), sampler=CyclicSampler(rounds), noise=noise)
    alg.setup(num_clients=rounds, dim=2, num_rounds=rounds, dtype=DT)
    ledger = PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], rounds)
    for k in range(rounds):
        ledger.account(k)
    history = ledger.report()["adversaries"]["models"]["history"]
    orders = [1 + x / 10 for x in range(1, 100)] + list(range(12, 64))
    rdp = sum(
        compute_rdp(
            q=1.0, noise_multiplier=h["noise_multiplier"], steps=h["releases"], orders=orders
        )
        for h in history
    )
    classic = min(r + math.log(1e6) / (a - 1) for r, a in zip(rdp, orders))
    assert round(classic, 2) == published
    tree = RdpAccountant(orders, dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    tree.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(multiplier, rounds))
    assert ledger.accountant.get_epsilon_rdp(1e-6) == pytest.approx(
        tree.get_epsilon(1e-6), rel=1e-6
    )
    assert round(ledger.accountant.get_epsilon_rdp(1e-6), 2) == current < published
    assert ledger.epsilon() < ledger.accountant.get_epsilon_rdp(1e-6)


# ------------------------------------------------------------------------------- refusals
def test_refusals():
    with pytest.raises(ValueError, match="groups=4 does not divide"):
        CyclicSampler(4).setup(10)
    with pytest.raises(ValueError, match="bands"):
        BandedMFNoise(0)
    with pytest.raises(ValueError, match="toeplitz must be true or false, got 'no'"):
        BandedMFNoise(2, toeplitz="no")
    with pytest.raises(ValueError, match="restart"):
        TreeNoise(0)
    poisson = DPFedAvg(
        0.1,
        operator=Clip(1.0),
        sampler=PoissonSampler(0.5),
        noise=DPNoise(noise_multiplier=1.0, rounds=4, placement=BandedMFNoise(2)),
    )
    with pytest.raises(ValueError, match="without secret sampling"):
        poisson.setup(num_clients=4, dim=2, num_rounds=4)
    # distributed shares of correlated noise (a t of contributors): refused, by name or object
    for placement in ("banded_mf", BandedMFNoise(2), "tree_aggregation"):
        with pytest.raises(
            ValueError,
            match=r"min_contributors=5: placement='(banded_mf|tree_a).*"
            "distributed shares of correlated noise are not supported",
        ):
            DPNoise(noise_multiplier=1.0, placement=placement, min_contributors=5)
    # without noise.rounds the run's rounds are the horizon, fixed at setup
    derived = dp_fedavg(BandedMFNoise(2), 2, None)
    derived.setup(num_clients=4, dim=2, num_rounds=4)
    assert derived.noise.rounds == 4
    loose = DPNoise(noise_multiplier=1.0, placement=BandedMFNoise(2))
    with pytest.raises(ValueError, match=r"noise\.rounds"):
        plan.round_mechanisms(derived.release(), loose, 1.0, 0)


def test_a_configuration_chooses_the_general_banded_c():
    """``placement: {class_path: ...BandedMFNoise, init_args: {bands, toeplitz: false}}`` in a
    YAML configuration builds the general banded strategy, named in the run's report."""
    parser = ArgumentParser()
    parser.add_argument("--noise", type=DPNoise)
    spec = {"class_path": "pl_privfed.privacy.BandedMFNoise"}
    noise = {"noise_multiplier": 1.0, "rounds": 6}
    noise["placement"] = {**spec, "init_args": {"bands": 3, "toeplitz": False}}
    built = parser.instantiate(parser.parse_string(yaml.safe_dump({"noise": noise}))).noise
    assert built.where == BandedMFNoise(3, toeplitz=False)
    assert built.where.strategy() == Banded(3)
    assert "general, not Toeplitz" in built.where.record()["strategy"]


def test_resuming_with_another_horizon_is_refused():
    """The factorization is built for the run's rounds; a checkpoint cannot continue with
    another horizon (its C, and the noise already released, would change)."""

    def ledger(rounds):
        noise = DPNoise(epsilon=2.0, calibration="target", placement=BandedMFNoise(2))
        alg = DPFedAvg(0.1, operator=Clip(1.0), sampler=CyclicSampler(2), noise=noise)
        alg.setup(num_clients=4, dim=2, num_rounds=rounds, dtype=DT)
        return PrivacyLedger(alg.release(), alg.noise, [alg.noise_std], rounds)

    saved = ledger(10).calibration
    assert ledger(10).restore(saved) is None
    with pytest.raises(ValueError, match="built for 10 rounds"):
        ledger(12).restore(saved)


def test_every_stream_has_its_own_number():
    """Two purposes on one stream number would draw the same noise under one seed and key (the
    adaptive clip's count and correlated noise both run on DP-FedAvg)."""
    from pl_privfed import rng

    streams = {name: getattr(rng, name) for name in rng.__all__ if name.startswith("STREAM_")}
    assert len(set(streams.values())) == len(streams), streams
