"""Client sampling: which clients take part in a round, and the rate the accountant uses.

A sampler draws a participation mask ``[n]`` (bool) from an explicit ``torch.Generator`` owned by
the algorithm (so a checkpoint carries it) and says how the server normalizes the sum of the
participants' messages:

* :class:`BernoulliSampler` — each client independently with probability ``p``; the server
  averages over the clients that actually took part (``|S|``, the realized cohort).
* :class:`PoissonSampler` — the same independent draw with probability ``q``; the server divides
  by the *expected* cohort size ``q·n`` (the fixed denominator of DP-FedAvg, McMahan et al. 2018,
  which keeps the aggregate's sensitivity independent of who took part).
* :class:`FixedSizeSampler` — a uniformly random cohort of exactly ``B`` clients (paper 003
  App. C.1, paper 004 §3 "S^k … with size B"); the server divides by ``B``.
* :class:`CyclicSampler` — no randomness: the clients split into ``b`` fixed groups, group
  ``k mod b`` takes part in round ``k`` (each client once every ``b`` rounds, the participation
  schema of the matrix factorization mechanisms, which needs no secret sampling); the server
  divides by the group size.

``sample_rate`` is the probability that a given client takes part in a round; it is what the
algorithms report to the privacy accountant (amplification by subsampling). For independent
(Bernoulli / Poisson) sampling that is exactly the Poisson-subsampled Gaussian mechanism that
Opacus' accountants analyse. For a fixed-size cohort ``B/n`` is the usual approximation (sampling
without replacement is analysed as Poisson sampling at the same rate, as Opacus does for
fixed-size batches); the reported ε is then an estimate, which the docs say.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pl_privfed.checks import check_positive_int

__all__ = [
    "BernoulliSampler",
    "ClientSampler",
    "CyclicSampler",
    "FixedSizeSampler",
    "PoissonSampler",
    "check_probability",
]


def check_probability(name: str, value: float) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` naming ``name`` unless it is in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


class ClientSampler:
    """Draws the clients of a round (override :meth:`sample`)."""

    def setup(self, num_clients: int) -> None:
        """Validate against the number of clients ``n`` (called before training)."""
        self.num_clients = num_clients

    @property
    def sample_rate(self) -> float:
        """Probability that one client takes part in a round."""
        raise NotImplementedError

    def sample(self, num_clients: int, generator: torch.Generator) -> Tensor:
        """A participation mask ``[num_clients]`` (bool)."""
        raise NotImplementedError

    def sample_round(
        self, num_clients: int, round_index: int, generator: torch.Generator
    ) -> Tensor:
        """The participation mask of round ``round_index`` (default :meth:`sample`, which does
        not depend on the round)."""
        return self.sample(num_clients, generator)

    @property
    def separation(self) -> int:
        """The fewest rounds between two rounds of one client (1: consecutive rounds)."""
        return 1

    def denominator(self, mask: Tensor) -> Tensor:
        """What the server divides the participants' sum by (a scalar tensor)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if k != "num_clients")
        return f"{type(self).__name__}({args})"


class _Independent(ClientSampler):
    def __init__(self, probability: float) -> None:
        self.probability = check_probability("probability", probability)

    @property
    def sample_rate(self) -> float:
        return self.probability

    def sample(self, num_clients: int, generator: torch.Generator) -> Tensor:
        u = torch.rand(num_clients, generator=generator, device=generator.device)
        return u < self.probability


class BernoulliSampler(_Independent):
    """Each client takes part independently with probability ``p``; average over ``|S|``.

    With no participant the round changes nothing (the denominator is ``max(|S|, 1)``).

    Args:
        probability: ``p ∈ (0, 1]``.

    >>> mask = BernoulliSampler(0.5).sample(8, torch.Generator().manual_seed(0))
    >>> mask.dtype, mask.shape
    (torch.bool, torch.Size([8]))
    """

    def denominator(self, mask: Tensor) -> Tensor:
        return mask.sum().clamp(min=1).to(torch.float64)


class PoissonSampler(_Independent):
    """Each client takes part independently with probability ``q``; divide by ``q·n``.

    Args:
        probability: ``q ∈ (0, 1]``.
    """

    def denominator(self, mask: Tensor) -> Tensor:
        return torch.tensor(self.probability * mask.numel(), dtype=torch.float64)


class FixedSizeSampler(ClientSampler):
    """A uniformly random cohort of exactly ``cohort_size`` clients (without replacement).

    Args:
        cohort_size: ``B``, in ``[1, n]`` (checked when the number of clients is known).
    """

    def __init__(self, cohort_size: int) -> None:
        self.cohort_size = check_positive_int("cohort_size", cohort_size)
        self.num_clients = 0

    def setup(self, num_clients: int) -> None:
        if self.cohort_size > num_clients:
            raise ValueError(
                f"cohort_size={self.cohort_size} is more than the {num_clients} clients"
            )
        self.num_clients = num_clients

    @property
    def sample_rate(self) -> float:
        if not self.num_clients:
            raise RuntimeError(f"{self!r}: call setup(num_clients) first")
        return self.cohort_size / self.num_clients

    def sample(self, num_clients: int, generator: torch.Generator) -> Tensor:
        perm = torch.randperm(num_clients, generator=generator, device=generator.device)
        mask = torch.zeros(num_clients, dtype=torch.bool, device=generator.device)
        mask[perm[: self.cohort_size]] = True
        return mask

    def denominator(self, mask: Tensor) -> Tensor:
        return torch.tensor(float(self.cohort_size), dtype=torch.float64)


class CyclicSampler(ClientSampler):
    """Cyclic cohorts: client ``i`` is in group ``i mod b`` and group ``k mod b`` takes part in
    round ``k`` (every client exactly once every ``b`` rounds, ``b``-min-separated; Choquette-Choo
    et al. 2023's participation schema for the banded matrix factorization mechanism). Nothing
    is random, so nothing is secret and nothing amplifies; the server divides by the group size
    ``n/b``. The clients must split into equal groups (``n`` a multiple of ``b``), refused at
    :meth:`setup` otherwise.

    Args:
        groups: ``b >= 1``.

    >>> s = CyclicSampler(3)
    >>> s.setup(6)
    >>> s.sample_round(6, 4, torch.Generator()).tolist()
    [False, True, False, False, True, False]
    """

    def __init__(self, groups: int) -> None:
        self.groups = check_positive_int("groups", groups)
        self.num_clients = 0

    def setup(self, num_clients: int) -> None:
        if num_clients % self.groups:
            raise ValueError(
                f"groups={self.groups} does not divide the {num_clients} clients: cyclic "
                "cohorts need equal groups (a fixed denominator)"
            )
        self.num_clients = num_clients

    @property
    def sample_rate(self) -> float:
        return 1.0 / self.groups

    @property
    def separation(self) -> int:
        return self.groups

    @property
    def group_size(self) -> int:
        """``n/b``, the clients of a round."""
        if not self.num_clients:
            raise RuntimeError(f"{self!r}: call setup(num_clients) first")
        return self.num_clients // self.groups

    def sample(self, num_clients: int, generator: torch.Generator) -> Tensor:
        raise ValueError("CyclicSampler's cohort depends on the round: call sample_round")

    def sample_round(
        self, num_clients: int, round_index: int, generator: torch.Generator
    ) -> Tensor:
        ids = torch.arange(num_clients, device=generator.device)
        return ids % self.groups == round_index % self.groups

    def denominator(self, mask: Tensor) -> Tensor:
        return torch.tensor(float(mask.numel() // self.groups), dtype=torch.float64)
