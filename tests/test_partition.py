import numpy as np
import pytest

from pl_privfed.datamodules import (
    ClassesPerClientPartitioner,
    DirichletPartitioner,
    FixedSizePartitioner,
    IIDPartitioner,
    classes_per_client_partition,
    dirichlet_partition,
    iid_partition,
)

LABELS = np.repeat(np.arange(10), 100)  # 1,000 examples, 10 balanced classes
np.random.default_rng(0).shuffle(LABELS)


def assert_disjoint_covering(shards, n_total):
    joined = np.concatenate(shards)
    assert len(joined) == len(np.unique(joined)) == n_total
    assert all(len(s) > 0 for s in shards)


def mean_label_entropy(shards):
    ent = []
    for s in shards:
        p = np.bincount(LABELS[s], minlength=10) / len(s)
        p = p[p > 0]
        ent.append(-(p * np.log(p)).sum())
    return float(np.mean(ent))


@pytest.mark.parametrize(
    "partitioner",
    [IIDPartitioner(seed=3), DirichletPartitioner(0.3, seed=3), ClassesPerClientPartitioner(2)],
)
def test_disjoint_covering_and_seeded(partitioner):
    shards = partitioner(LABELS, 10)
    assert len(shards) == 10
    assert_disjoint_covering(shards, len(LABELS))
    again = partitioner(LABELS, 10)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again))


def test_different_seeds_differ():
    a = iid_partition(LABELS, 5, seed=0)
    b = iid_partition(LABELS, 5, seed=1)
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))
    assert [len(s) for s in a] == [200] * 5


def test_dirichlet_skew_grows_as_concentration_shrinks():
    skewed = dirichlet_partition(LABELS, 10, 0.1, seed=0)
    mild = dirichlet_partition(LABELS, 10, 100.0, seed=0)
    assert mean_label_entropy(skewed) < mean_label_entropy(mild) - 0.5
    assert mean_label_entropy(mild) > 0.95 * np.log(10)


def test_dirichlet_min_size():
    shards = dirichlet_partition(LABELS, 20, 0.1, seed=0, min_size=20)
    assert min(len(s) for s in shards) >= 20


@pytest.mark.parametrize("k", [1, 2, 5, 10])
def test_classes_per_client(k):
    shards = classes_per_client_partition(LABELS, 10, k, seed=1)
    for s in shards:
        assert len(np.unique(LABELS[s])) == k
    assert_disjoint_covering(shards, len(LABELS))


def test_classes_per_client_samples_per_client():
    shards = ClassesPerClientPartitioner(1, samples_per_client=40)(LABELS, 10)
    assert [len(s) for s in shards] == [40] * 10
    assert all(len(np.unique(LABELS[s])) == 1 for s in shards)
    assert len(np.unique(np.concatenate(shards))) == 400
    with pytest.raises(ValueError, match="not enough"):
        ClassesPerClientPartitioner(1, samples_per_client=200)(LABELS, 10)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: iid_partition(LABELS, 1001), "more than the 1000"),
        (lambda: iid_partition(LABELS, 0), "num_clients"),
        (lambda: DirichletPartitioner(0.0), "concentration"),
        (lambda: DirichletPartitioner(-1.0), "concentration"),
        (lambda: ClassesPerClientPartitioner(0), "classes_per_client"),
        (lambda: ClassesPerClientPartitioner(11)(LABELS, 5), "classes_per_client"),
        (lambda: dirichlet_partition(LABELS, 10, 0.01, min_size=101), "min_size"),
    ],
)
def test_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_empty_client_is_reported():
    labels = np.array([0, 0, 1, 1, 2])
    with pytest.raises(ValueError, match="client"):
        # 5 examples, 5 clients, extreme Dirichlet: some client gets nothing in every draw
        dirichlet_partition(labels, 5, 0.001, seed=0, max_attempts=5)


@pytest.mark.parametrize("concentration", [None, 0.3])
def test_fixed_size_partition_serves_populations_larger_than_the_data(concentration):
    labels = np.arange(200) % 10
    part = FixedSizePartitioner(8, concentration, seed=3)
    shards = part(labels, 1_000)  # 8,000 client examples from 200: clients share examples
    assert len(shards) == 1_000 and {len(s) for s in shards} == {8}
    assert all(0 <= s.min() and s.max() < 200 for s in shards)
    again = part(labels, 1_000)
    assert all(np.array_equal(a, b) for a, b in zip(shards, again))  # seeded
    if concentration is None:
        assert all(len(np.unique(s)) == 8 for s in shards)  # distinct within a client
    else:  # Dirichlet(0.3): most clients see few classes
        classes = [len(np.unique(labels[s])) for s in shards]
        assert np.mean(classes) < 5
    with pytest.raises(ValueError, match="examples_per_client"):
        FixedSizePartitioner(0)
    with pytest.raises(ValueError, match="concentration"):
        FixedSizePartitioner(4, concentration=-1.0)
