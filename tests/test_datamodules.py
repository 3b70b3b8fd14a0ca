import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from pl_privfed.datamodules import (
    ClientStreams,
    DigitsDataModule,
    DirichletPartitioner,
    IIDPartitioner,
    QuadraticDataModule,
    SyntheticLogisticDataModule,
)


def digits(**kwargs):
    dm = DigitsDataModule(**{"num_clients": 10, "batch_size": 32, **kwargs})
    dm.setup("fit")
    return dm


def test_digits_shapes_and_split():
    dm = digits()
    x, y = dm.round_batch(0)
    assert x.shape == (10, 32, 64) and y.shape == (10, 32)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0 <= x.min() and x.max() <= 1 and set(y.unique().tolist()) <= set(range(10))
    assert len(dm.train_dataset) == 1437 and len(dm.test_dataset) == 360
    assert dm.num_classes == 10 and dm.input_shape == (64,)
    assert dm.rounds_per_epoch == 5  # ceil(1293 / 320): 144 of the 1437 are held out
    assert next(iter(dm.val_dataloader()))[0].shape == (144, 64)
    assert next(iter(dm.test_dataloader()))[0].shape == (360, 64)


def test_validation_is_held_out_of_the_training_data_before_partitioning():
    dm = digits(partitioner=DirichletPartitioner(0.5, seed=0))
    val = set(dm.val_indices.tolist())
    trained = np.concatenate(dm.shards)
    assert len(val) == 144 and not val & set(trained.tolist())  # no client trains on it
    assert sorted([*val, *trained.tolist()]) == list(range(1437))  # nothing else is lost
    labels = dm.train_targets.numpy()
    assert set(labels[dm.val_indices].tolist()) == set(range(10))  # stratified by label
    x, y = next(iter(dm.val_dataloader()))
    assert torch.equal(x, dm.train_inputs[dm.val_indices]) and len(y) == 144
    # seeded: the same seed holds out the same examples, another seed others
    assert np.array_equal(digits(seed=0).val_indices, digits(seed=0).val_indices)
    assert not np.array_equal(digits(seed=0).val_indices, digits(seed=1).val_indices)
    assert len(digits(val_fraction=0.25).val_indices) == 360  # ceil(0.25 · 1437)
    assert dm.describe()["val_size"] == 144 and dm.describe()["val_fraction"] == 0.1


def test_val_fraction_zero_validates_on_the_training_data():
    dm = digits(val_fraction=0)
    assert len(dm.val_indices) == 0 and sum(map(len, dm.shards)) == 1437
    x, _ = next(iter(dm.val_dataloader()))
    assert x.shape == (1024, 64)  # the training data, never the 360 test images
    assert dm.describe()["validation"] == "the clients' training data"
    quad = QuadraticDataModule(centers=[[3.0], [-3.0]])  # its default: f(x) is the objective
    quad.setup("fit")
    assert quad.val_fraction == 0 and next(iter(quad.val_dataloader()))[1].tolist() == [
        [3.0],
        [-3.0],
    ]


def test_natural_clients_hold_out_a_share_of_every_shard():
    dm = SyntheticLogisticDataModule(num_clients=4, samples_per_client=50, val_fraction=0.2)
    dm.setup("fit")
    assert [len(s) for s in dm.shards] == [32] * 4  # 40 training examples each, 8 held out
    assert len(dm.val_indices) == 32 and not set(dm.val_indices) & set(np.concatenate(dm.shards))
    with pytest.raises(ValueError, match=r"val_fraction=0\.9.*client 0"):
        SyntheticLogisticDataModule(num_clients=2, samples_per_client=2, val_fraction=0.9).setup()


@pytest.mark.parametrize("value", [1.0, -0.1, True, "0.1", None])
def test_val_fraction_is_checked(value):
    with pytest.raises(ValueError, match=f"val_fraction must be in \\[0, 1\\), got {value!r}"):
        DigitsDataModule(val_fraction=value)


def test_rounds_are_a_pure_function_of_seed_and_round():
    a, b, c = digits(seed=1), digits(seed=1), digits(seed=2)
    for k in (0, 3, 17, 4):
        assert torch.equal(a.round_indices(k), b.round_indices(k))
    assert not torch.equal(a.round_indices(3), c.round_indices(3))
    # evaluation order does not matter (no hidden sampler state)
    fresh = digits(seed=1)
    assert torch.equal(fresh.round_indices(17), a.round_indices(17))


