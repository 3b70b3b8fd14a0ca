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

* A client canary is a client of the round: client ``n + j`` (no real client's index, so no
  real client's stream), placed among the round's real clients at a place drawn from the
  audit's stream (:meth:`ClientCanaries.place`: anywhere in the sequence the engine cuts into
  chunks, the last chunk and a chunk's tail included). The engine runs the algorithm's client
  lines on it in that chunk like on any client (:class:`~pl_privfed.engine.ClientChunk`): its
  gradient is ``N·u_j`` where the oracle gives the real clients' (``N`` large: ``overshoot``
  times the operator's bound), its state rows start from zeros each round and are never kept,
  and its message goes through the chunk's own operator call and, under local or distributed
  noise, the chunk's own per-client draw ``N(0, σ²)`` or ``N(0, σ²/t)`` (keyed by its index
  as a real client's is by its own), to the sum the server receives (``key:canaries``); under
  central noise the aggregator's draw covers it. So whatever changes a real client's clip or
  noise on its path through the engine changes a canary's that lands there: a clip skipped on
  one path shows as a canary ``overshoot`` times too loud. It takes part with the cohort's
  rate (a Poisson cohort's ``q``, a fixed cohort's ``B/N``; keyed, independent of the real
  cohort); it is never a sender of the abort rule, a message counted, a statistic or a
  loss, and the server's denominator is not changed: one canary moves the noised sum by
  ``Φ``, as one client does (add/remove). Under several processes the canaries sit among the
  first process's clients.
* A record canary is a record of the real per-example path
  (:mod:`pl_privfed.privacy.audit_records`): in every round its record is drawn (the release's
  record rate ``L/N``, keyed) it is an example of its host client's minibatch, at a keyed place
  among the real ones, through the same operator call, sum and noise draw as they are, adding
  ``Ψ(G·u_j)/b`` to the clipped mean of ``b`` records (per-example clipping), or ``G·u_j/b`` to
  the minibatch gradient that the algorithm then clips; the real records and their noise are
  unchanged. One canary moves the average by at most the sensitivity the accountant is given.

Beside both, a **white-box** statistic (:class:`WhiteBox`): the auditor of a simulation knows
every contribution to a release except whether each canary took part, so the engine's hook
hands it what is left once they are subtracted (the noise the placement's guarantee rests on:
a canary's own noise under local noise, the aggregator's draw under central noise, and under
distributed noise only the ``t`` honest senders' shares, the other ``n − t`` being known to
the server they collude with, as the certificate assumes; and the canary's contribution through
the run's operator), and its Gaussian fit reads the mechanism's own μ (docs/audit.md, "The
white-box auditor").

Both therefore audit an adversary the ledger accounts for: whoever sees the models
(:func:`~pl_privfed.privacy.plan.adversaries`, ``"models"``); the models after every round, or
the final one only (a post-processing: the same certificate bounds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pl_privfed.privacy.audit_bound import CanaryBound, operator_ratio
from pl_privfed.privacy.audit_estimates import (
    GaussianEstimate,
    OneRunAudit,
    gaussian_estimate,
    guess_counts,
    one_run_audit,
    one_run_lower_bound,
    one_run_p_value,
)
from pl_privfed.rng import (
    AUDIT_DIRECTION,
    AUDIT_MEMBERSHIP,
    AUDIT_PARTICIPATION,
    AUDIT_PLACEMENT,
    STREAM_AUDIT,
    keyed_generator,
)

__all__ = [
    "ClientCanaries",
    "GaussianEstimate",
    "OneRunAudit",
    "WhiteBox",
    "canary_directions",
    "canary_membership",
    "canary_participation",
    "covering_places",
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


# ---------------------------------------------------------------------------- white box
class WhiteBox:
    """The white-box auditor's statistic per canary (Nasr, Song, Thakurta, Papernot & Carlini,
    "Adversary instantiation", 2021; Nasr et al., "Tight auditing", 2023): an adversary who knows
    every contribution to each release except whether each canary took part subtracts them, so
    what is left is the noise the certificate counts on plus, when the canary took part, its
    own contribution. Per release and canary ``j`` the engine's hook adds ``⟨noise, u_j⟩`` to
    :attr:`base` (for every canary that would take part, inserted or held out: the held-out
    ones are the null) and ``⟨c_j, u_j⟩`` to :attr:`shift` (the inserted canary's contribution
    ``c_j`` after the run's own operator: a clip that is skipped or loosened shows here).

    For a correct Gaussian mechanism ``base`` is ``N(0, K σ²)`` and ``shift`` ``K Φ``: the
    statistic is the mechanism's own, so the Gaussian fit of :meth:`values` reads the mechanism's
    μ (the certificate's, up to the accountant's slack); a mechanism with less noise or a
    larger contribution reads a larger one.
    """

    def __init__(self, count: int) -> None:
        self.base = np.zeros(count)
        self.shift = np.zeros(count)
        self.releases = 0
        #: a release whose canary contribution could not be known (then no statistic at all)
        self.unknown = False

    def add(self, base: np.ndarray, shift: np.ndarray) -> None:
        self.base += base
        self.shift += shift
        self.releases += 1

    def values(self, factor: float = 1.0) -> np.ndarray | None:
        """``base + factor·shift`` per canary (``None`` before any release): ``factor`` 2 reads
        the replace-one relation, whose neighbour of an inserted canary is the opposite one
        (``−c_j``, a contribution of the same bound), ``2⟨c_j, u_j⟩`` away in the statistic."""
        if not self.releases or self.unknown:
            return None
        sign = -1.0 if self.shift.sum() < 0 else 1.0  # a server step that negates the sum
        return sign * (self.base + float(factor) * self.shift)

    def state_dict(self) -> dict[str, Any]:
        """Tensors (a checkpoint loads with ``weights_only``)."""
        return {
            "base": torch.from_numpy(self.base.copy()),
            "shift": torch.from_numpy(self.shift.copy()),
            "releases": self.releases,
            "unknown": self.unknown,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base = torch.as_tensor(state["base"]).double().numpy().copy()
        self.shift = torch.as_tensor(state["shift"]).double().numpy().copy()
        self.releases = int(state["releases"])
        self.unknown = bool(state.get("unknown", False))


def covering_places(total: int, chunk_size: int | None = None) -> list[int]:
    """The places of a round's sequence of ``total`` rows, cut into chunks of ``chunk_size``
    (``None``: one chunk), that every engine path of a client row passes through, most
    telling first: the last row (the last chunk's last row, in its remainder past any block
    that does not divide it), the first row (the first chunk's), the first chunk's last row
    (a full chunk's remainder) and the last chunk's first row; no place twice."""
    if total <= 0:
        return []
    size = total if chunk_size is None else max(1, min(int(chunk_size), total))
    last_start = (total - 1) // size * size
    places = [total - 1, 0, size - 1, last_start]
    return list(dict.fromkeys(places))


# ---------------------------------------------------------------------------- client canaries
class ClientCanaries:
    """Canary clients of the round (module docstring, first bullet of "what the canaries
    enter").

    The message stage's hook (:class:`~pl_privfed.engine.MessageHook`, put on the stage from
    ``algorithm.canaries``): the engine places them among the round's clients
    (:meth:`place`), the chunks give them their gradients (:meth:`client_gradients`) and report
    what they sent through the chunk's operator and noise (:meth:`sent`),
    :meth:`~pl_privfed.engine.Reduction.received` adds their sum and hands the received sum to
    :meth:`observe`; the held-out ones draw the white-box null (:meth:`noise`);
    :meth:`gradients` adds nothing.

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
        operator: the algorithm's operator, whose bound sets ``N`` (read every round: an
            adaptive clip's moves).
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
        operator: Any = None,
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
        self.message_norm: float | None = None  # ||c_j||, the last one sent
        self.operator = operator
        self._sent_round = False
        self.white = WhiteBox(self.count)
        #: the per-canary check against the declared bound (the callback's; ``None``: none)
        self.bound: CanaryBound | None = None
        #: this round's (round, who would take part, own-noise projections, contributions)
        self._round: tuple[int, Tensor, np.ndarray, np.ndarray] | None = None

    @property
    def count(self) -> int:
        return int(self.inserted.numel())

    @property
    def message_sign(self) -> float:
        """``-1`` when the inserted canaries' messages point against their directions (the
        algorithm's lines negate a gradient, e.g. a model delta ``−η Σ g``), else ``1``."""
        return -1.0 if self.white.shift.sum() < 0 else 1.0

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

    def place(
        self, round_index: int, ids: Tensor, num_clients: int, chunk_size: int | None = None
    ) -> Tensor:
        """The round's clients ``ids`` with the inserted canaries that take part in round
        ``round_index`` among them: canary ``j`` is client ``n + j`` (``n = num_clients``: no
        real client's index, so no real client's stream), from ``(seed, STREAM_AUDIT,
        AUDIT_PLACEMENT, round)``. The initialization's round (``-1``) has none.

        Every engine path a client row can take is covered in every round: with the engine's
        chunks of ``chunk_size`` rows (``None``: one chunk) cut from the sequence of ``n_ids +
        a`` rows, the first canaries (in a keyed order) take :func:`covering_places`, the last
        row of the round (the last chunk's last row: in that chunk's remainder past any block
        size that does not divide it), the first row (the first chunk's), the first chunk's
        last row (a full chunk's remainder) and the last chunk's first row; the others take
        places uniform over the rest of the sequence. So a branch that treats some rows of a
        round differently from the others is met by a canary every round, not by chance (a
        chunk's remainder is 2 rows of 10,050 on the distributed configs: with uniform places
        alone a canary landed there about 0.3 times in 30 rounds)."""
        self._round = None
        if round_index < 0:
            return ids
        takes = canary_participation(self.count, self.participation, self.seed, round_index)
        self._round = (round_index, takes, np.zeros(self.count), np.zeros(self.count))
        self._sent_round = False
        active = (self.inserted & takes).nonzero().flatten()
        if active.numel() == 0:
            return ids
        gen = keyed_generator(self.seed, STREAM_AUDIT, AUDIT_PLACEMENT, round_index)
        total = ids.numel() + active.numel()
        fixed = torch.tensor(covering_places(total, chunk_size)[: active.numel()])
        where = torch.zeros(total, dtype=torch.bool)
        where[fixed] = True
        free = (~where).nonzero().flatten()
        drawn = free[torch.randperm(free.numel(), generator=gen)[: active.numel() - fixed.numel()]]
        where[drawn] = True
        order = active[torch.randperm(active.numel(), generator=gen)] + num_clients
        placed = torch.empty(total, dtype=ids.dtype)
        placed[~where] = ids.cpu()
        placed[torch.cat([fixed, drawn])] = order.to(ids.dtype)
        return placed.to(ids.device)

    def client_gradients(self, index: Tensor, round_index: int, like: Tensor) -> Tensor:
        """``[a, d]``: canary ``j``'s gradient ``N·u_j`` for each ``j`` of ``index``, every
        local step (``N``: :meth:`input_norm` of the algorithm's operator, or the given
        norm), so the algorithm's lines make its message of it as of a real gradient."""
        norm = self.input_norm_used = self.input_norm(self.operator)
        rows = self.directions[index.to(self.directions.device)] * norm
        return rows.to(like.device, like.dtype)

    def sent(
        self, round_index: int, key: str, index: Tensor, clean: Tensor, noise: Tensor | None
    ) -> None:
        """What the canary clients ``index`` of a chunk sent to the sum ``key``: their clean
        messages ``c_j`` (the chunk's operator call, the algorithm's lines) and their own
        noise (the chunk's per-client draw, ``None`` where clients add none). The white-box
        statistic (:class:`WhiteBox`) reads ``⟨c_j, u_j⟩`` and, under local noise,
        ``⟨z_j, u_j⟩``; the per-canary check (:attr:`bound`) reads ``||c_j||``."""
        state = self._round
        if state is None or state[0] != round_index or key != self.key or not index.numel():
            return
        _, _, own, shift = state
        index = index.to("cpu", torch.int64)
        u = self.directions[index.to(self.directions.device)]
        shift[index.numpy()] += (u * clean.to(u.device, u.dtype)).sum(1).double().cpu().numpy()
        if noise is not None:
            own[index.numpy()] = (u * noise.to(u.device, u.dtype)).sum(1).double().cpu().numpy()
        if self.bound is not None:  # each message against Φ (times an adaptive clip's C_t/C_0)
            norms = torch.linalg.vector_norm(clean, dim=-1, dtype=torch.float64)
            bound = self.bound.declared * operator_ratio(self.operator)
            self.bound.add(round_index, index, norms, bound)
        self.messages_sent += int(index.numel())
        self.message_norm = float(torch.linalg.vector_norm(clean[0].double()))
        if not self._sent_round:
            self.rounds_sent += 1
            self._sent_round = True

    def noise(
        self, round_index: int, key: str, draw: Callable[[int], Tensor | None]
    ) -> Tensor | None:
        """The own noise the held-out canaries that would take part this round would have
        drawn (``draw(j)``, :meth:`~pl_privfed.engine.MessageStage.canary_noise`), projected
        on ``u_j``: the white-box null under local noise (an inserted canary's is its real
        draw, :meth:`sent`). Adds nothing (``None``)."""
        state = self._round
        if state is None or state[0] != round_index or key != self.key:
            return None
        _, takes, own, _ = state
        for j in (takes & ~self.inserted).nonzero().flatten().tolist():
            z = draw(j)
            if z is None:
                return None
            u = self.directions[j]
            own[j] = float(torch.dot(u, z.to(u.device, u.dtype)))
        return None

    def observe(
        self, round_index: int, key: str, received: Tensor, shared_noise: Tensor | None = None
    ) -> None:
        """The sum ``key`` the server received in round ``round_index`` (canaries included), and
        the noise the placement's guarantee rests on, as far as the certificate's adversary
        cannot subtract it (``shared_noise``: the aggregator's draw under central noise, the
        ``t`` honest senders' shares under distributed noise; ``None`` for local noise, whose
        guarantee is each sender's own noise): the white-box statistic of the round
        (:class:`WhiteBox`) is ``⟨shared_noise, u_j⟩`` or, under local noise, the projection
        of the canary's own noise (for a canary that would take part), plus, inserted, its
        contribution ``⟨c_j, u_j⟩``. Under distributed noise a canary's own share is not
        counted: the certificate counts only the ``t`` honest shares, and the colluding
        senders may include the canary's own."""
        if round_index < 0 or key != self.key:
            return
        self.last_received = received
        state, self._round = self._round, None
        if state is None or state[0] != round_index:
            return
        _, _, own, shift = state
        base = own.copy()
        if shared_noise is not None:
            u = self.directions
            base = (u @ shared_noise.to(u.device, u.dtype)).double().cpu().numpy()
        self.white.add(base, shift)

    def noise_drawn(self, ids: Tensor, round_index: int, rows: Tensor) -> None:
        """Nothing: client canaries read the sums, not record-level draws."""

    def gradients(
        self, ids: Tensor, round_index: int, step: int | None, like: Tensor
    ) -> Tensor | None:
        """Nothing: client canaries are senders, not records."""
        return None

    def records(self, ids: Tensor, round_index: int, step: int | None) -> None:
        """Nothing: client canaries are senders, not records."""
        return None

    def operator_applied(
        self, ids: Tensor, round_index: int, operator: Any, rows: Tensor, factor: float = 1.0
    ) -> None:
        """Nothing: client canaries go through the round's operator in :meth:`messages`."""
