"""SoteriaFL-SGD (Li, Zhao, Li & Chi 2022), the server-based baseline of paper 001 §5."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor

from pl_privfed.algorithms.base import FederatedAlgorithm, RoundResult
from pl_privfed.algorithms.server_opt import ServerOptimizer
from pl_privfed.checks import check_int, check_positive
from pl_privfed.communication import Messages
from pl_privfed.engine import ClientChunk, Reduction, noise_to_signal
from pl_privfed.operators import Clip, Identity, Operator
from pl_privfed.privacy import BatchSampling, DPNoise, Release
from pl_privfed.privacy.release import (
    check_record_arguments,
    minibatch_population,
    minibatch_records,
)

__all__ = ["SoteriaFL"]


class SoteriaFL(FederatedAlgorithm):
    r"""SoteriaFL-SGD with shifted compression, as in its public reference implementation.

    The baseline of paper 001 §5 (``001-porter.txt`` line 293: "the state-of-the-art
    server/client private stochastic algorithm SoteriaFL-SGD, which also utilizes communication
    compression and guarantees local differential privacy"). Round ``t``, all shifts starting at
    zero:

    * client ``i``: minibatch gradient ``∇f_i(x; 𝒵_i)`` at the server model ``x``, clipped to
      norm ``G`` — ``min(1, G/||g||) g`` — plus Gaussian noise: ``g_i = clip_G(∇f_i) + e_i``,
      ``e_i ~ N(0, σ² I)``; sends ``v_i = C(g_i − s_i)`` and updates its shift
      ``s_i ← s_i + γ v_i``;
    * server: ``v = (1/n) Σ_i v_i``, ``x ← x − η (s + v)``, ``s ← s + γ v``.

    Communication: the clients' compressed ``v_i`` up; down, the server broadcasts ``v`` (the
    mean of ``n`` sparse vectors), from which every client replays ``x ← x − η(s + v)`` and
    ``s ← s + γ v`` (all start from the same ``x⁰`` and ``s = 0``), so the model itself never
    has to be sent.

    Server optimizer (:mod:`~pl_privfed.algorithms.server_opt`): it acts on the model step only,
    with the pseudo-update ``Δ_t = −(s + v)`` at step size ``η``; the shift ``s ← s + γ v`` is
    kept as written. The default :class:`~pl_privfed.algorithms.ServerSGD` is
    ``x ← x − η (s + v)``; with another the clients replay its deterministic step from the
    broadcast ``v`` too (holding its state), so the messages counted are unchanged.
    Post-processing of the clients' noisy messages: the privacy below is unchanged.

    Privacy (record-level local DP against the server): each client's messages are
    post-processing of its noisy gradients. Paper 001 §5 (line 295) uses the noise
    ``σ_p = τ sqrt(T log(1/δ))/(m ε)`` for every algorithm (``τ = G``); with
    ``DPNoise(epsilon=…, calibration="paper")`` the package formula
    ``q · (G/b) · sqrt(T log(1/δ))/ε`` with ``q = b/m`` gives exactly that. The clipped
    minibatch gradient has sensitivity ``2G`` under the default replace-one relation (``G``
    under add/remove for ``b = 1``; ``2G`` under either for ``b > 1``, because clipping the
    minibatch *mean* lets one record move the clipped vector anywhere in the ``G``-ball). The
    record sampling inside a client is hidden from the server, so the defensible ε amplifies
    by it as what it is (:class:`~pl_privfed.privacy.RecordUse`); the papers'
    convention (add/remove, Poisson at ``b/m``) is reported beside it. ``m`` defaults to the
    smallest shard of the data and ``b`` must be what the datamodule delivers, both checked
    before training (:func:`~pl_privfed.privacy.release.minibatch_population`).

    Args:
        step_size: ``η > 0``, the model step size.
        shift_step_size: ``γ > 0``, the shift (memory) step size.
        clip_threshold: ``G > 0`` (paper 001 §5: τ = 1).
        compressor: ``C`` (default identity; paper §5: biased random sparsification).
        noise: DP noise settings or ``None``.
        batch_size: ``b``, each client's minibatch size (sets ``q = b/m``; checked against the
            data before training).
        local_dataset_size: ``m``, records per client; ``None`` takes the smallest shard of the
            data.
        seed: seed of the compression generator.
        server_optimizer: the server's model step on ``Δ_t`` (``None``: ``x ← x − η (s + v)``).
    """

    #: paper 001 §5: η the step size, γ the shift step size, G the clipping threshold
    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "η",
        "shift_step_size": "γ",
        "clip_threshold": "G",
    }

    def __init__(
        self,
        step_size: float,
        shift_step_size: float,
        clip_threshold: float = 1.0,
        compressor: Operator | None = None,
        noise: DPNoise | None = None,
        batch_size: int = 1,
        local_dataset_size: int | None = None,
        seed: int = 0,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__(step_size, noise, server_optimizer)
        self.shift_step_size = check_positive("shift_step_size", shift_step_size)
        self.clip_threshold = check_positive("clip_threshold", clip_threshold)
        self.clip = Clip(self.clip_threshold)
        self.compressor = compressor if compressor is not None else Identity()
        if not isinstance(self.compressor, Operator):
            raise ValueError(f"compressor must be an Operator, got {compressor!r}")
        check_record_arguments(batch_size, local_dataset_size)
        self.batch_size, self.local_dataset_size = batch_size, local_dataset_size
        self.batch_sampling: BatchSampling = "epochs"
        self.seed = check_int("seed", seed)

    def operators(self) -> list[Operator]:
        return [self.compressor]

    def extra_repr(self) -> str:
        return (
            f"step_size={self.step_size}, shift_step_size={self.shift_step_size}, "
            f"clip_threshold={self.clip_threshold}, compressor={self.compressor!r}, "
            f"noise={self.noise!r}, batch_size={self.batch_size}, "
            f"local_dataset_size={self.local_dataset_size}"
        )

    def configure_data(self, **data) -> None:
        if self.noise is not None:  # m and the record sampling from the data, b checked
            self.local_dataset_size, self.batch_sampling = minibatch_population(
                self.batch_size, self.local_dataset_size, **data
            )

    def release(self) -> Release:
        """Every client's noisy gradient ``clip_G(∇f_i(x; 𝒵_i)) + e_i`` on ``b`` of its ``m``
        records: sensitivity ``G`` (``2G`` replace-one) for ``b = 1``, ``2G`` for ``b > 1``
        (minibatch clipping); the papers' formula scales with ``G/b``."""
        b, clip = self.batch_size, self.clip_threshold
        return Release(
            "record-level local DP per client (each client noises its own gradient)",
            clip / b,
            sensitivity=clip if b == 1 else 2.0 * clip,
            replace_one_sensitivity=2.0 * clip,
            records=minibatch_records(b, self.local_dataset_size, self.batch_sampling),
        )

    def allocate(self) -> None:
        self.register_client_state("client_shift", self.dim)  # s_i
        self.register_buffer("server_shift", self._zeros(self.dim))  # s

    def server_init(self, x: Tensor, reduced: Reduction) -> None:
        self.server_shift.zero_()  # (the clients' shifts s_i start at zero too)

    def client_update(self, chunk: ClientChunk) -> None:
        grads = chunk.grad(chunk.x)  # minibatch gradient at the server model
        clipped = chunk.apply(self.clip, grads, inplace=True)  # min(1, G/||g||) g
        noisy = clipped
        if self.noise is not None:  # g_i = clip_G(∇f_i) + e_i
            chunk.add("clean", clipped)
            noisy = chunk.noised(clipped, self.noise.seed, self.noise_std)
            chunk.add("noisy", noisy)
        shift = chunk.rows("client_shift")
        sent = chunk.apply(self.compressor, noisy - shift, seed=self.seed, statistics=False)
        shift.add_(sent, alpha=self.shift_step_size)  # s_i ← s_i + γ v_i
        chunk.add("sent", sent)  # v_i = C(g_i − s_i)
        chunk.send("client_to_server", sent, compressed=self.compressor.sparsifying)
        if chunk.statistics:
            chunk.add("shift", shift)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        n = self.num_clients
        metrics = reduced.operator_metrics()
        if self.noise is not None:  # the clients' own noise on their gradients
            metrics["noise_to_signal"] = noise_to_signal(reduced.get("noisy"), reduced.get("clean"))
        v = reduced.get("sent", like=x) / n  # server: v = mean_i v_i
        direction = self.server_shift + v
        new_x = self.server_step(x, direction.neg_(), self.step_size)  # x ← x − η (s + v)
        self.server_shift.add_(v, alpha=self.shift_step_size)  # s ← s + γ v
        if "shift" in reduced.sums:
            metrics["shift_gap"] = torch.linalg.vector_norm(
                self.server_shift - reduced.get("shift") / n
            )
        messages = [
            reduced.messages("client_to_server"),
            Messages.of("server_to_client", v, copies=n)  # the mean of n sparse vectors
            if self.compressor.sparsifying
            else Messages.dense("server_to_client", self.dim, copies=n),
        ]
        return RoundResult(params=new_x, metrics=metrics, messages=messages)
