"""Decentralized algorithms over a communication graph: PORTER (-DP / -GC) and BEER (paper 001).

Layout: the paper stacks the agents as the *columns* of ``d × n`` matrices (``X = [x_1, …,
x_n]``, ``001-porter.txt`` line 185) and gossips by a right product ``Q (W − I_n)`` (Algorithm 1,
lines 179 and 181). Here every per-agent quantity is a ``[n, d]`` tensor with one *row* per agent
(the package's client-axis-first convention), i.e. the transpose of the paper's matrix, so the
paper's ``Q (W − I)`` is ``(W − I)ᵀ Q = (Wᵀ − I) Q`` here — one matrix product, no loop over
agents. (For the symmetric weights of :mod:`pl_privfed.graphs` the transpose changes nothing; it
matters for a non-symmetric ``W``, which paper 001 Def. 1 allows, and is tested with one.)

An algorithm here plugs into :class:`~pl_privfed.FederatedModule` like the server-based ones: it
keeps the agents' parameters ``X`` as a buffer, asks the oracle for gradients at per-agent
parameters (``grad_fn(X) -> [n, d]``, or ``grad_fn(X, per_example=True) -> [n, b, d]`` for
PORTER-DP's per-example clipping) and returns the agents' average ``x̄ = (1/n) Σ_i x_i`` as the
round's parameters, at which the module evaluates the model.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from pl_privfed.algorithms.base import (
    FederatedAlgorithm,
    GradFn,
    RecordSampling,
    RoundResult,
    check_int,
    check_positive,
    noise_to_signal,
    operator_metrics,
)
from pl_privfed.communication import Messages
from pl_privfed.graphs import Topology, mixing_rate
from pl_privfed.operators import Clip, Identity, Operator, SmoothClip
from pl_privfed.privacy import DPNoise

__all__ = ["BEER", "PORTER", "ClippingName", "DecentralizedAlgorithm", "PorterOption"]

ClippingName = Literal["smooth", "linear", "none"]
PorterOption = Literal["dp", "gc"]


def clipping_operator(clipping: ClippingName, threshold: float) -> Operator:
    """``Clip_τ`` of paper 001: smooth (Def. 2, line 106), piecewise linear (Remark 1, line 115)."""
    if clipping == "smooth":
        return SmoothClip(threshold)
    if clipping == "linear":
        return Clip(threshold)
    if clipping == "none":
        return Identity()
    raise ValueError(f"clipping must be 'smooth', 'linear' or 'none', got {clipping!r}")


class DecentralizedAlgorithm(FederatedAlgorithm):
    r"""Shared machinery of the gossip algorithms: graph, state ``[n, d]``, output iterate.

    State (registered buffers, so checkpoints carry them): ``X`` (``agent_params``), the mixing
    matrix ``W`` (``mixing_matrix``), and the uniformly sampled output iterate of paper 001
    Algorithm 1 line 16 (line 183), ``x_out ~ Uniform{x_i^{(t)} | i ∈ [n], t ∈ [T]}``
    (``output_iterate``, with ``output_round`` ``t`` and ``output_agent`` ``i``). The output is
    drawn by reservoir sampling from the ``"output"`` generator — round ``t`` replaces the kept
    iterate with probability ``1/t`` by the iterate of a uniformly drawn agent — which is
    uniform over all ``n·t`` iterates after every round ``t`` (so also when a run stops early).

    Args:
        step_size: the gradient step size ``η > 0``.
        consensus_step_size: the consensus step size ``γ > 0``.
        topology: the communication graph and mixing rule (default: Erdős–Rényi(0.8), FDLA).
        compressor: ``C``, applied row-wise (default: identity, no compression).
        noise: DP noise settings or ``None``.
        seed: seed of the compression and output-sampling generators.
    """

    privacy_unit = "record-level local DP per agent (each agent noises its own gradient)"
    observer = "the agent's neighbours"

    def __init__(
        self,
        step_size: float,
        consensus_step_size: float,
        topology: Topology | None = None,
        compressor: Operator | None = None,
        noise: DPNoise | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(step_size, noise)
        self.consensus_step_size = check_positive("consensus_step_size", consensus_step_size)
        self.topology = topology if topology is not None else Topology()
        if not isinstance(self.topology, Topology):
            raise ValueError(f"topology must be a Topology, got {topology!r}")
        self.compressor = compressor if compressor is not None else Identity()
        if not isinstance(self.compressor, Operator):
            raise ValueError(f"compressor must be an Operator, got {compressor!r}")
        self.seed = check_int("seed", seed)
        self.rate = float("nan")

    def operators(self) -> list[Operator]:
        return [self.compressor]

    def extra_repr(self) -> str:
        return (
            f"step_size={self.step_size}, consensus_step_size={self.consensus_step_size}, "
            f"topology={self.topology!r}, compressor={self.compressor!r}, noise={self.noise!r}"
        )

    def allocate(self) -> None:
        n, d = self.num_clients, self.dim
        weights = self.topology.mixing_matrix(n)
        self.rate = mixing_rate(weights)
        self.register_buffer("mixing_matrix", weights.to(self.device, self.dtype))
        self.register_buffer("agent_params", self._zeros(n, d))  # X
        self.register_buffer("output_iterate", self._zeros(d))  # x_out
        self.register_buffer("output_round", torch.zeros((), dtype=torch.int64, device=self.device))
        self.register_buffer("output_agent", torch.zeros((), dtype=torch.int64, device=self.device))
        self.add_generator("compression", self.seed)
        self.add_generator("output", self.seed + 1)

    # ------------------------------------------------------------------ helpers
    def gossip(self, q: Tensor) -> Tensor:
        """The paper's ``Q (W − I_n)`` for agents as rows: ``(W − I)ᵀ Q``."""
        return self.mixing_matrix.T @ q - q

    def compress(self, v: Tensor) -> Tensor:
        """``C(v)`` row by row, drawing from the ``"compression"`` generator."""
        return self.compressor(v, self.generator("compression"))

    def _sample_output(self) -> None:
        """Reservoir step of the uniformly sampled output iterate (Algorithm 1 line 16)."""
        t = int(self.rounds_done) + 1
        gen = self.generator("output")
        keep_new = torch.randint(t, (), generator=gen, device=self.device) == 0
        agent = torch.randint(self.num_clients, (), generator=gen, device=self.device)
        self.output_iterate.copy_(
            torch.where(keep_new, self.agent_params[agent], self.output_iterate)
        )
        self.output_round.copy_(torch.where(keep_new, t, self.output_round))
        self.output_agent.copy_(torch.where(keep_new, agent, self.output_agent))

    def output(self) -> dict[str, Tensor | int]:
        """The sampled output ``x_out`` and where it came from (round ``t`` >= 1, agent ``i``)."""
        return {
            "params": self.output_iterate.clone(),
            "round": int(self.output_round),
            "agent": int(self.output_agent),
        }

    def consensus_metrics(self) -> dict[str, Tensor]:
        """``consensus_error = ||X − 1 x̄ᵀ||_F`` and the mixing rate ``α`` (Def. 1)."""
        x = self.agent_params
        return {
            "consensus_error": torch.linalg.vector_norm(x - x.mean(0)),
            "mixing_rate": torch.tensor(self.rate),
        }


