"""FedAvg variants with a bounded client contribution.

* :class:`DPFedAvg` — paper 004 §3 (line 85) and App. D.1 (line 324):
  ``x ← x − (η/B) Σ_{i∈S} (β Ψ(x − T_i(x)) + z_i)`` with Ψ ∈ {clipping, smoothed normalization};
* :class:`FedAvgPerSampleClipping` — paper 003 Algorithm 1 (line 101), with the local noise of
  Corollary I (line 164);
* :class:`FedAvgPerUpdateClipping` — paper 003 Algorithm 2 (line 127) and its DP version with
  client sampling, eq. (C.1) (line 514).

Every algorithm here runs its clients' local steps through a :class:`~pl_privfed.algorithms.local.
LocalSolver` (per-client parameters ``[m, d]``, no loop over clients) and draws the cohort with a
:class:`~pl_privfed.sampling.ClientSampler` from its own ``"sampling"`` generator (checkpointed).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import torch
from torch import Tensor

from pl_privfed.algorithms.base import (
    FederatedAlgorithm,
    GradFn,
    Mechanism,
    RoundResult,
    check_int,
    check_positive,
    noise_to_signal,
    operator_metrics,
)
from pl_privfed.algorithms.local import LocalGD, LocalSolver
from pl_privfed.communication import Messages
from pl_privfed.operators import Clip, Identity, Operator
from pl_privfed.privacy import DPNoise
from pl_privfed.sampling import ClientSampler

__all__ = ["DPFedAvg", "FedAvgPerSampleClipping", "FedAvgPerUpdateClipping", "LocalUpdateAlgorithm"]


class LocalUpdateAlgorithm(FederatedAlgorithm):
    """Shared plumbing of the algorithms with local steps and client sampling.

    Args:
        step_size: the server step size.
        local_solver: the clients' local update (default one local GD step).
        sampler: the client sampler (``None``: every client, every round).
        noise: DP noise settings or ``None``.
        sampling_seed: seed of the ``"sampling"`` generator.
    """

    def __init__(
        self,
        step_size: float,
        local_solver: LocalSolver | None = None,
        sampler: ClientSampler | None = None,
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
    ) -> None:
        super().__init__(step_size, noise)
        local_solver = local_solver if local_solver is not None else LocalGD(1)
        if not isinstance(local_solver, LocalSolver):
            raise ValueError(f"local_solver must be a LocalSolver, got {local_solver!r}")
        if sampler is not None and not isinstance(sampler, ClientSampler):
            raise ValueError(f"sampler must be a ClientSampler or None, got {sampler!r}")
        check_int("sampling_seed", sampling_seed)
        self.local_solver = local_solver
        self.sampler = sampler
        self.sampling_seed = sampling_seed

    def setup(self, *, num_clients: int, **kwargs: Any) -> None:
        if self.sampler is not None:
            self.sampler.setup(num_clients)  # before the noise calibration reads sample_rate
        super().setup(num_clients=num_clients, **kwargs)

    def allocate(self) -> None:
        self.add_generator("sampling", self.sampling_seed)

    @property
    def sample_rate(self) -> float:
        return 1.0 if self.sampler is None else self.sampler.sample_rate

    def configure_data(
        self, *, batch_size: int, local_batches: int, shuffle: bool, client_sizes: list[int]
    ) -> None:
        """Check the datamodule's rounds against the local solver (called before training)."""
        self.local_solver.check_data(
            batch_size=batch_size,
            local_batches=local_batches,
            shuffle=shuffle,
            client_sizes=client_sizes,
        )

    def _cohort(self) -> tuple[Tensor | None, Tensor]:
        """``(indices of the participants or None for all, denominator)``."""
        if self.sampler is None:
            return None, torch.tensor(float(self.num_clients), dtype=torch.float64)
        mask = self.sampler.sample(self.num_clients, self.generator("sampling"))
        return mask.nonzero().squeeze(1), self.sampler.denominator(mask)

    def _empty_round(self, x: Tensor) -> RoundResult:
        """A round in which no client was sampled: nothing is sent, the model stays."""
        metrics = {"participants": torch.tensor(0.0)}
        return RoundResult(params=x.clone(), metrics=metrics, messages=[])

    def _broadcast(self, new_x: Tensor, participants: int) -> Messages:
        return Messages("server_to_client", new_x, copies=participants)


