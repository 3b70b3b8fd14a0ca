"""Clients in the span of their data (``client_span``, :mod:`pl_privfed.layer_rules.span`,
:class:`~pl_privfed.engine.SpanRows`): the
coordinates are an isometry of the gradients (unit), and a run whose clients compute there has
the iterates of the run that forms every ``[c, d]`` gradient, for every algorithm that declares
it can (α-NormEC with and without noise or server normalization, Clip21, distributed DP-SGD),
in a single run and in a grid over step sizes and seeds; anything else is refused or left in
``d`` dimensions."""

import pytest
import torch
from helpers.training import trainer

from pl_privfed import FederatedModule
from pl_privfed.algorithms import EF21, AlphaNormEC, Clip21, DistributedDPSGD
from pl_privfed.callbacks import PrivacyAudit
from pl_privfed.datamodules import DigitsDataModule, FixedSizePartitioner
from pl_privfed.engine import DENSE, SpanRows
from pl_privfed.grads import GradientOracle
from pl_privfed.grid import GridModule
from pl_privfed.grid.seeds import RUN_SEED
from pl_privfed.layer_rules import ClientSpan
from pl_privfed.models import MLP, LogisticRegression
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise


def test_coordinates_are_an_isometry_of_the_gradients():
    torch.manual_seed(0)
    n, m, din, out = 6, 5, 12, 3
    examples = torch.randn(n, m, din, dtype=torch.float64)
    examples[1, 3:] = 0  # a client with 3 examples (padded)
    examples[2, 1] = examples[2, 0]  # a repeated example: a rank-deficient client
    basis = ClientSpan.orthonormal(examples)
    assert torch.allclose(basis @ basis.mT, torch.eye(m, dtype=torch.float64).expand(n, m, m))
    d = out * din + out
    span = ClientSpan(basis, (0, out), (out * din, out), d)
    assert span.rank == m * out + out
    g = torch.randn(n, m, out, dtype=torch.float64)
    weight = torch.einsum("nbi,nji,nbo->njo", examples, basis, g)  # C[j, o] = Σ_b (a_b·q_j) g_bo
    coords = torch.cat([weight.flatten(1), g.sum(1)], 1)
    dense = torch.cat([torch.einsum("nbo,nbi->noi", g, examples).flatten(1), g.sum(1)], 1)
    assert torch.allclose(span.lift(basis, coords), dense)  # plain loop: one client at a time
    assert torch.allclose(coords.norm(dim=1), dense.norm(dim=1))  # norms, so Ψ, are the same
    weights = torch.rand(n, dtype=torch.float64)
    assert torch.allclose(span.expand(basis, coords, weights), weights @ dense)
    together = span.expand_many(basis, [coords, weights[:, None] * coords])  # one product
    assert torch.allclose(together[0], dense.sum(0))
    assert torch.allclose(together[1], weights @ dense)
    assert span.rows(torch.tensor([2, 3, 4])).data_ptr() == basis[2].data_ptr()  # a view


def _data():
    # 6 examples a client, minibatches of 4 (a round's examples are a subset of the shard), and
    # shards that share examples (FixedSizePartitioner draws each client's from its classes)
    partitioner = FixedSizePartitioner(examples_per_client=6, concentration=1.0, seed=0)
    return DigitsDataModule(num_clients=300, batch_size=4, partitioner=partitioner)


def _fit(tmp_path, algorithm, span, model=None, rounds=5, data=None, **kwargs):
    torch.manual_seed(0)
    model = model or LogisticRegression(64, 10)
    module = FederatedModule(model, algorithm, client_span=span, client_chunk=50, **kwargs)
    trainer(tmp_path / span, max_steps=rounds).fit(module, datamodule=data or _data())
    return module


