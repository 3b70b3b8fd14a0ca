"""Exact iterates of PORTER-DP, PORTER-GC, BEER and SoteriaFL-SGD against plain references.

Quadratic agents: agent ``i``'s examples in round ``t`` have targets ``b_{t,i,z}`` and losses
``½||x − b_{t,i,z}||²``, so a per-example gradient is ``x_i − b_{t,i,z}``. The references are
plain loops with scalar arithmetic written from paper 001 Algorithm 1 (``001-porter.txt`` lines
167–183) in the paper's ``d × n`` layout (agents as columns, gossip ``Q (W − I)`` as a right
product), sharing nothing with the package but the definition of the random streams: agent
``i``'s compression mask and noise in round ``t`` come from the streams keyed by ``(seed, t, i)``
(tests/helpers/noise.py), the output iterate's integers from ``(seed, t)``. The comparisons run with
chunks of one agent, two agents and all of them.
"""

import math

import pytest
import torch
from helpers.noise import client_noise
from helpers.privacy import mechanisms, paper_mechanisms

from pl_privfed.algorithms.decentralized import BEER, PORTER
from pl_privfed.algorithms.soteria import SoteriaFL
from pl_privfed.engine import run_round
from pl_privfed.graphs import Topology
from pl_privfed.operators import Identity, RandKBiased, TopK
from pl_privfed.privacy import DPNoise, level_of
from pl_privfed.rng import STREAM_COMPRESSION, STREAM_OUTPUT, keyed_generator

DT = torch.float64
ROUNDS = 12
N, D, B = 4, 6, 3

# A non-symmetric mixing matrix with W1 = 1 and 1ᵀW = 1ᵀ (paper 001 Def. 1 allows it):
# 0.5 I + 0.3 P + 0.2 P² for the cyclic shift P — a wrong transpose changes the iterates.
W_NONSYM = [
    [0.5, 0.3, 0.2, 0.0],
    [0.0, 0.5, 0.3, 0.2],
    [0.2, 0.0, 0.5, 0.3],
    [0.3, 0.2, 0.0, 0.5],
]


def targets(rounds=ROUNDS, n=N, batch=B, d=D, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rounds, n, batch, d, generator=g, dtype=DT) * 2


def grad_fn_for(b_t):
    """Oracle of one round: ``[m, d]`` minibatch gradients or ``[m, B, d]`` per example of the
    agents ``clients``."""

    def grad_fn(params, per_example=False, clients=None):
        rows = b_t if clients is None else b_t[clients]
        x = params.unsqueeze(0) if params.dim() == 1 else params  # shared or per agent
        per = x.unsqueeze(1).expand(rows.shape[0], rows.shape[1], -1) - rows
        return per if per_example else per.mean(1)

    return grad_fn


def run(alg, b, x0, n=N, chunk=None):
    alg.setup(num_clients=n, dim=x0.shape[0], num_rounds=b.shape[0], dtype=DT)
    x, xs, agents = x0.clone(), [], []
    for t in range(b.shape[0]):
        x = run_round(alg, x, grad_fn_for(b[t]), chunk_size=chunk).params
        xs.append(x.clone())
        agents.append(alg.agent_params.clone() if hasattr(alg, "agent_params") else None)
    return xs, agents


# ---------------------------------------------------------------------------- plain references
def norm(v):
    return math.sqrt(sum(c * c for c in v))


def smooth_clip(v, tau):  # Def. 2
    s = tau / (tau + norm(v))
    return [s * c for c in v]


def linear_clip(v, tau):  # Remark 1
    nv = norm(v)
    return [c * min(1.0, tau / nv) for c in v] if nv > 0 else list(v)


def column(m, i):
    return [row[i] for row in m]


def keep_mask(seed, t, i, which, d):
    """Agent ``i``'s uniforms of round ``t`` for the mask of its ``which``-th message."""
    gen = keyed_generator(seed, STREAM_COMPRESSION, t, i, which)
    return torch.rand(1, d, generator=gen, dtype=DT)[0].tolist()


