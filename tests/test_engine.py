"""The round engine: chunks of clients give the same iterates as the whole federation at once.

Every algorithm family through a real Trainer on the digits (float64, so that only the order of
floating-point sums differs between chunkings), with chunks of 1, 3 and all clients and each
gradient backend; the pieces the chunking relies on (per-client data, keyed streams, masked
shares of a secure sum, the neighbours' rows of a gossip, the clipped per-example mean) against
their whole-federation counterparts.
"""

import pytest
import torch
from helpers.engine import FAMILIES, Digits64
from helpers.training import trainer

from pl_privfed import FederatedModule
from pl_privfed.algorithms import (
    BEER,
    AlphaNormEC,
)
from pl_privfed.datamodules import CIFAR10DataModule, DigitsDataModule, DirichletPartitioner
from pl_privfed.engine import CHUNK_ENV, Reduction, choose_chunk_size, run_round
from pl_privfed.grads import GradientOracle
from pl_privfed.graphs import Topology
from pl_privfed.models import MLP
from pl_privfed.operators import Clip, SmoothClip, SmoothedNormalization
from pl_privfed.privacy import SecureAggregation

DT = torch.float64


def _fit(name, chunk, backend="auto", rounds=6, clients=7):
    make, data_kwargs = FAMILIES[name]
    torch.manual_seed(0)
    dm = Digits64(
        num_clients=clients,
        batch_size=8,
        seed=3,
        partitioner=DirichletPartitioner(concentration=0.5, seed=1),
        **data_kwargs,
    )
    module = FederatedModule(
        MLP(64, [16], 10).double(), make(), grad_backend=backend, client_chunk=chunk
    )
    trainer(max_steps=rounds).fit(module, datamodule=dm)
    return module


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_gives_the_same_iterates_with_any_chunk_size(name, monkeypatch):
    monkeypatch.delenv(
        CHUNK_ENV, raising=False
    )  # the chunks are this test's (the suite may set it)
    runs = [_fit(name, chunk) for chunk in (1, 3, "all")]
    whole = runs[-1]
    assert whole.chunk_size() == 7 and runs[0].chunk_size() == 1
    for run in runs[:-1]:
        for (key, a), (_, b) in zip(run.state_dict().items(), whole.state_dict().items()):
            if torch.is_tensor(a) and a.is_floating_point():
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=key)
            elif torch.is_tensor(a):
                assert torch.equal(a, b), key
    torch.manual_seed(0)
    initial = whole.layout.flatten(MLP(64, [16], 10).double())
    assert not torch.equal(whole.layout.flatten(whole.model), initial)  # it trained


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_chunks_with_the_other_backends(backend):
    a = _fit("per_sample_clipping", 2, backend=backend, rounds=3)
    b = _fit("per_sample_clipping", "all", backend="layers", rounds=3)
    torch.testing.assert_close(
        a.layout.flatten(a.model), b.layout.flatten(b.model), rtol=1e-11, atol=1e-12
    )


def test_chunk_size_choice_and_override(monkeypatch):
    monkeypatch.delenv(CHUNK_ENV, raising=False)  # the engine's own choice (the suite may set it)
    cpu = torch.device("cpu")
    assert choose_chunk_size(100, 199_210, cpu) == 7  # three [c, d] float32 tensors in 16 MiB
    assert choose_chunk_size(10_000, 7_850, cpu) == 178  # the quickstart (docs/engine.md)
    assert choose_chunk_size(100, 2_410, cpu) == 100
    assert choose_chunk_size(5000, 10, cpu) == 256
    assert choose_chunk_size(100, 199_210, torch.device("cuda")) == 100  # a GPU takes all
    assert choose_chunk_size(100, 10, cpu, requested=7) == 7
    assert choose_chunk_size(100, 10, cpu, requested="all") == 100
    monkeypatch.setenv(CHUNK_ENV, "1")
    assert choose_chunk_size(100, 10, cpu, requested="all") == 1
    with pytest.raises(ValueError, match="client_chunk"):
        FederatedModule(MLP(4, [], 2), AlphaNormEC(0.1, 0.1, 0.1), client_chunk=0)