FAMILIES = {
    "alpha_normec": lambda: AlphaNormEC(0.1, beta=0.1, alpha=0.01),
    "alpha_normec_gradient_init": lambda: AlphaNormEC(
        0.1, beta=0.1, alpha=0.01, memory_init="gradient"
    ),
    "dp_alpha_normec_distributed": lambda: AlphaNormEC(
        0.1,
        beta=0.1,
        alpha=0.01,
        noise=DPNoise(noise_multiplier=1.0, seed=3, placement="distributed", min_contributors=90),
    ),
    "dp_alpha_normec_no_sn_central": lambda: AlphaNormEC(
        1.0,
        beta=0.1,
        alpha=0.01,
        server_normalization=False,
        noise=DPNoise(noise_multiplier=1.0, seed=3, placement="central"),
    ),
    "dp_clip21": lambda: Clip21(0.5, clip_threshold=0.3, noise=DPNoise(noise_multiplier=1.0)),
    "dp_sgd_distributed": lambda: DistributedDPSGD(
        0.5, Clip(1.0), noise=DPNoise(noise_multiplier=1.0, seed=5)
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_run_in_the_span_has_the_iterates_of_the_dense_run(family, tmp_path):
    dense = _fit(tmp_path, FAMILIES[family](), "off")
    spanned = _fit(tmp_path, FAMILIES[family](), "on")
    rows = spanned.algorithm.client_rows
    assert isinstance(rows, SpanRows) and dense.algorithm.client_rows is DENSE
    for name in spanned.algorithm.state.names:  # [N, r·out + out], never [N, d]
        assert spanned.algorithm.state.table(name).shape[-1] == rows.rank, name
    for a, b in zip(dense.model.parameters(), spanned.model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), family
    torch.manual_seed(0)
    start = LogisticRegression(64, 10)
    moved = [not torch.allclose(a, b) for a, b in zip(start.parameters(), dense.parameters())]
    assert any(moved)  # it trained


def test_auto_chooses_the_span_only_where_it_is_exact(tmp_path):
    auto = _fit(tmp_path, AlphaNormEC(0.1, beta=0.1, alpha=0.01), "auto")
    assert isinstance(auto.algorithm.client_rows, SpanRows)
    ef21 = _fit(tmp_path / "ef21", EF21(0.1), "auto")  # top-k is not norm-based
    assert ef21.algorithm.client_rows is DENSE
    per_client = DPNoise(noise_multiplier=1.0, draws="per_client")
    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=per_client)
    assert _fit(tmp_path / "pc", alg, "auto").algorithm.client_rows is DENSE
    mlp = _fit(tmp_path / "mlp", AlphaNormEC(0.1, beta=0.1, alpha=0.01), "auto", MLP(64, [8], 10))
    assert mlp.algorithm.client_rows is DENSE


def test_auto_keeps_d_dimensions_where_the_basis_is_wider_than_two_minibatches(tmp_path):
    """Shards of 6 with minibatches of 2: a basis of 6 rows costs more than the d-dimensional
    gradients of 2 examples (engine.span.SPAN_WIDEST_BASIS); ``on`` still runs it, exactly."""

    def narrow():
        partitioner = FixedSizePartitioner(examples_per_client=6, concentration=1.0, seed=0)
        return DigitsDataModule(num_clients=300, batch_size=2, partitioner=partitioner)

    auto = _fit(tmp_path, AlphaNormEC(0.1, beta=0.1, alpha=0.01), "auto", data=narrow())
    assert auto.algorithm.client_rows is DENSE
    forced = _fit(tmp_path, AlphaNormEC(0.1, beta=0.1, alpha=0.01), "on", data=narrow())
    assert isinstance(forced.algorithm.client_rows, SpanRows)
    for a, b in zip(auto.model.parameters(), forced.model.parameters(), strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("make", "model", "match"),
    [
        (lambda: EF21(0.1), None, "EF21's client lines"),
        (lambda: AlphaNormEC(0.1, 0.1, 0.01), MLP(64, [8], 10), "not one Linear layer"),
        (
            lambda: AlphaNormEC(0.1, 0.1, 0.01, memory_init="gradient_offset"),
            None,
            "AlphaNormEC's client lines",
        ),
    ],
)
def test_on_says_why_a_run_cannot_be_in_the_span(make, model, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        _fit(tmp_path, make(), "on", model)


def test_client_span_is_checked():
    with pytest.raises(ValueError, match="client_span"):
        FederatedModule(LogisticRegression(64, 10), AlphaNormEC(0.1, 0.1, 0.01), client_span="yes")


@pytest.mark.parametrize("seeds", [False, True])
def test_a_grid_in_the_span_equals_the_dense_grid(seeds, tmp_path):
    noise = DPNoise(noise_multiplier=1.0, seed=3, placement="distributed", min_contributors=90)
    grid = [{"step_size": 0.1}, {"step_size": 0.3}]
    if seeds:
        grid = [{**point, RUN_SEED: s} for point in grid for s in (0, 1)]
    runs = {}
    for span in ("off", "on"):
        torch.manual_seed(0)
        alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01, noise=noise)
        module = GridModule(LogisticRegression(64, 10), alg, grid=grid, client_span=span)
        trainer(tmp_path / span, max_steps=4).fit(module, datamodule=_data())
        runs[span] = module
    assert all(isinstance(runs["on"].grid_rows(k), SpanRows) for k in range(len(grid)))
    assert all(runs["off"].grid_rows(k) is DENSE for k in range(len(grid)))
    assert torch.allclose(runs["off"].grid_params, runs["on"].grid_params, rtol=1e-4, atol=1e-5)


def test_an_audited_run_keeps_its_clients_in_the_span(tmp_path):
    """The audit's canary clients are clients of the span (tests/test_span_audit.py); canary
    records, which join the clients' d-dimensional gradients, are refused there."""
    torch.manual_seed(0)
    alg = DistributedDPSGD(0.5, Clip(1.0), noise=DPNoise(noise_multiplier=1.0, seed=5))
    module = FederatedModule(LogisticRegression(64, 10), alg, client_chunk=50)
    audit = PrivacyAudit()
    trainer(tmp_path, max_steps=2, callbacks=[audit]).fit(module, datamodule=_data())
    assert isinstance(module.algorithm.client_rows, SpanRows) and audit.report() is not None
    alg = DistributedDPSGD(0.5, Clip(1.0), noise=DPNoise(noise_multiplier=1.0, seed=5))
    module = FederatedModule(LogisticRegression(64, 10), alg, client_chunk=50, client_span="on")
    with pytest.raises(ValueError, match="PrivacyAudit reads the clients' d-dimensional rows"):
        trainer(tmp_path, max_steps=1, callbacks=[PrivacyAudit(level="record")]).fit(
            module, datamodule=_data()
        )


def test_the_basis_forward_gives_the_cross_entropy_gradients_of_a_plain_loop():
    """Logits from the examples' coordinates, minibatches that are subsets of a shard in any
    order, shards of different sizes that share examples (as FixedSizePartitioner's may), and
    several parameter vectors at once: against autograd, one client at a time."""
    torch.manual_seed(1)
    n, m, din, out, k = 4, 6, 9, 3, 2
    pool = torch.randn(20, din, dtype=torch.float64)
    shards = [
        torch.tensor(s)
        for s in ([0, 1, 2, 3, 4, 5], [6, 7, 8, 9], [10, 11, 0, 12, 13, 14], [15, 16, 17, 18, 1])
    ]
    examples = torch.zeros(n, m, din, dtype=torch.float64)
    members = torch.full((n, m), -1)
    for i, shard in enumerate(shards):
        examples[i, : len(shard)], members[i, : len(shard)] = pool[shard], shard
    model = LogisticRegression(din, out).double()
    span = GradientOracle(model, torch.nn.CrossEntropyLoss()).layer_rules().span(examples, members)
    labels = torch.randint(0, out, (len(pool),))
    batch = torch.stack([shard[torch.randperm(len(shard))[:3]] for shard in shards])  # [n, 3]
    params = torch.randn(k, span.dim, dtype=torch.float64)
    coords, losses = span.gradients(params, torch.arange(n), batch, labels[batch])
    for j in range(k):
        lifted = span.lift(span.basis, coords[j])
        for i in range(n):
            w = params[j, : out * din].view(out, din).clone().requires_grad_()
            b = params[j, out * din :].clone().requires_grad_()
            logits = pool[batch[i]] @ w.T + b
            loss = torch.nn.functional.cross_entropy(logits, labels[batch[i]])
            gw, gb = torch.autograd.grad(loss, (w, b))
            assert torch.allclose(lifted[i], torch.cat([gw.flatten(), gb]))
            assert torch.allclose(losses[j, i], loss.detach())
    with pytest.raises(ValueError, match="outside its client's shard"):
        span.gradients(params, torch.arange(n), batch.roll(1, 0), labels[batch])