def ref_porter(
    b, x0, w, eta, gamma, option, clip, keep=None, topk=None, std=0.0, seed=0, noise_seed=0
):
    """Algorithm 1 in the d × n layout; ``keep`` = Example 1's probability k/d."""
    rounds, n, batch, d = b.shape
    b = b.tolist()
    zeros = [[0.0] * n for _ in range(d)]
    V, Qv, Gp = [r[:] for r in zeros], [r[:] for r in zeros], [r[:] for r in zeros]  # line 169
    X = [[float(x0[j])] * n for j in range(d)]
    Qx = [r[:] for r in X]

    def compress(M, t, which):  # C applied to each column (agent) of a d × n matrix
        if keep is not None:
            u = [keep_mask(seed, t, i, which, d) for i in range(n)]  # u[i][j]: agent i, coord j
            return [[M[j][i] if u[i][j] < keep else 0.0 for i in range(n)] for j in range(d)]
        if topk is not None:
            out = [[0.0] * n for _ in range(d)]
            for i in range(n):
                col = column(M, i)
                for j in sorted(range(d), key=lambda j: -abs(col[j]))[:topk]:
                    out[j][i] = col[j]
            return out
        return [r[:] for r in M]

    def right_gossip(Q):  # Q (W − I)
        return [
            [sum(Q[j][k] * (w[k][i] - (k == i)) for k in range(n)) for i in range(n)]
            for j in range(d)
        ]

    out_x, out_t, out_i = [0.0] * d, 0, 0
    xbars, Xs = [], []
    for t in range(rounds):
        G = [[0.0] * n for _ in range(d)]
        if option == "dp":
            e = [client_noise(noise_seed, t, i, d, std) for i in range(n)]
            for i in range(n):
                xi = column(X, i)
                for z in range(batch):  # line 173: average of clipped per-example gradients
                    gz = clip([xi[j] - b[t][i][z][j] for j in range(d)])
                    for j in range(d):
                        G[j][i] += gz[j] / batch
                for j in range(d):  # line 174: + e_i
                    G[j][i] += e[i][j]
        else:
            for i in range(n):
                xi = column(X, i)
                g = [sum(xi[j] - b[t][i][z][j] for z in range(batch)) / batch for j in range(d)]
                g = clip(g) if clip is not None else g  # line 177 (BEER: no clipping)
                for j in range(d):
                    G[j][i] = g[j]
        cv = compress([[V[j][i] - Qv[j][i] for i in range(n)] for j in range(d)], t, 0)
        Qv = [[Qv[j][i] + cv[j][i] for i in range(n)] for j in range(d)]  # line 178
        mix = right_gossip(Qv)
        V = [
            [V[j][i] + gamma * mix[j][i] + G[j][i] - Gp[j][i] for i in range(n)] for j in range(d)
        ]  # line 179
        Gp = G
        cx = compress([[X[j][i] - Qx[j][i] for i in range(n)] for j in range(d)], t, 1)
        Qx = [[Qx[j][i] + cx[j][i] for i in range(n)] for j in range(d)]  # line 180
        mix = right_gossip(Qx)
        X = [
            [X[j][i] + gamma * mix[j][i] - eta * V[j][i] for i in range(n)] for j in range(d)
        ]  # line 181
        gen_o = keyed_generator(seed, STREAM_OUTPUT, t)
        replace = int(torch.randint(t + 1, (), generator=gen_o)) == 0  # line 183, reservoir
        i = int(torch.randint(n, (), generator=gen_o))
        if replace:
            out_x, out_t, out_i = column(X, i), t + 1, i
        xbars.append(torch.tensor([sum(X[j]) / n for j in range(d)], dtype=DT))
        Xs.append(torch.tensor(X, dtype=DT).T)  # agents as rows, for the comparison
    return xbars, Xs, (torch.tensor(out_x, dtype=DT), out_t, out_i)


def ref_soteria(b, x0, eta, gamma, G, keep=None, std=0.0, seed=0, noise_seed=0):
    rounds, n, batch, d = b.shape
    b = b.tolist()
    x = x0.tolist()
    s_i = [[0.0] * d for _ in range(n)]
    s = [0.0] * d
    out = []
    for t in range(rounds):
        v_sum = [0.0] * d
        for i in range(n):
            g = [sum(x[j] - b[t][i][z][j] for z in range(batch)) / batch for j in range(d)]
            g = linear_clip(g, G)
            if std > 0:
                e = client_noise(noise_seed, t, i, d, std)
                g = [g[j] + e[j] for j in range(d)]
            v = [g[j] - s_i[i][j] for j in range(d)]
            if keep is not None:
                u = keep_mask(seed, t, i, 0, d)
                v = [v[j] if u[j] < keep else 0.0 for j in range(d)]
            s_i[i] = [s_i[i][j] + gamma * v[j] for j in range(d)]
            v_sum = [v_sum[j] + v[j] for j in range(d)]
        v = [c / n for c in v_sum]
        x = [x[j] - eta * (s[j] + v[j]) for j in range(d)]
        s = [s[j] + gamma * v[j] for j in range(d)]
        out.append(torch.tensor(x, dtype=DT))
    return out


