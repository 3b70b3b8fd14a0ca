"""The EF21 family: α-NormEC / DP-α-NormEC, Clip21 / DP-Clip21 and EF21 (paper 002)."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor

from pl_privfed.algorithms.base import CLIENT_LEVEL_DP, FederatedAlgorithm, RoundResult
from pl_privfed.algorithms.server_opt import ServerOptimizer
from pl_privfed.checks import check_choice, check_positive
from pl_privfed.communication import Messages
from pl_privfed.engine import ClientChunk, Reduction
from pl_privfed.operators import Clip, Operator, SmoothedNormalization, TopK
from pl_privfed.privacy import DPNoise, Release, SecureAggregation

__all__ = ["EF21", "AlphaNormEC", "Clip21", "ErrorFeedback", "MemoryInit"]

MemoryInit = Literal["zeros", "gradient", "gradient_offset"]


class ErrorFeedback(FederatedAlgorithm):
    r"""EF21-style error feedback with an arbitrary operator Ψ (paper 002 Algorithm 1, eqs. 8–9).

    Paper 002 (``002-alpha-normec.md``), Algorithm 1 (line 140), per round ``k``:

    * client ``i``: ``Δ_i = Ψ(∇f_i(x^k) − g_i^k)`` (line 5), ``g_i^{k+1} = g_i^k + β Δ_i``
      (line 6), transmits ``Δ̂_i = Δ_i`` (line 7) or ``Δ_i + z_i`` when private (line 8);
    * server: ``ĝ^{k+1} = ĝ^k + (β/n) Σ_i Δ̂_i`` (line 10) and
      ``x^{k+1} = x^k − γ ĝ^{k+1}/||ĝ^{k+1}||`` with server normalization (line 11, 0/0 = 0) or
      ``x^{k+1} = x^k − γ ĝ^{k+1}`` without (Appendix B.5).

    Server optimizer (:mod:`~pl_privfed.algorithms.server_opt`): it acts at line 11 only, on the
    direction line 11 steps along, ``Δ^k = −ĝ^{k+1}/||ĝ^{k+1}||`` (``−ĝ^{k+1}`` without server
    normalization), at step size ``γ``: ``x^{k+1} = x^k + γ u_k``. Line 10's ``ĝ`` (the error
    feedback's server memory, which mirrors the clients' ``g_i``) is kept as written. The default
    :class:`~pl_privfed.algorithms.ServerSGD` is line 11 exactly; any other is post-processing of
    the released sums (privacy unchanged).

    Ψ = smoothed normalization gives α-NormEC (:class:`AlphaNormEC`), Ψ = hard clipping with
    β = 1 gives Clip21 (:class:`Clip21`), Ψ = a contractive compressor gives EF21 (:class:`EF21`).

    Memory initialization (``memory_init``): ``"zeros"``; ``"gradient"``: ``g_i⁰ = ∇f_i(x⁰)``
    on the first round's minibatch (exact for full-batch clients); ``"gradient_offset"``:
    ``g_i⁰ = ∇f_i(x⁰) + e`` with ``e = (D/sqrt(K+1), 0, …, 0)`` (paper 002 line 263, ``D`` =
    ``memory_init_offset``, ``K`` = number of rounds). Always ``ĝ⁰ = (1/n) Σ_i g_i⁰`` (line 1).
    Note: with a gradient initialization the server learns ``ĝ⁰`` in the clear; the noise and
    the reported ε cover rounds ``k >= 0`` only (paper 002 Appendix C.3 protects ``ĝ⁰`` with
    secure aggregation).

    DP noise: each client adds ``z_i ~ N(0, σ² I)`` to ``Δ_i``; with the paper calibration
    ``σ = c · bound(Ψ) · sqrt(K log(1/δ))/ε`` (1 for smoothed normalization, τ for clipping), which
    the server's factor β turns into the papers' noise ``β sqrt(K log(1/δ))/ε`` (§5.2).
    Accounting (client-level local DP against the server): noise multiplier ``σ / (2 bound(Ψ))``
    per round under the default replace-one relation, beside the papers' add/remove
    ``σ / bound(Ψ)`` (docs/privacy.md).

    Args:
        step_size: ``γ > 0``.
        beta: ``β > 0``.
        operator: ``Ψ``.
        server_normalization: use line 11 as written (True) or the un-normalized step (False).
        memory_init: ``"zeros"``, ``"gradient"`` or ``"gradient_offset"``.
        memory_init_offset: ``D >= 0`` of ``"gradient_offset"``.
        noise: DP noise settings or ``None``.
        secure_aggregation: sum the clients' initial memories with simulated secure aggregation
            (paper 002 Appendix C.3: the server learns ``ĝ⁰`` but no ``g_i⁰``), and every round's
            messages too when its ``every_round`` is set. Fixed-point rounding perturbs each
            aggregate by at most ``n·2^{-f-1}`` per coordinate.
        server_optimizer: the server's step at line 11 (``None``: line 11 as written).
    """

    #: paper 002 Alg. 1 (Clip21: τ)
    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "γ",
        "beta": "β",
        "alpha": "α",
        "clip_threshold": "τ",
    }

    def __init__(
        self,
        step_size: float,
        beta: float,
        operator: Operator,
        server_normalization: bool = True,
        memory_init: MemoryInit = "zeros",
        memory_init_offset: float = 0.0,
        noise: DPNoise | None = None,
        secure_aggregation: SecureAggregation | None = None,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(step_size, noise, server_optimizer)
        self.beta = check_positive("beta", beta)
        if secure_aggregation is not None and not isinstance(secure_aggregation, SecureAggregation):
            raise ValueError(
                f"secure_aggregation must be a SecureAggregation or None, got {secure_aggregation!r}"
            )
        self.secure_aggregation = secure_aggregation
        if not isinstance(operator, Operator):
            raise ValueError(f"operator must be an Operator, got {operator!r}")
        self.operator = operator
        self.server_normalization = bool(server_normalization)
        check_choice("memory_init", memory_init, ("zeros", "gradient", "gradient_offset"))
        if not memory_init_offset >= 0:
            raise ValueError(f"memory_init_offset must be >= 0, got {memory_init_offset!r}")
        self.memory_init = memory_init
        self.memory_init_offset = float(memory_init_offset)

    def operators(self) -> list[Operator]:
        return [self.operator]

    def span_states(self) -> tuple[str, ...] | None:
        """Lines 4-6 combine gradients and memories linearly through Ψ: with a norm-based Ψ
        (smoothed normalization, clipping) ``g_i`` stays in the span of client ``i``'s
        gradients, unless the offset initialization adds ``e`` (:mod:`pl_privfed.layer_rules.span`)."""
        if not self.operator.norm_based or self.memory_init == "gradient_offset":
            return None
        return ("client_memory",)

    def release(self) -> Release:
        """Line 8: every client sends ``Δ_i`` with ``||Δ_i|| <= bound(Ψ)``, every round; its
        noise ``z_i`` is its own (local), a share of the sum's (distributed) or the trusted
        aggregator's on the sum (central)."""
        return Release(CLIENT_LEVEL_DP, bound=self.operator.bound, clients=self.num_clients)

    def allocate(self) -> None:
        self.register_client_state("client_memory", self.dim)  # g_i
        self.register_buffer("server_memory", self._zeros(self.dim))  # ĝ

    @property
    def operator_seed(self) -> int:
        """Seed of a random operator's per-client streams (rand-k)."""
        return 0 if self.noise is None else self.noise.seed + 1

    # ------------------------------------------------------------------ initialization
    def initializes_clients(self) -> bool:
        return self.memory_init != "zeros"

    def client_init(self, chunk: ClientChunk) -> None:
        g = chunk.rows("client_memory")
        g.copy_(chunk.grad(chunk.x))  # g_i⁰ = ∇f_i(x⁰)
        if self.memory_init == "gradient_offset":
            g[:, 0] += self.memory_init_offset / (self.num_rounds + 1) ** 0.5
        chunk.transmit(g, key="memory")  # (securely aggregated when configured)

    def server_init(self, x: Tensor, reduced: Reduction) -> None:
        if not self.initializes_clients():
            self.server_memory.zero_()
            return
        total, _ = reduced.received("memory")
        self.server_memory.copy_(total / self.num_clients)  # line 1: ĝ⁰ = (1/n) Σ_i g_i⁰

    # ------------------------------------------------------------------ one round
    def client_update(self, chunk: ClientChunk) -> None:
        grads = chunk.grad(chunk.x)  # line 4: ∇f_i(x^k)
        g = chunk.rows("client_memory")
        delta = chunk.transmit(grads.sub_(g), self.operator, seed=self.operator_seed)  # l. 5, 7-8
        delta.add_to(g, alpha=self.beta)  # line 6: g_i^{k+1} = g_i^k + β Δ_i
        if chunk.statistics:
            chunk.add("memory", g)  # for ef_gap = ||ĝ − (1/n) Σ_i g_i||

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        n = self.num_clients
        total, metrics = reduced.received()  # Σ_i Δ̂_i
        self.server_memory.add_(total, alpha=self.beta / n)  # line 10
        ghat = self.server_memory
        if "memory" in reduced.sums:
            metrics["ef_gap"] = torch.linalg.vector_norm(ghat - reduced.get("memory") / n)
        if self.server_normalization:  # line 11, with 0/0 = 0
            norm = torch.linalg.vector_norm(ghat)
            direction = torch.where(norm > 0, ghat / norm.clamp(min=1e-30), torch.zeros_like(ghat))
        else:  # Appendix B.5
            direction = ghat
        new_x = self.server_step(x, direction.neg(), self.step_size)  # x − γ·direction
        messages = [  # Δ̂_i up; the new model down to every client
            reduced.messages("client_to_server"),
            Messages.dense("server_to_client", self.dim, copies=n),
        ]
        return RoundResult(params=new_x, metrics=metrics, messages=messages)