def _participants(idx: Tensor | None, n: int) -> int:
    return n if idx is None else int(idx.numel())


class DPFedAvg(LocalUpdateAlgorithm):
    r"""(DP-)FedAvg with a bounding operator Ψ on the local update (paper 004 §3, line 85).

    Per round ``k`` (``S^k`` from the sampler, ``B`` its normalization):

    .. math:: x^{k+1} = x^k − \frac{η}{B} \sum_{i∈S^k} \big(β Ψ(x^k − T_i(x^k)) + z_i^k\big)

    with ``T_i(x) = x − (γ/T) Σ_j ∇f_i(x_i^j)`` the local solver's update at local step size γ
    (``T`` steps of size ``γ/T``, paper 004 Theorem 1; one step: ``T_i(x) = x − γ∇f_i(x)``),
    ``Ψ`` clipping or smoothed normalization, ``β`` (``scale``) the sensitivity that paper 004
    App. D.1 sweeps ("β"; 1 is §3 as written) and ``z_i ~ N(0, σ² I)`` each client's noise.

    Paper 004 App. D.1 baseline (line 324): ``Ψ = Norm_α``, one local step, ``η = γ``, ``p = 1``
    (``configs/algorithms/dp_fedavg_normalization.yaml``). With ``Ψ`` the identity, one local
    step and no sampling it is distributed gradient descent with step ``ηγ``.

    Accountant: noise multiplier ``σ / (β · bound(Ψ))`` (``2β bound(Ψ)`` under replace-one) per
    round at the sampler's rate (client-level local DP).

    Args:
        step_size: the server step size ``η > 0``.
        local_step_size: ``γ > 0``; ``None`` (default) sets ``γ = η`` (App. D.1).
        operator: ``Ψ`` (default identity: plain FedAvg; noise needs a bounded Ψ).
        scale: ``β > 0`` multiplying Ψ's output.
        local_solver: ``T_i`` (default one local GD step).
        sampler: cohort sampler (default every client).
        noise: DP noise or ``None``.
        sampling_seed: seed of the sampling generator.
    """

    def __init__(
        self,
        step_size: float,
        local_step_size: float | None = None,
        operator: Operator | None = None,
        scale: float = 1.0,
        local_solver: LocalSolver | None = None,
        sampler: ClientSampler | None = None,
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
    ) -> None:
        super().__init__(step_size, local_solver, sampler, noise, sampling_seed)
        if local_step_size is None:
            local_step_size = step_size
        self.local_step_size = check_positive("local_step_size", local_step_size)
        self.operator = operator if operator is not None else Identity()
        if not isinstance(self.operator, Operator):
            raise ValueError(f"operator must be an Operator, got {operator!r}")
        self.scale = check_positive("scale", scale)

    def operators(self) -> list[Operator]:
        return [self.operator]

    def message_bound(self) -> float | None:
        bound = self.operator.bound
        return None if bound is None else self.scale * bound

    def round(self, x: Tensor, grad_fn: GradFn) -> RoundResult:
        idx, denom = self._cohort()
        if idx is not None and idx.numel() == 0:
            return self._empty_round(x)
        steps = self.local_solver.steps
        local = self.local_solver.run(x, grad_fn, self.local_step_size / steps, clients=idx)
        update = local.grad_sum.mul_(self.local_step_size / steps)  # x − T_i(x) = (γ/T) Σ_j ∇f_i
        messages = self.operator(update).mul(self.scale)  # β Ψ(x − T_i(x))
        metrics = operator_metrics(update, messages)
        clean = messages.sum(0)
        sent = messages if self.noise is None else messages + self._gaussian(*messages.shape)
        total = sent.sum(0)
        if self.noise is not None:
            metrics["noise_to_signal"] = noise_to_signal(total, clean)
        aggregate = total / denom.to(total.dtype)
        metrics["aggregate_norm"] = torch.linalg.vector_norm(aggregate)
        metrics["participants"] = torch.tensor(float(sent.shape[0]))
        new_x = x - self.step_size * aggregate
        m = _participants(idx, self.num_clients)
        return RoundResult(
            params=new_x,
            metrics=metrics,
            messages=[Messages("client_to_server", sent), self._broadcast(new_x, m)],
        )