def assert_close_all(got, ref):
    assert len(got) == len(ref) == ROUNDS
    for t, (a, r) in enumerate(zip(got, ref)):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10, msg=f"round {t + 1}")


# ---------------------------------------------------------------------------- PORTER / BEER
CHUNKS = [1, 3, "all"]


@pytest.mark.parametrize("clipping", ["smooth", "linear"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("private", [True, False])
def test_porter_dp_exact(clipping, chunk, private):
    """PORTER-DP, and without noise its non-private twin (the same per-example clipping)."""
    b = targets()
    x0 = torch.linspace(-1, 1, D, dtype=DT)
    noise = DPNoise(noise_multiplier=0.7, seed=5) if private else None
    alg = PORTER(
        step_size=0.1,
        consensus_step_size=0.4,
        option="dp",
        clip_threshold=1.5,
        clipping=clipping,
        topology=Topology(matrix=W_NONSYM),
        compressor=RandKBiased(k=3),
        noise=noise,
        batch_size=B,
        local_dataset_size=30,
        seed=11,
    )
    xs, agents = run(alg, b, x0, chunk=chunk)
    # multiplier × replace-one sensitivity 2τ/b of the clipped average
    std = 0.7 * 2 * 1.5 / B if private else 0.0
    assert alg.noise_std == pytest.approx(std)
    clip = smooth_clip if clipping == "smooth" else linear_clip
    xbars, Xs, (out_x, out_t, out_i) = ref_porter(
        b,
        x0,
        W_NONSYM,
        0.1,
        0.4,
        "dp",
        lambda v: clip(v, 1.5),
        keep=3 / D,
        std=std,
        seed=11,
        noise_seed=5,
    )
    assert_close_all(xs, xbars)
    assert_close_all(agents, Xs)
    got = alg.output()
    assert (got["round"], got["agent"]) == (out_t, out_i) and 1 <= out_t <= ROUNDS
    torch.testing.assert_close(got["params"], out_x, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("clipping", ["smooth", "linear"])
@pytest.mark.parametrize("compressor", ["randk", "topk"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_porter_gc_exact(clipping, compressor, chunk):
    b = targets(seed=1)
    x0 = torch.linspace(2, -1, D, dtype=DT)
    comp = RandKBiased(ratio=0.5) if compressor == "randk" else TopK(k=2)
    alg = PORTER(
        step_size=0.2,
        consensus_step_size=0.5,
        option="gc",
        clip_threshold=0.8,
        clipping=clipping,
        topology=Topology(matrix=W_NONSYM),
        compressor=comp,
        seed=3,
    )
    xs, agents = run(alg, b, x0, chunk=chunk)
    clip = smooth_clip if clipping == "smooth" else linear_clip
    xbars, Xs, _ = ref_porter(
        b,
        x0,
        W_NONSYM,
        0.2,
        0.5,
        "gc",
        lambda v: clip(v, 0.8),
        keep=0.5 if compressor == "randk" else None,
        topk=2 if compressor == "topk" else None,
        seed=3,
    )
    assert_close_all(xs, xbars)
    assert_close_all(agents, Xs)


@pytest.mark.parametrize("weights", ["fdla", "metropolis"])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_beer_exact_on_erdos_renyi(weights, chunk):
    b = targets(seed=2)
    x0 = torch.zeros(D, dtype=DT)
    topology = Topology(graph="erdos_renyi", p=0.6, weights=weights, seed=4)
    alg = BEER(
        step_size=0.1,
        consensus_step_size=0.3,
        topology=topology,
        compressor=RandKBiased(k=2),
        seed=8,
    )
    xs, agents = run(alg, b, x0, chunk=chunk)
    w = topology.mixing_matrix(N).tolist()
    xbars, Xs, _ = ref_porter(b, x0, w, 0.1, 0.3, "gc", None, keep=2 / D, seed=8)
    assert_close_all(xs, xbars)
    assert_close_all(agents, Xs)
    assert alg.clipping == "none" and alg.noise is None


def test_consensus_and_gradient_tracking_with_exact_averaging():
    """Identity C, complete graph with W = 11ᵀ/n, γ = 1, no clipping or noise (BEER).

    Then line 179 reads ``V ← J V + G^{(t)} − G^{(t−1)}`` and line 181 ``X ← J X − η V`` with
    ``J = 11ᵀ/n``: the tracked average is the average gradient (``v̄ = ḡ``), so the agents'
    average follows gradient descent on ``f = (1/n) Σ f_i`` with the gradients taken at the
    agents' own points; for ``f_i = ½||x − b_i||²`` that is exactly ``x̄ ← x̄ − η (x̄ − b̄)``. The
    deviation ``E = X − 1x̄ᵀ`` obeys ``E_1 = η (B − 1b̄ᵀ)``, ``E_2 = −η E_1``,
    ``E_t = −η (E_{t−1} − E_{t−2})``: it vanishes geometrically, and is zero throughout when the
    agents are identical (they stay in consensus).
    """
    n, d, eta = 5, 3, 0.1
    centers = torch.randn(n, d, generator=torch.Generator().manual_seed(0), dtype=DT)
    topology = Topology(graph="complete", weights="metropolis")
    torch.testing.assert_close(topology.mixing_matrix(n), torch.full((n, n), 1 / n, dtype=DT))
    b = centers.unsqueeze(0).unsqueeze(2).expand(ROUNDS, n, 1, d)
    x0 = torch.ones(d, dtype=DT)
    alg = BEER(eta, 1.0, topology=topology, compressor=Identity())
    alg.setup(num_clients=n, dim=d, num_rounds=ROUNDS, dtype=DT)
    xbar, deviations = x0.clone(), [torch.zeros(n, d, dtype=DT)]
    for t in range(ROUNDS):
        result = run_round(alg, xbar, grad_fn_for(b[t]))
        expected = xbar - eta * (xbar - centers.mean(0))  # gradient descent on f
        torch.testing.assert_close(result.params, expected, rtol=1e-12, atol=1e-12)
        assert float(result.metrics["tracking_gap"]) < 1e-12  # v̄ = ḡ
        xbar = result.params
        deviations.append(alg.agent_params - xbar)
    e1 = eta * (centers - centers.mean(0))
    torch.testing.assert_close(deviations[1], e1, rtol=1e-12, atol=1e-12)
    for t in range(2, ROUNDS + 1):
        want = -eta * (deviations[t - 1] - deviations[t - 2])
        torch.testing.assert_close(deviations[t], want, rtol=1e-10, atol=1e-12)
    assert deviations[-1].norm() < 1e-3 * e1.norm()
    # identical agents: exact consensus at every round
    same = torch.ones(ROUNDS, n, 1, d, dtype=DT)
    alg = BEER(eta, 1.0, topology=topology)
    alg.setup(num_clients=n, dim=d, num_rounds=ROUNDS, dtype=DT)
    x = x0.clone()
    for t in range(ROUNDS):
        result = run_round(alg, x, grad_fn_for(same[t]))
        x = result.params
        assert float(result.metrics["consensus_error"]) < 1e-14


def test_output_iterate_is_uniform_over_agents_and_rounds():
    """Reservoir sampling: every (round, agent) pair is equally likely (chi-square, seeded)."""
    n, rounds, runs = 3, 4, 1200
    counts = torch.zeros(rounds, n)
    b = torch.zeros(rounds, n, 1, 2, dtype=DT)
    for seed in range(runs):
        alg = BEER(0.1, 0.5, topology=Topology(graph="ring", weights="metropolis"), seed=seed)
        alg.setup(num_clients=n, dim=2, num_rounds=rounds, dtype=DT)
        x = torch.zeros(2, dtype=DT)
        for t in range(rounds):
            x = run_round(alg, x, grad_fn_for(b[t])).params
        out = alg.output()
        counts[out["round"] - 1, out["agent"]] += 1
    expected = runs / (n * rounds)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 31.3  # 99.9 % quantile of χ²(11)


def test_checkpoint_state_resumes_exactly():
    b = targets(seed=5)
    x0 = torch.zeros(D, dtype=DT)

    def make():
        return PORTER(
            0.1,
            0.4,
            option="dp",
            topology=Topology(matrix=W_NONSYM),
            compressor=RandKBiased(k=2),
            noise=DPNoise(noise_multiplier=1.0, seed=2),
            batch_size=B,
            local_dataset_size=50,
            seed=1,
        )

    full = make()
    full.setup(num_clients=N, dim=D, num_rounds=ROUNDS, dtype=DT)
    x, state = x0.clone(), None
    for t in range(ROUNDS):
        if t == 5:
            state = {
                k: v.clone() if torch.is_tensor(v) else v for k, v in full.state_dict().items()
            }
            x_mid = x.clone()
        x = run_round(full, x, grad_fn_for(b[t])).params
    resumed = make()
    resumed.setup(num_clients=N, dim=D, num_rounds=ROUNDS, dtype=DT)
    resumed.load_state_dict(state)
    y = x_mid
    for t in range(5, ROUNDS):
        y = run_round(resumed, y, grad_fn_for(b[t])).params
    torch.testing.assert_close(y, x, rtol=0, atol=0)


# ---------------------------------------------------------------------------- privacy
def test_porter_dp_theorem_1_noise_and_accountant_inputs():
    """σ_p = τ sqrt(T log(1/δ))/(m ε) (eq. 5); the papers' accountant: multiplier σ_p b/τ at
    rate b/m; the defensible one (reshuffled epochs): multiplier σ_p b/(2τ) once per use."""
    m, T, tau = 3256, 1000, 1.0
    for batch in (1, 4):
        alg = PORTER(
            0.01,
            0.5,
            option="dp",
            clip_threshold=tau,
            batch_size=batch,
            local_dataset_size=m,
            noise=DPNoise(epsilon=0.1, delta=1e-3),
        )
        alg.setup(num_clients=10, dim=5, num_rounds=T)
        sigma = tau * math.sqrt(T * math.log(1e3)) / (m * 0.1)
        assert alg.noise_std == pytest.approx(sigma)
        (mech,) = paper_mechanisms(alg)
        assert mech.sample_rate == pytest.approx(batch / m)
        assert mech.noise_multiplier == pytest.approx(sigma * batch / tau)
        assert "record-level" in mech.privacy_unit
        (mech,) = mechanisms(alg, 0)
        assert mech.sample_rate == 1.0 and mechanisms(alg, 1) == []  # one use per m/b rounds
        assert mech.noise_multiplier == pytest.approx(sigma * batch / (2 * tau))


def test_soteria_paper_noise_matches_porter():
    alg = SoteriaFL(
        0.1,
        0.5,
        clip_threshold=1.0,
        noise=DPNoise(epsilon=0.01, delta=1e-3),
        local_dataset_size=6000,
    )
    alg.setup(num_clients=10, dim=5, num_rounds=500)
    sigma = math.sqrt(500 * math.log(1e3)) / (6000 * 0.01)
    assert alg.noise_std == pytest.approx(sigma)
    (mech,) = paper_mechanisms(alg)
    assert mech.noise_multiplier == pytest.approx(sigma) and mech.sample_rate == 1 / 6000
    assert mechanisms(alg, 0)[0].noise_multiplier == pytest.approx(sigma / 2)  # replace-one: 2G


# ---------------------------------------------------------------------------- SoteriaFL
@pytest.mark.parametrize("private", [False, True])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_soteria_exact(private, chunk):
    b = targets(seed=6)
    x0 = torch.linspace(-2, 2, D, dtype=DT)
    noise = DPNoise(noise_multiplier=0.5, seed=9) if private else None
    alg = SoteriaFL(
        0.3,
        0.6,
        clip_threshold=1.2,
        compressor=RandKBiased(k=2),
        noise=noise,
        batch_size=B,
        local_dataset_size=20,
        seed=4,
    )
    xs, _ = run(alg, b, x0, chunk=chunk)
    std = 0.5 * 2 * 1.2 if private else 0.0  # b > 1: sensitivity 2G
    ref = ref_soteria(b, x0, 0.3, 0.6, 1.2, keep=2 / D, std=std, seed=4, noise_seed=9)
    assert_close_all(xs, ref)


# ---------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: PORTER(0.1, 0.0, option="gc"), "consensus_step_size"),
        (lambda: PORTER(-0.1, 0.5, option="gc"), "step_size"),
        (lambda: PORTER(0.1, 0.5, option="sgd"), "option"),
        (lambda: PORTER(0.1, 0.5, option="gc", clipping="hard"), "clipping"),
        (lambda: PORTER(0.1, 0.5, option="gc", clip_threshold=0), "clip_threshold"),
        (lambda: PORTER(0.1, 0.5, option="gc", noise=DPNoise(epsilon=1.0)), "noise"),
        (lambda: PORTER(0.1, 0.5, option="gc", batch_size=0), "batch_size"),
        (
            lambda: PORTER(0.1, 0.5, option="gc", batch_size=4, local_dataset_size=2),
            "local_dataset_size",
        ),
        (lambda: PORTER(0.1, 0.5, option="gc", topology="ring"), "topology"),
        (lambda: BEER(0.1, 0.5, compressor="randk"), "compressor"),
        (lambda: SoteriaFL(0.1, 0.0), "shift_step_size"),
        (lambda: SoteriaFL(0.1, 0.5, clip_threshold=-1), "clip_threshold"),
    ],
)
def test_bad_arguments(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


DP_FACTORIES = {
    "porter_dp": lambda noise=None, **kw: PORTER(
        0.1, 0.5, option="dp", noise=noise or DPNoise(epsilon=1.0), **kw
    ),
    "soteriafl": lambda noise=None, **kw: SoteriaFL(
        0.1, 0.5, noise=noise or DPNoise(epsilon=1.0), **kw
    ),
}


@pytest.mark.parametrize("name", list(DP_FACTORIES))
def test_record_sampling_takes_m_from_the_data_and_checks_b(name):
    """m defaults to the smallest shard; a larger m or a b the data does not deliver is refused
    before training; without data or m the noise cannot be calibrated. Sampling without
    replacement is accounted as such (replace-one only); reshuffled epochs by a record's uses."""
    make = DP_FACTORIES[name]
    data = dict(batch_size=2, local_batches=1, shuffle=True, client_sizes=[40, 37, 41])
    alg = make(batch_size=2)
    alg.configure_data(**data)
    alg.setup(num_clients=3, dim=D, num_rounds=10, dtype=DT)
    assert alg.local_dataset_size == 37 and level_of(alg.release()).paper_rate == pytest.approx(
        2 / 37
    )
    assert paper_mechanisms(alg)[0].sample_rate == pytest.approx(2 / 37)
    # by round k an example has been used ⌈2(k+1)/37⌉ times: rounds 0 and 18 (positions 36, 37)
    assert [len(mechanisms(alg, k)) for k in range(20)] == [1] + [0] * 17 + [1, 0]
    assert mechanisms(alg, 0)[0].sample_rate == 1.0
    wor = make(batch_size=2)
    wor.configure_data(**data, batch_sampling="without_replacement")
    wor.setup(num_clients=3, dim=D, num_rounds=10, dtype=DT)
    (mech,) = mechanisms(wor, 7)
    assert mech.sampling == "without_replacement" and mech.population == 37
    assert mech.sample_rate == pytest.approx(2 / 37) and mech.sample_size == 2
    with pytest.raises(ValueError, match="replace_one"):  # checked with the accounting, at setup
        add_remove = make(noise=DPNoise(epsilon=1.0, neighbouring="add_remove"), batch_size=2)
        add_remove.configure_data(**data, batch_sampling="without_replacement")
        add_remove.setup(num_clients=3, dim=D, num_rounds=10, dtype=DT)

    alg = make(batch_size=2, local_dataset_size=30)  # smaller: conservative, kept
    alg.configure_data(**data)
    assert alg.local_dataset_size == 30
    with pytest.raises(ValueError, match="local_dataset_size=38"):
        make(batch_size=2, local_dataset_size=38).configure_data(**data)
    with pytest.raises(ValueError, match="batch_size=1"):
        make(batch_size=1).configure_data(**data)
    with pytest.raises(ValueError, match="local_dataset_size"):
        make(batch_size=2).setup(num_clients=3, dim=D, num_rounds=10, dtype=DT)


def test_porter_dp_checks_the_batch_size_every_round():
    alg = PORTER(
        0.1,
        0.5,
        option="dp",
        noise=DPNoise(noise_multiplier=1.0),
        batch_size=2,
        local_dataset_size=10,
        topology=Topology(graph="ring"),
    )
    alg.setup(num_clients=N, dim=D, num_rounds=3, dtype=DT)
    with pytest.raises(ValueError, match="batch_size=2"):
        run_round(alg, torch.zeros(D, dtype=DT), grad_fn_for(targets(rounds=1)[0]))  # B = 3