class PORTER(RecordSampling, DecentralizedAlgorithm):
    r"""PORTER (paper 001, ``001-porter.txt`` Algorithm 1, lines 167–183).

    Initialization (line 169): ``V = Q_v = G_p = 0``, ``Q_x = X = x̄⁰ 1ᵀ``. Round ``t``:

    * Option I, PORTER-DP (``option="dp"``, lines 172–174):
      ``G_τ = (1/b) Σ_{Z ∈ 𝒵} Clip_τ(∇ℓ(X; Z))`` — every example's gradient is clipped before
      the minibatch average — then ``G_p = G_τ + E`` with ``e_i ~ N(0, σ_p² I_d)`` per agent;
    * Option II, PORTER-GC (``option="gc"``, lines 175–177):
      ``G = (1/b) Σ_Z ∇ℓ(X; Z)``, ``G_p = Clip_τ(G)`` (the minibatch gradient is clipped);
    * line 178: ``Q_v ← Q_v + C(V − Q_v)`` (communication);
    * line 179: ``V ← V + γ Q_v (W − I) + G_p^{(t)} − G_p^{(t−1)}`` (gradient tracking);
    * line 180: ``Q_x ← Q_x + C(X − Q_x)`` (communication);
    * line 181: ``X ← X + γ Q_x (W − I) − η V``.

    ``Clip_τ`` is the smooth clipping ``τ/(τ + ||x||) x`` of Def. 2 (line 106) by default, or the
    piecewise-linear ``min(1, τ/||x||) x`` of Remark 1 (line 115) with ``clipping="linear"``
    (``"none"``: no clipping — PORTER-GC then is BEER, see :class:`BEER`). ``C`` is any
    compressor (paper §5 uses biased random sparsification, Example 1 line 137:
    :class:`~pl_privfed.operators.RandKBiased`).

    Privacy (PORTER-DP; Theorem 1, line 245; record-level local DP against the agent's
    neighbours): each agent's released messages are post-processing of its noisy gradients
    ``G_p``. Replacing one record of agent ``i`` changes the sum of its ``b`` clipped
    per-example gradients by at most ``2τ`` (``τ`` under add/remove), so the noised average
    ``G_τ`` has sensitivity ``2τ/b`` under the default replace-one relation (paper 001 Def. 4:
    datasets "different by one data point"). Each round uses ``b`` of the agent's ``m``
    records; the defensible ε amplifies by that sampling as what it is
    (:class:`~pl_privfed.algorithms.base.RecordSampling`: sampling without replacement with the
    datamodule's ``batch_sampling: without_replacement``, none for reshuffled epochs); the
    papers' convention (add/remove, Poisson at ``q = b/m``) is reported beside it. With
    ``DPNoise(epsilon=…, calibration="paper")`` the noise is Theorem 1's
    ``σ_p = τ sqrt(T log(1/δ))/(m ε)`` (eq. 5, line 250; paper §5 line 295) — the package formula
    ``q · (τ/b) · sqrt(T log(1/δ))/ε`` equals it for every ``b``.

    Args:
        step_size: the gradient step size ``η > 0``.
        consensus_step_size: the consensus step size ``γ > 0``.
        option: ``"dp"`` (Option I, PORTER-DP) or ``"gc"`` (Option II, PORTER-GC).
        clip_threshold: ``τ > 0``.
        clipping: ``"smooth"`` (Def. 2), ``"linear"`` (Remark 1) or ``"none"`` (``"gc"`` only).
        topology: graph and mixing rule (paper §5: Erdős–Rényi(0.8), FDLA).
        compressor: ``C`` (default identity).
        noise: DP noise, required with ``option="dp"`` and refused with ``"gc"``.
        batch_size: ``b``, each agent's minibatch size (PORTER-DP: it sets the sensitivity
            ``τ/b``; checked against the data before training and every round).
        local_dataset_size: ``m``, records per agent (PORTER-DP: sampling rate ``b/m``);
            ``None`` takes the smallest shard of the data (:class:`~pl_privfed.algorithms.base.
            RecordSampling`).
        seed: seed of the compression and output generators.
    """

    def __init__(
        self,
        step_size: float,
        consensus_step_size: float,
        option: PorterOption = "dp",
        clip_threshold: float = 1.0,
        clipping: ClippingName = "smooth",
        topology: Topology | None = None,
        compressor: Operator | None = None,
        noise: DPNoise | None = None,
        batch_size: int = 1,
        local_dataset_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(step_size, consensus_step_size, topology, compressor, noise, seed)
        if option not in ("dp", "gc"):
            raise ValueError(f"option must be 'dp' (PORTER-DP) or 'gc' (PORTER-GC), got {option!r}")
        self.option = option
        self.clip_threshold = check_positive("clip_threshold", clip_threshold)
        self.clipping = clipping
        self.clip = clipping_operator(clipping, self.clip_threshold)
        self._init_record_sampling(batch_size, local_dataset_size)
        if option == "dp":
            if noise is None:
                raise ValueError("option='dp' (PORTER-DP) needs noise (paper 001 line 174)")
            if clipping == "none":
                raise ValueError("option='dp' needs clipping 'smooth' or 'linear', got 'none'")
        elif noise is not None:
            raise ValueError(f"option='gc' (PORTER-GC) adds no noise, got noise={noise!r}")

    def extra_repr(self) -> str:
        return (
            f"option={self.option!r}, clip_threshold={self.clip_threshold}, "
            f"clipping={self.clipping!r}, batch_size={self.batch_size}, "
            f"local_dataset_size={self.local_dataset_size}, " + super().extra_repr()
        )

    @property
    def sample_rate(self) -> float:
        """``q = b/m`` for PORTER-DP (record-level sampling), 1 otherwise."""
        return self.record_rate if self.option == "dp" else 1.0

    def message_bound(self) -> float | None:
        """PORTER-DP: ``τ/b``, one record's largest contribution to the noised average ``G_τ``."""
        if self.option == "dp":
            return self.clip_threshold / self.batch_size
        return None

    def allocate(self) -> None:
        super().allocate()
        n, d = self.num_clients, self.dim
        for name in ("agent_params_surrogate", "tracking", "tracking_surrogate", "noisy_gradient"):
            self.register_buffer(name, self._zeros(n, d))  # Q_x, V, Q_v, G_p

    def initialize(self, x: Tensor, grad_fn: GradFn) -> None:
        """Line 169: ``V = Q_v = G_p = 0``, ``Q_x = X = x̄⁰ 1ᵀ``."""
        for name in ("tracking", "tracking_surrogate", "noisy_gradient"):
            getattr(self, name).zero_()
        self.agent_params.copy_(x.expand_as(self.agent_params))
        self.agent_params_surrogate.copy_(self.agent_params)

    def local_gradient(self, grad_fn: GradFn) -> tuple[Tensor, dict[str, Tensor]]:
        """``G_p^{(t)}`` at ``X^{(t−1)}``: Option I (lines 173–174) or Option II (176–177)."""
        x = self.agent_params
        if self.option == "dp":
            per_example = grad_fn(x, per_example=True)  # ∇ℓ(X; Z), [n, b, d]
            if per_example.shape[1] != self.batch_size:
                raise ValueError(
                    f"batch_size={self.batch_size} (sets the sensitivity τ/b and the sampling "
                    f"rate b/m) but the agents' minibatches have {per_example.shape[1]} examples"
                )
            clipped = self.clip(per_example)  # Clip_τ of every example's gradient
            metrics = operator_metrics(per_example, clipped)
            g_tau = clipped.mean(1)  # line 173: G_τ
            g_p = g_tau + self._gaussian(*g_tau.shape)  # line 174: G_p = G_τ + E
            metrics["noise_to_signal"] = noise_to_signal(g_p.sum(0), g_tau.sum(0))
            return g_p, metrics
        grads = grad_fn(x)  # line 176: G, [n, d]
        g_p = self.clip(grads)  # line 177: G_p = Clip_τ(G)
        return g_p, operator_metrics(grads, g_p)

    def round(self, x: Tensor, grad_fn: GradFn) -> RoundResult:
        g_p, metrics = self.local_gradient(grad_fn)  # lines 172–177
        gamma, eta = self.consensus_step_size, self.step_size
        q_v, v = self.tracking_surrogate, self.tracking
        sent_v = self.compress(v - q_v)
        q_v.add_(sent_v)  # line 178: Q_v ← Q_v + C(V − Q_v)
        v.add_(self.gossip(q_v), alpha=gamma).add_(g_p).sub_(self.noisy_gradient)  # line 179
        self.noisy_gradient.copy_(g_p)
        q_x, x_agents = self.agent_params_surrogate, self.agent_params
        sent_x = self.compress(x_agents - q_x)
        q_x.add_(sent_x)  # line 180: Q_x ← Q_x + C(X − Q_x)
        x_agents.add_(self.gossip(q_x), alpha=gamma).sub_(v, alpha=eta)  # line 181
        self._sample_output()  # line 183
        metrics.update(self.consensus_metrics())
        metrics["tracking_error"] = torch.linalg.vector_norm(v - v.mean(0))
        metrics["tracking_gap"] = torch.linalg.vector_norm(v.mean(0) - g_p.mean(0))
        messages = [  # each agent broadcasts C(V − Q_v) and C(X − Q_x) to its neighbours
            Messages("agent_to_agent", sent_v),
            Messages("agent_to_agent", sent_x),
        ]
        return RoundResult(params=x_agents.mean(0), metrics=metrics, messages=messages)


class BEER(PORTER):
    """BEER (Zhao, Li, Li, Richtárik & Chi 2022): PORTER-GC without clipping.

    Paper 001 §4.3 (after Theorem 4): "When the gradients are bounded, we can omit the clipping
    operator in PORTER-GC, which become the same as BEER". Algorithm 1 Option II with
    ``G_p = G`` (lines 176–181, no ``Clip_τ``).

    Args:
        step_size: ``η > 0``.
        consensus_step_size: ``γ > 0``.
        topology: graph and mixing rule.
        compressor: ``C`` (default identity).
        seed: seed of the compression and output generators.
    """

    def __init__(
        self,
        step_size: float,
        consensus_step_size: float,
        topology: Topology | None = None,
        compressor: Operator | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(
            step_size,
            consensus_step_size,
            option="gc",
            clipping="none",
            topology=topology,
            compressor=compressor,
            seed=seed,
        )