PerSampleLevel = Literal["minibatch", "example"]


class FedAvgPerSampleClipping(LocalUpdateAlgorithm):
    r"""FedAvg with per-sample clipping (paper 003 Algorithm 1, line 101; Corollary I, line 164).

    Per round, for every participating client, from ``y_i = x`` (line 6), ``τ`` local steps
    (lines 7–10):

    * ``g_i ← min(1, c/||∇F_i(y_i)||) ∇F_i(y_i)`` (line 8) — the local (minibatch) gradient is
      clipped (``clip_level="minibatch"``, as written); ``clip_level="example"`` clips every
      example's gradient (nested vmap, :mod:`pl_privfed.grads`) and averages them, the record-level
      variant (identical for batch size 1, the paper's privacy setting);
    * private (Corollary I): ``g_i ← g_i + z_i``, ``z_i ~ N(0, σ² I)`` drawn at every local step
      (the paper writes ``N(0, σ_DP²/d · I)``: its ``σ_DP = σ √d``);
    * ``y_i ← y_i − η g_i`` (line 9);

    then the server ``x ← x + (1/|S|) Σ_{i∈S} (y_i − x)`` (line 13; ``S`` all clients in the paper,
    a sampler's cohort here, normalized by the sampler's denominator).

    Privacy (example-level local DP). Sensitivity of one noised local step: ``c/B``
    (``"example"``: one example moves the average of ``B`` clipped gradients by at most ``c/B``;
    ``2c/B`` under replace-one); ``"minibatch"`` with ``B = 1``: ``c`` (``2c`` replace-one); with
    ``B > 1``: ``2c`` under either relation (one example can turn the clipped mean ``c·u`` into
    ``−c·u``). How the local steps compose depends on the data they use:

    * :class:`~pl_privfed.algorithms.LocalSGD` on shuffled data: every step a fresh minibatch,
      ``τ`` releases per round, each at rate ``q_client · B/N`` (``N`` the smallest shard;
      shuffling without replacement analysed as Poisson sampling, as Opacus does);
    * :class:`~pl_privfed.algorithms.LocalGD`: the round's batch (``b`` examples) is reused by all
      ``τ`` steps — one release per round of ``τ`` Gaussians on the same sample, i.e. noise
      multiplier ``σ/(sens·√τ)``, at rate ``q_client · min(1, b/N)`` (``q_client`` alone when
      the data is not shuffled);
    * a fixed order (``shuffle: false``, e.g. :class:`~pl_privfed.algorithms.IncrementalGradient`):
      no record sampling; an example is used by at most ``u = ⌈τB/N⌉`` steps of a round, so one
      release per round with multiplier ``σ/(sens·√u)`` at rate ``q_client``.

    ``calibration: "target"`` solves for that accounting; ``calibration: "paper"`` is paper
    003's formula, whose ``K`` counts local steps (``R τ``) at bound ``c/B`` (``"example"``) or
    ``c``: with batch size 1 it is ``σ_DP² = c² d log(1/δ) T / (N² ε²)`` (line 172).

    Args:
        step_size: ``η > 0``, the local step size (and, through line 13, the server's).
        clip_threshold: ``c > 0``, or ``None`` for no clipping (``c → ∞``).
        local_solver: the ``τ`` local steps (default one full-batch step).
        clip_level: ``"minibatch"`` (as written) or ``"example"``.
        sampler: cohort sampler (default every client, as in Algorithm 1).
        noise: Corollary I noise, or ``None``.
        sampling_seed: seed of the sampling generator.
    """

    privacy_unit = "example-level local DP (each client noises every local step)"

    def __init__(
        self,
        step_size: float,
        clip_threshold: float | None = None,
        local_solver: LocalSolver | None = None,
        clip_level: PerSampleLevel = "minibatch",
        sampler: ClientSampler | None = None,
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
    ) -> None:
        super().__init__(step_size, local_solver, sampler, noise, sampling_seed)
        if clip_level not in ("minibatch", "example"):
            raise ValueError(f"clip_level must be 'minibatch' or 'example', got {clip_level!r}")
        self.clip_level = clip_level
        if clip_threshold is not None:
            check_positive("clip_threshold", clip_threshold)
        self.operator: Operator = Clip(clip_threshold) if clip_threshold is not None else Identity()
        self.clip_threshold = None if clip_threshold is None else float(clip_threshold)
        self.batch_size = 1  # B, examples per local step (set by configure_data)
        self.record_rate = 1.0  # probability that an example is in a release
        # releases per round, and local steps a release's example is used by (see docstring)
        steps = self.local_solver.steps
        per_step = self.local_solver.per_step_batches
        self.releases_per_round, self.uses_per_release = (steps, 1) if per_step else (1, steps)

    def operators(self) -> list[Operator]:
        return [self.operator]

    def message_bound(self) -> float | None:
        return self.operator.bound

    def record_bound(self) -> float:
        """What one example adds to a noised step before the relation: ``c/B`` or ``c``."""
        per_example = self.clip_level == "example"
        return self.message_bound() / (self.batch_size if per_example else 1)

    def accounting_sensitivity(self) -> float:
        if self.clip_level == "minibatch" and self.batch_size > 1:
            return 2.0 * self.message_bound()  # the clipped mean can flip: c·u → −c·u
        return self.record_bound() * self.noise.sensitivity_factor

    def configure_data(self, *, batch_size, local_batches, shuffle, client_sizes) -> None:
        super().configure_data(
            batch_size=batch_size,
            local_batches=local_batches,
            shuffle=shuffle,
            client_sizes=client_sizes,
        )
        # examples per local step: one minibatch each (LocalSGD), or all the round's data
        steps, per_step = self.local_solver.steps, self.local_solver.per_step_batches
        self.batch_size = int(batch_size) * (1 if per_step else local_batches)
        smallest = max(1, min(client_sizes) if client_sizes else self.batch_size)
        if not shuffle:  # a fixed order: no record sampling
            self.record_rate = 1.0
            self.releases_per_round = 1
            self.uses_per_release = (
                math.ceil(steps * self.batch_size / smallest) if per_step else steps
            )
        else:
            self.record_rate = min(1.0, self.batch_size / smallest)
            self.releases_per_round, self.uses_per_release = (steps, 1) if per_step else (1, steps)

    @property
    def sample_rate(self) -> float:
        return super().sample_rate * self.record_rate

    def setup(self, **kwargs: Any) -> None:
        super().setup(**kwargs)
        if self.noise is None or self.noise.noise_multiplier is not None:
            return
        rounds = self.noise.rounds or self.num_rounds
        noise = dataclasses.replace(self.noise, rounds=None)
        if self.noise.calibration == "paper":  # paper 003: K counts the R·τ local steps
            self.noise_std = noise.std(
                bound=self.record_bound(),
                sensitivity=self.accounting_sensitivity(),
                rounds=rounds * self.local_solver.steps,
                sample_rate=self.sample_rate,
            )
        else:  # the accountant's releases: multiplier/√uses each, releases_per_round per round
            self.noise_std = math.sqrt(self.uses_per_release) * noise.std(
                bound=self.record_bound(),
                sensitivity=self.accounting_sensitivity(),
                rounds=rounds * self.releases_per_round,
                sample_rate=self.sample_rate,
            )

    def mechanisms(self) -> list[Mechanism]:
        if self.noise is None:
            return []
        multiplier = self.noise_std / (
            self.accounting_sensitivity() * math.sqrt(self.uses_per_release)
        )
        mechanism = Mechanism(multiplier, self.sample_rate, self.privacy_unit)
        return [mechanism] * self.releases_per_round

    def round(self, x: Tensor, grad_fn: GradFn) -> RoundResult:
        idx, denom = self._cohort()
        if idx is not None and idx.numel() == 0:
            return self._empty_round(x)
        stats: list[dict[str, Tensor]] = []

        def example_grad_fn(params: Tensor, **kwargs: Any) -> Tensor:
            per_example = grad_fn(params, per_example=True, **kwargs)  # [m, B, d]
            clipped = self.operator(per_example)  # clip_c(∇f_b) for every example b
            if not stats:
                stats.append(operator_metrics(per_example, clipped))
            return clipped.mean(1)

        def transform(g: Tensor, j: int) -> Tensor:
            clipped = g if self.clip_level == "example" else self.operator(g)  # line 8
            if not stats:
                stats.append(operator_metrics(g, clipped))
            if self.noise is not None:  # Corollary I: y ← y − η(g + z)
                clipped = clipped + self._gaussian(*clipped.shape)
            return clipped

        oracle = example_grad_fn if self.clip_level == "example" else grad_fn
        local = self.local_solver.run(x, oracle, self.step_size, clients=idx, transform=transform)
        sent = local.params  # line 11: y_i to the server
        new_x = x + (sent - x).sum(0) / denom.to(x.dtype)  # line 13
        metrics = dict(stats[0]) if stats else {}
        metrics["participants"] = torch.tensor(float(sent.shape[0]))
        m = _participants(idx, self.num_clients)
        return RoundResult(
            params=new_x,
            metrics=metrics,
            messages=[Messages("client_to_server", sent), self._broadcast(new_x, m)],
        )


