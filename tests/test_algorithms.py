"""Exact iterates of every algorithm against small independent references.

Quadratic clients f_i(x) = ½||x − b_i||² (∇f_i(x) = x − b_i). The references below are plain
loops over clients with scalar arithmetic written from the papers, sharing nothing with the
package but the noise: the same keyed streams (tests/helpers/noise.py), either each client's own draw
(``draws: per_client``) or the sum of the clients' noises drawn once (``aggregate``). Every
reference comparison runs with chunks of one client, two clients and all of them.
"""

import math
from pathlib import Path

import pytest
import torch
from helpers.algorithms import DT, ROUNDS, norm, problem, ref_error_feedback, run, smoothed
from helpers.noise import client_noise, noise_sum, server_noise
from helpers.privacy import mechanisms, paper_mechanisms

from pl_privfed.algorithms import EF21, AlphaNormEC, Clip21, DistributedDPSGD
from pl_privfed.operators import Clip, SmoothedNormalization, TopK
from pl_privfed.privacy import DPNoise, PrivacyAccountant


def hard_clip(v, tau):
    nv = norm(v)
    return [c * min(1.0, tau / nv) for c in v] if nv > 0 else list(v)


def topk(v, k):
    keep = sorted(range(len(v)), key=lambda j: -abs(v[j]))[:k]
    return [v[j] if j in keep else 0.0 for j in range(len(v))]


def ref_dpsgd(
    b, x0, psi, scale, gamma, rounds, std=0.0, placement="client", seed=0, draws="aggregate"
):
    n, d = b.shape
    b = b.tolist()
    x = x0.tolist()
    out = []
    for k in range(rounds):
        msgs = [[scale * c for c in psi([x[j] - b[i][j] for j in range(d)])] for i in range(n)]
        if std > 0 and placement == "client" and draws == "per_client":
            z = [client_noise(seed, k, i, d, std) for i in range(n)]
            msgs = [[msgs[i][j] + z[i][j] for j in range(d)] for i in range(n)]
        total = [sum(msgs[i][j] for i in range(n)) for j in range(d)]
        if std > 0 and placement == "client" and draws == "aggregate":
            z = noise_sum(seed, k, n, d, std)
            total = [total[j] + z[j] for j in range(d)]
        if std > 0 and placement == "server":  # the trusted aggregator's noise on the sum
            z = server_noise(seed, k, d, std)
            total = [total[j] + z[j] for j in range(d)]
        agg = [total[j] / n for j in range(d)]
        x = [x[j] - gamma * agg[j] for j in range(d)]
        out.append(torch.tensor(x, dtype=DT))
    return out


def assert_iterates(xs, ref):
    assert len(xs) == len(ref) == ROUNDS
    for k, (a, r) in enumerate(zip(xs, ref)):
        torch.testing.assert_close(a, r, rtol=1e-11, atol=1e-11, msg=f"round {k}")


# ---------------------------------------------------------------------------- tests
CHUNKS = [1, 2, "all"]
DRAWS = ["aggregate", "per_client"]


@pytest.mark.parametrize("server_normalization", [True, False])
@pytest.mark.parametrize("init", ["zeros", "gradient", "gradient_offset"])
@pytest.mark.parametrize(
    "private, draws", [(False, None), (True, "aggregate"), (True, "per_client")]
)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_alpha_normec_exact(server_normalization, init, private, draws, chunk):
    b, x0 = problem()
    noise = DPNoise(noise_multiplier=0.3, seed=7, draws=draws) if private else None
    alg = AlphaNormEC(
        step_size=0.05,
        beta=0.4,
        alpha=0.5,  # β/α < 1 (paper 002 Theorem 1): rounding is not amplified
        server_normalization=server_normalization,
        memory_init=init,
        memory_init_offset=2.0,
        noise=noise,
    )
    xs = run(alg, b, x0, chunk=chunk)
    ref = ref_error_feedback(
        b,
        x0,
        lambda v: smoothed(v, 0.5),
        0.4,
        0.05,
        server_normalization,
        ROUNDS,
        init=init,
        std=0.3 * 2 if private else 0.0,
        seed=7,
        D=2.0,
        draws=draws,
    )  # (noise std = multiplier × the replace-one sensitivity 2 of Norm_α)
    assert_iterates(xs, ref)


def test_dp_alpha_normec_paper_noise_level():
    b, x0 = problem()
    alg = AlphaNormEC(0.05, 0.1, 0.01, noise=DPNoise(epsilon=8.0, delta=1e-5, seed=1))
    alg.setup(num_clients=5, dim=4, num_rounds=300, dtype=DT)
    assert alg.noise_std == pytest.approx(math.sqrt(300 * math.log(1e5)) / 8.0)
    xs = run(alg, b, x0)
    std = math.sqrt(ROUNDS * math.log(1e5)) / 8.0  # run() calls setup with K = ROUNDS
    ref = ref_error_feedback(
        b, x0, lambda v: smoothed(v, 0.01), 0.1, 0.05, True, ROUNDS, std=std, seed=1
    )
    assert_iterates(xs, ref)
    (mech,) = mechanisms(alg)  # replace-one (local DP): sensitivity 2
    assert mech.noise_multiplier == pytest.approx(std / 2) and mech.sample_rate == 1.0
    (paper,) = paper_mechanisms(alg)  # the papers' add/remove: sensitivity 1
    assert paper.noise_multiplier == pytest.approx(std) and paper.sample_rate == 1.0


