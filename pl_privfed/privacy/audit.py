"""An empirical privacy audit beside the certified ε: canaries planted in the training run itself.

Every ε the package reports is a certificate for the mechanism the code is *supposed* to run. An
audit measures the run that did run: it plants canaries, trains once, and asks how well their
presence can be told from the trained model. Two methods, each needing one run:

* **Client level** — Andrew, Kairouz, Oh, Oprea, McMahan & Suriyakumar, "One-shot empirical
  privacy estimation for federated learning" (ICLR 2024). ``m`` canary clients each own a fixed
  random unit direction ``u_j`` (:func:`canary_directions`); half of them are inserted
  (:func:`canary_membership`) and send that direction in every round they take part in, through
  the run's operator and noised like a real client (:class:`ClientCanaries`, which the engine's
  message stage adds to the sum the server receives); the other half are never inserted. After
  training, the statistic of canary ``j`` is the cosine between the model's change and ``u_j``
  (of the final model, or summed over every round's model change); the held-out canaries'
  cosines are what chance gives. The Gaussian fit ``μ = (mean_in − mean_out)/std_out``, read as
  μ-GDP, gives an ε **estimate** at δ (:func:`gaussian_estimate`; the conversion is
  dp-accounting's exact one for the Gaussian mechanism). It is an estimate, not a bound: the
  fit assumes the statistic is Gaussian, which holds for the Gaussian mechanism in high
  dimension (the paper's theorem), not for every bug.
* **Record level** — Steinke, Nasr & Jagielski, "Privacy auditing with one (1) training run"
  (NeurIPS 2023). ``m`` canary records, each inserted independently with probability 1/2 into
  one client's data (:class:`RecordCanaries`: a record whose gradient is a fixed direction
  ``G·u_j``, joined to the client's minibatch by the engine's gradient oracle and clipped like
  every other record there); a score per canary (how far the model moved against ``u_j``); the
  auditor guesses "in" for the ``k`` highest scores and "out" for the ``k`` lowest, and the
  number of correct guesses gives an ε **lower bound** at a stated confidence
  (:func:`one_run_p_value`, :func:`one_run_lower_bound`: their theorem with the δ term). With
  ``m`` canaries the bound can never exceed a ceiling (:attr:`OneRunAudit.ceiling`: 3.49 at
  95 % for 100 canaries all guessed right in one test, 2.90 with the callback's ten tests,
  whatever the run): a low bound certifies nothing.

What the canaries enter and why it is sound:

* A client canary is an extra sender in the message stage, never a client of the federation: it
  has no data, no state and no row in any table. Its message is ``β·Ψ(N·u_j)`` with the round's
  operator ``Ψ`` and factor ``β`` (those the real clients' ``transmit`` used) and ``N`` large
  (``overshoot`` times ``Ψ``'s bound), so ``Ψ`` must clip it to the bound ``Φ`` the accounting
  assumes — a clip that is skipped shows as a canary ``overshoot`` times too loud. It takes part
  with the cohort's rate (a Poisson cohort's ``q``, a fixed cohort's ``B/N``; keyed, independent
  of the real cohort), adds its own ``N(0, σ²)`` under local noise or its share ``N(0, σ²/t)``
  under distributed noise (drawn from the audit's stream, so nobody else's draw changes) and
  nothing under central noise (the aggregator's draw covers the sum). The server's denominator
  is not changed: one canary moves the noised sum by ``Φ``, as one client does (add/remove).
* A record canary joins its host client's minibatch in every round its record is drawn (the
  release's record rate ``L/N``, keyed), adding ``Ψ(G·u_j)/b`` to the clipped mean of ``b``
  records (per-example clipping) or ``G·u_j/b`` to the minibatch gradient that the algorithm then
  clips; the real records, their order and their noise are unchanged. One canary moves the
  average by at most the sensitivity the accountant is given.

Both therefore audit an adversary the ledger accounts for: whoever sees the models
(:func:`~pl_privfed.privacy.plan.adversaries`, ``"models"``); the models after every round, or
the final one only (a post-processing: the same certificate bounds it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats
import torch
from dp_accounting import gaussian_mechanism
from torch import Tensor

from pl_privfed.rng import (
    AUDIT_DIRECTION,
    AUDIT_MEMBERSHIP,
    AUDIT_PARTICIPATION,
    STREAM_AUDIT,
    keyed_generator,
)

__all__ = [
    "ClientCanaries",
    "GaussianEstimate",
    "OneRunAudit",
    "RecordCanaries",
    "canary_directions",
    "canary_membership",
    "canary_participation",
    "gaussian_epsilon",
    "gaussian_estimate",
    "guess_counts",
    "one_run_audit",
    "one_run_lower_bound",
    "one_run_p_value",
]


# ---------------------------------------------------------------------------- canaries' draws
def canary_directions(
    count: int,
    dim: int,
    seed: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``[count, dim]`` unit vectors, row ``j`` isotropic from the stream ``(seed, STREAM_AUDIT,
    AUDIT_DIRECTION, j)`` (drawn in float64 on the CPU, so a canary's direction depends on
    neither the device, the dtype nor the number of canaries)."""
    rows = torch.empty(count, dim, dtype=torch.float64)
    for j in range(count):
        rows[j].normal_(generator=keyed_generator(seed, STREAM_AUDIT, AUDIT_DIRECTION, j))
    rows /= torch.linalg.vector_norm(rows, dim=1, keepdim=True).clamp(min=1e-300)
    return rows.to(device=device, dtype=dtype)