class FedAvgPerUpdateClipping(LocalUpdateAlgorithm):
    r"""FedAvg with per-update clipping (paper 003 Algorithm 2, line 127) and DP-FedAvg (C.1).

    Per round, the cohort ``S`` (all clients in Algorithm 2; a sampler's, e.g. fixed size ``S``,
    in eq. (C.1), line 514) each run ``τ`` local steps ``y_i ← y_i − η_l ∇F_i(y_i)`` from
    ``y_i = x`` (lines 6–9), then

    * ``Δ_i ← y_i − x`` (line 10), ``Δ_i ← min(1, c/||Δ_i||) Δ_i`` (line 11);
    * private (§3.2, line 192; C.1): ``Δ_i ← Δ_i + z_i``, ``z_i ~ N(0, σ² I)`` (the paper's
      ``N(0, σ_DP²/d · I)``, so ``σ_DP = σ √d``);
    * server ``x ← x + η_g (1/|S|) Σ_{i∈S} Δ_i`` (line 14).

    Privacy (user-level local DP): one Gaussian mechanism per round with sensitivity ``c``
    (``2c`` under replace-one) at the sampler's rate; the paper calibration is paper 003's
    ``σ_DP² = c² d log(1/δ) R / ε²`` (line 196).

    Args:
        step_size: ``η_g > 0``, the global step size.
        local_step_size: ``η_l > 0``.
        clip_threshold: ``c > 0``, or ``None`` for no clipping (``c → ∞``, plain FedAvg).
        local_solver: the ``τ`` local steps (default one full-batch step).
        sampler: cohort sampler (default every client).
        noise: DP noise on the clipped update, or ``None``.
        sampling_seed: seed of the sampling generator.
    """

    privacy_unit = "user-level (client-level) local DP (each client noises its clipped update)"

    def __init__(
        self,
        step_size: float,
        local_step_size: float,
        clip_threshold: float | None = None,
        local_solver: LocalSolver | None = None,
        sampler: ClientSampler | None = None,
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
    ) -> None:
        super().__init__(step_size, local_solver, sampler, noise, sampling_seed)
        self.local_step_size = check_positive("local_step_size", local_step_size)
        if clip_threshold is not None:
            check_positive("clip_threshold", clip_threshold)
        self.operator: Operator = Clip(clip_threshold) if clip_threshold is not None else Identity()
        self.clip_threshold = None if clip_threshold is None else float(clip_threshold)

    def operators(self) -> list[Operator]:
        return [self.operator]

    def message_bound(self) -> float | None:
        return self.operator.bound

    def round(self, x: Tensor, grad_fn: GradFn) -> RoundResult:
        idx, denom = self._cohort()
        if idx is not None and idx.numel() == 0:
            return self._empty_round(x)
        local = self.local_solver.run(x, grad_fn, self.local_step_size, clients=idx)
        update = local.params - x  # line 10: Δ_i = y_i − x
        clipped = self.operator(update)  # line 11
        metrics = operator_metrics(update, clipped)
        sent = clipped if self.noise is None else clipped + self._gaussian(*clipped.shape)
        total = sent.sum(0)
        if self.noise is not None:
            metrics["noise_to_signal"] = noise_to_signal(total, clipped.sum(0))
        new_x = x + self.step_size * (total / denom.to(total.dtype))  # line 14
        metrics["participants"] = torch.tensor(float(sent.shape[0]))
        m = _participants(idx, self.num_clients)
        return RoundResult(
            params=new_x,
            metrics=metrics,
            messages=[Messages("client_to_server", sent), self._broadcast(new_x, m)],
        )
