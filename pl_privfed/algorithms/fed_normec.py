"""Fed-α-NormEC / DP-Fed-α-NormEC (paper 004 Algorithm 1)."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor

from pl_privfed.algorithms.base import RoundResult
from pl_privfed.algorithms.fedavg import LocalUpdateAlgorithm
from pl_privfed.algorithms.local import LocalSolver
from pl_privfed.algorithms.server_opt import ServerOptimizer
from pl_privfed.checks import check_choice, check_positive
from pl_privfed.communication import Messages
from pl_privfed.engine import ClientChunk, Reduction
from pl_privfed.operators import SmoothedNormalization
from pl_privfed.privacy import Cohort, DPNoise, Release
from pl_privfed.sampling import BernoulliSampler, check_probability

__all__ = ["FedAlphaNormEC", "Participation"]

Participation = Literal["as_written", "practical"]


class FedAlphaNormEC(LocalUpdateAlgorithm):
    r"""Fed-α-NormEC / DP-Fed-α-NormEC (paper 004, ``004-fed-alpha-normec.md``, Algorithm 1).

    Algorithm 1 (lines 105–128), per round ``k``, for every client ``i`` in parallel:

    * line 4: local update ``T_i(x^k)`` (the local solver at local step size γ: ``T`` local GD
      steps of size ``γ/T``, ``T_i(x) = x − (γ/T) Σ_j ∇f_i(x_i^{k,j})``, Theorem 1, line 137;
      or cyclic incremental gradient, ``γ/N`` per sample, App. G eq. (2), line 850);
    * line 5: ``Δ_i = Norm_α((x^k − T_i(x^k))/γ − v_i)``, where ``(x − T_i(x))/γ`` is computed as
      the paper defines it, ``(1/T) Σ_j ∇f_i(x_i^{k,j})`` (exactly ``∇f_i(x^k)`` for one step);
    * line 6: ``v_i ← v_i + β Δ_i``;
    * line 7: ``q_i = 1/p`` with probability ``p``, else 0;
    * lines 8–9: transmit ``Δ̂_i = q_i Δ_i`` (non-private) or ``q_i (Δ_i + z_i)``,
      ``z_i ~ N(0, σ² I)`` (private) — only clients with ``q_i ≠ 0`` send anything;

    and the server (line 11) ``v̂ ← v̂ + (β/M) Σ_i Δ̂_i`` and (line 12)
    ``x ← x − η v̂/||v̂||`` (``server_normalization``, 0/0 = 0) or ``x ← x − η v̂`` (the paper's
    experiments, App. D line 318, turn the normalization off).

    Server optimizer (:mod:`~pl_privfed.algorithms.server_opt`): it acts at line 12 only, on the
    direction line 12 steps along, ``Δ^k = −v̂^{k+1}/||v̂^{k+1}||`` (``−v̂^{k+1}`` without server
    normalization), at step size ``η``: ``x^{k+1} = x^k + η u_k``; line 11's ``v̂``, the error
    feedback's server memory that mirrors the clients' ``v_i``, is kept as written. The default
    :class:`~pl_privfed.algorithms.ServerSGD` is line 12 exactly; any other is post-processing
    of the released sums (privacy unchanged).

    Participation (``participation``):

    * ``"as_written"`` (default): every client computes ``T_i`` and updates ``v_i`` every round,
      transmitting or not (lines 3–6 run for all ``i``); only the transmission is sampled.
    * ``"practical"``: only the sampled clients compute and update their memory (unsampled
      clients are offline and do nothing), and they send ``Δ_i`` (+ ``z_i``) with weight 1
      instead of ``1/p``, so that ``v̂ = (1/M) Σ_i v_i`` holds exactly (noise aside) as in
      EF21 with partial participation. This is not Algorithm 1: it saves the ``(1−p)`` share of
      the local computation and is what a deployment can run.

    With ``p = 1``, one local GD step, no noise, Algorithm 1 is α-NormEC (paper 004 line 147):
    :class:`FedAlphaNormEC` then reproduces :class:`~pl_privfed.algorithms.AlphaNormEC` with the
    same ``step_size`` (η) exactly, and with the same noise seed its private version too.

    Memory initialization: ``"zeros"`` (``v_i⁰ = 0``) or ``"local_update"``
    (``v_i⁰ = (x⁰ − T_i(x⁰))/γ``, i.e. ``R = 0`` in Theorem 1); always ``v̂⁰ = (1/M) Σ_i v_i⁰``
    (line 1).

    DP noise: ``σ`` from :class:`~pl_privfed.privacy.DPNoise`, where ``noise.placement`` puts it:
    line 9's ``z_i`` as written (``local``), one ``N(0, σ²)`` on the transmitted sum from a
    trusted aggregator (``central``) or shares ``N(0, σ²/t)`` under secure aggregation
    (``distributed``); line 6's memory ``v_i`` always takes the clean ``Δ_i`` and line 11's
    ``v̂`` the received sum. The paper calibration gives
    ``σ = c · p · sqrt(K log(1/δ))/ε`` (Corollary 2, line 159), which the server's factor β turns
    into the paper's experimental noise ``p β sqrt(K log(1/δ))/ε`` (§5, line 175). Accountant
    (client-level local DP against the server, which receives each transmitted ``Δ̂_i`` and
    knows its sender): noise multiplier ``σ/2`` per round under the default replace-one
    relation (``Norm_α`` is bounded by 1, so a client can move its message by 2), composed over
    all ``K`` rounds — the Bernoulli participation is observed by the server and amplifies
    nothing against it. The papers' convention, ``σ/1`` at Poisson rate ``p`` (add/remove,
    amplification by the participation, paper 004 Cor. 2), is reported beside it.

    Args:
        step_size: the server step size ``η > 0``.
        local_step_size: ``γ > 0``.
        beta: ``β > 0``.
        alpha: ``α >= 0``.
        local_solver: ``T_i`` (default one local GD step).
        participation_prob: ``p ∈ (0, 1]``.
        participation: ``"as_written"`` or ``"practical"``.
        server_normalization: line 12 as written (True) or ``x ← x − η v̂`` (False).
        memory_init: ``"zeros"`` or ``"local_update"``.
        noise: DP noise (DP-Fed-α-NormEC) or ``None``.
        sampling_seed: seed of the participation generator.
        server_optimizer: the server's step at line 12 (``None``: line 12 as written).
    """

    #: paper 004 Alg. 1: η the server's step size, γ the local one
    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "η",
        "local_step_size": "γ",
        "beta": "β",
        "alpha": "α",
        "participation_prob": "p",
    }

    def __init__(
        self,
        step_size: float,
        local_step_size: float,
        beta: float,
        alpha: float,
        local_solver: LocalSolver | None = None,
        participation_prob: float = 1.0,
        participation: Participation = "as_written",
        server_normalization: bool = True,
        memory_init: Literal["zeros", "local_update"] = "zeros",
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(step_size, local_solver, None, noise, sampling_seed, server_optimizer)
        self.local_step_size = check_positive("local_step_size", local_step_size)
        self.beta = check_positive("beta", beta)
        self.operator = SmoothedNormalization(alpha)
        self.alpha = float(alpha)
        self.participation_prob = check_probability("participation_prob", participation_prob)
        self.sampler = BernoulliSampler(self.participation_prob)  # line 7's independent q_i
        self.participation = check_choice(
            "participation", participation, ("as_written", "practical")
        )
        if not isinstance(server_normalization, bool):
            raise ValueError(f"server_normalization must be a bool, got {server_normalization!r}")
        self.server_normalization = server_normalization
        self.memory_init = check_choice("memory_init", memory_init, ("zeros", "local_update"))

    def operators(self):
        return [self.operator]

    def release(self) -> Release:
        """Line 9: a transmitting client sends ``q_i (Δ_i + z_i)`` with ``||Δ_i|| <= 1``
        (``Norm_α``), taking part independently with probability ``p``; the server divides the
        sum by a fixed number (``pM`` as written, ``M`` in ``"practical"``), so with ``p < 1``
        the cohort is a Poisson cohort with a fixed denominator (central and distributed
        noise on the sum keep sensitivity 1)."""
        return self.client_release(self.operator.bound)

    def cohort(self) -> Cohort:
        return "all" if self.participation_prob >= 1.0 else "poisson"

    def allocate(self) -> None:
        super().allocate()
        self.register_client_state("client_memory", self.dim)  # v_i
        self.register_buffer("server_memory", self._zeros(self.dim))  # v̂

    def _pseudo_gradient(self, chunk: ClientChunk) -> Tensor:
        """``(x − T_i(x))/γ = (1/T) Σ_j ∇f_i(x_i^{k,j})`` for the chunk's clients."""
        steps = self.local_solver.steps
        local = self.local_solver.run(chunk.x, chunk.grad, self.local_step_size / steps, keep="sum")
        return local.grad_sum if steps == 1 else local.grad_sum.div_(steps)

    def initializes_clients(self) -> bool:
        return self.memory_init == "local_update"

    def client_init(self, chunk: ClientChunk) -> None:
        v = chunk.rows("client_memory")
        v.copy_(self._pseudo_gradient(chunk))  # v_i⁰ = (x⁰ − T_i(x⁰))/γ
        chunk.transmit(v, key="memory")

    def server_init(self, x: Tensor, reduced: Reduction) -> None:
        total, _ = reduced.received("memory")
        self.server_memory.copy_(total / self.num_clients)  # line 1

    def begin_round(self, round_index: int) -> Tensor | None:
        """Line 7's ``q_i`` (drawn before the clients compute; they use it only at line 8):
        as written every client computes, in ``"practical"`` only the sampled ones."""
        if self.participation_prob >= 1.0:
            self._transmits = torch.ones(self.num_clients, dtype=torch.bool)
        else:
            gen = self.sampling_generator(round_index)
            self._transmits = self.sampler.sample(self.num_clients, gen).cpu()
        self._cohort_size = int(self._transmits.sum())
        if self.participation == "practical":
            return self._transmits.nonzero().squeeze(1)
        return None

    def client_update(self, chunk: ClientChunk) -> None:
        pseudo = self._pseudo_gradient(chunk)  # line 4: (x^k − T_i(x^k))/γ
        v = chunk.rows("client_memory")
        transmits = self._transmits[chunk.real_ids]  # line 7: q_i ≠ 0
        if chunk.canary is not None:  # an audit's canary clients took part: they send
            transmits = chunk.canary.clone()
            transmits[~chunk.canary] = self._transmits[chunk.real_ids]
        # line 5: Δ_i = Norm_α(pseudo − v_i); lines 8-9: the transmitting clients send Δ_i (+ z_i)
        # (the factor q_i = 1/p is the server's)
        delta = chunk.transmit(pseudo.sub_(v), self.operator, select=transmits)
        delta.add_to(v, alpha=self.beta)  # line 6 (every client; practical: the sampled ones)
        if chunk.statistics:
            chunk.add("memory", v)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        practical = self.participation == "practical"
        weight = 1.0 if practical else 1.0 / self.participation_prob  # q_i
        total, metrics = reduced.received()  # Σ_{q_i ≠ 0} (Δ_i + z_i)
        if weight != 1.0:
            total = total * weight
        self.server_memory.add_(total, alpha=self.beta / self.num_clients)  # line 11
        vhat = self.server_memory
        if "memory" in reduced.sums and not practical:
            metrics["ef_gap"] = torch.linalg.vector_norm(
                vhat - reduced.get("memory") / self.num_clients
            )
        metrics["participants"] = torch.tensor(float(self._cohort_size))
        if self.server_normalization:  # line 12, with 0/0 = 0
            norm = torch.linalg.vector_norm(vhat)
            direction = torch.where(norm > 0, vhat / norm.clamp(min=1e-30), torch.zeros_like(vhat))
        else:  # App. D (line 318): no server normalization
            direction = vhat
        new_x = self.server_step(x, direction.neg(), self.step_size)  # x − η·direction
        receivers = self._cohort_size if practical else self.num_clients
        messages = [
            reduced.messages("client_to_server"),
            Messages.dense("server_to_client", self.dim, copies=receivers),
        ]
        return RoundResult(params=new_x, metrics=metrics, messages=messages)