@pytest.mark.parametrize("server_normalization", [False, True])
@pytest.mark.parametrize(
    "private, draws", [(False, None), (True, "aggregate"), (True, "per_client")]
)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_clip21_exact(server_normalization, private, draws, chunk):
    b, x0 = problem(seed=3)
    noise = DPNoise(noise_multiplier=0.5, seed=2, draws=draws) if private else None
    alg = Clip21(0.1, clip_threshold=1.5, server_normalization=server_normalization, noise=noise)
    assert alg.beta == 1.0
    xs = run(alg, b, x0, chunk=chunk)
    # DP-Clip21 noise is calibrated to the replace-one sensitivity 2τ: std = multiplier · 2τ
    ref = ref_error_feedback(
        b,
        x0,
        lambda v: hard_clip(v, 1.5),
        1.0,
        0.1,
        server_normalization,
        ROUNDS,
        std=0.5 * 2 * 1.5 if private else 0.0,
        seed=2,
        draws=draws,
    )
    assert_iterates(xs, ref)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_ef21_topk_exact(chunk):
    b, x0 = problem(seed=4)
    alg = EF21(0.2, compressor=TopK(k=2))
    xs = run(alg, b, x0, chunk=chunk)
    ref = ref_error_feedback(b, x0, lambda v: topk(v, 2), 1.0, 0.2, False, ROUNDS, init="gradient")
    assert_iterates(xs, ref)


@pytest.mark.parametrize("placement", ["client", "server"])
@pytest.mark.parametrize(
    "operator, psi",
    [
        (SmoothedNormalization(0.01), lambda v: smoothed(v, 0.01)),
        (Clip(1.0), lambda v: hard_clip(v, 1.0)),
    ],
)
@pytest.mark.parametrize(
    "private, draws", [(False, None), (True, "aggregate"), (True, "per_client")]
)
@pytest.mark.parametrize("chunk", CHUNKS)
def test_distributed_dpsgd_exact(operator, psi, placement, private, draws, chunk):
    b, x0 = problem(seed=5)
    where = {"client": "local", "server": "central"}[placement]
    noise = DPNoise(noise_multiplier=0.2, seed=3, draws=draws, placement=where) if private else None
    alg = DistributedDPSGD(0.1, operator, scale=2.0, noise=noise)
    xs = run(alg, b, x0, chunk=chunk)
    # noise multiplier = std / sensitivity: 2β·τ per client (local DP, replace-one), β·τ for
    # the sum (central DP, add/remove)
    std = 0.2 * 2.0 * (1 if placement == "server" else 2) if private else 0.0
    ref = ref_dpsgd(b, x0, psi, 2.0, 0.1, ROUNDS, std=std, placement=placement, seed=3, draws=draws)
    assert_iterates(xs, ref)


def test_dpsgd_central_noise_multiplier_accounts_for_averaging():
    alg = DistributedDPSGD(0.1, Clip(1.0), noise=DPNoise(noise_multiplier=0.2, placement="central"))
    alg.setup(num_clients=10, dim=3, num_rounds=5)
    (mech,) = mechanisms(alg)
    # one client moves the sum by at most τ = 1: std = 0.2 × 1 on the sum (0.02 on the mean)
    assert alg.noise_std == pytest.approx(0.2)
    assert mech.noise_multiplier == pytest.approx(0.2)
    assert "central" in mech.privacy_unit
    paper = DistributedDPSGD(0.1, Clip(1.0), noise=DPNoise(epsilon=8.0, placement="central"))
    paper.setup(num_clients=10, dim=3, num_rounds=300)
    # eq. (3) sizes σ = Φ sqrt(K log(1/δ))/ε for what is noised, the sum (sensitivity Φ): the
    # average carries σ/n, not σ (the papers' σ on the average would be n times too large)
    assert paper.noise_std == pytest.approx(math.sqrt(300 * math.log(1e5)) / 8)
    assert mechanisms(paper)[0].noise_multiplier == pytest.approx(paper.noise_std)


