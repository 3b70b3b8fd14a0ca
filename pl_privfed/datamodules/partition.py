"""Seeded partitioners that split a labelled dataset across clients.

Each partitioner maps the training labels to one sorted index array per client; the shards are
disjoint and non-empty, and (unless ``samples_per_client`` subsamples) cover the dataset.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from pl_privfed.checks import check_positive_int

__all__ = [
    "ClassesPerClientPartitioner",
    "DirichletPartitioner",
    "FixedSizePartitioner",
    "IIDPartitioner",
    "Partitioner",
    "classes_per_client_partition",
    "dirichlet_partition",
    "fixed_size_partition",
    "iid_partition",
]


def _check_num_clients(num_clients: int, num_examples: int) -> None:
    check_positive_int("num_clients", num_clients)
    if num_clients > num_examples:
        raise ValueError(
            f"num_clients={num_clients} is more than the {num_examples} training examples"
        )


def _finish(shards: list[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]


def iid_partition(labels: np.ndarray, num_clients: int, seed: int = 0) -> list[np.ndarray]:
    """Shuffle, then split into ``num_clients`` nearly equal shards.

    >>> [len(s) for s in iid_partition(np.zeros(10), 3)]
    [4, 3, 3]
    """
    _check_num_clients(num_clients, len(labels))
    perm = np.random.default_rng(seed).permutation(len(labels))
    return _finish(np.array_split(perm, num_clients))


def dirichlet_partition(
    labels: np.ndarray,
    num_clients: int,
    concentration: float,
    seed: int = 0,
    min_size: int = 1,
    max_attempts: int = 1000,
) -> list[np.ndarray]:
    """Label-Dirichlet split: each class is divided among clients in proportions ``~ Dir(c·1)``.

    Redraws (continuing the same seeded generator) until every client holds at least
    ``min_size`` examples.
    """
    if not concentration > 0:
        raise ValueError(f"concentration must be positive, got {concentration!r}")
    if not isinstance(min_size, int) or min_size < 1:
        raise ValueError(f"min_size must be a positive integer, got {min_size!r}")
    labels = np.asarray(labels)
    _check_num_clients(num_clients, len(labels))
    if num_clients * min_size > len(labels):
        raise ValueError(
            f"min_size={min_size} per client needs {num_clients * min_size} examples, "
            f"only {len(labels)} available"
        )
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _ in range(max_attempts):
        shards: list[list[int]] = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            props = rng.dirichlet(np.full(num_clients, float(concentration)))
            cuts = (np.cumsum(props)[:-1] * len(idx)).astype(int)
            for shard, part in zip(shards, np.split(idx, cuts)):
                shard.extend(part.tolist())
        sizes = [len(s) for s in shards]
        if min(sizes) >= min_size:
            return _finish(shards)
    raise ValueError(
        f"DirichletPartitioner(concentration={concentration}) left a client with fewer than "
        f"min_size={min_size} examples in {max_attempts} draws (smallest: client "
        f"{int(np.argmin(sizes))} with {min(sizes)}); raise concentration or lower num_clients"
    )


def classes_per_client_partition(
    labels: np.ndarray,
    num_clients: int,
    classes_per_client: int,
    seed: int = 0,
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """Pathological split: each client holds examples of exactly ``classes_per_client`` classes.

    Client ``i`` gets classes ``order[(i·k + j) mod C]`` for ``j < k`` (``order`` a seeded
    shuffle of the ``C`` classes), so every class is used when ``n·k >= C``. Without
    ``samples_per_client`` each class's examples are split evenly among the clients holding it;
    with it (paper 003: 1,024 images per worker) each client gets exactly that many examples,
    spread evenly over its classes, disjoint from the other clients'.
    """
    labels = np.asarray(labels)
    classes = np.unique(labels)
    num_classes = len(classes)
    if (
        isinstance(classes_per_client, bool)
        or not isinstance(classes_per_client, int)
        or not 1 <= classes_per_client <= num_classes
    ):
        raise ValueError(
            f"classes_per_client must be in [1, {num_classes}], got {classes_per_client!r}"
        )
    if samples_per_client is not None and samples_per_client < classes_per_client:
        raise ValueError(
            f"samples_per_client must be >= classes_per_client={classes_per_client}, "
            f"got {samples_per_client!r}"
        )
    _check_num_clients(num_clients, len(labels))
    rng = np.random.default_rng(seed)
    order = rng.permutation(classes)
    k = classes_per_client
    owned = [[order[(i * k + j) % num_classes] for j in range(k)] for i in range(num_clients)]
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for i, cs in enumerate(owned):
        for c in cs:
            holders[int(c)].append(i)
    pools = {int(c): rng.permutation(np.flatnonzero(labels == c)) for c in classes}
    shards: list[list[int]] = [[] for _ in range(num_clients)]
    if samples_per_client is None:
        for c, owners in holders.items():
            for owner, part in zip(owners, np.array_split(pools[c], max(len(owners), 1))):
                if owners:
                    shards[owner].extend(part.tolist())
    else:
        taken = dict.fromkeys(holders, 0)
        for i, cs in enumerate(owned):
            counts = [len(a) for a in np.array_split(np.arange(samples_per_client), k)]
            for c, count in zip(cs, counts):
                c = int(c)
                start = taken[c]
                if start + count > len(pools[c]):
                    raise ValueError(
                        f"samples_per_client={samples_per_client}: class {c} has "
                        f"{len(pools[c])} examples, not enough for its {len(holders[c])} clients"
                    )
                shards[i].extend(pools[c][start : start + count].tolist())
                taken[c] = start + count
    return _finish(shards)


def fixed_size_partition(
    labels: np.ndarray,
    num_clients: int,
    examples_per_client: int,
    concentration: float | None = None,
    seed: int = 0,
) -> list[np.ndarray]:
    """Every client holds ``examples_per_client`` examples drawn from the dataset, for
    populations larger than the dataset (cross-device federations of 10,000 to 100,000+
    clients simulated from MNIST): clients' shards may overlap.

    Without ``concentration`` a client's examples are distinct and uniform over the dataset;
    with it, the client's class proportions are ``~ Dir(concentration · 1)`` (the label skew of
    :func:`dirichlet_partition`) and its examples of class ``c`` are drawn uniformly, with
    replacement, from class ``c``'s examples. Vectorized over clients (100,000 clients of 32
    examples take about a second).

    >>> shards = fixed_size_partition(np.arange(20) % 4, 50, 3, seed=1)
    >>> len(shards), {len(s) for s in shards}
    (50, {3})
    """
    labels = np.asarray(labels)
    check_positive_int("num_clients", num_clients)
    k = check_positive_int("examples_per_client", examples_per_client)
    rng = np.random.default_rng(seed)
    if concentration is None:
        if k > len(labels):
            raise ValueError(
                f"examples_per_client={k} is more than the {len(labels)} training examples"
            )
        draws = rng.integers(0, len(labels), (num_clients, k))
        while True:  # redraw the rows with a repeated example (rare when k << the dataset)
            ordered = np.sort(draws, axis=1)
            repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
            if not repeated.any():
                break
            draws[repeated] = rng.integers(0, len(labels), (int(repeated.sum()), k))
        return _finish(list(draws))
    classes = np.unique(labels)
    pools = [np.flatnonzero(labels == c) for c in classes]
    proportions = rng.dirichlet(np.full(len(classes), float(concentration)), size=num_clients)
    counts = rng.multinomial(k, proportions)  # [clients, classes]
    rows = np.empty((num_clients, k), dtype=np.int64)
    filled = np.zeros(num_clients, dtype=np.int64)
    for c, pool in enumerate(pools):
        per_client = counts[:, c]
        picks = pool[rng.integers(0, len(pool), int(per_client.sum()))]
        owners = np.repeat(np.arange(num_clients), per_client)
        slots = filled[owners] + (
            np.arange(len(owners)) - np.repeat(np.cumsum(per_client) - per_client, per_client)
        )
        rows[owners, slots] = picks
        filled += per_client
    return _finish(list(rows))


class Partitioner(ABC):
    """Splits training labels across clients; subclasses are configurable from YAML."""

    def __call__(self, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        labels = np.asarray(labels)
        _check_num_clients(num_clients, len(labels))
        shards = self.split(labels, num_clients)
        for i, shard in enumerate(shards):
            if len(shard) == 0:
                raise ValueError(f"{self!r} left client {i} empty ({num_clients} clients)")
        return shards

    @abstractmethod
    def split(self, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        """The partition (override)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class IIDPartitioner(Partitioner):
    """Uniformly shuffled, nearly equal shards."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def split(self, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        return iid_partition(labels, num_clients, self.seed)


class DirichletPartitioner(Partitioner):
    """Label-Dirichlet non-IID split (smaller ``concentration`` = more skewed clients).

    Args:
        concentration: Dirichlet parameter ``> 0``.
        seed: partition seed.
        min_size: every client gets at least this many examples (redraws until it does).
    """

    def __init__(self, concentration: float, seed: int = 0, min_size: int = 1) -> None:
        if not (isinstance(concentration, int | float) and concentration > 0):
            raise ValueError(f"concentration must be positive, got {concentration!r}")
        self.concentration = float(concentration)
        self.seed = seed
        self.min_size = min_size

    def split(self, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        return dirichlet_partition(
            labels, num_clients, self.concentration, self.seed, self.min_size
        )


class ClassesPerClientPartitioner(Partitioner):
    """Each client holds ``classes_per_client`` classes (``1`` = paper 003's extreme).

    Args:
        classes_per_client: classes per client, in ``[1, number of classes]``.
        seed: partition seed.
        samples_per_client: exact shard size (subsamples the dataset), or ``None``.
    """

    def __init__(
        self, classes_per_client: int, seed: int = 0, samples_per_client: int | None = None
    ) -> None:
        if isinstance(classes_per_client, bool) or not isinstance(classes_per_client, int):
            raise ValueError(f"classes_per_client must be an integer, got {classes_per_client!r}")
        if classes_per_client < 1:
            raise ValueError(f"classes_per_client must be >= 1, got {classes_per_client!r}")
        self.classes_per_client = classes_per_client
        self.seed = seed
        self.samples_per_client = samples_per_client

    def split(self, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        return classes_per_client_partition(
            labels, num_clients, self.classes_per_client, self.seed, self.samples_per_client
        )


class FixedSizePartitioner(Partitioner):
    """Every client holds ``examples_per_client`` examples, with a Dirichlet label skew if
    ``concentration`` is given; populations larger than the dataset share examples
    (:func:`fixed_size_partition`).

    Args:
        examples_per_client: ``k``, each client's shard size.
        concentration: Dirichlet parameter ``> 0`` of each client's class proportions, or
            ``None`` for uniform shards.
        seed: partition seed.
    """

    def __init__(
        self, examples_per_client: int, concentration: float | None = None, seed: int = 0
    ) -> None:
        self.examples_per_client = check_positive_int("examples_per_client", examples_per_client)
        if concentration is not None and not (
            isinstance(concentration, int | float) and concentration > 0
        ):
            raise ValueError(f"concentration must be positive or null, got {concentration!r}")
        self.concentration = None if concentration is None else float(concentration)
        self.seed = seed

    def __call__(self, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        return self.split(np.asarray(labels), num_clients)  # more clients than examples is fine

    def split(self, labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
        return fixed_size_partition(
            labels, num_clients, self.examples_per_client, self.concentration, self.seed
        )
