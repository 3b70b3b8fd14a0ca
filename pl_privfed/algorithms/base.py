"""Base class of the federated algorithms (server topology).

An algorithm reads like its paper, split the way a round runs: the client lines for a chunk of
clients (:meth:`FederatedAlgorithm.client_update`, a map: each client's update depends only on
its own state, data and randomness and on the broadcast) and the server lines on the sums the
clients contributed (:meth:`FederatedAlgorithm.server_update`). The engine
(:mod:`pl_privfed.engine`) runs the client part chunk by chunk and hands the reduced sums to the
server part; the algorithm never sees the model or the chunk size, only a
:class:`~pl_privfed.engine.ClientChunk` whose ``grad(params)`` returns the chunk's clients'
gradients (``[c, d]``, at shared ``[d]`` or per-client ``[c, d]`` parameters) and whose
``rows(name)`` are their rows of the algorithm's per-client state. Its state tensors (client
memories ``[n, d]``, server memory ``[d]``) are registered buffers, and its randomness is keyed
by ``(seed, round, client)`` (:mod:`pl_privfed.rng`), so a Lightning checkpoint carries
all of it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from pl_privfed.checks import check_int, check_positive, check_positive_int
from pl_privfed.communication import Messages
from pl_privfed.engine import (
    ChunkOracle,
    ClientChunk,
    ClientShard,
    ClientStates,
    FunctionOracle,
    Reduction,
    choose_chunk_size,
    iter_phases,
    make_context,
)
from pl_privfed.operators import Operator
from pl_privfed.privacy import (
    AccountingBasis,
    DPNoise,
    Mechanism,
    Neighbouring,
    PrivacyAccountant,
    calibrate_noise_std,
    paper_noise_std,
    relation_factor,
)
from pl_privfed.rng import STREAM_INIT, STREAM_SERVER_NOISE, KeyedGenerator

__all__ = [
    "BatchSampling",
    "FederatedAlgorithm",
    "GradFn",
    "Mechanism",
    "RecordSampling",
    "RoundResult",
    "check_int",
    "check_positive",
    "check_positive_int",
    "noise_to_signal",
    "operator_metrics",
    "record_round_mechanisms",
]

GradFn = Callable[..., Tensor]


def operator_metrics(inputs: Tensor, outputs: Tensor) -> dict[str, Tensor]:
    """Per-round statistics of an operator applied to client vectors, ``outputs = Ψ(inputs)``.

    ``clip_fraction``: fraction of clients whose vector Ψ shortened; ``norm_before`` /
    ``update_norm``: mean norm of the clients' vectors before / after Ψ (the messages before
    noise).
    """
    in_norms = torch.linalg.vector_norm(inputs, dim=-1)
    out_norms = torch.linalg.vector_norm(outputs, dim=-1)
    return {
        "clip_fraction": (out_norms < in_norms * (1 - 1e-6)).float().mean(),
        "norm_before": in_norms.mean(),
        "update_norm": out_norms.mean(),
    }


def noise_to_signal(noisy_sum: Tensor, clean_sum: Tensor) -> Tensor:
    """``||Σ_i z_i|| / ||Σ_i Δ_i||``: the noise-to-signal ratio of an aggregate."""
    signal = torch.linalg.vector_norm(clean_sum)
    return torch.linalg.vector_norm(noisy_sum - clean_sum) / signal.clamp(min=1e-30)


@dataclass
class RoundResult:
    """A round's outcome.

    Attributes:
        params: the new parameters ``[d]``.
        metrics: the round's operator statistics (scalar tensors, not synced).
        messages: what was sent, for communication accounting.
        loss: the mean training loss of the round's computing clients (set by the engine;
            ``None`` when nobody computed or the oracle reports no losses).
        buffers: the model's buffers after the round (BatchNorm running statistics, the
            engine's rule), or ``None``.
    """

    params: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    messages: list[Messages] = field(default_factory=list)
    loss: Tensor | None = None
    buffers: dict[str, Tensor] | None = None


class FederatedAlgorithm(nn.Module):
    """Common state handling of the server-based algorithms.

    Args:
        step_size: the server step size ``γ > 0``.
        noise: Gaussian DP noise settings, or ``None`` for the non-private method.
    """

    #: Who is protected and against whom, for the docs and the summary.
    privacy_unit: str = "client-level local DP (each client noises its own message)"

    def __init__(self, step_size: float, noise: DPNoise | None = None) -> None:
        super().__init__()
        self.step_size = check_positive("step_size", step_size)
        if noise is not None and not isinstance(noise, DPNoise):
            raise ValueError(f"noise must be a DPNoise or None, got {noise!r}")
        self.noise = noise
        self.num_clients = 0
        self.dim = 0
        self.num_rounds = 0
        self.noise_std = 0.0
        self.state = ClientStates(self)
        self.shard = ClientShard(0)
        self._keyed: KeyedGenerator | None = None
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
    ) -> None:
        """Allocate state for ``num_clients`` clients and ``d = dim`` parameters.

        Called before training (and before a checkpoint is restored into the buffers).

        Args:
            shard: the clients this process holds (default: all of them, one process).
            client_state: where the per-client state tables go (``"auto"``, ``"device"``,
                ``"host"``, ``"disk"``; :mod:`pl_privfed.engine.state`).
            state_dir: directory of the memory-mapped tables (``"disk"``).
        """
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.num_clients, self.dim, self.num_rounds = num_clients, dim, max(1, num_rounds)
        self.device, self.dtype = torch.device(device), dtype
        self.shard = shard if shard is not None else ClientShard(num_clients)
        self.state = ClientStates(self, self.shard)
        self._keyed = KeyedGenerator(self.device)
        for op in self.operators():
            op.setup(dim)
        if self.noise is not None:
            if self.message_bound() is None:
                raise ValueError(
                    f"noise needs an operator with a bounded output, got {self.operators()!r}"
                )
            self.noise_std = self.calibrate()
            self.check_accounting()
        self.allocate()
        self.state.allocate(self.device, client_state, state_dir)

    def allocate(self) -> None:
        """Register the state: server buffers with ``register_buffer``, per-client tables with
        :meth:`register_client_state` (override)."""

    def register_client_state(self, name: str, *shape: int) -> None:
        """A per-client state table ``name``: one row of shape ``shape`` per client (zeros),
        placed by :mod:`pl_privfed.engine.state` and read by chunks through
        :meth:`~pl_privfed.engine.ClientChunk.rows`; on the device it is the buffer
        ``self.<name>`` of this process's clients."""
        self.state.declare(name, shape, self.dtype)

    def operators(self) -> list[Operator]:
        """Operators whose ``setup(dim)`` must run (override)."""
        return []

    def message_bound(self) -> float | None:
        """``Φ``: bound on the norm of one client's noised message (override)."""
        return None

    @property
    def sample_rate(self) -> float:
        """The nominal probability that a privacy unit takes part in a round: the client
        participation rate (1: full participation), or for record-level DP the record rate. The
        papers' convention amplifies by it as Poisson sampling; the defensible accounting only
        where that holds (:meth:`mechanisms`)."""
        return 1.0

    def _zeros(self, *shape: int) -> Tensor:
        return torch.zeros(*shape, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ privacy
    #: ``"local"``: each client (agent) noises what it sends and the server (the neighbours)
    #: sees every message and who sent it; ``"central"``: a trusted server noises the aggregate.
    privacy_model: Literal["local", "central"] = "local"
    #: who sees the noised messages (the adversary of local DP)
    observer: str = "the server"

    def neighbouring(self) -> Neighbouring:
        """The neighbouring relation of the reported (defensible) ε: ``noise.neighbouring`` if
        given, else replace-one for local DP and add/remove for central DP (docs/privacy.md)."""
        if self.noise is not None and self.noise.neighbouring is not None:
            return self.noise.neighbouring
        return "replace_one" if self.privacy_model == "local" else "add_remove"

    def sensitivity(self, relation: Neighbouring) -> float:
        """How far one privacy unit can move the noised quantity under ``relation``:
        ``Φ`` under add/remove, ``2Φ`` under replace-one (override for central noise or
        record-level clipping)."""
        return self.message_bound() * relation_factor(relation)

    def accounting_sensitivity(self) -> float:
        """The sensitivity of the reported ε (under :meth:`neighbouring`)."""
        return self.sensitivity(self.neighbouring())

    def round_mechanisms(self, noise_std: float, round_index: int) -> list[Mechanism]:
        """The Gaussian releases of round ``round_index`` at noise std ``noise_std``, as the
        defensible accounting composes them (override).

        Local DP (the default): one release per round at noise multiplier ``σ / sensitivity``
        and **no amplification by client sampling**: the server sees who transmits, so a
        client's privacy loss composes over every round it can take part in.
        """
        return [Mechanism(noise_std / self.accounting_sensitivity(), 1.0, self.privacy_unit,
                          sampling="none")]  # fmt: skip

    #: whether :meth:`round_mechanisms` depends on the round (record-level epochs)
    round_dependent_mechanisms: bool = False

    def mechanisms(self, round_index: int | None = None) -> list[Mechanism]:
        """The Gaussian releases of one round under the defensible accounting (empty when
        non-private); ``round_index`` defaults to the round last run."""
        if self.noise is None:
            return []
        if round_index is None:
            round_index = max(0, int(self.rounds_done) - 1)
        return self.round_mechanisms(self.noise_std, round_index)

    def release_plan(self, noise_std: float, rounds: int) -> list[tuple[Mechanism, int]]:
        """Every release of ``rounds`` rounds at noise std ``noise_std`` (defensible), as
        ``(mechanism, count)`` pairs: what ``calibration: target`` solves over."""
        if not self.round_dependent_mechanisms:
            return [(m, rounds) for m in self.round_mechanisms(noise_std, 0)]
        counts: Counter = Counter()
        kinds: dict[tuple, Mechanism] = {}
        for k in range(rounds):
            for m in self.round_mechanisms(noise_std, k):
                counts[m.key()] += 1
                kinds.setdefault(m.key(), m)
        return [(kinds[key], count) for key, count in counts.items()]

    def paper_mechanisms(self) -> list[Mechanism]:
        """The releases of one round as the papers account them: add/remove, and Poisson
        amplification at the nominal :attr:`sample_rate` (what this package reported before
        the defensible accounting; reported beside it)."""
        if self.noise is None:
            return []
        return [Mechanism(self.noise_std / self.sensitivity("add_remove"), self.sample_rate,
                          self.privacy_unit)]  # fmt: skip

    def accounting_basis(self) -> AccountingBasis:
        """What the defensible ε assumes (override where the amplification differs)."""
        if self.privacy_model == "central":
            amplification = "none: every client takes part in every round"
        elif self.sample_rate < 1:
            amplification = (
                f"none: {self.observer} sees which clients transmit, so client sampling (rate "
                f"{self.sample_rate:g}) does not amplify against it"
            )
        else:
            amplification = "none: every client sends every round"
        return AccountingBasis(
            self.neighbouring(),
            self.accounting_sensitivity(),
            amplification,
            composition="every round of the run (a client may take part in any)",
        )

    def paper_accounting_basis(self) -> AccountingBasis:
        """What the papers' ε assumes, and where that fails for this mechanism."""
        problems = []
        if self.privacy_model == "local" and self.sample_rate < 1:
            problems.append(
                "Poisson amplification at the client rate does not hold against the server, "
                "which sees who transmits"
            )
        if self.privacy_model == "local":
            problems.append(
                "add/remove understates what one client can change in its own message "
                "(replace-one: twice the bound)"
            )
        amplification = (
            f"Poisson sampling at rate {self.sample_rate:g}" if self.sample_rate < 1 else "none"
        )
        return AccountingBasis(
            "add_remove",
            self.sensitivity("add_remove"),
            amplification,
            "; ".join(problems) or None,
        )

    def calibrate(self) -> float:
        """The noise std ``σ``, fixed when the run starts (:class:`~pl_privfed.privacy.DPNoise`).

        ``noise_multiplier``: ``σ = multiplier × sensitivity`` (of the reported ε);
        ``calibration: paper``: the papers' formula (:meth:`paper_noise_std`);
        ``calibration: target``: the ``σ`` at which the defensible accounting of the run's
        ``K`` rounds certifies ``epsilon`` (:func:`~pl_privfed.privacy.calibrate_noise_std`).
        """
        noise = self.noise
        if noise.noise_multiplier is not None:
            return noise.noise_multiplier * self.accounting_sensitivity()
        rounds = self.calibration_rounds()
        if noise.calibration == "paper":
            return self.paper_noise_std(rounds)
        return calibrate_noise_std(
            target_epsilon=noise.epsilon,
            delta=noise.delta,
            plan=lambda std: self.release_plan(std, rounds),
            accountant=noise.accountant,
        )

    def calibration_rounds(self) -> int:
        """``K`` of the calibration: ``noise.rounds``, else the run's number of rounds."""
        return self.noise.rounds or self.num_rounds

    def paper_noise_std(self, rounds: int) -> float:
        """The papers' calibration ``σ = c · p · Φ · sqrt(K log(1/δ))/ε`` (override)."""
        return paper_noise_std(
            sensitivity=self.message_bound(),
            epsilon=self.noise.epsilon,
            delta=self.noise.delta,
            rounds=rounds,
            constant=self.noise.constant,
            sample_rate=self.sample_rate,
        )

    def check_accounting(self) -> None:
        """Raise ``ValueError`` before training if the accountant cannot compose this run's
        releases (e.g. sampling without replacement with the PRV accountant)."""
        for mechanisms in (self.round_mechanisms(self.noise_std, 0), self.paper_mechanisms()):
            probe = PrivacyAccountant(self.noise.accountant)
            for mechanism in mechanisms:
                probe.check(mechanism)
                probe.step_mechanism(mechanism)

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

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult:
        """The server lines of one round from ``x`` (``[d]``) and the clients' sums; returns
        the new parameters (override)."""
        raise NotImplementedError

    def initializes_clients(self) -> bool:
        """Whether :meth:`client_init` must run over the clients before the first round."""
        return False

    def client_init(self, chunk: ClientChunk) -> None:
        """Initialize the chunk's clients' memories at ``x⁰`` (override with
        :meth:`initializes_clients`)."""

    def server_init(self, x: Tensor, reduced: Reduction) -> None:
        """Initialize the server's state at ``x⁰`` from the clients' initialization sums."""

    def step(
        self,
        x: Tensor,
        oracle: ChunkOracle | GradFn,
        *,
        client_chunk: int | str | None = None,
        statistics: bool = True,
    ) -> RoundResult:
        """One communication round from ``x`` (initializing the memories first on first use).

        Args:
            x: the global parameters ``[d]``.
            oracle: the round's gradient oracle for chunks of clients
                (:class:`~pl_privfed.engine.ChunkOracle`), or a plain function
                ``grad_fn(params, per_example=False, step=None, clients=None)`` returning the
                gradients of the clients ``clients``.
            client_chunk: clients per chunk (an int or ``"all"``); default: the engine's choice
                (:func:`~pl_privfed.engine.choose_chunk_size`). The iterates do not depend on it.
            statistics: compute the round's operator statistics.
        """
        steps = self.step_iter(x, oracle, client_chunk=client_chunk, statistics=statistics)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def step_iter(
        self,
        x: Tensor,
        oracle: ChunkOracle | GradFn,
        *,
        client_chunk: int | str | None = None,
        statistics: bool = True,
    ) -> Iterator[None]:
        """:meth:`step` as a generator that yields after every chunk and returns the round's
        :class:`RoundResult` (a grid advances its configurations' rounds chunk by chunk)."""
        if not isinstance(oracle, ChunkOracle):
            oracle = FunctionOracle(oracle)
        size = choose_chunk_size(self.num_clients, self.dim, x.device, client_chunk,
                                 x.element_size())  # fmt: skip
        if not bool(self.initialized):
            if self.initializes_clients():
                yield from self._run(x, oracle, -1, size, statistics, init=True)
            else:
                self.server_init(x, Reduction(self.dim))
            self.initialized.fill_(True)
        result = yield from self._run(x, oracle, int(self.rounds_done), size, statistics)
        self.rounds_done += 1
        return result

    def _run(self, x, oracle, round_index, chunk_size, statistics, init=False):
        """The map over chunks (:func:`~pl_privfed.engine.iter_phases`), then the server."""
        ctx = make_context(x, oracle, round_index, self.dim, self._keyed, statistics)
        participants = None if init else self.begin_round(round_index)
        if participants is None:
            participants = torch.arange(self.num_clients)
        phases = [self.client_init] if init else self.client_phases()
        mine = self.shard.owned(participants)  # this process's clients of the round
        yield from iter_phases(phases, ctx, mine, chunk_size, self.state, self.between_phases)
        self.shard.all_reduce_reduction(ctx.reduction)
        if init:
            self.server_init(x, ctx.reduction)
            return None
        result = self.server_update(x, ctx.reduction)
        result.loss = ctx.reduction.loss()
        result.buffers = ctx.reduction.buffers()
        return result

    def between_phases(self, phase: int, ctx) -> None:
        """Runs after client phase ``phase`` of a round (context ``ctx``) on every process
        (override: e.g. the exchange of gossiped rows)."""

    def noise_sum(self, count: int, round_index: int) -> Tensor:
        """``Σ_{i ≤ count} z_i`` for ``count`` clients' independent ``z_i ~ N(0, σ² I)``,
        drawn as the one Gaussian ``N(0, count·σ² I)`` it is, from the round's server stream
        ``(noise seed, round)``: for algorithms whose clients' noise enters the iterates only
        through its sum (``DPNoise(draws="aggregate")``, the default), which saves ``count − 1``
        draws of ``d`` normals per round and gives every iterate the same distribution."""
        out = self._zeros(self.dim)
        if count > 0:
            gen = self._keyed(self.noise.seed, STREAM_SERVER_NOISE, round_index)
            out.normal_(0.0, self.noise_std * math.sqrt(count), generator=gen)
        return out

    def server_gaussian(self, round_index: int) -> Tensor:
        """One ``N(0, σ² I)`` draw of the server in round ``round_index`` (central noise)."""
        gen = self._keyed(self.noise.seed, STREAM_SERVER_NOISE, round_index)
        return self._zeros(self.dim).normal_(0.0, self.noise_std, generator=gen)

    def per_client_noise(self) -> bool:
        """Whether each client's noise is drawn and added to its own message (``DPNoise``
        ``draws: per_client``) rather than the sum drawn once (``aggregate``)."""
        return self.noise is not None and self.noise.draws == "per_client"

    def init_generator(self, *keys: int) -> torch.Generator:
        """A generator for the memory initialization (``(noise seed, init, *keys)``)."""
        seed = self.noise.seed if self.noise is not None else 0
        return self._keyed(seed, STREAM_INIT, *keys)

    def _keyed_generator(self, seed: int, *keys: int) -> torch.Generator:
        return self._keyed(seed, *keys)


#: how the datamodule draws a client's examples of a round (``FederatedDataModule.batch_sampling``)
BatchSampling = Literal["epochs", "without_replacement"]


def record_round_mechanisms(
    noise_multiplier: float,
    *,
    positions: int,
    population: int,
    batch_sampling: BatchSampling,
    round_index: int,
    privacy_unit: str,
) -> list[Mechanism]:
    """A record's releases in round ``round_index`` of a client drawing ``positions`` of its
    ``population`` records per round (record-level local DP).

    * ``"without_replacement"``: each round an independent uniform sample without replacement;
      a record is in it with probability ``positions / population`` and then in one release
      (whose noise multiplier is ``noise_multiplier``): one release sampled without replacement
      (dp-accounting), unamplified when the sample is the whole shard.
    * ``"epochs"``: the client walks per-epoch permutations of its shard (or its stored order),
      ``positions`` stream positions per round, every record once per ``population`` positions;
      by the end of round ``k`` a record has been used at most ``⌈(k+1)·positions/population⌉``
      times, so the round adds that count's increment of unamplified releases (a certificate
      for every record, no amplification by shuffling claimed).
    """
    if batch_sampling == "without_replacement":
        if positions >= population:
            return [Mechanism(noise_multiplier, 1.0, privacy_unit, sampling="none")]
        return [
            Mechanism(
                noise_multiplier,
                positions / population,
                privacy_unit,
                sampling="without_replacement",
                population=int(population),
            )
        ]
    uses = math.ceil((round_index + 1) * positions / population) - math.ceil(
        round_index * positions / population
    )
    return [Mechanism(noise_multiplier, 1.0, privacy_unit, sampling="none")] * uses


def record_sampling_basis(
    batch_sampling: BatchSampling, positions: int, population: int, relation: str, observer: str
) -> tuple[str, str]:
    """``(amplification, composition)`` texts of a record-level accounting."""
    if batch_sampling == "without_replacement":
        if positions >= population:
            return "none: every round uses the whole shard", "every round of the run"
        return (
            f"sampling without replacement of {positions} of the {population} records of the "
            f"smallest shard each round, hidden from {observer} (dp-accounting RDP, "
            f"{relation})",
            "every round of the run",
        )
    return (
        "none: the minibatches walk per-epoch permutations of the shard (or its stored order); "
        "no amplification by shuffling is claimed",
        f"a record's uses: at most ⌈k·{positions}/{population}⌉ by round k",
    )


def check_record_sampling(
    batch_sampling: str, relation: str, per_release: int, population: int
) -> None:
    """``ValueError`` unless the record-level accounting holds for this data."""
    if batch_sampling not in ("epochs", "without_replacement"):
        raise ValueError(
            f"batch_sampling must be 'epochs' or 'without_replacement', got {batch_sampling!r}"
        )
    if per_release > population:
        raise ValueError(
            f"a release uses {per_release} examples but the smallest shard has {population}: a "
            "record would enter one release more than once (its sensitivity would grow); lower "
            "the batch size or give every client more data"
        )
    if batch_sampling == "without_replacement" and relation != "replace_one":
        raise ValueError(
            "sampling without replacement is analysed under the replace-one relation "
            f"(dp-accounting), got noise.neighbouring={relation!r}: set it to replace_one or null"
        )


class RecordSampling:
    """Mixin for record-level local DP: each agent noises the average of ``b`` of its ``m`` records.

    The defensible accounting (:meth:`round_mechanisms`) follows the data: with the datamodule's
    ``batch_sampling: without_replacement`` every round is one release on a sample of ``b`` of
    ``m`` drawn without replacement (dp-accounting, replace-one); with ``epochs`` (per-epoch
    reshuffling) a record's uses are counted without amplification
    (:func:`record_round_mechanisms`). The papers' convention accounts one release per round at
    Poisson rate ``q = b/m``. ``m`` (``local_dataset_size``) defaults to the smallest shard of the
    datamodule (the conservative rate); given explicitly it may not exceed that shard, and ``b``
    must be the examples per agent and round the datamodule delivers — both checked before
    training (:meth:`configure_data`), so a run's ε cannot silently assume the wrong rate.
    """

    batch_size: int
    local_dataset_size: int | None
    batch_sampling: BatchSampling = "epochs"

    def _init_record_sampling(self, batch_size: int, local_dataset_size: int | None) -> None:
        self.batch_size = check_positive_int("batch_size", batch_size)
        if local_dataset_size is not None:
            check_positive_int("local_dataset_size", local_dataset_size)
            if local_dataset_size < self.batch_size:
                raise ValueError(
                    f"local_dataset_size must be >= batch_size={self.batch_size}, "
                    f"got {local_dataset_size!r}"
                )
        self.local_dataset_size = local_dataset_size

    def configure_data(
        self,
        *,
        batch_size: int,
        local_batches: int,
        shuffle: bool,
        client_sizes: list[int],
        batch_sampling: BatchSampling = "epochs",
    ) -> None:
        """Check ``b`` against the data and take ``m`` and the sampling from it (called before
        training)."""
        if self.noise is None:
            return
        delivered = int(batch_size) * int(local_batches)
        if delivered != self.batch_size:
            raise ValueError(
                f"batch_size={self.batch_size} (b: the sensitivity and the sampling rate b/m) but "
                f"the datamodule delivers {delivered} examples per agent and round: set the "
                f"algorithm's batch_size: {delivered} or the data's batch_size: {self.batch_size}"
            )
        smallest = min(int(v) for v in client_sizes)
        if self.local_dataset_size is None:
            self.local_dataset_size = smallest
        elif self.local_dataset_size > smallest:
            raise ValueError(
                f"local_dataset_size={self.local_dataset_size} (m) is more than the smallest "
                f"shard ({smallest} records): the rate b/m would understate that agent's "
                "privacy loss; leave it null to take the smallest shard"
            )
        check_record_sampling(
            batch_sampling, self.neighbouring(), self.batch_size, self.local_dataset_size
        )
        self.batch_sampling = batch_sampling

    @property
    def record_rate(self) -> float:
        """``q = b/m``."""
        if self.local_dataset_size is None:
            raise ValueError(
                "record-level noise needs local_dataset_size (m, records per agent): give it, "
                "or train through FederatedModule, which takes the smallest shard of the data"
            )
        return self.batch_size / self.local_dataset_size

    @property
    def round_dependent_mechanisms(self) -> bool:
        return self.batch_sampling == "epochs"

    def round_mechanisms(self, noise_std: float, round_index: int) -> list[Mechanism]:
        """A record's releases in round ``round_index`` (:func:`record_round_mechanisms`)."""
        self.record_rate  # noqa: B018 (raises without m)
        return record_round_mechanisms(
            noise_std / self.accounting_sensitivity(),
            positions=self.batch_size,
            population=self.local_dataset_size,
            batch_sampling=self.batch_sampling,
            round_index=round_index,
            privacy_unit=self.privacy_unit,
        )

    def check_accounting(self) -> None:
        self.record_rate  # noqa: B018 (raises without m)
        check_record_sampling(
            self.batch_sampling, self.neighbouring(), self.batch_size, self.local_dataset_size
        )
        super().check_accounting()

    def accounting_basis(self) -> AccountingBasis:
        amplification, composition = record_sampling_basis(
            self.batch_sampling,
            self.batch_size,
            self.local_dataset_size,
            self.neighbouring(),
            self.observer,
        )
        return AccountingBasis(
            self.neighbouring(), self.accounting_sensitivity(), amplification,
            composition=composition,
        )  # fmt: skip

    def paper_accounting_basis(self) -> AccountingBasis:
        what = {
            "epochs": "reshuffled each local epoch (every record once per epoch)",
            "without_replacement": "fixed-size samples drawn without replacement",
        }[self.batch_sampling]
        return AccountingBasis(
            "add_remove",
            self.sensitivity("add_remove"),
            f"Poisson sampling at rate b/m = {self.record_rate:.6g}",
            f"the minibatches are not Poisson samples but {what}",
        )
