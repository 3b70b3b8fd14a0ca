"""Distributed DP-SGD (paper 002 eq. 2)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from pl_privfed.algorithms.base import CLIENT_LOCAL_DP, FederatedAlgorithm, RoundResult
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

    Noise (when ``noise`` is set), with ``Φ = β · bound(Ψ)``:

    * ``noise_placement="client"`` (local DP, the server sees every message): each client adds
      ``z_i ~ N(0, σ² I)`` to its message ``β Ψ(∇f_i)`` before sending; the server averages
      the noisy messages. Accountant: noise multiplier ``σ/2Φ`` per round under the default
      replace-one relation (``σ/Φ`` under add/remove, the papers' convention).
    * ``noise_placement="server"`` (central DP, trusted server): the server adds one
      ``z ~ N(0, σ² I)`` to the average; one client moves the average by at most ``Φ/n``, so
      the noise multiplier is ``σ n/Φ`` under the default add/remove relation (``σ n/2Φ``
      under replace-one). Every client takes part every round: nothing is amplified.

    ``σ`` follows eq. (3) with ``B = n`` (see :func:`~pl_privfed.privacy.paper_noise_std`) or
    the noise multiplier given directly.

    Args:
        step_size: ``γ > 0``.
        operator: ``Ψ``; identity (plain distributed gradient descent) by default.
        scale: ``β > 0`` multiplying ``Ψ``'s output.
        noise: DP noise settings or ``None``.
        noise_placement: ``"client"`` or ``"server"``.
    """

    def __init__(
        self,
        step_size: float,
        operator: Operator | None = None,
        scale: float = 1.0,
        noise: DPNoise | None = None,
        noise_placement: Literal["client", "server"] = "client",
    ) -> None:
        super().__init__(step_size, noise)
        self.operator = operator if operator is not None else Identity()
        if not isinstance(self.operator, Operator):
            raise ValueError(f"operator must be an Operator, got {operator!r}")
        self.scale = check_positive("scale", scale)
        if noise_placement not in ("client", "server"):
            raise ValueError(
                f"noise_placement must be 'client' or 'server', got {noise_placement!r}"
            )
        self.noise_placement = noise_placement

    def operators(self) -> list[Operator]:
        return [self.operator]

    def release(self) -> Release:
        """Each client's message ``β Ψ(∇f_i)`` has norm at most ``Φ = β · bound(Ψ)``: noised by
        the client (local DP), or, with ``noise_placement="server"``, the average noised by
        the server (central DP, one client moves it by at most ``Φ/n``)."""
        bound = self.operator.bound
        bound = None if bound is None else self.scale * bound
        if self.noise_placement == "server":
            unit = "client-level central DP (the server noises the aggregate)"
            return Release(unit, bound, placement="central", aggregated_over=self.num_clients)
        return Release(CLIENT_LOCAL_DP, bound)

    def client_update(self, chunk: ClientChunk) -> None:
        grads = chunk.grad(chunk.x)  # line 73: ∇f_i(x^k)
        chunk.transmit(grads, self.operator, factor=self.scale)  # β Ψ(∇f_i) (+ z_i, local DP)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        n = self.num_clients
        total, metrics = reduced.received()  # Σ_i β Ψ(∇f_i) + the noise (clients' or server's)
        aggregate = total / n
        metrics["aggregate_norm"] = torch.linalg.vector_norm(aggregate)
        new_x = x - self.step_size * aggregate
        messages_sent = [
            reduced.messages("client_to_server"),
            Messages.dense("server_to_client", self.dim, copies=n),
        ]
        return RoundResult(params=new_x, metrics=metrics, messages=messages_sent)
