"""The validation split: examples held out of training before (or, for natural per-client data,
within) the partition across clients, seeded by the run's seed."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["hold_out_per_client", "validation_split"]

#: Stream tag of the validation split's generator (distinct from the subsample's and the shards').
_VALIDATION_TAG = 0x7A11D


def _validation_seed(seed: int) -> int:
    """A 32-bit ``random_state`` for scikit-learn, derived from ``seed`` and the split's tag."""
    return int(np.random.SeedSequence([seed, _VALIDATION_TAG]).generate_state(1)[0])


def validation_split(
    labels: np.ndarray, fraction: float, seed: int, stratify: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of ``len(labels)`` examples into ``(train, validation)`` index arrays.

    :func:`sklearn.model_selection.train_test_split` with ``test_size=fraction`` (so the
    validation set has ``ceil(fraction · N)`` examples), stratified by ``labels`` when
    ``stratify`` is true and every class has at least two examples and the validation and
    training parts can each hold one of every class (else a plain seeded random split). Both
    arrays are sorted; ``fraction = 0`` gives every index to training.

    >>> train, val = validation_split(np.repeat([0, 1], 10), 0.1, seed=0)
    >>> len(train), len(val), sorted(np.repeat([0, 1], 10)[val].tolist())
    (18, 2, [0, 1])
    """
    n = len(labels)
    if fraction == 0:
        return np.arange(n, dtype=np.int64), np.zeros(0, dtype=np.int64)
    n_val = math.ceil(fraction * n)
    if n_val >= n:
        raise ValueError(f"val_fraction={fraction} leaves no training example out of {n}: lower it")
    strata = None
    if stratify:
        _, counts = np.unique(labels, return_counts=True)
        if counts.min() >= 2 and min(n_val, n - n_val) >= len(counts):
            strata = labels
    from sklearn.model_selection import train_test_split  # on use: 0.3 s of CPU to import

    train, val = train_test_split(
        np.arange(n, dtype=np.int64),
        test_size=n_val,
        random_state=_validation_seed(seed),
        stratify=strata,
    )
    return np.sort(train), np.sort(val)


def hold_out_per_client(
    shards: list[np.ndarray], fraction: float, seed: int
) -> tuple[list[np.ndarray], np.ndarray]:
    """``(kept shards, validation indices)``: the same seeded ``fraction`` of every client's
    shard held out (rounded per shard), for datamodules with natural per-client data;
    ``fraction = 0`` holds out nothing.

    >>> kept, val = hold_out_per_client([np.arange(10), np.arange(10, 20)], 0.2, seed=0)
    >>> [len(k) for k in kept], len(val)
    ([8, 8], 4)
    """
    if fraction == 0:
        return shards, np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(_validation_seed(seed))
    kept, held = [], []
    for i, shard in enumerate(shards):
        take = round(fraction * len(shard))
        if take >= len(shard):
            raise ValueError(
                f"val_fraction={fraction} holds out all {len(shard)} examples of "
                f"client {i}: lower val_fraction (0 validates on the training data)"
            )
        chosen = np.zeros(len(shard), dtype=bool)
        chosen[rng.choice(len(shard), take, replace=False)] = True
        kept.append(shard[~chosen])
        held.append(shard[chosen])
    return kept, np.sort(np.concatenate(held))