def test_without_replacement_within_a_local_epoch():
    dm = digits(partitioner=DirichletPartitioner(0.5, seed=0), batch_size=8)
    client = 0
    size = int(dm.client_sizes[client])
    rounds = -(-size // 8) + 1
    stream = torch.cat([dm.round_indices(k)[client] for k in range(rounds)])
    first_epoch = stream[:size]
    assert sorted(first_epoch.tolist()) == sorted(dm.shards[client].tolist())
    second = stream[size : 2 * size]
    assert len(set(second.tolist())) == len(second)  # no repeats inside the next epoch either


def test_small_shard_batches_repeat_examples():
    # a client whose shard is smaller than the batch cycles through it (one example, 3 draws)
    streams = ClientStreams([np.array([0]), np.array([1, 2, 3])], batch_size=3, seed=0)
    assert streams.indices(0)[0].tolist() == [0, 0, 0]
    assert sorted(streams.indices(0)[1].tolist()) == [1, 2, 3]


def test_batch_larger_than_every_shard_is_refused():
    """Today's behaviour was to repeat every shard ~B/N times per batch, silently."""
    dm = QuadraticDataModule(centers=[[1.0], [2.0]])  # one example per client
    dm.batch_size = 3
    with pytest.raises(ValueError, match=r"batch_size=3 is larger than every client's shard"):
        dm.setup("fit")
    full = digits(num_clients=3, batch_size=479, partitioner=IIDPartitioner(0), val_fraction=0.0)
    # 1,437 = 3 × 479 (nothing held out for validation): batch = shard, full-batch rounds
    assert sorted(full.round_indices(0)[0].tolist()) == sorted(full.shards[0].tolist())


class _FakeTrainer:
    def __init__(self, global_step):
        self.global_step = global_step


def test_loader_resumes_from_global_step():
    dm = digits()
    full = [b.dense()[0] for b in dm.train_dataloader()]
    assert len(full) == dm.rounds_per_epoch
    dm.trainer = _FakeTrainer(3)
    rest = [b.dense()[0] for b in dm.train_dataloader()]
    assert len(rest) == dm.rounds_per_epoch - 3
    assert all(torch.equal(a, b) for a, b in zip(rest, full[3:]))
    dm.trainer = _FakeTrainer(7)  # second epoch, round 2 of it
    assert torch.equal(next(iter(dm.train_dataloader())).dense()[0], dm.round_batch(7)[0])


def test_quadratic_module():
    dm = QuadraticDataModule(centers=[[3.0], [-3.0]])
    dm.setup("fit")
    assert dm.num_clients == 2 and dm.num_classes is None
    _, y = dm.round_batch(5)
    assert y.tolist() == [[[3.0]], [[-3.0]]]
    with pytest.raises(ValueError, match="num_clients"):
        QuadraticDataModule(centers=[[1.0]], num_clients=3)
    random = QuadraticDataModule(num_clients=4, dim=3, seed=1)
    random.setup("fit")
    assert random.round_batch(0)[1].shape == (4, 1, 3)


def test_synthetic_logistic_is_non_iid():
    dm = SyntheticLogisticDataModule(num_clients=6, alpha=1.0, beta=1.0, seed=0)
    dm.setup("fit")
    x, y = dm.round_batch(0)
    assert x.shape == (6, 16, 20) and y.shape == (6, 16)
    hists = [np.bincount(dm.train_targets[s].numpy(), minlength=5) for s in dm.shards]
    assert len({int(np.argmax(h)) for h in hists}) > 1  # clients differ in their majority class
    assert len(dm.test_dataset) == 6 * 20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_clients": 0}, "num_clients"),
        ({"batch_size": 0}, "batch_size"),
        ({"partitioner": "iid"}, "partitioner"),
    ],
)
def test_constructor_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DigitsDataModule(**kwargs)


def test_more_clients_than_examples_fails_in_setup():
    with pytest.raises(ValueError, match="more than the 1293"):
        DigitsDataModule(num_clients=2000).setup("fit")


class _Probe(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.shapes = []

    def training_step(self, batch, batch_idx):
        self.shapes.append(tuple(batch[0].shape))
        self.optimizers().step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_real_trainer_consumes_rounds():
    probe = _Probe()
    trainer = pl.Trainer(
        max_steps=7,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(probe, datamodule=DigitsDataModule(num_clients=10, batch_size=32))
    assert probe.shapes == [(10, 32, 64)] * 7
    assert trainer.global_step == 7
