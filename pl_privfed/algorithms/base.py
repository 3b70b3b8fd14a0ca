"""Base class of the federated algorithms (server topology).

An algorithm reads like its paper, split the way a round runs: the client lines for a chunk of
clients (:meth:`FederatedAlgorithm.client_update`, a map: each client's update depends only on
its own state, data and randomness and on the broadcast) and the server lines on the sums the
clients contributed (:meth:`FederatedAlgorithm.server_update`); plus one declaration of what it
releases (:meth:`FederatedAlgorithm.release`, a :class:`~pl_privfed.privacy.Release`), from
which :mod:`pl_privfed.privacy` derives its calibration and accounting. The engine
(:func:`~pl_privfed.engine.run_round`) runs the client part chunk by chunk and hands the reduced
sums to the server part; the algorithm never sees the model or the chunk size, only a
:class:`~pl_privfed.engine.ClientChunk` whose ``grad(params)`` returns the chunk's clients'
gradients (``[c, d]``, at shared ``[d]`` or per-client ``[c, d]`` parameters), whose
``rows(name)`` are their rows of the algorithm's per-client state and whose ``transmit`` sends
their messages through the engine's message stage. Its state tensors (client memories
``[n, d]``, server memory ``[d]``) are registered buffers, and its randomness is keyed by
``(seed, round, client)`` (:mod:`pl_privfed.rng`), so a Lightning checkpoint carries all of it.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from pl_privfed.algorithms.server_opt import ServerOptimizer, ServerSGD
from pl_privfed.checks import check_positive
from pl_privfed.engine import (
    DENSE,
    ClientChunk,
    ClientRows,
    ClientShard,
    ClientStates,
    MessageStage,
    Reduction,
    RoundContext,
    RoundResult,
)
from pl_privfed.operators import AdaptiveClip, Operator
from pl_privfed.operators.adaptive import UNCLIPPED, adaptive_noise_multiplier
from pl_privfed.privacy import DPNoise, Release, invariants, plan
from pl_privfed.rng import STREAM_CLIP_COUNT, KeyedGenerator

__all__ = ["CLIENT_LEVEL_DP", "FederatedAlgorithm", "RoundResult"]

#: the privacy unit of the client-level algorithms; where the noise goes (``DPNoise.placement``)
#: is added by the accounting (:func:`pl_privfed.privacy.plan.unit`)
CLIENT_LEVEL_DP = "client-level DP"


class FederatedAlgorithm(nn.Module, metaclass=abc.ABCMeta):
    """Common state handling of the server-based algorithms.

    Abstract: a subclass implements :meth:`server_update` (so the command line refuses this
    class, and the bases without one, as ``--model.algorithm`` and does not list them).

    Args:
        step_size: the server step size ``γ > 0``: every algorithm's main step (a subclass
            names its own, e.g. the gradient step ``η`` of a decentralized method), which a
            ``FederatedModule`` shows as its optimizer's learning rate (Lightning's
            ``LearningRateMonitor`` logs it).
        noise: Gaussian DP noise settings, or ``None`` for the non-private method.
        server_optimizer: what the server does with its step's pseudo-update
            (:mod:`pl_privfed.algorithms.server_opt`: server momentum, FedAdam, FedYogi,
            FedAdagrad); ``None``: :class:`~pl_privfed.algorithms.ServerSGD`, the paper's step.
            A subclass that takes one says in its docstring where it acts (:meth:`server_step`).
    """

    #: the symbol each paper gives a hyperparameter (``__init__`` argument -> symbol), for the
    #: axes and tables of ``pl-privfed report``; subclasses name their own paper's symbols
    hyperparameter_symbols: ClassVar[dict[str, str]] = {"step_size": "γ"}

    #: simulated secure aggregation of the clients' sums (algorithms that offer it set it)
    secure_aggregation = None
    #: an audit's canary clients or records (:mod:`pl_privfed.privacy.audit`), which the engine
    #: adds to the message stage or the clients' minibatches; set by
    #: :class:`~pl_privfed.callbacks.PrivacyAudit`, never by an algorithm
    canaries = None
    #: an audit's noise monitor (:class:`~pl_privfed.privacy.audit_noise.RealizedNoise`), which
    #: the message stage hands every noised release's realized noise; set by
    #: :class:`~pl_privfed.callbacks.PrivacyAudit`, never by an algorithm
    noise_monitor = None

    def __init__(
        self,
        step_size: float,
        noise: DPNoise | None = None,
        server_optimizer: ServerOptimizer | None = None,
    ) -> None:
        super().__init__()
        self.step_size = check_positive("step_size", step_size)
        if noise is not None and not isinstance(noise, DPNoise):
            raise ValueError(f"noise must be a DPNoise or None, got {noise!r}")
        self.noise = noise
        if server_optimizer is not None and not isinstance(server_optimizer, ServerOptimizer):
            raise ValueError(
                f"server_optimizer must be a ServerOptimizer or None, got {server_optimizer!r}"
            )
        self.server_optimizer = server_optimizer if server_optimizer is not None else ServerSGD()
        self.num_clients = 0
        self.dim = 0
        self.num_rounds = 0
        self.noise_std = 0.0
        #: how the clients' rows are represented in the rounds
        #: (:class:`~pl_privfed.engine.ClientRows`), chosen at :meth:`setup`
        self.client_rows: ClientRows = DENSE
        #: the aggregator's noise across rounds where the placement correlates it (an
        #: ``nn.Module``: its state is in this module's ``state_dict``), else ``None``
        self.noise_process = None
        #: the run's privacy invariants in the check mode (:mod:`pl_privfed.privacy.invariants`:
        #: ``PL_PRIVFED_CHECK_INVARIANTS=1``), set at :meth:`setup`; ``None`` otherwise
        self.invariants: invariants.RunChecks | None = None
        self.state = ClientStates(self)
        self.shard = ClientShard(0)
        self.keyed = KeyedGenerator()
        self.register_buffer("initialized", torch.tensor(False))
        self.register_buffer("rounds_done", torch.tensor(0, dtype=torch.int64))

    # ------------------------------------------------------------------ setup
    def setup(
        self,
        *,
        num_clients: int,
        dim: int,
        num_rounds: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        shard: ClientShard | None = None,
        client_state: str = "auto",
        state_dir: str | None = None,
        state_in_memory: int = 0,
        client_rows: ClientRows = DENSE,
    ) -> None:
        """Allocate state for ``num_clients`` clients and ``d = dim`` parameters, and calibrate
        the noise (:func:`pl_privfed.privacy.plan.calibrate` of :meth:`release`).

        Called before training (and before a checkpoint is restored into the buffers).

        Args:
            shard: the clients this process holds (default: all of them, one process).
            client_state: where the per-client state tables go (``"auto"``, ``"device"``,
                ``"host"``, ``"disk"``; :mod:`pl_privfed.engine.state`).
            state_dir: directory of the memory-mapped tables (``"disk"``).
            state_in_memory: bytes of client state the run's other algorithms (a grid's
                configurations) already hold in memory: ``"auto"`` counts them
                (:func:`~pl_privfed.engine.state.choose_placement`).
            client_rows: how the clients' rows are represented
                (:class:`~pl_privfed.engine.ClientRows`; the default: rows of ``d``): it
                admits the algorithm or raises ``ValueError``, shapes the states
                :meth:`span_states` names, and the engine's rounds run in it
                (:attr:`client_rows`).
        """
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.num_clients, self.dim, self.num_rounds = num_clients, dim, max(1, num_rounds)
        self.device, self.dtype = torch.device(device), dtype
        client_rows.admit(self)
        self.client_rows = client_rows
        self.shard = shard if shard is not None else ClientShard(num_clients)
        self.state = ClientStates(self, self.shard)
        self.keyed = KeyedGenerator(self.device)
        for op in self.operators():
            op.setup(dim)
        if self.noise is not None:
            release = self.release()
            rounds = plan.calibration_rounds(self.noise, self.num_rounds)
            if self.noise.where.round_dependent and self.noise.rounds is None:
                # correlated noise: its factorization is built for K rounds, fixed from here on
                self.noise = dataclasses.replace(self.noise, rounds=rounds)
            self.noise_std = plan.calibrate(release, self.noise, rounds)
            plan.check(release, self.noise, self.noise_std, num_rounds or self.noise.rounds)
            # correlated noise keeps its state across rounds in this module's buffers
            self.noise_process = self.noise.where.noise_process(dim, rounds, self.device)
        self._setup_adaptive_clip()
        self.invariants = None if self.noise is None else self._invariant_checks(release)
        self.allocate()
        self.server_optimizer.setup(dim, self.device, dtype)
        self.state.allocate(self.device, client_state, state_dir, state_in_memory)

    def _setup_adaptive_clip(self) -> None:
        """An :class:`~pl_privfed.operators.AdaptiveClip`'s ``m`` and noise split (the run's
        noise multiplier ``z = σ/C_0``), and its norm ``C_t`` as the buffer ``clip_norm`` (in
        the checkpoint: a resumed run continues from it)."""
        clip = self.adaptive_clipping()
        if clip is None:
            return
        if self.noise is not None and self.noise.where.round_dependent:
            raise ValueError(
                f"noise.placement={self.noise.where.name!r} with an AdaptiveClip: the adaptive "
                "clip's noise split and its count release assume independent noise in every "
                "round, which correlated noise is not; use Clip(threshold) with correlated noise"
            )
        z = None if self.noise is None else self.noise_std / clip.reference_bound
        clip.configure(self.expected_cohort(), z)
        self.register_buffer("clip_norm", torch.tensor(clip.initial_norm, dtype=torch.float64))

    def _invariant_checks(self, release: Release) -> invariants.RunChecks | None:
        """The run's privacy invariants in the check mode (``None`` when it is off): the
        declared bound and the calibrated σ the ledger composes, and an adaptive clip's noise
        split written from Andrew et al.'s formula, not read from the clip's own factor."""
        clip, split, count_std = self.adaptive_clipping(), 1.0, None
        if clip is not None:
            count_std = clip.count_std
            z = self.noise_std / clip.reference_bound
            split = adaptive_noise_multiplier(z, count_std) / z
        return invariants.checks_for(
            type(self).__name__,
            self.noise_std,
            self.noise.where,
            release.bound,
            release.records is not None,
            split,
            count_std,
        )

    def restore_noise_std(self, std: float) -> None:
        """Keep the noise the run started with (a resumed run's σ, which its ledger restores),
        and the check mode's declared σ with it."""
        self.noise_std = float(std)
        if self.invariants is not None:
            self.invariants = self._invariant_checks(self.release())

    def adaptive_clipping(self) -> AdaptiveClip | None:
        """The algorithm's :class:`~pl_privfed.operators.AdaptiveClip`, or ``None``."""
        found = [op for op in self.operators() if isinstance(op, AdaptiveClip)]
        if len(found) > 1:
            raise ValueError(f"{type(self).__name__} takes at most one AdaptiveClip, got {found}")
        return found[0] if found else None

    def expected_cohort(self) -> float:
        """``m``, the expected number of clients that send in a round (every client here)."""
        return float(self.num_clients)

    def release_clip_count(self, reduced: Reduction, metrics: dict[str, Tensor]) -> None:
        """Adaptive clipping's server lines (:mod:`pl_privfed.operators.adaptive`): the noised,
        centred count of unclipped updates ``b̃`` (noise ``σ_b`` where the run's noise
        placement puts the update's: the trusted aggregator's one draw, or the senders' draws
        as their sum, from the count's own stream ``(noise seed, STREAM_CLIP_COUNT, round)``),
        then ``C ← C exp(−η_C (b̃ − γ))``. A no-op without an adaptive clip; an aborted round
        released nothing and keeps ``C``."""
        clip = self.adaptive_clipping()
        if clip is None:
            return
        metrics["clip_norm"] = torch.tensor(clip.norm, dtype=torch.float64)
        if not reduced.released:
            return
        senders = reduced.count(UNCLIPPED)
        unclipped = float(reduced.stat_sums[UNCLIPPED]) if senders else 0.0
        noise = 0.0
        if self.noise is not None:
            where, sigma_b = self.noise.where, clip.count_std
            std = sigma_b if where.aggregator_draws else where.sender_std(sigma_b) * senders**0.5
            gen = self.keyed(self.noise.seed, STREAM_CLIP_COUNT, reduced.round_index)
            draw = torch.randn((), generator=gen, device=self.keyed.device, dtype=torch.float64)
            noise = float(draw) * std
            if self.invariants is not None:
                k = reduced.round_index
                self.invariants.drew(k, "clip_count", self.keyed, std, senders, release="count")
        fraction = clip.released_fraction(unclipped, senders, noise)
        metrics["unclipped_fraction"] = torch.tensor(fraction, dtype=torch.float64)
        clip.norm = clip.next_norm(fraction)
        self.clip_norm.fill_(clip.norm)

    def allocate(self) -> None:
        """Register the state: server buffers with ``register_buffer``, per-client tables with
        :meth:`register_client_state` (override)."""

    def register_client_state(self, name: str, *shape: int) -> None:
        """A per-client state table ``name``: one row of shape ``shape`` per client (zeros),
        placed by :mod:`pl_privfed.engine.state` and read by chunks through
        :meth:`~pl_privfed.engine.ClientChunk.rows`; on the device it is the buffer
        ``self.<name>`` of this process's clients. Its rows take the shape the clients' row
        representation gives them (:attr:`client_rows`, set at :meth:`setup`), which may
        shorten a state of :meth:`span_states`."""
        linear = name in (self.span_states() or ())
        self.state.declare(name, self.client_rows.state_shape(shape, linear), self.dtype)

    def span_states(self) -> tuple[str, ...] | None:
        """The algorithm's declaration for the clients' data span
        (:mod:`pl_privfed.engine.span`): the per-client states that stay linear
        combinations of the client's gradients, when every client line is such a combination
        through norm-based operators (``Ψ(v) = s(||v||) v``) and nothing else (``()`` for a
        stateless one); ``None`` (default): the clients cannot run there."""
        return None

    def operators(self) -> list[Operator]:
        """Operators whose ``setup(dim)`` must run (override)."""
        return []

    def configure_data(self, **data: Any) -> None:
        """Check the rounds the datamodule delivers against the algorithm, and take what the
        accounting needs from them (called before training, before :meth:`setup`; override).

        ``data``: ``batch_size`` (examples per client and minibatch), ``local_batches``
        (minibatches per round), ``shuffle`` (reshuffled epochs, or a fixed order),
        ``client_sizes`` (each shard's size) and ``batch_sampling`` (``"epochs"`` or
        ``"without_replacement"``)."""

    def _zeros(self, *shape: int) -> Tensor:
        return torch.zeros(*shape, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ privacy
    def release(self) -> Release:
        """What one round releases about one privacy unit: the algorithm's privacy
        declaration (override; needed only with noise)."""
        raise NotImplementedError(f"{type(self).__name__} declares no release: it takes no noise")

    def message_stage(self) -> MessageStage:
        """How this round's messages reach the server (:mod:`pl_privfed.engine.message`): the
        noise where ``noise.where`` puts it, at the calibrated std, secure aggregation where
        configured, and the stage's hook (an audit's :attr:`canaries`)."""
        noise, clip, factor = self.noise, self.adaptive_clipping(), 1.0
        if clip is not None and hasattr(self, "clip_norm"):
            clip.norm = float(self.clip_norm)  # C_t (restored from a checkpoint, too)
            factor = clip.noise_factor(None if noise is None else self.noise_std)
            if self.invariants is not None:  # this round's bound and std follow C_t/C_0
                self.invariants.ratio = float(self.clip_norm) / clip.reference_bound
        if noise is None:
            return MessageStage(secure_aggregation=self.secure_aggregation, hook=self.canaries)
        return MessageStage(
            noise_std=self.noise_std * factor,
            noise_seed=noise.seed,
            noised=True,
            per_client=noise.draws == "per_client",
            placement=noise.where,
            secure_aggregation=self.secure_aggregation,
            hook=self.canaries,
            process=self.noise_process,
            checks=self.invariants,
            monitor=self.noise_monitor,
        )

    # ------------------------------------------------------------------ the round
    def begin_round(self, round_index: int) -> Tensor | None:
        """Server decisions taken before the clients compute (e.g. the cohort); returns the
        indices of the clients that compute this round (sorted, on the CPU), ``None`` for all."""
        return None

    def client_phases(self) -> list:
        """The client map's phases, each run over every chunk before the next starts (one
        phase for server-based algorithms; decentralized ones add the gossip)."""
        return [self.client_update]

    def client_update(self, chunk: ClientChunk) -> None:
        """The client lines of one round for the clients of ``chunk`` (override)."""
        raise NotImplementedError

    def between_phases(self, phase: int, ctx: RoundContext) -> None:
        """Runs after client phase ``phase`` of a round on every process (override: e.g. the
        exchange of gossiped rows)."""

    @abc.abstractmethod
    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        """The server lines of one round from ``x`` (``[d]``) and the clients' sums; returns
        the new parameters (override)."""
        raise NotImplementedError

    def server_step(self, x: Tensor, delta: Tensor, step_size: float) -> Tensor:
        """The server's step from ``x`` along the pseudo-update ``Δ_t`` (the direction the
        model moves, computed from what the round released) at the step size ``η``:
        ``x + η Δ_t`` with the default :class:`~pl_privfed.algorithms.ServerSGD`, else what
        :attr:`server_optimizer` makes of it (post-processing: no privacy change)."""
        return self.server_optimizer.step(x, delta, step_size)

    def initializes_clients(self) -> bool:
        """Whether :meth:`client_init` must run over the clients before the first round."""
        return False

    def client_init(self, chunk: ClientChunk) -> None:
        """Initialize the chunk's clients' memories at ``x⁰`` (override with
        :meth:`initializes_clients`)."""

    def server_init(self, x: Tensor, reduced: Reduction) -> None:
        """Initialize the server's state at ``x⁰`` from the clients' initialization sums."""
