"""The realized noise of a simulated run, tested against the mechanism its ledger certified.

In a simulation the clean sum of every release is known, so the noise a release actually carried
is ``released − clean``. :class:`RealizedNoise` is the message stage's noise monitor
(:attr:`~pl_privfed.engine.MessageStage.monitor`): in every released round it keeps that
difference on a fixed subset of ``m`` coordinates, with the std the *declaration* gives it
(:func:`declared_sum_std`: from the ledger's ``σ``, the configured placement and ``t``, and the
round's senders; never from the engine's own ``sender_std`` or draw, which a bug would change
with the noise). :func:`noise_tests` then tests the rows, whitened by that std (and, for
correlated noise, by the strategy ``C``: ``C X / σ``), against "iid ``N(0, 1)`` in every
coordinate and release":

* **variance** — ``Σ w²`` over every release and coordinate is ``χ²_{Km}`` (exact), two-sided;
* **variance per release** — each release's ``Σ_i w_i²`` is ``χ²_m``, two-sided, Bonferroni over
  the ``K`` releases (a single round drawn with the wrong std);
* **mean** — ``Σ w / √(Km)`` is ``N(0, 1)`` (exact), two-sided;
* **independence across releases** — for every pair of releases the cosine ``r_kl`` of the two
  rows: for independent isotropic Gaussian rows ``(r + 1)/2 ~ Beta((m−1)/2, (m−1)/2)``
  exactly; the largest ``|r_kl|``, Bonferroni over the ``K(K−1)/2`` pairs (a reused draw reads
  ``r = 1``);
* **isotropy (independence across coordinates)** — ``S = Σ_{k<l} r_kl²``: each ``r_kl²`` is
  ``Beta(1/2, (m−1)/2)`` (mean ``1/m``) and the ``r_kl`` are pairwise independent, so ``S`` has
  mean ``P/m`` and variance ``P·2(m−1)/(m²(m+2))`` exactly; its one-sided p-value is that of
  the scaled ``χ²`` with those two moments (Satterthwaite; ``m·S`` is close to ``χ²_P``, the
  off-diagonal of a Wishart matrix: an approximation, whose level the tests measure on iid
  rows). Coordinates drawn correlated (covariance ``Σ`` with ``tr Σ² > m``) or releases
  correlated raise ``E r_kl²`` to ``tr Σ²/(tr Σ)²``.

The five p-values are combined by Bonferroni (:attr:`NoiseTest.p_value`): the test rejects at
level ``α`` when the smallest is below ``α/5``, so a correct mechanism is flagged with
probability at most ``α`` (the callback gives it its share of the run's alarm,
:class:`~pl_privfed.callbacks.PrivacyAudit`).

**Record level** (:class:`RecordNoise`): record-level noise is drawn inside the clients' local
steps, one ``N(0, σ² I)`` per client and local step added to its clipped gradient
(:meth:`~pl_privfed.engine.ClientChunk.noised`), so the release tested is each such draw: the
chunk hands the monitor the clean and the noised gradient, and the realized noise is their
difference, declared ``N(0, σ² I)`` with the ledger's ``σ``. A run holds ``K = rounds × clients
× local steps`` of them (a9a's 1,000 rounds of 1,000 clients: 10⁶), and the test across releases
costs ``O(K²m)``: the monitor keeps at most :data:`RECORD_RELEASES` draws, on at most
:data:`RECORD_COORDINATES` coordinates, chosen by a keyed order of the clients (every draw of the
first client in that order, every round and step, then the second's, …; the first
:data:`RECORD_RELEASES` of that order), so that the kept draws hold whole runs of one client's
rounds (a draw reused or correlated across rounds) and the same rounds of several clients (a
draw shared by clients) whenever ``rounds × steps`` is below :data:`RECORD_RELEASES`.

What it cannot see: noise the clean sum already contains (a client that noises its message and
then also reports it as clean; at record level, noise already in the clipped gradient the
algorithm hands the chunk), a per-client draw under ``draws: aggregate`` (only the sum of the
senders' noises exists; its variance is tested, not how it splits among the senders), anything
outside the ``m`` coordinates kept, at record level the draws not kept (clients late in the keyed
order; in a run of more than :data:`RECORD_RELEASES` draws per client, the first client's later
rounds), and a deviation too small for the run's ``K·m`` numbers (the variance test's relative
resolution is about ``√(2/(Km))``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from pl_privfed.privacy.correlated import CorrelatedNoise
from pl_privfed.privacy.placement import CentralNoise, DistributedNoise, LocalNoise
from pl_privfed.rng import (
    AUDIT_NOISE_CLIENTS,
    AUDIT_NOISE_COORDINATES,
    STREAM_AUDIT,
    keyed_generator,
)

__all__ = [
    "RECORD_COORDINATES",
    "RECORD_RELEASES",
    "TESTS",
    "NoiseTest",
    "RealizedNoise",
    "RecordNoise",
    "client_order",
    "declared_sum_std",
    "noise_coordinates",
    "noise_tests",
    "whiten",
]

#: the record-level test's bounds (module docstring): the draws kept (the test across releases
#: costs ``O(K²m)``: about 2·10⁹ products at these values) and the coordinates of each
RECORD_RELEASES = 1024
RECORD_COORDINATES = 2048

#: the tests of :func:`noise_tests`, in words (the report's ``tests``)
TESTS = {
    "variance": "Σ w² over every release and coordinate against χ²_{Km} (two-sided)",
    "variance_per_release": (
        "each release's Σ_i w_i² against χ²_m (two-sided), Bonferroni over the K releases"
    ),
    "mean": "Σ w / √(Km) against N(0, 1) (two-sided)",
    "independence_across_releases": (
        "max over pairs of releases of |cos(w_k, w_l)|, (r+1)/2 ~ Beta((m−1)/2, (m−1)/2), "
        "Bonferroni over the K(K−1)/2 pairs"
    ),
    "isotropy": (
        "Σ_{k<l} cos(w_k, w_l)² against the scaled χ² of its mean P/m and variance "
        "P·2(m−1)/(m²(m+2)) (one-sided)"
    ),
}


def declared_sum_std(placement: Any, sigma: float, senders: int) -> float | None:
    """The std per coordinate of the noise a released sum carries, as the declaration says:
    ``σ`` for central noise (the aggregator's one draw; correlated noise: each row of ``Z``,
    tested after whitening), ``σ √(n/t)`` for distributed noise (``n = senders`` shares of
    ``N(0, σ²/t)``), ``σ √n`` for local noise (``n`` clients' own ``N(0, σ²)``); ``None`` for a
    placement this test does not know (a user's, or a subclass that may draw otherwise). Exact
    types on purpose: the answer must not come from the placement's methods, which the engine
    draws with."""
    kind = type(placement)
    if isinstance(placement, CorrelatedNoise) or kind is CentralNoise:
        return float(sigma)
    if kind is DistributedNoise:
        return float(sigma) * math.sqrt(senders / placement.min_contributors)
    if kind is LocalNoise:
        return float(sigma) * math.sqrt(senders)
    return None


def noise_coordinates(dim: int, count: int, seed: int) -> Tensor:
    """The ``min(dim, count)`` coordinates the monitor keeps (sorted; all when ``count >= dim``),
    a uniform subset from the audit's stream ``(seed, STREAM_AUDIT, AUDIT_NOISE_COORDINATES)``."""
    if count >= dim:
        return torch.arange(dim)
    gen = keyed_generator(seed, STREAM_AUDIT, AUDIT_NOISE_COORDINATES)
    return torch.randperm(dim, generator=gen)[:count].sort().values


class RealizedNoise:
    """The message stage's noise monitor (module docstring): per released sum ``key`` and round,
    the realized noise ``released − clean`` on :attr:`index` (float32: the test's numbers need
    no more, and a run of 300 rounds of 11,322 coordinates keeps 14 MB), and its declared std.

    Args:
        index: the coordinates kept (:func:`noise_coordinates`).
        declared: ``declared(senders)``: the declared std of a sum of ``senders`` senders
            (:func:`declared_sum_std` with the ledger's σ and the run's factors), ``None`` when
            not known (then nothing is kept).
    """

    def __init__(self, index: Tensor, declared: Callable[[int], float | None]) -> None:
        self.index = index.to("cpu", torch.int64)
        self.declared = declared
        #: per key: rounds, rows ``[m]`` (float64, CPU), declared stds
        self.rows: dict[str, list[tuple[int, Tensor, float]]] = {}
        self.unknown = False  # a release whose declared std is not known

    def observe(self, round_index: int, key: str, noise: Tensor, senders: int) -> None:
        """Round ``round_index``'s released sum ``key`` carried ``noise`` (``released − clean``,
        the real senders' sum; ``senders`` of them)."""
        std = self.declared(int(senders))
        if std is None:
            self.unknown = True
            return
        if not std > 0:
            return  # nothing declared: no noised release (e.g. no sender under local noise)
        picked = noise.detach().reshape(-1)[self.index.to(noise.device)]
        kept = self.rows.setdefault(key, [])
        kept[:] = [r for r in kept if r[0] != round_index]  # a round redone after a resume
        kept.append((int(round_index), picked.to("cpu", torch.float32), float(std)))

    def state_dict(self) -> dict[str, Any]:
        return {
            "rows": {
                key: {
                    "rounds": torch.tensor([r for r, _, _ in rows], dtype=torch.int64),
                    "noise": torch.stack([x for _, x, _ in rows])
                    if rows
                    else torch.zeros(0, self.index.numel(), dtype=torch.float32),
                    "stds": torch.tensor([s for _, _, s in rows], dtype=torch.float64),
                }
                for key, rows in self.rows.items()
            },
            "unknown": self.unknown,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = {
            key: [
                (int(r), x.float(), float(s))
                for r, x, s in zip(v["rounds"].tolist(), v["noise"], v["stds"].tolist())
            ]
            for key, v in state["rows"].items()
        }
        self.unknown = bool(state.get("unknown", False))


def client_order(clients: int, seed: int) -> Tensor:
    """Every client's place ``[n]`` in the record-level monitor's keyed order (a uniform
    permutation from the audit's stream ``(seed, STREAM_AUDIT, AUDIT_NOISE_CLIENTS)``)."""
    gen = keyed_generator(seed, STREAM_AUDIT, AUDIT_NOISE_CLIENTS)
    return torch.argsort(torch.randperm(clients, generator=gen))


class RecordNoise:
    """The record-level noise monitor (module docstring): per client, round and local step, the
    realized noise ``noised − clean`` of the client's own draw on :attr:`index`, for at most
    ``releases`` draws: the first in the order (client's place in ``order``, round, step).

    Args:
        index: the coordinates kept (:func:`noise_coordinates`).
        std: the declared std of one draw (the ledger's ``σ``; never the engine's argument).
        order: every client's place in the keyed order (:func:`client_order`).
        releases: the most draws kept.
    """

    def __init__(self, index: Tensor, std: float, order: Tensor, releases: int = RECORD_RELEASES):
        self.index = index.to("cpu", torch.int64)
        self.std = float(std)
        self.order = order.to("cpu", torch.int64)
        self.releases = int(releases)
        #: ``(place, round, step) -> (client, row [m] float32)``
        self.rows: dict[tuple[int, int, int], tuple[int, Tensor]] = {}
        self.unknown = False  # a sum released through the message stage (not a local draw)

    def observe(self, round_index: int, key: str, noise: Tensor, senders: int) -> None:
        """A noised sum released through the message stage: not a record-level draw (the
        record-level algorithms release none); marked as a release of unknown law."""
        self.unknown = True

    def _last(self) -> tuple[int, int, int] | None:
        """The last key kept when the monitor is full (a later key in the order is not kept)."""
        return max(self.rows) if len(self.rows) >= self.releases else None

    def observe_draws(
        self, round_index: int, step: int, clients: Tensor, noised: Tensor, clean: Tensor
    ) -> None:
        """Round ``round_index``'s local step ``step``: the real clients ``clients`` (``[c]``)
        added their draws to ``clean`` (``[c, d]``), giving ``noised``."""
        places = self.order[clients.cpu()].tolist()
        last = self._last()
        rows = [
            i for i, place in enumerate(places) if last is None or (place, round_index, step) < last
        ]
        if not rows:
            return
        at = torch.tensor(rows, device=noised.device)
        index = self.index.to(noised.device)
        picked = noised[at][:, index].double() - clean[at][:, index].double()
        picked = picked.to("cpu", torch.float32)
        ids = clients.cpu().tolist()
        for row, i in zip(picked, rows):  # a draw seen again (a resumed round) replaces its row
            self.rows[(places[i], int(round_index), int(step))] = (int(ids[i]), row)
        if len(self.rows) > self.releases:
            for key in sorted(self.rows)[self.releases :]:
                del self.rows[key]

    def kept(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept draws in the order (round, client, step): ``(keys [K, 3] of (round, client,
        step), noise [K, m])``."""
        items = sorted(((k[1], client, k[2]), row) for k, (client, row) in self.rows.items())
        keys = np.array([k for k, _ in items], dtype=np.int64).reshape(-1, 3)
        noise = (
            torch.stack([row for _, row in items]).numpy()
            if items
            else np.zeros((0, self.index.numel()), dtype=np.float32)
        )
        return keys, noise

    def state_dict(self) -> dict[str, Any]:
        keys = list(self.rows)
        return {
            "keys": torch.tensor(keys, dtype=torch.int64).reshape(-1, 3),
            "clients": torch.tensor([self.rows[k][0] for k in keys], dtype=torch.int64),
            "noise": torch.stack([self.rows[k][1] for k in keys])
            if keys
            else torch.zeros(0, self.index.numel(), dtype=torch.float32),
            "unknown": self.unknown,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = {
            tuple(key): (int(client), row.float())
            for key, client, row in zip(
                state["keys"].tolist(), state["clients"].tolist(), state["noise"]
            )
        }
        self.unknown = bool(state.get("unknown", False))


def whiten(
    rounds: list[int], noise: np.ndarray, stds: np.ndarray, c_matrix: np.ndarray | None = None
) -> np.ndarray:
    """``[K, m]`` rows that are iid ``N(0, 1)`` under the declared mechanism: ``noise / std``
    row by row, or, for correlated noise (``c_matrix`` the strategy ``C`` for rounds
    ``0..K−1``), ``C X / σ`` (``X = (C^{-1} Z)``, so ``C X = Z``, whose rows are iid
    ``N(0, σ² I)``). Correlated noise needs the releases of rounds ``0, 1, …, K−1``."""
    order = np.argsort(rounds, kind="stable")
    x, s = np.asarray(noise, dtype=np.float64)[order], np.asarray(stds, dtype=np.float64)[order]
    if c_matrix is None:
        return x / s[:, None]
    k = len(rounds)
    if sorted(rounds) != list(range(k)):
        raise ValueError("correlated noise is whitened from round 0 on, every round released")
    return (c_matrix[:k, :k] @ x) / s[:, None]


@dataclass
class NoiseTest:
    """The tests of :func:`noise_tests` on ``K`` releases of ``m`` coordinates."""

    releases: int
    coordinates: int
    p_values: dict[str, float]
    statistics: dict[str, float] = field(default_factory=dict)

    @property
    def p_value(self) -> float:
        """Bonferroni over the tests: ``min(1, T · min p)``."""
        return min(1.0, len(self.p_values) * min(self.p_values.values()))

    def failed(self) -> list[str]:
        """The tests whose p-value is the smallest (the one a rejection names)."""
        low = min(self.p_values.values())
        return [name for name, p in self.p_values.items() if p == low]

    def as_dict(self) -> dict[str, Any]:
        return {
            "releases": self.releases,
            "coordinates": self.coordinates,
            "p_value": self.p_value,
            "tests": {
                name: {"test": TESTS[name], "p_value": p, "statistic": self.statistics.get(name)}
                for name, p in self.p_values.items()
            },
        }


def _two_sided(cdf: float, sf: float) -> float:
    return min(1.0, 2.0 * min(cdf, sf))


def noise_tests(w: np.ndarray) -> NoiseTest:
    """The five tests of the module docstring on whitened rows ``w`` (``[K, m]``, iid
    ``N(0, 1)`` under the declared mechanism). With one release the two tests across releases
    are left out (p-value 1)."""
    w = np.asarray(w, dtype=np.float64)
    k, m = w.shape
    n = k * m
    total = float(np.sum(w * w))
    p = {
        "variance": _two_sided(stats.chi2.cdf(total, n), stats.chi2.sf(total, n)),
    }
    per = np.sum(w * w, axis=1)
    p_rows = np.minimum(1.0, 2.0 * np.minimum(stats.chi2.cdf(per, m), stats.chi2.sf(per, m)))
    p["variance_per_release"] = min(1.0, k * float(p_rows.min()))
    z = float(w.sum()) / math.sqrt(n)
    p["mean"] = _two_sided(stats.norm.cdf(z), stats.norm.sf(z))
    statistics = {
        "variance": total / n,  # realized variance over declared
        "variance_per_release": float(per.max() / m),
        "mean": z,
    }
    pairs = k * (k - 1) // 2
    if pairs and m > 1:
        norms = np.linalg.norm(w, axis=1)
        unit = w / np.where(norms > 0, norms, 1.0)[:, None]
        cos = unit @ unit.T
        upper = cos[np.triu_indices(k, 1)]
        top = float(np.abs(upper).max())
        a = (m - 1) / 2.0
        tail = 2.0 * float(stats.beta.sf((top + 1.0) / 2.0, a, a))  # P(|r| >= top)
        p["independence_across_releases"] = min(1.0, pairs * tail)
        statistics["independence_across_releases"] = top
        s = float(np.sum(upper * upper))
        mean, var = pairs / m, pairs * 2.0 * (m - 1) / (m * m * (m + 2))
        scale, dof = var / (2.0 * mean), 2.0 * mean * mean / var  # S ≈ scale · χ²_dof
        p["isotropy"] = float(stats.chi2.sf(s / scale, dof))
        statistics["isotropy"] = s / mean  # E r² over its isotropic value 1/m
    else:
        p["independence_across_releases"] = p["isotropy"] = 1.0
    return NoiseTest(k, m, p, statistics)
