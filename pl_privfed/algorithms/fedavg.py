"""FedAvg variants with a bounded client contribution.

* :class:`DPFedAvg` — paper 004 §3 (line 85) and App. D.1 (line 324):
  ``x ← x − (η/B) Σ_{i∈S} (β Ψ(x − T_i(x)) + z_i)`` with Ψ ∈ {clipping, smoothed normalization};
* :class:`FedAvgPerSampleClipping` — paper 003 Algorithm 1 (line 101), with the local noise of
  Corollary I (line 164);
* :class:`FedAvgPerUpdateClipping` — paper 003 Algorithm 2 (line 127) and its DP version with
  client sampling, eq. (C.1) (line 514).

Every algorithm here runs its clients' local steps through a :class:`~pl_privfed.algorithms.local.
LocalSolver` (per-client parameters ``[c, d]`` for a chunk of clients) and draws the cohort with a
:class:`~pl_privfed.sampling.ClientSampler` from the round's sampling stream
``(sampling_seed, round)`` (:mod:`pl_privfed.rng`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from torch import Tensor

from pl_privfed.algorithms.base import CLIENT_LEVEL_DP, FederatedAlgorithm, RoundResult
from pl_privfed.algorithms.local import LocalGD, LocalSolver
from pl_privfed.algorithms.server_opt import ServerOptimizer
from pl_privfed.checks import check_choice, check_int, check_positive
from pl_privfed.communication import Messages
from pl_privfed.engine import ClientChunk, Reduction
from pl_privfed.operators import AdaptiveClip, Clip, Identity, Operator
from pl_privfed.privacy import BatchSampling, Cohort, DPNoise, RecordUse, Release
from pl_privfed.rng import STREAM_SAMPLING
from pl_privfed.sampling import ClientSampler, CyclicSampler, FixedSizeSampler, PoissonSampler

__all__ = ["DPFedAvg", "FedAvgPerSampleClipping", "FedAvgPerUpdateClipping", "LocalUpdateAlgorithm"]


class LocalUpdateAlgorithm(FederatedAlgorithm):
    """Shared plumbing of the algorithms with local steps and client sampling.

    Args:
        step_size: the server step size.
        local_solver: the clients' local update (default one local GD step).
        sampler: the client sampler (``None``: every client, every round).
        noise: DP noise settings or ``None``.
        sampling_seed: seed of the ``"sampling"`` generator.
        server_optimizer: the server's step on the pseudo-update (``None``: the paper's step;
            :mod:`pl_privfed.algorithms.server_opt`).
    """

    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "η",
        "local_step_size": "γ",
    }  # paper 004 §3

    def __init__(
        self,
        step_size: float,
        local_solver: LocalSolver | None = None,
        sampler: ClientSampler | None = None,
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(step_size, noise, server_optimizer)
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

    @property
    def participation_rate(self) -> float:
        """The probability that a client takes part in a round (1 without a sampler)."""
        return 1.0 if self.sampler is None else self.sampler.sample_rate

    def expected_cohort(self) -> float:
        """``m = q·N``, the expected cohort (adaptive clipping's count denominator)."""
        return self.participation_rate * self.num_clients

    def cohort(self) -> Cohort:
        """How the sampler draws the cohort and the server normalizes (:data:`Cohort`)."""
        if self.sampler is None:
            return "all"
        if isinstance(self.sampler, PoissonSampler):
            return "poisson"
        if isinstance(self.sampler, FixedSizeSampler):
            return "fixed"
        if isinstance(self.sampler, CyclicSampler):
            return "cyclic"
        return "realized"  # Bernoulli: the average over the clients that took part

    def client_release(self, bound: float | None, unit: str = CLIENT_LEVEL_DP) -> Release:
        """Client-level DP of a message bounded by ``bound``, sent by the cohort."""
        return Release(unit, bound, **self.cohort_fields())

    def cohort_fields(self) -> dict[str, Any]:
        """The declaration's cohort: participation rate, kind, ``N`` and cohort size."""
        rate = self.participation_rate
        return {
            "participation": rate,
            "cohort": self.cohort(),
            "clients": self.num_clients,
            "cohort_size": rate * self.num_clients,
            "separation": 1 if self.sampler is None else self.sampler.separation,
        }

    def configure_data(self, *, batch_size, local_batches, shuffle, client_sizes, **_) -> None:
        """Check the datamodule's rounds against the local solver (called before training)."""
        self.local_solver.check_data(
            batch_size=batch_size,
            local_batches=local_batches,
            shuffle=shuffle,
            client_sizes=client_sizes,
        )

    def sampling_generator(self, round_index: int) -> torch.Generator:
        """The round's cohort stream ``(sampling_seed, round)``."""
        return self.keyed(self.sampling_seed, STREAM_SAMPLING, round_index)

    def begin_round(self, round_index: int) -> Tensor | None:
        """Draw the cohort ``S^k`` (all clients without a sampler) and the server's
        denominator; the participants compute."""
        if self.sampler is None:
            self._denominator, self._cohort_size = float(self.num_clients), self.num_clients
            return None
        gen = self.sampling_generator(round_index)
        mask = self.sampler.sample_round(self.num_clients, round_index, gen)
        self._denominator = float(self.sampler.denominator(mask))
        cohort = mask.nonzero().squeeze(1).cpu()
        self._cohort_size = int(cohort.numel())
        return cohort

    def _server_step(
        self,
        x: Tensor,
        reduced: Reduction,
        total: Tensor,
        metrics: dict,
        step: float,
        descent: bool = False,
    ) -> RoundResult:
        """The server's step from ``x`` along the pseudo-update ``Δ = ±total / B`` (``−`` when
        ``descent``: ``total`` sums gradient-like messages) at step size ``step``, through the
        server optimizer (``x ± step · total / B`` by default), with the round's metrics and
        messages (``total`` the participants' summed messages as received, noise included)."""
        participants = self._cohort_size
        self.release_clip_count(reduced, metrics)  # adaptive clipping: b̃ and C_{t+1}
        aggregate = total / self._denominator
        metrics["aggregate_norm"] = torch.linalg.vector_norm(aggregate)
        metrics["participants"] = torch.tensor(float(participants))
        new_x = self.server_step(x, aggregate.neg_() if descent else aggregate, step)
        messages = [reduced.messages("client_to_server")] if participants else []
        if participants:
            messages.append(Messages.dense("server_to_client", self.dim, copies=participants))
        return RoundResult(params=new_x, metrics=metrics, messages=messages)


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

    Server optimizer (:mod:`~pl_privfed.algorithms.server_opt`): the pseudo-update is
    ``Δ^k = −(1/B) Σ_{i∈S^k} (β Ψ(x^k − T_i(x^k)) + z_i^k)`` at step size ``η`` (the default
    :class:`~pl_privfed.algorithms.ServerSGD` is the line above); DP-FedAdam is this class with
    ``server_optimizer: FedAdam``, its ε unchanged (post-processing of the released sum).

    DP-FTRL-style (correlated noise, :mod:`pl_privfed.privacy.correlated`): with
    ``noise.placement`` :class:`~pl_privfed.privacy.BandedMFNoise` or
    :class:`~pl_privfed.privacy.TreeNoise` and a :class:`~pl_privfed.sampling.CyclicSampler`,
    the aggregator adds ``(C^{-1} Z)_k`` to round ``k``'s sum instead of an independent draw, so
    with the default server step ``x^{k+1} = x^0 − (η/B) Σ_{s≤k} (Σ_{i∈S^s} β Ψ(·) + (C^{-1}
    Z)_s)``: the model is ``x^0`` minus ``η/B`` times the noisy prefix sum ``A(G + C^{-1}Z)`` of
    the matrix factorization mechanism (Kairouz et al. 2021; Choquette-Choo et al. 2023). A
    server optimizer acts on the same noisy per-round increments (post-processing of the
    released ``C G + Z``: the ε is unchanged, but only plain SGD makes the model the noisy prefix
    sum whose error the factorization minimizes).

    Args:
        step_size: the server step size ``η > 0``.
        local_step_size: ``γ > 0``; ``None`` (default) sets ``γ = η`` (App. D.1).
        operator: ``Ψ`` (default identity: plain FedAvg; noise needs a bounded Ψ); an
            :class:`~pl_privfed.operators.AdaptiveClip` clips at a norm that adapts to a
            quantile of the update norms (Andrew et al. 2021, its count released beside).
        scale: ``β > 0`` multiplying Ψ's output.
        local_solver: ``T_i`` (default one local GD step).
        sampler: cohort sampler (default every client).
        noise: DP noise or ``None``.
        sampling_seed: seed of the sampling generator.
        server_optimizer: the server's step on ``Δ^k`` (``None``: the line above).
    """

    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        **LocalUpdateAlgorithm.hyperparameter_symbols,
        "scale": "β",
    }

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
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(step_size, local_solver, sampler, noise, sampling_seed, server_optimizer)
        if local_step_size is None:
            local_step_size = step_size
        self.local_step_size = check_positive("local_step_size", local_step_size)
        self.operator = operator if operator is not None else Identity()
        if not isinstance(self.operator, Operator):
            raise ValueError(f"operator must be an Operator, got {operator!r}")
        self.scale = check_positive("scale", scale)

    def operators(self) -> list[Operator]:
        return [self.operator]

    def release(self) -> Release:
        """Every participant sends ``β Ψ(x − T_i(x))`` (+ its noise or share), of norm at most
        ``β · bound(Ψ)`` before the noise (an adaptive clip's ``C_0``: its noise follows
        ``C_t``, :mod:`pl_privfed.operators.adaptive`)."""
        bound = self.operator.reference_bound
        return self.client_release(None if bound is None else self.scale * bound)

    def client_update(self, chunk: ClientChunk) -> None:
        steps = self.local_solver.steps
        local = self.local_solver.run(chunk.x, chunk.grad, self.local_step_size / steps, keep="sum")
        update = local.grad_sum.mul_(self.local_step_size / steps)  # x − T_i(x) = (γ/T) Σ_j ∇f_i
        chunk.transmit(update, self.operator, factor=self.scale)  # β Ψ(x − T_i(x)) (+ z_i)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        total, metrics = reduced.received()  # Σ_{i∈S} (β Ψ(x − T_i(x)) + z_i)
        # x − (η/B) Σ(·): the pseudo-update Δ = −Σ(·)/B at step size η
        return self._server_step(x, reduced, total, metrics, self.step_size, descent=True)


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
    a sampler's cohort here, normalized by the sampler's denominator). Line 13 has no server step
    size; ``server_step_size`` ``η_g`` (default 1, line 13 as written) scales it,
    ``x ← x + η_g (1/|S|) Σ_{i∈S} (y_i − x)`` as in Algorithm 2's line 14, and is the step size
    of a ``server_optimizer``, whose pseudo-update is ``Δ = (1/|S|) Σ_{i∈S} (y_i − x)``
    (:mod:`~pl_privfed.algorithms.server_opt`; post-processing, the privacy below unchanged).

    Privacy (example-level local DP against the server, which sees every participant's
    message and who sent it). Sensitivity of one noised local step under the default
    replace-one relation: ``2c/B`` (``"example"``: replacing one example moves the average of
    ``B`` clipped gradients by at most ``2c/B``; ``c/B`` under add/remove); ``"minibatch"``:
    ``2c`` (``c`` under add/remove with ``B = 1``; with ``B > 1`` ``2c`` under either relation,
    one example can turn the clipped mean ``c·u`` into ``−c·u``). A record is *used* when it is
    in a step's minibatch (:class:`~pl_privfed.algorithms.LocalSGD`, ``B`` examples per step) or
    in the round's batch that all ``τ`` steps of :class:`~pl_privfed.algorithms.LocalGD` reuse
    (one use is then ``τ`` Gaussians on the same sample: multiplier ``σ/(sens·√τ)``). The
    defensible ε composes a record's uses as the data draws them
    (:meth:`~pl_privfed.privacy.RecordLevel.uses`): with the datamodule's
    ``batch_sampling: without_replacement`` one release per round on a sample of the round's
    ``L = B·T`` positions of the ``N`` records of the smallest shard (a record is in at most one
    step of a round), amplified as sampling without replacement (dp-accounting); with
    ``epochs`` (reshuffled, or a fixed order with ``shuffle: false``) the record's uses
    ``⌈k·L/N⌉`` by round ``k``, unamplified. Client sampling amplifies nothing against the
    server.

    The papers' convention (reported beside it): add/remove, and

    * :class:`~pl_privfed.algorithms.LocalSGD` on shuffled data: ``τ`` releases per round, each
      at Poisson rate ``q_client · B/N``;
    * :class:`~pl_privfed.algorithms.LocalGD`: one release per round at multiplier
      ``σ/(sens·√τ)`` and rate ``q_client · min(1, b/N)`` (``q_client`` alone when the data is
      not shuffled);
    * a fixed order (``shuffle: false``, e.g. :class:`~pl_privfed.algorithms.IncrementalGradient`):
      one release per round with multiplier ``σ/(sens·√u)``, ``u = ⌈τB/N⌉``, at rate
      ``q_client``.

    ``calibration: "target"`` solves for the defensible accounting; ``calibration: "paper"`` is
    paper 003's formula, whose ``K`` counts local steps (``R τ``) at bound ``c/B``
    (``"example"``) or ``c`` and the papers' rate: with batch size 1 it is
    ``σ_DP² = c² d log(1/δ) T / (N² ε²)`` (line 172).

    Args:
        step_size: ``η > 0``, the local step size (and, through line 13, the server's).
        clip_threshold: ``c > 0``, or ``None`` for no clipping (``c → ∞``).
        local_solver: the ``τ`` local steps (default one full-batch step).
        clip_level: ``"minibatch"`` (as written) or ``"example"``.
        sampler: cohort sampler (default every client, as in Algorithm 1).
        noise: Corollary I noise, or ``None``.
        sampling_seed: seed of the sampling generator.
        server_optimizer: the server's step on ``Δ`` (``None``: line 13).
        server_step_size: ``η_g > 0`` of the server's step (1: line 13 as written).
    """

    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "η",
        "clip_threshold": "c",
    }  # paper 003 Alg. 1

    def __init__(
        self,
        step_size: float,
        clip_threshold: float | None = None,
        local_solver: LocalSolver | None = None,
        clip_level: PerSampleLevel = "minibatch",
        sampler: ClientSampler | None = None,
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
        server_step_size: float = 1.0,
    ) -> None:
        super().__init__(step_size, local_solver, sampler, noise, sampling_seed, server_optimizer)
        self.server_step_size = check_positive("server_step_size", server_step_size)
        self.clip_level = check_choice("clip_level", clip_level, ("minibatch", "example"))
        if clip_threshold is not None:
            check_positive("clip_threshold", clip_threshold)
        self.operator: Operator = Clip(clip_threshold) if clip_threshold is not None else Identity()
        self.clip_threshold = None if clip_threshold is None else float(clip_threshold)
        # what the data delivers (configure_data; until then each round uses a one-record shard)
        self.batch_size = 1  # B, examples per noised local step
        self.round_positions, self.shard_size = 1, 1  # records read per round, smallest shard
        self.batch_sampling: BatchSampling = "epochs"
        self.shuffle = True

    def operators(self) -> list[Operator]:
        return [self.operator]

    def configure_data(
        self, *, batch_size, local_batches, shuffle, client_sizes, batch_sampling="epochs"
    ) -> None:
        super().configure_data(
            batch_size=batch_size,
            local_batches=local_batches,
            shuffle=shuffle,
            client_sizes=client_sizes,
        )
        # examples per local step: one minibatch each (LocalSGD), or all the round's data
        per_step = self.local_solver.per_step_batches
        self.batch_size = int(batch_size) * (1 if per_step else local_batches)
        self.shard_size = max(1, min(client_sizes) if client_sizes else self.batch_size)
        self.round_positions = int(batch_size) * int(local_batches)
        self.batch_sampling = batch_sampling
        self.shuffle = bool(shuffle)

    def release(self) -> Release:
        """Corollary I: every local step is noised; one record moves a step's clipped average
        by at most ``c/B`` (``"example"``) or the clipped minibatch gradient by up to ``c``
        (``2c`` under either relation with ``B > 1``: the clipped mean can flip). A record is
        used when it is in a step's minibatch (``LocalSGD``) or in the batch that all ``τ``
        steps of ``LocalGD`` reuse (class docstring)."""
        unit = "example-level local DP (each client noises every local step)"
        clip, batch = self.operator.bound, self.batch_size
        if clip is None:
            return Release(unit, None)
        steps, per_step = self.local_solver.steps, self.local_solver.per_step_batches
        record = clip / batch if self.clip_level == "example" else clip
        flips = self.clip_level == "minibatch" and batch > 1
        if not self.shuffle:  # a fixed order: no record sampling
            rate, releases = 1.0, 1
            uses = math.ceil(steps * batch / self.shard_size) if per_step else steps
        else:
            rate = min(1.0, batch / self.shard_size)
            releases, uses = (steps, 1) if per_step else (1, steps)
        records = RecordUse(
            positions=self.round_positions,
            population=self.shard_size,
            batch_sampling=self.batch_sampling,
            release_size=batch,
            gaussians_per_use=1 if per_step else steps,
            paper_rate=rate,
            paper_releases_per_round=releases,
            paper_gaussians_per_release=uses,
        )
        return Release(
            unit,
            clip,
            sensitivity=2.0 * clip if flips else record,
            replace_one_sensitivity=2.0 * clip if flips else None,
            **self.cohort_fields(),
            records=records,
            paper_bound=record,
            paper_steps_per_round=steps,
        )

    def client_update(self, chunk: ClientChunk) -> None:
        example = self.clip_level == "example"

        def grad(params: Tensor, step: int | None) -> Tensor:
            if example:  # clip_c(∇f_b) for every example b, then the minibatch mean
                first = params.dim() == 1
                return chunk.clipped_mean(params, self.operator, step, statistics=first)
            return chunk.grad(params, step)

        def transform(g: Tensor, j: int) -> Tensor:
            clipped = g if example else chunk.apply(self.operator, g, statistics=j == 0)  # l. 8
            if self.noise is not None:  # Corollary I: y ← y − η(g + z), z fresh at every step
                clipped = chunk.noised(clipped, self.noise.seed, self.noise_std, extra=j)
            return clipped

        local = self.local_solver.run(
            chunk.x, grad, self.step_size, transform=transform, keep="params"
        )
        sent = local.params  # line 11: y_i to the server
        chunk.add("moved", sent - chunk.x)
        chunk.send("client_to_server", sent)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        moved = reduced.get("moved", like=x)
        metrics, step = reduced.operator_metrics(), self.server_step_size
        return self._server_step(x, reduced, moved, metrics, step)  # line 13 (η_g = 1)


