"""Decentralized algorithms over a communication graph: PORTER (-DP / -GC) and BEER (paper 001).

Layout: the paper stacks the agents as the *columns* of ``d × n`` matrices (``X = [x_1, …,
x_n]``, ``001-porter.txt`` line 185) and gossips by a right product ``Q (W − I_n)`` (Algorithm 1,
lines 179 and 181). Here every per-agent quantity is a ``[n, d]`` tensor with one *row* per agent
(the package's client-axis-first convention), i.e. the transpose of the paper's matrix, so the
paper's ``Q (W − I)`` is ``(W − I)ᵀ Q = (Wᵀ − I) Q`` here — one matrix product, no loop over
agents. (For the symmetric weights of :mod:`pl_privfed.graphs` the transpose changes nothing; it
matters for a non-symmetric ``W``, which paper 001 Def. 1 allows, and is tested with one.)

An algorithm here plugs into :class:`~pl_privfed.FederatedModule` like the server-based ones: it
keeps the agents' parameters ``X`` as a buffer and runs a round as two maps over chunks of agents
(:mod:`pl_privfed.engine`): the *local* phase (gradients at each agent's own parameters, with
PORTER-DP's per-example clipping, the compressed differences and the surrogates' updates), then
the *gossip* phase, which for each agent reads only its neighbours' rows of the surrogates
(``(Wᵀ Q)_i = Σ_j w_ji q_j``: a dense product for dense graphs, a gather over the neighbours for
sparse ones). It returns the agents' average ``x̄ = (1/n) Σ_i x_i`` as the round's parameters, at
which the module evaluates the model.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from torch import Tensor

from pl_privfed.algorithms.base import FederatedAlgorithm, RoundResult
from pl_privfed.checks import check_choice, check_int, check_positive
from pl_privfed.engine import ClientChunk, Reduction, noise_to_signal
from pl_privfed.graphs import Topology, mixing_rate
from pl_privfed.operators import Clip, Identity, Operator, SmoothClip
from pl_privfed.privacy import BatchSampling, DPNoise, Release
from pl_privfed.privacy.release import (
    check_record_arguments,
    minibatch_population,
    minibatch_records,
)
from pl_privfed.rng import STREAM_OUTPUT

__all__ = ["BEER", "PORTER", "ClippingName", "DecentralizedAlgorithm", "PorterOption"]

ClippingName = Literal["smooth", "linear", "none"]
PorterOption = Literal["dp", "gc"]


def clipping_operator(clipping: ClippingName, threshold: float) -> Operator:
    """``Clip_τ`` of paper 001: smooth (Def. 2, line 106), piecewise linear (Remark 1, line 115)."""
    check_choice("clipping", clipping, ("smooth", "linear", "none"))
    if clipping == "none":
        return Identity()
    return SmoothClip(threshold) if clipping == "smooth" else Clip(threshold)


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

    #: paper 001 Alg. 1: η the step size, γ the consensus step size, τ the clipping threshold
    hyperparameter_symbols: ClassVar[dict[str, str]] = {
        "step_size": "η",
        "consensus_step_size": "γ",
        "clip_threshold": "τ",
    }

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

    #: a graph denser than this (share of non-zero weights) is gossiped by a dense product
    DENSE_GOSSIP = 0.25
    #: the per-agent tables the gossip phase reads at the neighbours
    GOSSIPED: tuple[str, ...] = ()

    def allocate(self) -> None:
        n, d = self.num_clients, self.dim
        weights = self.topology.mixing_matrix(n)
        self.rate = mixing_rate(weights)
        self.register_buffer("mixing_matrix", weights.to(self.device, self.dtype))
        self.register_client_state("agent_params", d)  # X
        self.register_buffer("output_iterate", self._zeros(d))  # x_out
        self.register_buffer("output_round", torch.zeros((), dtype=torch.int64, device=self.device))
        self.register_buffer("output_agent", torch.zeros((), dtype=torch.int64, device=self.device))
        self._plan_gossip()

    def _plan_gossip(self) -> None:
        """Which agents' rows this process reads in the gossip: its own and, under several
        processes, its agents' in-neighbours held elsewhere (received each round, the only
        rows that cross between processes); ``(Wᵀ)_ij = w_ji`` restricted to those columns."""
        shard, transposed = self.shard, self.mixing_matrix.T.contiguous()
        needed = lambda lo, hi: (transposed[lo:hi] != 0).any(0).nonzero().squeeze(1).cpu()  # noqa: E731
        own = torch.arange(shard.start, shard.stop)
        self._send: dict[int, Tensor] = {}
        self._receive: dict[int, Tensor] = {}
        if shard.distributed:
            mine = needed(shard.start, shard.stop)
            for peer in range(shard.world_size):
                if peer == shard.rank:
                    continue
                lo, hi = shard.bounds(peer)
                self._receive[peer] = mine[(mine >= lo) & (mine < hi)]
                theirs = needed(lo, hi)
                self._send[peer] = shard.local(
                    theirs[(theirs >= shard.start) & (theirs < shard.stop)]
                )
        outside = [self._receive[p] for p in sorted(self._receive)]
        columns = torch.cat([own, *outside]) if outside else own
        self._columns = columns.to(self.device)  # global ids of the rows the gossip reads
        local = transposed.index_select(1, self._columns)
        self._dense_gossip = bool((transposed != 0).float().mean() > self.DENSE_GOSSIP)
        self._mixing = local if self._dense_gossip else local.to_sparse_csr()
        self._extended: dict[str, Tensor] = {}

    def between_phases(self, phase: int, ctx) -> None:
        """After the local phase: the neighbours' rows of the gossiped tables (exchanged
        between processes); after the gossip: the agents' means the statistics need."""
        if phase == 0:
            self._extended = {}
            for name in self.GOSSIPED:
                table = self.state.table(name)
                if self.shard.distributed:
                    halo = self.shard.exchange(table, self._send, self._receive)
                    self._extended[name] = torch.cat([table.to(self.device), halo.to(self.device)])
                else:
                    self._extended[name] = table
        elif phase == 1 and ctx.statistics:
            means = [ctx.reduction.get(k).clone() for k in ("params", "tracking")]
            self.shard.all_reduce_(means)
            ctx.state["means"] = [m / self.num_clients for m in means]

    # ------------------------------------------------------------------ helpers
    def gossip_rows(self, name: str, chunk: ClientChunk) -> Tensor:
        """The paper's ``Q (W − I_n)`` for the chunk's agents, as rows: ``(Wᵀ Q)_i − q_i`` with
        ``Q`` the table ``name`` (only the neighbours' rows are read)."""
        table = self._extended.get(name)
        if table is None:
            table = self.state.table(name)
        ids = chunk.ids.to(self.device)
        if self._dense_gossip:
            mixed = self._mixing.index_select(0, ids) @ table.to(self.device)
        else:
            crow, col, val = (
                self._mixing.crow_indices(),
                self._mixing.col_indices(),
                self._mixing.values(),
            )
            mixed = torch.zeros(ids.numel(), self.dim, device=self.device, dtype=self.dtype)
            for row, agent in enumerate(ids.tolist()):
                lo, hi = int(crow[agent]), int(crow[agent + 1])
                mixed[row] = val[lo:hi] @ table.index_select(0, col[lo:hi].to(table.device)).to(
                    self.device
                )
        return mixed.sub_(chunk.rows(name))

    def compress(self, chunk: ClientChunk, v: Tensor, which: int) -> Tensor:
        """``C(v)`` row by row, agent ``i`` drawing from its stream
        ``(seed, compression, round, i, which)``."""
        return chunk.apply(self.compressor, v, seed=self.seed, extra=which, statistics=False)

    def _sample_output(self, round_index: int) -> None:
        """Reservoir step of the uniformly sampled output iterate (Algorithm 1 line 16), from
        the round's stream ``(seed, output, round)``."""
        t = int(self.rounds_done) + 1
        gen = self.keyed(self.seed, STREAM_OUTPUT, round_index)
        keep_new = int(torch.randint(t, (), generator=gen, device=self.device)) == 0
        agent = int(torch.randint(self.num_clients, (), generator=gen, device=self.device))
        if keep_new:  # the agent's holder broadcasts its row
            self.output_iterate.copy_(self.shard.row(self.state.table("agent_params"), agent))
            self.output_round.fill_(t)
            self.output_agent.fill_(agent)

    def output(self) -> dict[str, Tensor | int]:
        """The sampled output ``x_out`` and where it came from (round ``t`` >= 1, agent ``i``)."""
        return {
            "params": self.output_iterate.clone(),
            "round": int(self.output_round),
            "agent": int(self.output_agent),
        }

    def spread(self, chunk: ClientChunk, name: str, mean: Tensor) -> None:
        """Statistics phase: ``Σ_i ||q_i − q̄||²`` over the chunk's rows of ``name``."""
        rows = chunk.rows(name)
        chunk.add(name + "_spread", torch.linalg.vector_norm(rows - mean, dim=1).square())