@pytest.mark.parametrize("value", ["n", "some"])
def test_chunk_size_spellings_are_checked(value, monkeypatch):
    """Only ``auto``, ``all`` and positive integers: the former undocumented ``n`` is refused,
    naming the parameter (or the variable)."""
    monkeypatch.delenv(CHUNK_ENV, raising=False)
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match=f"client_chunk must be 'auto' or 'all', got '{value}'"):
        choose_chunk_size(10, 10, cpu, requested=value)
    with pytest.raises(ValueError, match="client_chunk must be 'auto' or 'all'"):
        FederatedModule(MLP(4, [], 2), AlphaNormEC(0.1, 0.1, 0.1), client_chunk=value)
    monkeypatch.setenv(CHUNK_ENV, value)
    with pytest.raises(ValueError, match=f"{CHUNK_ENV}='{value}' is not a chunk size"):
        choose_chunk_size(10, 10, cpu)


def test_a_decided_chunk_size_is_used_as_it_is(monkeypatch):
    """The chunk size is decided once (``choose_chunk_size``, at a module's setup): a round
    given a decided size uses it as it is; only an undecided one (``None``, ``auto``, ``all``)
    is decided there, with the environment's override."""
    monkeypatch.setenv(CHUNK_ENV, "1")
    n, d = 7, 3
    sizes = []

    def grad_fn(params, clients):
        sizes.append(len(clients))
        return torch.ones(len(clients), d)

    alg = AlphaNormEC(0.1, beta=0.1, alpha=0.01)
    alg.setup(num_clients=n, dim=d, num_rounds=3)
    run_round(alg, torch.zeros(d), grad_fn, chunk_size=3)
    assert sizes == [3, 3, 1]
    sizes.clear()
    run_round(alg, torch.zeros(d), grad_fn, chunk_size="all")  # undecided: the override applies
    assert sizes == [1] * n


def test_round_batch_serves_each_client_its_own_rows():
    dm = DigitsDataModule(num_clients=6, batch_size=5, local_batches=2, seed=2)
    dm.setup("fit")
    full = dm.round_indices(3)
    ids = torch.tensor([1, 4, 5])
    assert torch.equal(dm.round_indices(3, ids), full[ids])
    inputs, targets = next(iter(dm.train_dataloader())).clients(ids)
    assert inputs.shape == (3, 2, 5, 64)
    assert torch.equal(targets, dm.train_targets[dm.round_indices(0, ids)])


def test_cifar_augmentation_does_not_depend_on_the_chunking():
    class TinyCifar(CIFAR10DataModule):
        def load_datasets(self):
            g = torch.Generator().manual_seed(0)
            images = torch.randint(0, 256, (40, 3, 32, 32), generator=g, dtype=torch.uint8)
            data = torch.utils.data.TensorDataset(images, torch.arange(40) % 10)
            return data, data

    dm = TinyCifar(num_clients=4, batch_size=3, seed=1)
    dm.setup("fit")
    raw, _ = dm.gather(dm.round_indices(2))
    whole = dm.preprocess_clients(raw, 2, torch.arange(4))
    parts = [dm.preprocess_clients(raw[i : i + 1], 2, torch.tensor([i])) for i in range(4)]
    assert torch.equal(whole, torch.cat(parts))
    other_round = dm.preprocess_clients(raw, 3, torch.arange(4))
    assert not torch.equal(whole, other_round)  # a fresh augmentation every round


def test_secure_sum_from_chunk_shares():
    agg = SecureAggregation(fraction_bits=20, modulus_bits=48, seed=3)
    v = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=DT)
    cohort = torch.arange(6)
    masked, absolute = torch.zeros(5, dtype=torch.int64), torch.zeros(5, dtype=DT)
    for rows in (torch.tensor([0, 1]), torch.tensor([2]), torch.tensor([3, 4, 5])):
        share, size = agg.partial_sum(v[rows], 7, cohort, rows)
        masked, absolute = (masked + share) % agg.modulus, absolute + size
    assert torch.equal(agg.finish(masked, absolute, 6), agg.sum(v, 7))
    torch.testing.assert_close(agg.finish(masked, absolute, 6), v.sum(0), atol=6 * 2.0**-21, rtol=0)
    share, _ = agg.partial_sum(v[:2], 7, cohort, torch.tensor([0, 1]))
    assert not torch.equal(share, agg.encode(v[:2]).sum(0) % agg.modulus)  # masked