class AlphaNormEC(ErrorFeedback):
    """α-NormEC / DP-α-NormEC: :class:`ErrorFeedback` with Ψ = ``Norm_α`` (paper 002 Alg. 1).

    Args:
        step_size: ``γ > 0``.
        beta: ``β > 0``.
        alpha: ``α >= 0`` of the smoothed normalization ``g/(α+||g||)`` (eq. 6).
        server_normalization: line 11 as written (True) or the un-normalized step (False).
        memory_init: see :class:`ErrorFeedback`.
        memory_init_offset: see :class:`ErrorFeedback`.
        noise: DP noise (DP-α-NormEC) or ``None``.
        secure_aggregation: see :class:`ErrorFeedback`.
        server_optimizer: see :class:`ErrorFeedback`.
    """

    def __init__(
        self,
        step_size: float,
        beta: float,
        alpha: float,
        server_normalization: bool = True,
        memory_init: MemoryInit = "zeros",
        memory_init_offset: float = 0.0,
        noise: DPNoise | None = None,
        secure_aggregation: SecureAggregation | None = None,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(
            step_size,
            beta,
            SmoothedNormalization(alpha),
            server_normalization,
            memory_init,
            memory_init_offset,
            noise,
            secure_aggregation,
            server_optimizer,
        )
        self.alpha = float(alpha)


class Clip21(ErrorFeedback):
    """Clip21 / DP-Clip21: ``g_i ← g_i + clip_τ(∇f_i(x) − g_i)``, i.e. β = 1 and Ψ = ``clip_τ``.

    Khirirat et al. (2023) as described in paper 002 §2.3 (line 134). This is *not* β·clip_1:
    the clipping threshold τ plays the role that the papers' grids call "β" for Clip21
    (Appendix D.2.4), so a grid value β maps to ``clip_threshold: β`` here.

    Args:
        step_size: ``γ > 0``.
        clip_threshold: ``τ > 0``.
        server_normalization: normalized server step (line 11) or not (the papers' Clip21 runs
            use the un-normalized step, the default here).
        memory_init: see :class:`ErrorFeedback`.
        memory_init_offset: see :class:`ErrorFeedback`.
        noise: DP noise (DP-Clip21) or ``None``; calibrated to the sensitivity τ.
        secure_aggregation: see :class:`ErrorFeedback`.
        server_optimizer: see :class:`ErrorFeedback`.
    """

    def __init__(
        self,
        step_size: float,
        clip_threshold: float,
        server_normalization: bool = False,
        memory_init: MemoryInit = "zeros",
        memory_init_offset: float = 0.0,
        noise: DPNoise | None = None,
        secure_aggregation: SecureAggregation | None = None,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(
            step_size,
            1.0,
            Clip(check_positive("clip_threshold", clip_threshold)),
            server_normalization,
            memory_init,
            memory_init_offset,
            noise,
            secure_aggregation,
            server_optimizer,
        )
        self.clip_threshold = float(clip_threshold)


class EF21(ErrorFeedback):
    """EF21 (Richtárik et al., 2021): ``g_i ← g_i + β C(∇f_i(x) − g_i)``, ``x ← x − γ ĝ``.

    Paper 002 eqs. (8)–(9) (lines 124–130) with Ψ = a contractive compressor, by default
    top-k. Non-private (a compressor has no bounded output, so no DP noise).

    Args:
        step_size: ``γ > 0``.
        compressor: the contractive compressor (default ``TopK(ratio=0.1)``).
        beta: ``β > 0`` (1 in the original EF21).
        server_normalization: normalized server step or not (default not, as in EF21).
        memory_init: see :class:`ErrorFeedback` (default ``"gradient"``, as in EF21).
        server_optimizer: see :class:`ErrorFeedback`.
    """

    def __init__(
        self,
        step_size: float,
        compressor: Operator | None = None,
        beta: float = 1.0,
        server_normalization: bool = False,
        memory_init: MemoryInit = "gradient",
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(
            step_size,
            beta,
            compressor if compressor is not None else TopK(ratio=0.1),
            server_normalization,
            memory_init,
            server_optimizer=server_optimizer,
        )
        self.compressor = self.operator