def canary_membership(count: int, seed: int, *, half: bool = True) -> Tensor:
    """Which of ``count`` canaries are inserted (``[count]`` bool, on the CPU): exactly
    ``count // 2`` chosen uniformly (``half``, the client-level estimate's split) or each
    independently with probability 1/2 (the one-run bound's premise), from ``(seed,
    STREAM_AUDIT, AUDIT_MEMBERSHIP)``."""
    gen = keyed_generator(seed, STREAM_AUDIT, AUDIT_MEMBERSHIP)
    if half:
        inserted = torch.zeros(count, dtype=torch.bool)
        inserted[torch.randperm(count, generator=gen)[: count // 2]] = True
        return inserted
    return torch.rand(count, generator=gen, dtype=torch.float64) < 0.5


def canary_participation(count: int, rate: float, seed: int, round_index: int) -> Tensor:
    """Which of ``count`` canaries take part in round ``round_index`` (``[count]`` bool): all
    when ``rate >= 1``, else each independently with probability ``rate`` from ``(seed,
    STREAM_AUDIT, AUDIT_PARTICIPATION, round)``."""
    if rate >= 1.0:
        return torch.ones(count, dtype=torch.bool)
    gen = keyed_generator(seed, STREAM_AUDIT, AUDIT_PARTICIPATION, round_index)
    return torch.rand(count, generator=gen, dtype=torch.float64) < rate


# ---------------------------------------------------------------------------- client canaries
class ClientCanaries:
    """Canary clients for the engine's message stage (module docstring, first bullet of "what
    the canaries enter").

    The message stage's hook (:class:`~pl_privfed.engine.MessageHook`, put on the stage from
    ``algorithm.canaries``): :meth:`~pl_privfed.engine.Reduction.received` adds
    :meth:`messages` (and the canaries' own noise,
    :meth:`~pl_privfed.engine.MessageStage.canary_noise`) to the sum ``key`` the server
    receives, then hands the received sum to :meth:`observe`; :meth:`gradients` adds nothing.

    Args:
        directions: ``[m, d]`` unit directions, on the training device.
        inserted: ``[m]`` bool: the canaries that send (the others are held out).
        participation: the probability that a canary takes part in a round (the cohort's rate).
        seed: the audit's seed (participation draws).
        overshoot: a canary's vector before the operator is ``overshoot`` times the operator's
            bound, so the operator must clip it.
        norm: the vector's norm before the operator, instead (needed for an operator with no
            bound, e.g. a non-private run without clipping).
        key: the server's sum the canaries join (``"sent"``, what ``transmit`` uses).
    """

    level = "client"

    def __init__(
        self,
        directions: Tensor,
        inserted: Tensor,
        *,
        participation: float = 1.0,
        seed: int = 0,
        overshoot: float = 100.0,
        norm: float | None = None,
        key: str = "sent",
    ) -> None:
        self.directions = directions
        self.inserted = inserted.to("cpu", torch.bool)
        self.participation = float(participation)
        self.seed = int(seed)
        self.overshoot = float(overshoot)
        self.norm = None if norm is None else float(norm)
        self.key = key
        self.last_received: Tensor | None = None
        self.messages_sent = 0
        self.rounds_sent = 0
        self.input_norm_used: float | None = None  # N, the last one sent
        self.message_norm: float | None = None  # ||β Ψ(N u)||, the last one sent
        self._operator: tuple[Any, float] | None = None

    @property
    def count(self) -> int:
        return int(self.inserted.numel())

    def input_norm(self, operator: Any) -> float:
        """``N``, the norm of a canary's vector before the operator."""
        if self.norm is not None:
            return self.norm
        bound = None if operator is None else operator.bound
        if bound is None:
            raise ValueError(
                "PrivacyAudit: the message operator bounds nothing, so a client canary has no "
                "norm to be clipped to; give PrivacyAudit(canary_norm=...)"
            )
        return self.overshoot * float(bound)

    def messages(
        self, round_index: int, key: str, used: tuple[Any, float] | None, like: Tensor
    ) -> tuple[Tensor, int] | None:
        """``(Σ_j β·Ψ(N·u_j), count)`` over the inserted canaries that take part in round
        ``round_index`` (``None`` when none does, for the initialization's round ``-1`` and for
        a sum other than :attr:`key`): ``used`` is the round's ``(Ψ, β)`` as the clients'
        ``transmit`` used them (``None`` when no client sent: the last round's)."""
        if round_index < 0 or key != self.key:
            return None
        if used is not None:
            self._operator = used
        elif self._operator is None:
            return None  # no operator seen yet: nothing to clip the canaries with
        operator, factor = self._operator
        active = self.inserted & canary_participation(
            self.count, self.participation, self.seed, round_index
        )
        count = int(active.sum())
        if count == 0:
            return None
        norm = self.input_norm_used = self.input_norm(operator)
        directions = self.directions
        if operator is None or operator.norm_based:
            scale = (
                1.0
                if operator is None
                else float(operator.scale(torch.tensor([norm], dtype=torch.float64))[0])
            )
            weight = float(factor) * scale * norm
            total = active.to(directions.device, directions.dtype).mul(weight) @ directions
            self.message_norm = abs(weight)
        elif not operator.random:
            rows = operator(directions[active.to(directions.device)] * norm) * float(factor)
            total = rows.sum(0)
            self.message_norm = float(torch.linalg.vector_norm(rows[0]))
        else:
            raise ValueError(
                f"PrivacyAudit: client canaries cannot pass through a random operator ({operator!r})"
            )
        self.messages_sent += count
        self.rounds_sent += 1
        return total.to(like.device, like.dtype), count

    def observe(self, round_index: int, key: str, received: Tensor) -> None:
        """The sum ``key`` the server received in round ``round_index`` (canaries included)."""
        if round_index >= 0 and key == self.key:
            self.last_received = received

    def gradients(
        self, ids: Tensor, round_index: int, step: int | None, operator: Any, like: Tensor
    ) -> Tensor | None:
        """Nothing: client canaries are senders, not records."""
        return None


# ---------------------------------------------------------------------------- record canaries
class RecordCanaries:
    """Canary records for the engine's gradient oracle (module docstring, second bullet of "what
    the canaries enter").

    :class:`~pl_privfed.engine.ClientChunk` finds them as the message stage's hook
    (:class:`~pl_privfed.engine.MessageHook`, from ``algorithm.canaries``) and adds
    :meth:`gradients` to what ``grad`` (the minibatch gradient) and ``clipped_mean`` (the
    clipped per-example mean) return for the chunk's clients; :meth:`messages` sends nothing.

    Args:
        directions: ``[m, d]`` unit directions, on the training device.
        inserted: ``[m]`` bool: the canaries inserted into their host's data.
        hosts: ``[m]`` the client (agent) holding each canary.
        release_size: ``b``, the records one noised average is over (the declaration's).
        norm: ``G``, the norm of a canary record's gradient (large: the clip must act).
        rate: the probability that a record is in a round's sample (the declaration's
            ``positions / population``, at most 1).
        seed: the audit's seed (sampling draws).
    """

    level = "record"

    def __init__(
        self,
        directions: Tensor,
        inserted: Tensor,
        hosts: Tensor,
        *,
        release_size: int,
        norm: float,
        rate: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.directions = directions
        self.inserted = inserted.to("cpu", torch.bool)
        self.hosts = hosts.to("cpu", torch.int64)
        self.release_size = int(release_size)
        self.norm = float(norm)
        self.rate = min(1.0, float(rate))
        self.seed = int(seed)
        self.uses = torch.zeros(self.count, dtype=torch.int64)
        self.last_received: Tensor | None = None  # record canaries observe no sum
        self._last_round = torch.full((self.count,), -1, dtype=torch.int64)

    @property
    def count(self) -> int:
        return int(self.inserted.numel())

    def messages(
        self, round_index: int, key: str, used: tuple[Any, float] | None, like: Tensor
    ) -> tuple[Tensor, int] | None:
        """Nothing: record canaries are records, not senders."""
        return None

    def observe(self, round_index: int, key: str, received: Tensor) -> None:
        """Nothing to observe: the audit reads the model."""

    def gradients(
        self, ids: Tensor, round_index: int, step: int | None, operator: Any, like: Tensor
    ) -> Tensor | None:
        """``[c, d]``: for each client of ``ids``, ``Σ_j Ψ(G·u_j)/b`` over its inserted canaries
        drawn in round ``round_index`` (``Ψ`` the per-example operator, ``None`` for the plain
        minibatch gradient); ``None`` when no canary of these clients is in the round. A canary
        joins the round's first local minibatch (``step`` 0) or, for solvers that reuse the
        round's batch (``step`` ``None``), every local step, as the record would."""
        if round_index < 0 or step not in (None, 0):
            return None
        ids = ids.to("cpu", torch.int64)
        active = self.inserted & torch.isin(self.hosts, ids)
        active &= canary_participation(self.count, self.rate, self.seed, round_index)
        if not bool(active.any()):
            return None
        fresh = active & (self._last_round != round_index)
        self.uses += fresh.to(torch.int64)
        self._last_round[active] = round_index
        norm = self.norm
        if operator is not None:
            if not operator.norm_based:
                raise ValueError(
                    f"PrivacyAudit: record canaries need a norm-based operator, got {operator!r}"
                )
            norm *= float(operator.scale(torch.tensor([norm], dtype=torch.float64))[0])
        chosen = active.nonzero().squeeze(1)
        rows = torch.searchsorted(ids, self.hosts[chosen])
        weights = torch.zeros(ids.numel(), self.count, dtype=torch.float64)
        weights[rows, chosen] = norm / self.release_size
        directions = self.directions
        out = weights.to(directions.device, directions.dtype) @ directions
        return out.to(like.device, like.dtype)


# ---------------------------------------------------------------------------- Gaussian fit
def gaussian_epsilon(mu: float, delta: float) -> float:
    """ε of μ-GDP at ``delta``: the Gaussian mechanism of sensitivity 1 and noise std ``1/μ``
    (Dong, Roth & Su), by dp-accounting's exact conversion (``get_epsilon_gaussian``, Balle &
    Wang's analytic Gaussian mechanism); 0 for ``μ <= 0``."""
    if not mu > 0:
        return 0.0
    if not math.isfinite(mu):
        return math.inf
    return float(gaussian_mechanism.get_epsilon_gaussian(1.0 / mu, delta))


@dataclass(frozen=True)
class GaussianEstimate:
    """The Gaussian fit of an audit statistic (Andrew et al. 2024).

    Attributes:
        mu: ``(mean_in − mean_out)/std_out``.
        epsilon: ε of μ-GDP at ``delta`` (0 when ``mu <= 0``): the estimate.
        delta: the δ of ``epsilon``.
        confidence: the one-sided level of ``mu_low`` and ``mu_high``.
        mu_low, mu_high: ``mu`` minus and plus ``z_confidence`` standard errors of its sampling
            error across canaries (normal approximation, delta method: ``std_in²/(std_out²
            n_in) + 1/n_out + mu²/(2(n_out − 1))``): a finite number of canaries gives a noisy
            ``mu``, and an estimate above a certificate means something only beyond that noise.
        epsilon_low, epsilon_high: ε of ``mu_low`` and ``mu_high``.
        mean_in, std_in: the inserted canaries' statistic.
        mean_out, std_out: the held-out canaries' statistic (the null).
        inserted, held_out: how many of each.
    """

    mu: float
    epsilon: float
    delta: float
    confidence: float
    mu_low: float
    mu_high: float
    epsilon_low: float
    epsilon_high: float
    mean_in: float
    std_in: float
    mean_out: float
    std_out: float
    inserted: int
    held_out: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gaussian_estimate(
    inserted: Sequence[float] | np.ndarray,
    held_out: Sequence[float] | np.ndarray,
    delta: float,
    confidence: float = 0.95,
) -> GaussianEstimate:
    """Andrew et al.'s ε estimate: fit a Gaussian to the held-out canaries' statistic, measure
    the inserted canaries' mean shift in its standard deviations, ``μ``, and read ``μ`` as
    μ-GDP at ``delta`` (:func:`gaussian_epsilon`), with ``μ``'s sampling error across canaries
    (:class:`GaussianEstimate`). An estimate, not a bound."""
    a = np.asarray(inserted, dtype=np.float64)
    b = np.asarray(held_out, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError(
            f"the Gaussian fit needs at least two inserted and two held-out canaries, got "
            f"{a.size} and {b.size}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    mean_in, mean_out = float(a.mean()), float(b.mean())
    std_in, std_out = float(a.std(ddof=1)), float(b.std(ddof=1))
    shift = mean_in - mean_out
    if std_out > 0:
        mu = shift / std_out
        spread = math.sqrt(
            (std_in / std_out) ** 2 / a.size + 1.0 / b.size + mu**2 / (2.0 * (b.size - 1))
        )
    else:
        mu, spread = (math.inf if shift > 0 else 0.0), 0.0
    z = float(scipy.stats.norm.ppf(confidence))
    low, high = mu - z * spread, mu + z * spread
    return GaussianEstimate(
        mu,
        gaussian_epsilon(mu, delta),
        delta,
        confidence,
        low,
        high,
        gaussian_epsilon(low, delta),
        gaussian_epsilon(high, delta),
        mean_in,
        std_in,
        mean_out,
        std_out,
        int(a.size),
        int(b.size),
    )


# ---------------------------------------------------------------------------- one-run bound
def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The probability of ``v`` or more correct guesses among ``r`` (of ``m`` canaries, each
    inserted independently with probability 1/2) when the mechanism is (ε, δ)-DP: Steinke, Nasr
    & Jagielski (2023), the theorem with the δ term,

    ``P[Bin(r, q) >= v] + 2 m δ · max_{1≤i≤v} P[v − i <= Bin(r, q) < v] / i``,
    ``q = e^ε/(1 + e^ε)`` (the accuracy of ε-randomized response), capped at 1. The binomial is
    scipy's."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    q = float(scipy.special.expit(epsilon))
    p = float(scipy.stats.binom.sf(v - 1, r, q))
    if delta > 0 and v > 0:
        i = np.arange(1, v + 1)
        below = np.cumsum(scipy.stats.binom.pmf(v - i, r, q))  # P[v − i <= Bin < v]
        p += 2.0 * m * delta * float(np.max(below / i))
    return min(1.0, p)


def one_run_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε that ``v`` correct guesses of ``r`` reject at ``confidence``: no (ε, δ)-DP
    mechanism gives that many with probability above ``1 − confidence``
    (:func:`one_run_p_value`). 0 when even ε = 0 is not rejected."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    level = 1.0 - confidence

    def excess(eps: float) -> float:
        return one_run_p_value(m, r, v, eps, delta) - level

    if excess(0.0) >= 0:
        return 0.0
    hi = 1.0
    while excess(hi) < 0:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(scipy.optimize.brentq(excess, hi / 2 if hi > 1 else 0.0, hi, xtol=1e-9))


def guess_counts(count: int) -> list[int]:
    """The guesses per side the one-run audit tries (``k`` "in" and ``k`` "out"): 5, 10, 25, 40
    and 50 % of the canaries, at least one; fixed before the scores are seen (40 %: with each
    canary inserted with probability 1/2, about half are in, so the top and bottom 40 % can all
    be right)."""
    fractions = (0.05, 0.1, 0.25, 0.4, 0.5)
    return sorted({max(1, min(count // 2, round(count * f))) for f in fractions})


@dataclass(frozen=True)
class OneRunAudit:
    """A one-run lower bound (Steinke et al. 2023) and how it was reached.

    Attributes:
        epsilon: the lower bound, at ``confidence`` for all the bounds computed together.
        confidence: the joint confidence.
        delta: the δ of the bound.
        guesses: ``r`` of the best ``k`` (``k`` "in" and ``k`` "out").
        correct: ``v``, the correct ones among them.
        canaries: ``m``.
        ceiling: the bound if every guess of the largest ``k`` were right: no run of this audit
            can report more.
        tried: the ``k`` tried (Bonferroni: each at ``(1 − confidence)/(len(tried)·tests)``).
    """

    epsilon: float
    confidence: float
    delta: float
    guesses: int
    correct: int
    canaries: int
    ceiling: float
    tried: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tried": list(self.tried)}


def one_run_audit(
    scores: Sequence[float] | np.ndarray,
    inserted: Sequence[bool] | np.ndarray,
    delta: float,
    confidence: float = 0.95,
    *,
    guesses: Sequence[int] | None = None,
    tests: int = 1,
) -> OneRunAudit:
    """Steinke et al.'s one-run lower bound from every canary's ``score`` (higher: more likely
    inserted) and whether it was ``inserted``: for each ``k`` of ``guesses`` (default
    :func:`guess_counts`), guess "in" for the ``k`` highest scores and "out" for the ``k``
    lowest, and keep the largest bound. Every ``k`` (and each of ``tests`` audits reported
    together) is tested at ``(1 − confidence)/(len(guesses)·tests)`` (Bonferroni), so the bounds
    hold jointly at ``confidence``."""
    s = np.asarray(scores, dtype=np.float64)
    truth = np.asarray(inserted, dtype=bool)
    m = int(s.size)
    if m < 2 or truth.size != m:
        raise ValueError(
            f"need at least two canaries and one membership each, got {m}, {truth.size}"
        )
    ks = tuple(sorted({max(1, min(m // 2, int(k))) for k in (guesses or guess_counts(m))}))
    each = 1.0 - (1.0 - confidence) / (len(ks) * max(1, tests))
    order = np.argsort(s, kind="stable")
    best = (0.0, 0, 0)
    for k in ks:
        low, high = order[:k], order[m - k :]
        correct = int(truth[high].sum() + (~truth[low]).sum())
        eps = one_run_lower_bound(m, 2 * k, correct, delta, each)
        if eps > best[0] or best[1] == 0:
            best = (eps, 2 * k, correct)
    ceiling = one_run_lower_bound(m, 2 * ks[-1], 2 * ks[-1], delta, each)
    return OneRunAudit(best[0], confidence, delta, best[1], best[2], m, ceiling, ks)