def test_sparse_gossip_reads_only_neighbours_and_equals_the_dense_product():
    n, d = 16, 4
    alg = BEER(0.1, 0.5, topology=Topology(graph="ring", weights="metropolis"))
    alg.setup(num_clients=n, dim=d, num_rounds=1, dtype=DT)
    assert not alg._dense_gossip  # 3 non-zeros per row of 16
    q = torch.randn(n, d, generator=torch.Generator().manual_seed(1), dtype=DT)
    alg.tracking_surrogate.copy_(q)
    want = alg.mixing_matrix.T @ q - q  # the paper's Q (W − I), agents as rows

    class Chunk:
        def __init__(self, ids):
            self.ids = ids

        def rows(self, name):
            return getattr(alg, name)[self.ids]

    got = torch.cat(
        [
            alg.gossip_rows("tracking_surrogate", Chunk(torch.tensor(ids)))
            for ids in ([0, 1], [2, 3, 4, 5], list(range(6, 16)))
        ]
    )
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    alg.DENSE_GOSSIP = 0.0
    alg._plan_gossip()
    assert alg._dense_gossip
    dense = alg.gossip_rows("tracking_surrogate", Chunk(torch.arange(n)))
    torch.testing.assert_close(dense, want, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("operator", [Clip(0.3), SmoothClip(0.5), SmoothedNormalization(0.01)])
@pytest.mark.parametrize("shared", [True, False])
def test_clipped_mean_without_per_example_gradients(operator, shared):
    """The analytic backend's ghost-clipping identity equals clipping the per-example
    gradients that vmap computes, then averaging."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 12),
        torch.nn.ReLU(),
        torch.nn.Linear(12, 10),
    ).double()
    criterion = torch.nn.CrossEntropyLoss()
    inputs = torch.randn(3, 5, 64, dtype=DT)
    targets = torch.randint(0, 10, (3, 5))
    analytic = GradientOracle(model, criterion, "layers")
    reference = GradientOracle(model, criterion, "vmap")
    x = analytic.layout.flatten(model)
    params = x if shared else x + 0.1 * torch.randn(3, x.numel(), dtype=DT)
    got = analytic.clipped_mean(params, inputs, targets, operator.scale)
    per_example = reference(params, inputs, targets, per_example=True).grads
    want = operator(per_example).mean(1)
    torch.testing.assert_close(got.grads, want, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(
        got.norms, torch.linalg.vector_norm(per_example, dim=-1), rtol=1e-12, atol=1e-13
    )
    generic = reference.clipped_mean(params, inputs, targets, operator.scale, max_bytes=1)
    torch.testing.assert_close(generic.grads, want, rtol=1e-12, atol=1e-13)


def test_reduction_sums_statistics_and_messages():
    red = Reduction(dim=4)
    red.add_rows("sent", torch.ones(2, 4))
    red.add_rows("sent", torch.full((3, 4), 2.0), weights=torch.tensor([1.0, 0.0, 1.0]))
    assert red.get("sent").tolist() == [6.0] * 4
    red.stat("norm_before", torch.tensor([1.0, 3.0]))
    red.stat("norm_before", torch.tensor([5.0]))
    assert red.mean("norm_before").item() == 3.0 and red.count("norm_before") == 3
    red.send("client_to_server", torch.tensor([4, 0]))
    red.send("client_to_server", torch.tensor([2]))
    msgs = red.messages("client_to_server")
    assert msgs.rows == 3 and msgs.dim == 4 and msgs.nonzeros.tolist() == [4, 0, 2]
    assert red.loss() is None and red.buffers() is None
    with pytest.raises(KeyError, match="nobody"):
        Reduction(2).get("nobody")
