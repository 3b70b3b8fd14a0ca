"""Base class of the federated algorithms (server topology).

An algorithm reads like its paper: :meth:`FederatedAlgorithm.round` follows the pseudocode of one
iteration. It never sees the model, only a gradient oracle ``grad_fn(params) -> [n, d]`` that
returns every client's gradient on this round's minibatch, at shared parameters ``[d]`` or at
per-client parameters ``[n, d]``; ``grad_fn(params, per_example=True) -> [n, B, d]`` returns
every example's gradient instead (record-level clipping). Its state tensors (client memories ``[n, d]``, server memory
``[d]``) are registered buffers and its generators are saved through ``get_extra_state``, so a
Lightning checkpoint carries all of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from pl_privfed.checks import check_int, check_positive, check_positive_int
from pl_privfed.communication import Messages
from pl_privfed.operators import Operator
from pl_privfed.privacy import DPNoise

__all__ = [
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


@dataclass(frozen=True)
class Mechanism:
    """One Gaussian mechanism applied in a round, as the accountant sees it.

    Attributes:
        noise_multiplier: noise std divided by the sensitivity of the noised quantity.
        sample_rate: probability that the privacy unit takes part in the release.
        privacy_unit: what is protected (e.g. ``"client-level local DP"``).
    """

    noise_multiplier: float
    sample_rate: float
    privacy_unit: str


@dataclass
class RoundResult:
    """A round's outcome.

    Attributes:
        params: the new parameters ``[d]``.
        metrics: the round's operator statistics (scalar tensors, not synced).
        messages: what was sent, for communication accounting.
    """

    params: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    messages: list[Messages] = field(default_factory=list)


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
        self._generators: dict[str, torch.Generator] = {}
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
    ) -> None:
        """Allocate state for ``num_clients`` clients and ``d = dim`` parameters.

        Called before training (and before a checkpoint is restored into the buffers).
        """
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        self.num_clients, self.dim, self.num_rounds = num_clients, dim, max(1, num_rounds)
        self.device, self.dtype = torch.device(device), dtype
        for op in self.operators():
            op.setup(dim)
        if self.noise is not None:
            if self.message_bound() is None:
                raise ValueError(
                    f"noise needs an operator with a bounded output, got {self.operators()!r}"
                )
            self.noise_std = self.noise.std(
                bound=self.message_bound(),
                sensitivity=self.accounting_sensitivity(),
                rounds=self.num_rounds,
                sample_rate=self.sample_rate,
            )
            self.add_generator("noise", self.noise.seed)
        self.allocate()

    def allocate(self) -> None:
        """Register the state buffers (override)."""

    def operators(self) -> list[Operator]:
        """Operators whose ``setup(dim)`` must run (override)."""
        return []

    def message_bound(self) -> float | None:
        """``Φ``: bound on the norm of one client's noised message (override)."""
        return None

    def accounting_sensitivity(self) -> float:
        """How much one privacy unit can change the noised quantity, under the relation.

        ``Φ`` under add/remove, ``2Φ`` under replace-one (override for central noise).
        """
        return self.message_bound() * self.noise.sensitivity_factor

    @property
    def sample_rate(self) -> float:
        """Probability that a client takes part in a round (1: full participation)."""
        return 1.0

    def add_generator(self, name: str, seed: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        self._generators[name] = gen
        return gen

    def generator(self, name: str) -> torch.Generator:
        return self._generators[name]

    def _zeros(self, *shape: int) -> Tensor:
        return torch.zeros(*shape, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ privacy
    def mechanisms(self) -> list[Mechanism]:
        """The Gaussian mechanisms one round applies (empty when non-private)."""
        if self.noise is None:
            return []
        return [
            Mechanism(
                self.noise_std / self.accounting_sensitivity(),
                self.sample_rate,
                self.privacy_unit,
            )
        ]

    # ------------------------------------------------------------------ the round
    def initialize(self, x: Tensor, grad_fn: GradFn) -> None:
        """Initialize the memories at ``x⁰`` (called once, before the first round)."""

    def round(self, x: Tensor, grad_fn: GradFn) -> RoundResult:
        """One communication round from ``x`` (``[d]``); returns the new parameters."""
        raise NotImplementedError

    def step(self, x: Tensor, grad_fn: GradFn) -> RoundResult:
        """Initialize on first use, then run one round."""
        if not bool(self.initialized):
            self.initialize(x, grad_fn)
            self.initialized.fill_(True)
        result = self.round(x, grad_fn)
        self.rounds_done += 1
        return result

    def _gaussian(self, *shape: int) -> Tensor:
        """``N(0, σ² I)`` of the given shape from the algorithm's noise generator."""
        out = torch.empty(*shape, device=self.device, dtype=self.dtype)
        return out.normal_(0.0, self.noise_std, generator=self.generator("noise"))

    # ------------------------------------------------------------------ checkpoint state
    def get_extra_state(self) -> dict:
        return {name: gen.get_state() for name, gen in self._generators.items()}

    def set_extra_state(self, state: dict) -> None:
        for name, gen_state in state.items():
            if name not in self._generators:
                raise KeyError(f"checkpoint has generator {name!r} that this algorithm lacks")
            self._generators[name].set_state(gen_state)


class RecordSampling:
    """Mixin for record-level local DP: each agent noises the average of ``b`` of its ``m`` records.

    The accountant sees one release per round at the sampling rate ``q = b/m`` (shuffled
    minibatches analysed as Poisson sampling). ``m`` (``local_dataset_size``) defaults to the
    smallest shard of the datamodule (the conservative rate); given explicitly it may not exceed
    that shard, and ``b`` must be the examples per agent and round the datamodule delivers — both
    checked before training (:meth:`configure_data`), so a run's ε cannot silently assume the
    wrong rate.
    """

    batch_size: int
    local_dataset_size: int | None

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
        self, *, batch_size: int, local_batches: int, shuffle: bool, client_sizes: list[int]
    ) -> None:
        """Check ``b`` against the data and take ``m`` from it (called before training)."""
        if self.noise is None:
            return
        delivered = int(batch_size) * int(local_batches)
        if delivered != self.batch_size:
            raise ValueError(
                f"batch_size={self.batch_size} (b: the sensitivity and the sampling rate b/m) but "
                f"the datamodule delivers {delivered} examples per agent and round: set the "
                f"algorithm's batch_size: {delivered} or the data's batch_size: {self.batch_size}"
            )
        if not shuffle:
            raise ValueError("record-level sampling needs shuffled data, got shuffle=False")
        smallest = min(int(v) for v in client_sizes)
        if self.local_dataset_size is None:
            self.local_dataset_size = smallest
        elif self.local_dataset_size > smallest:
            raise ValueError(
                f"local_dataset_size={self.local_dataset_size} (m) is more than the smallest "
                f"shard ({smallest} records): the rate b/m would understate that agent's "
                "privacy loss; leave it null to take the smallest shard"
            )

    @property
    def record_rate(self) -> float:
        """``q = b/m``."""
        if self.local_dataset_size is None:
            raise ValueError(
                "record-level noise needs local_dataset_size (m, records per agent): give it, "
                "or train through FederatedModule, which takes the smallest shard of the data"
            )
        return self.batch_size / self.local_dataset_size
