r"""Server optimizers: what the server does with the update an algorithm releases.

A server-based algorithm ends its round with a step of the global model along a direction
computed from what the clients released (their noised sum, and server memories built from
it). Its ``server_optimizer`` takes that direction as the *pseudo-update* ``Δ_t`` in the sign
convention of Reddi et al. (2021), pointing where the model moves (``Δ_t = −(aggregate)`` for an
algorithm that steps ``x ← x − η·aggregate``), and returns the new model

.. math:: x_{t+1} = x_t + η\, u_t(Δ_1, …, Δ_t)

with ``η`` the algorithm's server step size. :class:`ServerSGD` (the default) is
``u_t = Δ_t``: the algorithm's step as its paper writes it, bit for bit. The others keep state
across rounds (registered buffers, so a checkpoint carries it and a resumed run continues
exactly):

* :class:`ServerMomentum` — heavy-ball server momentum (FedAvgM; Hsu, Qi & Brown 2019,
  "Measuring the Effects of Non-Identical Data Distribution for Federated Visual
  Classification"): ``m_t = μ m_{t−1} + Δ_t``, ``u_t = m_t``, ``m_{−1} = 0``;
* :class:`FedAdagrad`, :class:`FedYogi`, :class:`FedAdam` — Reddi, Charles, Zaheer, Garrett,
  Rush, Konečný, Kumar & McMahan, "Adaptive Federated Optimization", ICLR 2021, Algorithm 2 (the
  server's lines after ``Δ_t``), elementwise:

  - ``m_t = β₁ m_{t−1} + (1 − β₁) Δ_t``;
  - FedAdagrad: ``v_t = v_{t−1} + Δ_t²``;
  - FedYogi: ``v_t = v_{t−1} − (1 − β₂) Δ_t² sign(v_{t−1} − Δ_t²)``;
  - FedAdam: ``v_t = β₂ v_{t−1} + (1 − β₂) Δ_t²``;
  - ``x_{t+1} = x_t + η m_t / (√v_t + τ)``;

  initialized as Algorithm 2's line 1 allows, ``v_{−1} = τ²`` (its lower bound ``v_{−1} ≥ τ²``
  taken with equality), and ``m_{−1} = 0``. No bias correction (Algorithm 2 has none).

  Checked line by line against a maintained implementation of the paper's arXiv v5: Flower's
  ``flwr/server/strategy/fedadam.py`` and ``fedyogi.py`` (adap/flower commits 18638bc and
  05c252a, ``FedAdam.aggregate_fit`` / ``FedYogi.aggregate_fit``, the blocks under ``# m_t``,
  ``# v_t`` and ``new_weights``) and ``fedadagrad.py`` (187f825): the same ``m_t``, the same
  three ``v_t`` (Yogi's ``x − (1 − β₂) y² sign(x − y²)``, ``np.sign(0) = 0``), ``τ`` outside the
  square root, no bias correction. Two differences: Flower starts ``v`` at zero (Algorithm 2's
  line 1 asks ``v_{−1} ≥ τ²``, kept here), and its FedAdagrad fixes ``β₁ = 0`` (Algorithm 2's
  ``m_t`` line serves all three; here ``β₁`` is FedAdagrad's parameter too).
  tests/test_server_optimizers.py runs Flower's lines beside these (``v`` zeroed).

Privacy: the optimizer reads only what the algorithm released (``Δ_t`` is a function of the
noised messages and of the server's earlier outputs), so it is post-processing: an algorithm's
privacy declaration, calibration and ε do not depend on it.
"""

from __future__ import annotations

import abc
import math

import torch
from torch import Tensor, nn

from pl_privfed.checks import check_positive

__all__ = ["FedAdagrad", "FedAdam", "FedYogi", "ServerMomentum", "ServerOptimizer", "ServerSGD"]


def _check_decay(name: str, value: float) -> float:
    """``value`` as a float, or ``ValueError`` naming ``name`` unless it is in ``[0, 1)``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    if not 0 <= value < 1:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    return float(value)


class ServerOptimizer(nn.Module, metaclass=abc.ABCMeta):
    """The server's step ``x_{t+1} = x_t + η u_t`` from the pseudo-update ``Δ_t`` (module
    docstring). Subclasses allocate their state in :meth:`setup` as registered buffers and
    implement :meth:`step` (abstract: the command line refuses this class as a
    ``server_optimizer``)."""

    def setup(self, dim: int, device: torch.device | str, dtype: torch.dtype) -> None:
        """Allocate (and reset) the state for ``d = dim`` parameters (called by the algorithm's
        setup, before a checkpoint is restored into the buffers)."""

    @abc.abstractmethod
    def step(self, x: Tensor, delta: Tensor, step_size: float) -> Tensor:
        """The new model from ``x`` ``[d]``, the pseudo-update ``Δ_t`` ``[d]`` and ``η``."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        args = {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "training"}
        return ", ".join(f"{k}={v!r}" for k, v in args.items())