def test_example_1_dpsgd_stalls_alpha_normec_converges():
    """Paper 002 Example 1: n = 2, d = 1, b = ±3, x⁰ = 2, the same γ and α for both methods."""
    b = torch.tensor([[3.0], [-3.0]], dtype=DT)
    x0 = torch.tensor([2.0], dtype=DT)
    dpsgd = DistributedDPSGD(0.01, SmoothedNormalization(0.0))
    xs = run(dpsgd, b, x0, rounds=200)
    assert all(float(x) == 2.0 for x in xs)  # Norm(−1) + Norm(5) = −1 + 1 = 0: no progress
    for alpha in (0.0, 1.0):  # α = 0 is the example as written
        normec = AlphaNormEC(0.01, beta=0.1, alpha=alpha, server_normalization=False)
        xs = run(normec, b, x0, rounds=2000)
        assert abs(float(xs[-1])) < 0.05, alpha  # converges to x* = 0
        assert abs(float(xs[-1])) < abs(float(xs[len(xs) // 2])) < 2.0, alpha
    # the stall needs α = 0: with α = 1 the estimator at x⁰ is −1/2 + 5/6 ≠ 0 and DP-SGD moves
    xs = run(DistributedDPSGD(0.01, SmoothedNormalization(1.0)), b, x0, rounds=2000)
    assert 0.0 < float(xs[-1]) < float(xs[len(xs) // 2]) < 2.0


@pytest.mark.parametrize("private", [False, True])
def test_dpsgd_with_scaled_normalization_depends_on_the_product_of_step_and_scale(private):
    """DP-SGD with Ψ = β·Norm_α (paper 002 eq. 2): x ← x − γ(β mean_i Norm_α(∇f_i) + noise), and the
    noise calibrated to ε has std ∝ Φ = β: (γ, β) and (γ/10, 10β) give the same iterates. Paper
    002's grid caps γ at 1, so it caps γβ at β (the claims table in docs/paper_experiments.md)."""
    b, x0 = problem(seed=8)
    runs = []
    for gamma, beta in ((0.1, 0.1), (0.01, 1.0), (1.0, 0.01)):
        noise = DPNoise(epsilon=8.0, delta=1e-5, seed=4) if private else None
        alg = DistributedDPSGD(gamma, SmoothedNormalization(0.01), scale=beta, noise=noise)
        runs.append(run(alg, b, x0))
    for other in runs[1:]:
        for x, y in zip(runs[0], other, strict=True):
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(runs[0][-1], x0)  # the runs moved


def test_example_1_configs_differ_only_in_the_algorithm():
    """configs/algorithms/example1_{dpsgd,alpha_normec}.yaml: the same problem, trainer and data
    (the loggers' names aside), and algorithms that share γ and α = 0 (Example 1 as written)."""
    import yaml

    folder = Path(__file__).resolve().parents[1] / "configs" / "algorithms"
    dpsgd, normec = (
        yaml.safe_load((folder / f"example1_{name}.yaml").read_text())
        for name in ("dpsgd", "alpha_normec")
    )
    a, b = dpsgd["model"].pop("algorithm"), normec["model"].pop("algorithm")
    for config in (dpsgd, normec):
        for logger in config["trainer"]["logger"]:
            logger["init_args"].pop("name")  # each run's own log directory
    assert dpsgd == normec
    assert a["class_path"] == "pl_privfed.algorithms.DistributedDPSGD"
    assert b["class_path"] == "pl_privfed.algorithms.AlphaNormEC"
    assert a["init_args"]["operator"]["class_path"] == "pl_privfed.operators.SmoothedNormalization"
    assert a["init_args"]["step_size"] == b["init_args"]["step_size"]
    assert a["init_args"]["operator"]["init_args"]["alpha"] == b["init_args"]["alpha"] == 0.0
    assert b["init_args"]["server_normalization"] is False


def test_accountant_matches_opacus():
    from opacus.accountants import RDPAccountant

    ours, theirs = PrivacyAccountant("rdp"), RDPAccountant()
    for _ in range(300):
        ours.step(noise_multiplier=1.1, sample_rate=1.0)
        theirs.step(noise_multiplier=1.1, sample_rate=1.0)
    assert ours.get_epsilon(1e-5) == theirs.get_epsilon(1e-5)
    assert ours.steps == 300


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: AlphaNormEC(0.0, 0.1, 0.1), "step_size"),
        (lambda: AlphaNormEC(-1.0, 0.1, 0.1), "step_size"),
        (lambda: AlphaNormEC(0.1, 0.0, 0.1), "beta"),
        (lambda: AlphaNormEC(0.1, -2.0, 0.1), "beta"),
        (lambda: AlphaNormEC(0.1, 0.1, -0.5), "alpha"),
        (lambda: Clip21(0.1, 0.0), "threshold"),
        (lambda: AlphaNormEC(0.1, 0.1, 0.1, memory_init="ones"), "memory_init"),
        (lambda: DistributedDPSGD(0.1, scale=0.0), "scale"),
        (lambda: DPNoise(epsilon=0.0), "epsilon"),
        (lambda: DPNoise(epsilon=-1.0), "epsilon"),
        (lambda: DPNoise(epsilon=8.0, delta=0.0), "delta"),
        (lambda: DPNoise(epsilon=8.0, delta=1.0), "delta"),
        (lambda: DPNoise(), "exactly one"),
        (lambda: DPNoise(epsilon=1.0, noise_multiplier=1.0), "exactly one"),
    ],
)
def test_validation(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_noise_needs_bounded_operator():
    alg = DistributedDPSGD(0.1, noise=DPNoise(noise_multiplier=1.0))  # identity: unbounded
    with pytest.raises(ValueError, match="bounded"):
        alg.setup(num_clients=2, dim=3, num_rounds=5)