class PORTER(DecentralizedAlgorithm):
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
    (sampling without replacement with the datamodule's ``batch_sampling:
    without_replacement``, none for reshuffled epochs); the
    papers' convention (add/remove, Poisson at ``q = b/m``) is reported beside it. With
    ``DPNoise(epsilon=…, calibration="paper")`` the noise is Theorem 1's
    ``σ_p = τ sqrt(T log(1/δ))/(m ε)`` (eq. 5, line 250; paper §5 line 295) — the package formula
    ``q · (τ/b) · sqrt(T log(1/δ))/ε`` equals it for every ``b``.

    Args:
        step_size: the gradient step size ``η > 0``.
        consensus_step_size: the consensus step size ``γ > 0``.
        option: ``"dp"`` (Option I, PORTER-DP; with ``noise=None`` its non-private twin, line 174
            without ``E``: the per-example clipped average) or ``"gc"`` (Option II, PORTER-GC).
        clip_threshold: ``τ > 0``.
        clipping: ``"smooth"`` (Def. 2), ``"linear"`` (Remark 1) or ``"none"`` (``"gc"`` only).
        topology: graph and mixing rule (paper §5: Erdős–Rényi(0.8), FDLA).
        compressor: ``C`` (default identity).
        noise: DP noise, required with ``option="dp"`` and refused with ``"gc"``.
        batch_size: ``b``, each agent's minibatch size (PORTER-DP: it sets the sensitivity
            ``τ/b``; checked against the data before training and every round).
        local_dataset_size: ``m``, records per agent (PORTER-DP: sampling rate ``b/m``);
            ``None`` takes the smallest shard of the data (checked before training).
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
        self.option = check_choice("option", option, ("dp", "gc"))  # PORTER-DP or PORTER-GC
        self.clip_threshold = check_positive("clip_threshold", clip_threshold)
        self.clipping = clipping
        self.clip = clipping_operator(clipping, self.clip_threshold)
        check_record_arguments(batch_size, local_dataset_size)
        self.batch_size, self.local_dataset_size = batch_size, local_dataset_size
        self.batch_sampling: BatchSampling = "epochs"
        if option == "dp":  # without noise: its non-private twin (line 174 without E)
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

    def configure_data(self, **data) -> None:
        if self.noise is not None:  # m and the record sampling from the data, b checked
            self.local_dataset_size, self.batch_sampling = minibatch_population(
                self.batch_size, self.local_dataset_size, **data
            )

    def release(self) -> Release:
        """PORTER-DP (Theorem 1): each agent's ``G_p = G_τ + E``, the average of ``b`` of its
        ``m`` records' clipped gradients; one record moves ``G_τ`` by at most ``τ/b``."""
        return Release(
            "record-level local DP per agent (each agent noises its own gradient)",
            self.clip_threshold / self.batch_size,
            observer="the agent's neighbours",
            records=minibatch_records(
                self.batch_size, self.local_dataset_size, self.batch_sampling
            ),
        )

    GOSSIPED = ("tracking_surrogate", "agent_params_surrogate")  # Q_v, Q_x

    def allocate(self) -> None:
        super().allocate()
        for name in ("agent_params_surrogate", "tracking", "tracking_surrogate", "noisy_gradient"):
            self.register_client_state(name, self.dim)  # Q_x, V, Q_v, G_p

    def initializes_clients(self) -> bool:
        return True

    def client_init(self, chunk: ClientChunk) -> None:
        """Line 169: ``V = Q_v = G_p = 0``, ``Q_x = X = x̄⁰ 1ᵀ``."""
        for name in ("tracking", "tracking_surrogate", "noisy_gradient"):
            chunk.rows(name).zero_()
        chunk.rows("agent_params").copy_(chunk.x.expand(chunk.size, -1))
        chunk.rows("agent_params_surrogate").copy_(chunk.x.expand(chunk.size, -1))

    def local_gradient(self, chunk: ClientChunk) -> Tensor:
        """``G_p^{(t)}`` at ``X^{(t−1)}``: Option I (lines 173–174) or Option II (176–177)."""
        x = chunk.rows("agent_params")
        if self.option == "dp":
            g_tau = chunk.clipped_mean(x, self.clip)  # line 173: (1/b) Σ_Z Clip_τ(∇ℓ(X; Z))
            if chunk.examples_per_client != self.batch_size:
                raise ValueError(
                    f"batch_size={self.batch_size} (sets the sensitivity τ/b and the sampling "
                    f"rate b/m) but the agents' minibatches have {chunk.examples_per_client} "
                    "examples"
                )
            if self.noise is None:  # the non-private twin: G_p = G_τ
                return g_tau
            g_p = chunk.noised(g_tau, self.noise.seed, self.noise_std)  # line 174: G_τ + E
            chunk.add("clean", g_tau)
            chunk.add("noisy", g_p)
            return g_p
        grads = chunk.grad(x)  # line 176: G
        return chunk.apply(self.clip, grads, inplace=True)  # line 177: G_p = Clip_τ(G)

    def client_phases(self) -> list:
        return [self.local_phase, self.gossip_phase, self.spread_phase]

    def local_phase(self, chunk: ClientChunk) -> None:
        """Lines 172–178 and 180, and the gradient-tracking increment of line 179."""
        g_p = self.local_gradient(chunk)  # lines 172–177
        q_v, v = chunk.rows("tracking_surrogate"), chunk.rows("tracking")
        sent_v = self.compress(chunk, v - q_v, 0)
        q_v.add_(sent_v)  # line 178: Q_v ← Q_v + C(V − Q_v)
        g_old = chunk.rows("noisy_gradient")
        v.add_(g_p).sub_(g_old)  # line 179, its G_p^{(t)} − G_p^{(t−1)} part
        g_old.copy_(g_p)
        q_x, x = chunk.rows("agent_params_surrogate"), chunk.rows("agent_params")
        sent_x = self.compress(chunk, x - q_x, 1)
        q_x.add_(sent_x)  # line 180: Q_x ← Q_x + C(X − Q_x)
        chunk.send(
            "agent_to_agent:v", sent_v, compressed=self.compressor.sparsifying
        )  # each agent broadcasts its two compressed
        chunk.send(
            "agent_to_agent:x", sent_x, compressed=self.compressor.sparsifying
        )  # differences to its neighbours
        chunk.add("gradient", g_p)

    def gossip_phase(self, chunk: ClientChunk) -> None:
        """The gossip parts of lines 179 and 181, reading the neighbours' surrogates."""
        gamma, eta = self.consensus_step_size, self.step_size
        v = chunk.rows("tracking")
        v.add_(self.gossip_rows("tracking_surrogate", chunk), alpha=gamma)  # line 179
        x = chunk.rows("agent_params")
        x.add_(self.gossip_rows("agent_params_surrogate", chunk), alpha=gamma)
        x.sub_(v, alpha=eta)  # line 181: X ← X + γ Q_x (W − I) − η V
        chunk.add("params", x)
        chunk.add("tracking", v)

    def spread_phase(self, chunk: ClientChunk) -> None:
        """Statistics: the consensus and tracking errors need the means of the gossip phase."""
        if not chunk.statistics:
            return
        mean_x, mean_v = chunk.ctx.state["means"]
        self.spread(chunk, "agent_params", mean_x)
        self.spread(chunk, "tracking", mean_v)

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        n = self.num_clients
        mean_x = reduced.get("params") / n  # x̄, where the model is evaluated
        metrics = reduced.operator_metrics()
        if self.option == "dp" and self.noise is not None:
            metrics["noise_to_signal"] = noise_to_signal(reduced.get("noisy"), reduced.get("clean"))
        self._sample_output(reduced.round_index)  # line 183
        metrics["mixing_rate"] = torch.tensor(self.rate)
        metrics["tracking_gap"] = torch.linalg.vector_norm(
            (reduced.get("tracking") - reduced.get("gradient")) / n
        )
        if "agent_params_spread" in reduced.sums:
            metrics["consensus_error"] = reduced.get("agent_params_spread").sum().sqrt()
            metrics["tracking_error"] = reduced.get("tracking_spread").sum().sqrt()
        messages = [reduced.messages(f"agent_to_agent:{v}", channel="agent_to_agent") for v in "vx"]
        return RoundResult(params=mean_x, metrics=metrics, messages=messages)


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