class ServerSGD(ServerOptimizer):
    """``x_{t+1} = x_t + η Δ_t``: the algorithm's own step (the default; stateless)."""

    def step(self, x: Tensor, delta: Tensor, step_size: float) -> Tensor:
        return x + step_size * delta


class ServerMomentum(ServerOptimizer):
    """Heavy-ball server momentum (FedAvgM, Hsu et al. 2019): ``m_t = μ m_{t−1} + Δ_t``,
    ``x_{t+1} = x_t + η m_t``, ``m_{−1} = 0``; ``μ = 0`` is :class:`ServerSGD`.

    Args:
        momentum: ``μ ∈ [0, 1)``.
    """

    def __init__(self, momentum: float = 0.9) -> None:
        super().__init__()
        self.momentum = _check_decay("momentum", momentum)

    def setup(self, dim: int, device: torch.device | str, dtype: torch.dtype) -> None:
        self.register_buffer("momentum_buffer", torch.zeros(dim, device=device, dtype=dtype))

    def step(self, x: Tensor, delta: Tensor, step_size: float) -> Tensor:
        m = self.momentum_buffer
        m.mul_(self.momentum).add_(delta)  # m_t = μ m_{t−1} + Δ_t
        return x + step_size * m


class _Adaptive(ServerOptimizer):
    """Reddi et al. (2021) Algorithm 2: the first moment and the step, shared;
    :meth:`update_second_moment` is the variant's ``v_t``."""

    def __init__(self, beta1: float, tau: float) -> None:
        super().__init__()
        self.beta1 = _check_decay("beta1", beta1)
        self.tau = check_positive("tau", tau)

    def setup(self, dim: int, device: torch.device | str, dtype: torch.dtype) -> None:
        self.register_buffer("first_moment", torch.zeros(dim, device=device, dtype=dtype))
        v = torch.full((dim,), self.tau**2, device=device, dtype=dtype)  # v_{−1} = τ²
        self.register_buffer("second_moment", v)

    def step(self, x: Tensor, delta: Tensor, step_size: float) -> Tensor:
        m, v = self.first_moment, self.second_moment
        m.mul_(self.beta1).add_(delta, alpha=1.0 - self.beta1)  # m_t = β₁ m_{t−1} + (1 − β₁) Δ_t
        self.update_second_moment(v, delta * delta)
        return x + step_size * (m / (v.sqrt() + self.tau))  # x_t + η m_t / (√v_t + τ)

    @abc.abstractmethod
    def update_second_moment(self, v: Tensor, square: Tensor) -> None:
        """``v ← v_t`` in place from ``v = v_{t−1}`` and ``square = Δ_t²`` (the variant's line)."""
        raise NotImplementedError


class FedAdagrad(_Adaptive):
    """FedAdagrad (Reddi et al. 2021, Algorithm 2): ``v_t = v_{t−1} + Δ_t²``.

    Args:
        beta1: ``β₁ ∈ [0, 1)`` of the first moment.
        tau: ``τ > 0``, the adaptivity (``v_{−1} = τ²``).
    """

    def __init__(self, beta1: float = 0.9, tau: float = 1e-3) -> None:
        super().__init__(beta1, tau)

    def update_second_moment(self, v: Tensor, square: Tensor) -> None:
        v.add_(square)


class FedYogi(_Adaptive):
    """FedYogi (Reddi et al. 2021, Algorithm 2):
    ``v_t = v_{t−1} − (1 − β₂) Δ_t² sign(v_{t−1} − Δ_t²)`` (``sign(0) = 0``).

    Args:
        beta1: ``β₁ ∈ [0, 1)`` of the first moment.
        beta2: ``β₂ ∈ [0, 1)`` of the second moment.
        tau: ``τ > 0``, the adaptivity (``v_{−1} = τ²``).
    """

    def __init__(self, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> None:
        super().__init__(beta1, tau)
        self.beta2 = _check_decay("beta2", beta2)

    def update_second_moment(self, v: Tensor, square: Tensor) -> None:
        v.sub_((1.0 - self.beta2) * square * torch.sign(v - square))


class FedAdam(_Adaptive):
    """FedAdam (Reddi et al. 2021, Algorithm 2): ``v_t = β₂ v_{t−1} + (1 − β₂) Δ_t²``.

    Args:
        beta1: ``β₁ ∈ [0, 1)`` of the first moment.
        beta2: ``β₂ ∈ [0, 1)`` of the second moment.
        tau: ``τ > 0``, the adaptivity (``v_{−1} = τ²``).
    """

    def __init__(self, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3) -> None:
        super().__init__(beta1, tau)
        self.beta2 = _check_decay("beta2", beta2)

    def update_second_moment(self, v: Tensor, square: Tensor) -> None:
        v.mul_(self.beta2).add_(square, alpha=1.0 - self.beta2)
