"""Distributed DP-SGD (paper 002 eq. 2)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from pl_privfed.algorithms.base import CLIENT_LEVEL_DP, FederatedAlgorithm, RoundResult
from pl_privfed.algorithms.server_opt import ServerOptimizer
from pl_privfed.checks import check_positive
from pl_privfed.communication import Messages
from pl_privfed.engine import ClientChunk, Reduction
from pl_privfed.operators import Identity, Operator
from pl_privfed.privacy import DPNoise, Release

__all__ = ["DistributedDPSGD"]


class DistributedDPSGD(FederatedAlgorithm):
    r"""Distributed DP-SGD: ``x ← x − γ ( (1/n) Σ_i β·Ψ(∇f_i(x)) + z )``.

    Paper 002 (``002-alpha-normec.md``), eq. (2), line 73, with every client taking part
    (``B = n``). ``Ψ`` is the operator (hard clipping ``Clip(τ)`` or smoothed normalization
    ``SmoothedNormalization(α)``); ``β`` (``scale``) multiplies its output, which is how the
    papers' experiments sweep a sensitivity "β" for DP-SGD with smoothed normalization
    (Appendix D.1: "Sensitivity/clip threshold β"); ``β = 1`` is eq. (2) as written.

    Noise (when ``noise`` is set), with ``Φ = β · bound(Ψ)``, where ``noise.placement`` puts it
    (the message stage's, :mod:`pl_privfed.engine.message`; line 73's ``z`` moves, nothing else):

    * ``local`` (eq. 2 as written: each client adds ``z_i ~ N(0, σ² I)`` to ``β Ψ(∇f_i)``; the
      server, which sees every message, is the adversary: noise multiplier ``σ/2Φ`` per round
      under replace-one, ``σ/Φ`` under add/remove, the papers' convention);
    * ``central`` (a trusted aggregator adds one ``z ~ N(0, σ² I)`` to ``Σ_i β Ψ(∇f_i)``, i.e.
      ``z/n`` to the average: one client moves the sum by at most ``Φ``, multiplier ``σ/Φ``
      against whoever sees the models);
    * ``distributed`` (every client adds ``N(0, σ²/t)`` under secure aggregation; the sum holds
      ``σ²`` with ``t`` or more senders).

    ``σ`` follows eq. (3) with ``B = n`` (see :func:`~pl_privfed.privacy.paper_noise_std`; for
    central and distributed noise it sizes the noise of the sum, whose sensitivity is ``Φ``),
    the target ε, or the noise multiplier given directly.

    Server optimizer (:mod:`~pl_privfed.algorithms.server_opt`): the pseudo-update is
    ``Δ^k = −((1/n) Σ_i β Ψ(∇f_i(x^k)) + z)``, the released average, at step size ``γ``
    (the default :class:`~pl_privfed.algorithms.ServerSGD` is line 73); post-processing, so the
    privacy above is unchanged.

    Args:
        step_size: ``γ > 0``.
        operator: ``Ψ``; identity (plain distributed gradient descent) by default; an
            :class:`~pl_privfed.operators.AdaptiveClip` adapts its norm between rounds.
        scale: ``β > 0`` multiplying ``Ψ``'s output.
        noise: DP noise settings (``noise.placement``: where it is added) or ``None``.
        server_optimizer: the server's step on ``Δ^k`` (``None``: line 73).
    """

    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "γ",
        "scale": "β",
    }  # paper 002 eq. (2)

    def __init__(
        self,
        step_size: float,
        operator: Operator | None = None,
        scale: float = 1.0,
        noise: DPNoise | None = None,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(step_size, noise, server_optimizer)
        self.operator = operator if operator is not None else Identity()
        if not isinstance(self.operator, Operator):
            raise ValueError(f"operator must be an Operator, got {operator!r}")
        self.scale = check_positive("scale", scale)

    def operators(self) -> list[Operator]:
        return [self.operator]

    def release(self) -> Release:
        """Each client's message ``β Ψ(∇f_i)`` has norm at most ``Φ = β · bound(Ψ)``; every
        client takes part in every round (an adaptive clip's ``C_0``: its noise follows ``C_t``,
        :mod:`pl_privfed.operators.adaptive`)."""
        bound = self.operator.reference_bound
        bound = None if bound is None else self.scale * bound
        return Release(CLIENT_LEVEL_DP, bound, clients=self.num_clients)

    def span_states(self) -> tuple[str, ...] | None:
        """Stateless; ``β Ψ(∇f_i)`` with a norm-based Ψ stays in the span of the client's
        gradient (:mod:`pl_privfed.layer_rules.span`)."""
        return () if self.operator.norm_based else None

    def client_update(self, chunk: ClientChunk) -> None:
        grads = chunk.grad(chunk.x)  # line 73: ∇f_i(x^k)
        chunk.transmit(grads, self.operator, factor=self.scale)  # β Ψ(∇f_i) (+ z_i or a share)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        n = self.num_clients
        total, metrics = reduced.received()  # Σ_i β Ψ(∇f_i) + z (clients', shares or central)
        self.release_clip_count(reduced, metrics)  # adaptive clipping: b̃ and C_{t+1}
        aggregate = total / n
        metrics["aggregate_norm"] = torch.linalg.vector_norm(aggregate)
        new_x = self.server_step(x, -aggregate, self.step_size)  # x − γ·aggregate
        messages_sent = [
            reduced.messages("client_to_server"),
            Messages.dense("server_to_client", self.dim, copies=n),
        ]
        return RoundResult(params=new_x, metrics=metrics, messages=messages_sent)
