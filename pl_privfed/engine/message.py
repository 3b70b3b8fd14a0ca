"""The message stage: how a client's message reaches the server, written once for every algorithm.

A server-based algorithm's client lines end with "client ``i`` sends ``Δ̂_i``" and its server
lines start with "the server receives ``Σ_i Δ̂_i``". Everything between those two lines is the
same for every algorithm and is this module's job, not the algorithm's:

* the operator ``Ψ`` applied to the client's vector (clipping, smoothed normalization, a
  compressor), times a factor ``β`` where the algorithm scales it; for a norm-based ``Ψ``
  (``Ψ(v) = s(||v||)·v``) the message is never formed unless something needs its rows: the
  engine keeps ``v`` and the per-client scales ``s_i`` (:class:`Message`), sums ``Σ_i s_i v_i`` in
  one product and updates memories with one ``addcmul_``;
* the DP noise (:class:`MessageStage`), where its placement
  (:class:`~pl_privfed.privacy.NoisePlacement`, which the stage asks and never names) puts it:
  with local noise every client adds its own
  ``z_i ~ N(0, σ² I)``; the simulation draws each ``z_i`` from the client's keyed stream
  (``draws: per_client``, or whenever the rows are formed for secure aggregation), or, where the
  clients' noise reaches the iterates only through the sum the server receives, draws that sum
  ``N(0, m σ² I)`` once for the ``m`` senders (``draws: aggregate``: ``d`` normals instead of
  ``m·d``, the same distribution of every iterate); with central noise the clients send
  clean messages and a trusted aggregator adds one ``N(0, σ² I)`` to their sum (its own stream);
  with distributed noise every sender adds its share ``N(0, σ²/t · I)`` (``t`` the
  guaranteed number of contributors) and the server learns only the sum, which a round with
  fewer than ``t`` senders never releases (:meth:`MessageStage.aborts`: the sum received is zero,
  the round's result says ``released=False`` and ``metrics["aborted"]`` is 1; a run that may
  abort is refused before training unless it allows aborts:
  :meth:`~pl_privfed.privacy.DistributedNoise.check_rounds`);
* secure aggregation (simulated pairwise masks, :class:`~pl_privfed.privacy.SecureAggregation`):
  every round when configured ``every_round``, and always for the initialization's sums;
* the bookkeeping: the message counts the communication callbacks read, and the statistics the
  server returns as metrics (the operator's clip fraction and norms, the noise-to-signal ratio of
  the received sum), pfl-style ``(value, metrics)``;
* the stage's one hook (:class:`MessageHook`, :attr:`MessageStage.hook`): an audit's canaries
  (``algorithm.canaries``, set by :class:`~pl_privfed.callbacks.PrivacyAudit`; the algorithm's
  :meth:`~pl_privfed.algorithms.FederatedAlgorithm.message_stage` puts them on the stage, the
  only way they enter the engine). Canary clients are clients of the round: placed among the
  real ones (:meth:`MessageHook.place`, chunk positions from the audit's stream), they go through
  the same chunks, algorithm lines, operator call and per-client noise draw
  (:class:`~pl_privfed.engine.ClientChunk`), their gradient being their fixed direction; their
  messages reach the sum the server receives (as ``key:canaries``, :data:`CANARIES`), never
  counted as senders, messages or contributors, and never changing another client's draw;
  canary records join the clients' minibatch gradients (:mod:`pl_privfed.privacy.audit`).

Client side: :meth:`pl_privfed.engine.ClientChunk.transmit`; server side:
:meth:`pl_privfed.engine.Reduction.received`. The noise placements are this module's and the
accounting's (:mod:`pl_privfed.privacy.plan`), never an algorithm's: an algorithm's client
memories always see the clean message (it never leaves the client) and its server lines the
received, noised sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from pl_privfed.privacy import NoisePlacement, SecureAggregation, resolve_placement
from pl_privfed.rng import (
    AUDIT_COLLUSION,
    AUDIT_NOISE,
    STREAM_AUDIT,
    STREAM_CENTRAL_NOISE,
    STREAM_SERVER_NOISE,
    KeyedGenerator,
)

__all__ = [
    "CANARIES",
    "Message",
    "MessageHook",
    "MessageStage",
    "NoisePlacement",
    "noise_to_signal",
]


#: the suffix of the sum that holds the canary clients' messages to a sum (``"sent:canaries"``)
CANARIES = ":canaries"


class MessageHook(Protocol):
    """The message stage's one hook (:attr:`MessageStage.hook`): what the engine asks of an
    audit's canaries, every method answering "nothing" where they do not enter.

    * :attr:`key`: the sum the canary clients send to (their messages to any other are dropped);
    * :meth:`place`: the round's clients ``ids`` (sorted) with the canary clients that take
      part inserted among them (indices ``n + j``, at places the audit draws, the rows every
      engine path passes through included: the engine's ``chunk_size`` says where its chunks
      start and end), which the engine then cuts into chunks;
    * :meth:`client_gradients`: the gradients ``[a, d]`` of the canary clients ``index`` (their
      fixed directions), where the oracle gives the real clients';
    * :meth:`sent`: what the canary clients ``index`` of a chunk sent to the sum ``key``, their
      clean messages through the round's operator and their own noise (``None`` where
      clients add none), as :meth:`~pl_privfed.engine.ClientChunk.transmit` formed them;
    * :meth:`noise`: the own noise of the canaries that would take part but are held out (each
      drawn by the stage, :meth:`MessageStage.canary_noise`): the white-box null; adds nothing;
    * :meth:`observe`: the sum the server received (canaries included) and, where the
      placement's guarantee rests on the noise of the sum (central, distributed), that noise
      as the real clients' part of it (``shared_noise``): what a white-box auditor, who knows
      every clean contribution, cannot subtract;
    * :meth:`noise_drawn`: a record-level noise draw of the clients ``ids``
      (:meth:`~pl_privfed.engine.ClientChunk.normal`), which a white-box auditor reads;
    * :meth:`records`: extra records of the clients ``ids`` that join their per-example
      computation (:meth:`~pl_privfed.engine.ClientChunk.clipped_mean`: each at its place among
      its host's examples, through the same operator call; a
      :class:`~pl_privfed.privacy.audit_records.RecordJoin`), or ``None``;
    * :meth:`gradients`: extra records' part of the plain minibatch gradients of the clients
      ``ids`` (:class:`~pl_privfed.engine.ClientChunk` adds it to ``grad``), or ``None``;
    * :meth:`operator_applied`: the rows ``[c, d]`` a norm-based operator is about to act on
      (:meth:`~pl_privfed.engine.ClientChunk.apply`): a minibatch gradient clipped whole,
      through which a white-box auditor follows its canary records.

    Implemented by :class:`~pl_privfed.privacy.audit.ClientCanaries` (client level) and
    :class:`~pl_privfed.privacy.audit_records.RecordCanaries` (record level).
    """

    key: str

    def place(
        self, round_index: int, ids: Tensor, num_clients: int, chunk_size: int | None = None
    ) -> Tensor: ...

    def client_gradients(self, index: Tensor, round_index: int, like: Tensor) -> Tensor: ...

    def sent(
        self, round_index: int, key: str, index: Tensor, clean: Tensor, noise: Tensor | None
    ) -> None: ...

    def noise(
        self, round_index: int, key: str, draw: Callable[[int], Tensor | None]
    ) -> Tensor | None: ...

    def observe(
        self, round_index: int, key: str, received: Tensor, shared_noise: Tensor | None = None
    ) -> None: ...

    def noise_drawn(self, ids: Tensor, round_index: int, rows: Tensor) -> None: ...

    def gradients(
        self, ids: Tensor, round_index: int, step: int | None, like: Tensor
    ) -> Tensor | None: ...

    def records(self, ids: Tensor, round_index: int, step: int | None) -> Any: ...

    def operator_applied(
        self, ids: Tensor, round_index: int, operator: Any, rows: Tensor, factor: float = 1.0
    ) -> None: ...


def noise_to_signal(noisy_sum: Tensor, clean_sum: Tensor) -> Tensor:
    """``||Σ_i z_i|| / ||Σ_i Δ_i||``: the noise-to-signal ratio of an aggregate."""
    signal = torch.linalg.vector_norm(clean_sum)
    return torch.linalg.vector_norm(noisy_sum - clean_sum) / signal.clamp(min=1e-30)


class Message:
    """The clean messages ``Δ_i`` of a chunk's clients: formed rows ``[c, d]``, or the rows
    ``v_i`` with per-client scales ``s_i`` (``Δ_i = s_i v_i``, never formed).

    Attributes:
        rows: ``Δ`` itself, or ``v`` when :attr:`scales` is set.
        scales: ``[c]`` or ``None``.
    """

    def __init__(self, rows: Tensor, scales: Tensor | None = None) -> None:
        self.rows = rows
        self.scales = scales

    def add_to(self, target: Tensor, alpha: float = 1.0) -> None:
        """``target += alpha · Δ`` (a memory update, e.g. ``g_i ← g_i + β Δ_i``)."""
        if self.scales is None:
            target.add_(self.rows, alpha=alpha)
        else:
            target.addcmul_(self.rows, self.scales.unsqueeze(1), value=alpha)


@dataclass(frozen=True)
class MessageStage:
    """How the messages of one round reach the server (module docstring).

    Attributes:
        noise_std: ``σ`` of the DP noise (0 when not private).
        noise_seed: seed of the noise streams.
        noised: whether the round's messages carry DP noise.
        per_client: draw every client's ``z_i`` from its own stream (``DPNoise`` ``draws:
            per_client``) rather than their sum once (``aggregate``).
        placement: where the noise goes (:class:`~pl_privfed.privacy.NoisePlacement`, or a
            registered name, built into one); ``noise_std`` is a client's noise (local) or the
            sum's (central, distributed).
        min_contributors: with a placement's name: ``t`` of distributed noise (each sender
            adds ``N(0, σ²/t)``; a round with fewer senders is aborted).
        secure_aggregation: pairwise-masked sums, or ``None``.
        hook: the stage's one hook (:class:`MessageHook`: an audit's canaries), or ``None``.
        process: the aggregator's noise across rounds where the placement correlates it
            (:meth:`~pl_privfed.privacy.NoisePlacement.noise_process`: correlated noise,
            ``draw(round, std, seed, keyed, like)``), or ``None`` (independent draws).
        checks: the run's privacy invariants in the check mode
            (:class:`~pl_privfed.privacy.invariants.RunChecks`), told of every bounded release
            and every noise draw, or ``None`` (the mode off, or no noise).
        monitor: an audit's noise monitor, or ``None``: every noised release's realized noise
            (``released − clean``, the real senders' sum) is handed to its
            ``observe(round, key, noise, senders)``
            (:class:`~pl_privfed.privacy.audit_noise.RealizedNoise`).
    """

    noise_std: float = 0.0
    noise_seed: int = 0
    noised: bool = False
    per_client: bool = False
    placement: NoisePlacement | str = "local"
    min_contributors: int | None = None
    secure_aggregation: SecureAggregation | None = None
    hook: MessageHook | None = None
    process: Any = None
    checks: Any = None
    monitor: Any = None

    def __post_init__(self) -> None:
        placement = resolve_placement(self.placement, self.min_contributors)
        object.__setattr__(self, "placement", placement)

    @property
    def client_noise_std(self) -> float:
        """The std of one sender's own noise: ``σ`` (local), ``σ/√t`` (distributed), 0 (central)."""
        return self.placement.sender_std(self.noise_std)

    def aborts(self, senders: int, round_index: int) -> bool:
        """Whether a round with ``senders`` senders releases nothing: e.g. distributed noise with
        fewer than ``t`` contributors would carry less noise than the accounting assumes."""
        return self.noised and round_index >= 0 and self.placement.aborts(senders)

    def secure(self, round_index: int) -> bool:
        """Whether the round's sums are securely aggregated: every round with
        ``every_round``, and always the initialization's (round ``-1``)."""
        agg = self.secure_aggregation
        return agg is not None and (agg.every_round or round_index < 0)

    def clients_noise(self, round_index: int) -> bool:
        """Whether each client's message carries its own noise (or share of it) this round
        (local and distributed noise; the initialization is never noised)."""
        return self.noised and self.placement.senders_noise and round_index >= 0

    def draws_per_client(self, round_index: int) -> bool:
        """Whether the simulation draws every client's ``z_i`` (rather than their sum)."""
        return self.clients_noise(round_index) and (self.per_client or self.secure(round_index))

    def forms_rows(self, round_index: int) -> bool:
        """Whether every message must be formed (noised per client, or masked)."""
        return self.draws_per_client(round_index) or self.secure(round_index)

    def noise_of_sum(
        self, count: int, round_index: int, keyed: KeyedGenerator, like: Tensor
    ) -> Tensor:
        """The noise the server's sum carries that no client drew: the senders' noises drawn as
        their sum, ``N(0, count·s² I)`` with ``s`` a sender's std (:attr:`client_noise_std`),
        from the round's stream ``(noise seed, STREAM_SERVER_NOISE, round)``; or the trusted
        aggregator's ``N(0, σ² I)`` (central) from its own stream ``(noise seed,
        STREAM_CENTRAL_NOISE, round)``: two purposes, two keys, never the same draw twice.
        Correlated noise: the aggregator's ``(C^{-1} Z)_t`` from the stage's :attr:`process`."""
        checks, std = self.checks, self.noise_std
        if self.placement.aggregator_draws and self.process is not None:
            return self.process.draw(round_index, std, self.noise_seed, keyed, like, checks=checks)
        out = torch.zeros_like(like)
        if self.placement.aggregator_draws:
            gen = keyed(self.noise_seed, STREAM_CENTRAL_NOISE, round_index)
            out.normal_(0.0, std, generator=gen)
            if checks is not None:
                checks.drew(round_index, "central", keyed, std, release="the aggregator's sum")
            return out
        if count > 0:
            gen = keyed(self.noise_seed, STREAM_SERVER_NOISE, round_index)
            std = self.client_noise_std * math.sqrt(count)
            out.normal_(0.0, std, generator=gen)
            if checks is not None:
                checks.drew(round_index, "sum", keyed, std, count, release="the senders' sum")
        return out

    def unknown_noise(
        self, noise: Tensor, senders: int, round_index: int, keyed: KeyedGenerator
    ) -> Tensor:
        """Of the real senders' noise in a released sum (``noise``, central or distributed),
        the part the certificate's adversary cannot subtract, for the white-box auditor: the
        placement decides (:meth:`~pl_privfed.privacy.NoisePlacement.unknown_noise`: all of
        the aggregator's draw; the ``t`` honest senders' shares of a distributed sum), drawing
        any split from the audit's stream ``(noise seed, STREAM_AUDIT, AUDIT_COLLUSION,
        round)``."""
        gen = keyed(self.noise_seed, STREAM_AUDIT, AUDIT_COLLUSION, round_index)
        return self.placement.unknown_noise(noise, senders, self.client_noise_std, gen)

    def canary_noise(
        self, index: int, round_index: int, keyed: KeyedGenerator, like: Tensor
    ) -> Tensor | None:
        """The own noise of held-out canary client ``index`` in round ``round_index`` (the
        white-box null; an inserted canary's noise is the chunk's per-client draw),
        ``N(0, s² I)`` (``s`` a sender's std, :attr:`client_noise_std`: ``σ`` local, ``σ/√t``
        distributed) from the audit's stream ``(noise seed, STREAM_AUDIT, AUDIT_NOISE, round,
        index)``, so no client's draw changes; ``None`` where a client adds no noise of its own
        (central noise covers the canaries in its one draw, and a non-private round has none)."""
        std = self.client_noise_std
        if not self.clients_noise(round_index) or std <= 0:
            return None
        gen = keyed(self.noise_seed, STREAM_AUDIT, AUDIT_NOISE, round_index, index)
        return torch.zeros_like(like).normal_(0.0, std, generator=gen)