class FedAvgPerUpdateClipping(LocalUpdateAlgorithm):
    r"""FedAvg with per-update clipping (paper 003 Algorithm 2, line 127) and DP-FedAvg (C.1).

    Per round, the cohort ``S`` (all clients in Algorithm 2; a sampler's, e.g. fixed size ``S``,
    in eq. (C.1), line 514) each run ``τ`` local steps ``y_i ← y_i − η_l ∇F_i(y_i)`` from
    ``y_i = x`` (lines 6–9), then

    * ``Δ_i ← y_i − x`` (line 10), ``Δ_i ← min(1, c/||Δ_i||) Δ_i`` (line 11);
    * private (§3.2, line 192; C.1): ``Δ_i ← Δ_i + z_i``, ``z_i ~ N(0, σ² I)`` (the paper's
      ``N(0, σ_DP²/d · I)``, so ``σ_DP = σ √d``);
    * server ``x ← x + η_g (1/|S|) Σ_{i∈S} Δ_i`` (line 14): the pseudo-update
      ``Δ = (1/|S|) Σ_{i∈S} Δ_i`` (noise included) at step size ``η_g`` of a
      ``server_optimizer`` (:mod:`~pl_privfed.algorithms.server_opt`), which is Reddi et al.'s
      (2021) Algorithm 2 with this algorithm's clients (post-processing: privacy unchanged).

    Privacy (user-level local DP against the server): one Gaussian mechanism per round with
    sensitivity ``2c`` under the default replace-one relation, composed over every round and
    not amplified by the client sampling, which the server observes; the papers' convention
    (sensitivity ``c``, add/remove, Poisson at the sampler's rate) is reported beside it. The
    paper calibration is paper 003's ``σ_DP² = c² d log(1/δ) R / ε²`` (line 196).

    Args:
        step_size: ``η_g > 0``, the global step size.
        local_step_size: ``η_l > 0``.
        clip_threshold: ``c > 0``, or ``None`` for no clipping (``c → ∞``, plain FedAvg).
        local_solver: the ``τ`` local steps (default one full-batch step).
        sampler: cohort sampler (default every client).
        noise: DP noise on the clipped update, or ``None``.
        sampling_seed: seed of the sampling generator.
        server_optimizer: the server's step on ``Δ`` (``None``: line 14).
        adaptive_clip: clip at a norm that adapts to a quantile of the update norms instead of
            ``c`` (Andrew et al. 2021; :class:`~pl_privfed.operators.AdaptiveClip`), or ``None``.
    """

    #: paper 003 Alg. 2: the global and the local step size
    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "η_g",
        "local_step_size": "η_l",
        "clip_threshold": "c",
    }

    def __init__(
        self,
        step_size: float,
        local_step_size: float,
        clip_threshold: float | None = None,
        local_solver: LocalSolver | None = None,
        sampler: ClientSampler | None = None,
        noise: DPNoise | None = None,
        sampling_seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
        adaptive_clip: AdaptiveClip | None = None,
    ) -> None:
        super().__init__(step_size, local_solver, sampler, noise, sampling_seed, server_optimizer)
        self.local_step_size = check_positive("local_step_size", local_step_size)
        if clip_threshold is not None:
            check_positive("clip_threshold", clip_threshold)
        if adaptive_clip is not None and not isinstance(adaptive_clip, AdaptiveClip):
            raise ValueError(
                f"adaptive_clip must be an AdaptiveClip or None, got {adaptive_clip!r}"
            )
        if adaptive_clip is not None and clip_threshold is not None:
            raise ValueError(
                f"give clip_threshold={clip_threshold!r} or adaptive_clip, not both: the adaptive "
                "clip's norm replaces c"
            )
        self.operator: Operator = Clip(clip_threshold) if clip_threshold is not None else Identity()
        self.adaptive_clip = adaptive_clip  # kept: a grid rebuilds the algorithm from it
        if adaptive_clip is not None:
            self.operator = adaptive_clip
        self.clip_threshold = None if clip_threshold is None else float(clip_threshold)

    def operators(self) -> list[Operator]:
        return [self.operator]

    def release(self) -> Release:
        """§3.2: every participant sends ``clip_c(Δ_i)`` (+ its noise or share: user-level DP)."""
        return self.client_release(self.operator.reference_bound, "user-level (client-level) DP")

    def client_update(self, chunk: ClientChunk) -> None:
        local = self.local_solver.run(chunk.x, chunk.grad, self.local_step_size, keep="sum")
        # lines 6-10: Δ_i = y_i − x = −η_l Σ_j ∇F_i(y_i^j), formed from the gradients' sum (the
        # last local model is never needed, so neither is the subtraction of x)
        update = local.grad_sum.mul_(-self.local_step_size)
        chunk.transmit(update, self.operator)  # line 11, §3.2: clip_c(Δ_i) (+ z_i)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        total, metrics = reduced.received()  # Σ_{i∈S} (clip_c(Δ_i) + z_i)
        return self._server_step(x, reduced, total, metrics, self.step_size)  # line 14
