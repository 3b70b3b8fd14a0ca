"""Matrix factorizations of the prefix-sum workload and their sensitivity under a schema.

The matrix factorization (MF) mechanism (Denisov, McMahan, Rush, Smith & Thakurta, NeurIPS
2022; Choquette-Choo et al., ICML 2023 "Multi-Epoch Matrix Factorization Mechanisms for Private
Machine Learning"; Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta & Xu, NeurIPS 2023
"(Amplified) Banded Matrix Factorization: A unified approach to private training") releases the
prefix sums ``A G`` of a stream of per-round sums ``G`` (rows ``g_0, …, g_{n−1}``; ``A`` the
lower-triangular all-ones matrix) as ``A (G + C^{-1} Z) = B (C G + Z)`` with ``B = A C^{-1}``
and the rows of ``Z`` iid ``N(0, σ² I)``: one Gaussian mechanism on ``C G``, whose sensitivity
depends on ``C`` and on which rounds one client can take part in (the participation schema).
Round ``t`` adds ``(C^{-1} Z)_t`` to its sum.

Every strategy here is a lower-triangular, *streaming* ``n × n`` matrix ``C`` (row ``t`` uses
rounds ``≤ t`` only, so the release up to round ``t`` is the Gaussian mechanism on the first
``t + 1`` rows, and the mechanism is valid for adaptively chosen ``G``; Denisov et al. 2022,
Thm. 2.1):

* :class:`BandedToeplitz` — ``C`` lower-triangular Toeplitz with ``bands`` nonzero diagonals
  ``c_0, …, c_{b̂−1}`` (the banded Toeplitz strategies of McKenna, McMahan, Rush et al. 2024,
  "Scaling up the Banded Matrix Factorization Mechanism for Differentially Private ML"; a
  special case of the banded MF paper's banded ``C``), the coefficients minimizing the total
  squared error ``‖A C^{-1}‖_F²`` for the horizon ``n`` under unit column norm
  (:func:`optimize_banded_toeplitz`, L-BFGS in float64, started at the square-root
  factorization's first ``b̂`` coefficients); ``bands = 1`` is ``C = I`` (independent noise);
* :class:`Banded` — the banded MF paper's general ``bands``-banded lower-triangular ``C`` (its
  entries free, not Toeplitz), unit columns, minimizing ``‖A C^{-1}‖_F²`` for the horizon
  (:func:`optimize_banded`: the paper's eq. (6), ``min tr(AᵀA X^{-1})`` over banded ``X = CᵀC``
  with unit diagonal, the problem pfl's ``BandedMatrixFactorizationMechanism`` optimizes over
  ``X``; solved here over ``C``'s band by L-BFGS from the optimized Toeplitz ``C``, so
  never worse than it); past the horizon the factorization starts again (block diagonal);
* :class:`TreeAggregation` — the binary tree of Kairouz, McMahan, Song, Thakkar, Thakurta & Xu
  (ICML 2021, "Practical and Private (Deep) Learning without Sampling or Shuffling", DP-FTRL
  with the plain tree estimator and restarts every ``restart`` rounds): row ``t`` of ``C`` is
  the dyadic node that ends at round ``t`` and that the estimator of the prefix sum ``[0, t]``
  reads (the node of size ``2^{v(t+1)}``, ``v`` the 2-adic valuation, within the current tree);
  the nodes the estimator never reads are never released. ``A C^{-1}`` is then the plain tree
  estimator (the prefix sum ``t`` is the sum of the nodes of the binary decomposition of
  ``t + 1``).

Sensitivity (the MF papers' definition, Choquette-Choo et al. 2023 eq. (3)): for a set ``Π`` of
participation patterns (the rounds one client may take part in),
``sens(C) = max_{π∈Π} sup_{‖g_t‖≤1} ‖Σ_{t∈π} C[:, t] g_tᵀ‖_F``.
:func:`pattern_sensitivity_squared` computes, row by row, ``Σ_t (Σ_{j∈π} |C[t, j]|)²`` — an
upper bound on the sup that is *exact* whenever every row's entries on ``π`` have one sign (all
the strategies here: nonnegative ``C``, or a banded ``C`` whose band is no wider than the
separation, whose columns on a pattern have disjoint supports): then the sup is attained with
all ``g_t`` equal. :func:`min_separation_sensitivity` is the banded MF paper's Theorem 2 for
``b``-min-separated participation (``sens ≤ √k · max_t ‖C[:, t]‖`` for a ``b̂ ≤ b``-banded
``C`` and at most ``k`` participations; computed exactly); :func:`cyclic_prefix_sensitivities` the exact prefix
sensitivities of cyclic cohorts (client group ``g`` trains at rounds ``g, g + b, g + 2b, …``),
a subset of the ``b``-min-separated patterns, what a run's accounting composes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from pl_privfed.checks import check_positive_int

__all__ = [
    "Banded",
    "BandedToeplitz",
    "Factorization",
    "TreeAggregation",
    "cyclic_patterns",
    "cyclic_prefix_sensitivities",
    "min_separation_sensitivity",
    "optimize_banded",
    "optimize_banded_toeplitz",
    "pattern_sensitivity_squared",
    "prefix_sum_matrix",
    "sqrt_toeplitz_coefficients",
    "toeplitz",
    "total_squared_error",
]

_F64 = torch.float64


def prefix_sum_matrix(n: int) -> Tensor:
    """``A``: the ``n × n`` lower-triangular all-ones matrix (the prefix-sum workload)."""
    return torch.tril(torch.ones(n, n, dtype=_F64))


def toeplitz(coefficients: Tensor | list[float], n: int) -> Tensor:
    """The ``n × n`` lower-triangular Toeplitz matrix with ``C[t, t − i] = coefficients[i]``."""
    c = torch.as_tensor(coefficients, dtype=_F64)
    out = torch.zeros(n, n, dtype=_F64)
    for i in range(min(len(c), n)):
        out += torch.diag(c[i].expand(n - i), -i)
    return out


def sqrt_toeplitz_coefficients(n: int) -> Tensor:
    """The first ``n`` coefficients of the lower-triangular Toeplitz square root of ``A``
    (``C² = A``, ``c_0 = 1``), solved from ``Σ_{i=0}^{k} c_i c_{k−i} = 1`` coefficient by
    coefficient (Fichtenberger, Henzinger & Upadhyay 2023 give the closed form
    ``c_k = binom(2k, k)/4^k``; the test checks this against it)."""
    c = torch.zeros(n, dtype=_F64)
    c[0] = 1.0
    for k in range(1, n):
        c[k] = (1.0 - torch.dot(c[1:k], c[1:k].flip(0))) / 2.0
    return c


def total_squared_error(c_matrix: Tensor) -> float:
    """``‖A C^{-1}‖_F²``: the total squared error of the prefix sums per unit noise variance."""
    n = c_matrix.shape[0]
    b = torch.linalg.solve_triangular(c_matrix, torch.eye(n, dtype=_F64), upper=False)
    return float((prefix_sum_matrix(n) @ b).square().sum())


@functools.lru_cache(maxsize=64)
def optimize_banded_toeplitz(n: int, bands: int, iterations: int = 200) -> tuple[float, ...]:
    """The unit-norm coefficients ``c_0 … c_{b̂−1}`` of a ``bands``-banded lower-triangular
    Toeplitz ``C`` minimizing ``‖A C^{-1}‖_F²`` for horizon ``n`` (every column of ``C`` has
    norm at most 1, the first ``n − b̂ + 1`` exactly 1), by L-BFGS in float64 from the
    normalized square-root coefficients; cached per process."""
    check_positive_int("n", n)
    check_positive_int("bands", bands)
    bands = min(bands, n)
    if bands == 1:
        return (1.0,)
    start = sqrt_toeplitz_coefficients(bands)
    theta = (start / start.norm()).clone().requires_grad_(True)
    eye, a = torch.eye(n, dtype=_F64), prefix_sum_matrix(n)

    def loss() -> Tensor:
        c = theta / theta.norm()
        mat = torch.zeros(n, n, dtype=_F64)
        for i in range(bands):
            mat = mat + torch.diag(c[i].expand(n - i), -i)
        return (a @ torch.linalg.solve_triangular(mat, eye, upper=False)).square().sum()

    opt = torch.optim.LBFGS(
        [theta], lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe", tolerance_grad=1e-12
    )

    def closure() -> Tensor:
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    opt.step(closure)
    c = (theta / theta.norm()).detach()
    if c[0] < 0:
        c = -c
    return tuple(float(v) for v in c)


def banded_matrix(columns: Tensor) -> Tensor:
    """The ``n × n`` lower-triangular ``C`` with ``C[j + i, j] = columns[j, i]`` (``columns``
    ``[n, b̂]``; entries past row ``n − 1`` ignored)."""
    n, bands = columns.shape
    out = torch.zeros(n, n, dtype=columns.dtype)
    for i in range(min(bands, n)):
        out = out + torch.diag(columns[: n - i, i], -i)
    return out


def _unit_columns(theta: Tensor) -> Tensor:
    """``theta`` ``[n, b̂]`` with the entries past row ``n − 1`` zeroed and each row (a column of
    ``C``) scaled to norm 1."""
    n, bands = theta.shape
    valid = (torch.arange(n).unsqueeze(1) + torch.arange(bands).unsqueeze(0)) < n
    theta = theta * valid
    return theta / theta.norm(dim=1, keepdim=True)


@functools.lru_cache(maxsize=16)
def optimize_banded(n: int, bands: int, iterations: int = 500) -> Tensor:
    """The columns ``[n, b̂]`` (``C[j + i, j] = out[j, i]``, each of norm 1) of a ``bands``-banded
    lower-triangular ``C`` minimizing ``‖A C^{-1}‖_F²`` for horizon ``n``, every entry in the
    band free (the banded MF paper's strategy class), by L-BFGS in float64 started at the
    optimized Toeplitz coefficients (:func:`optimize_banded_toeplitz`); cached per process
    (callers must not modify the result)."""
    check_positive_int("n", n)
    check_positive_int("bands", bands)
    bands = min(bands, n)
    start = torch.tensor(optimize_banded_toeplitz(n, bands), dtype=_F64)
    theta = _unit_columns(start.expand(n, bands).clone()).requires_grad_(True)
    if bands == 1:
        return theta.detach()
    eye, a = torch.eye(n, dtype=_F64), prefix_sum_matrix(n)

    def closure() -> Tensor:
        opt.zero_grad()
        c = banded_matrix(_unit_columns(theta))
        value = (a @ torch.linalg.solve_triangular(c, eye, upper=False)).square().sum()
        value.backward()
        return value

    opt = torch.optim.LBFGS(
        [theta], lr=1.0, max_iter=iterations, line_search_fn="strong_wolfe", tolerance_grad=1e-12
    )
    opt.step(closure)
    cols = _unit_columns(theta.detach())
    return cols * torch.where(cols[:, :1] < 0, -1.0, 1.0)  # a positive diagonal


def cyclic_patterns(n: int, groups: int) -> list[list[int]]:
    """The participation patterns of cyclic cohorts: group ``g`` trains at rounds ``g, g + b,
    g + 2b, …`` below ``n`` (``b = groups``)."""
    return [list(range(g, n, groups)) for g in range(min(groups, n))]


def pattern_sensitivity_squared(c_matrix: Tensor, pattern: list[int]) -> tuple[float, bool]:
    """``(Σ_t (Σ_{j∈π} |C[t, j]|)², exact)``: an upper bound on ``sup_{‖g_j‖≤1} ‖Σ_{j∈π}
    C[:, j] g_jᵀ‖_F²``, exact when every row's entries on ``π`` share one sign (module
    docstring)."""
    cols = c_matrix[:, pattern]
    exact = bool(((cols >= 0).all(dim=1) | (cols <= 0).all(dim=1)).all())
    return float(cols.abs().sum(dim=1).square().sum()), exact


def cyclic_prefix_sensitivities(c_matrix: Tensor, groups: int) -> tuple[Tensor, bool]:
    """``(s², exact)``: ``s²[t]`` the squared sensitivity of the release of rounds ``0 … t``
    (the first ``t + 1`` rows of ``C``) over the cyclic patterns of ``groups`` groups, the
    maximum over groups of ``Σ_{r≤t} (Σ_{j∈π_g} |C[r, j]|)²``; nondecreasing in ``t``;
    ``exact`` as in :func:`pattern_sensitivity_squared` (for every group)."""
    n = c_matrix.shape[0]
    rows = []
    exact = True
    for pattern in cyclic_patterns(n, groups):
        cols = c_matrix[:, pattern]
        exact &= bool(((cols >= 0).all(dim=1) | (cols <= 0).all(dim=1)).all())
        rows.append(torch.cumsum(cols.abs().sum(dim=1).square(), 0))
    return torch.stack(rows).amax(dim=0), exact


def min_separation_sensitivity(c_matrix: Tensor, separation: int, participations: int) -> float:
    """The sensitivity of a lower-triangular ``C`` with at most ``separation`` nonzero
    diagonals under ``separation``-min-separated participation with at most
    ``participations`` (``k``) rounds per client: a pattern's columns have disjoint supports,
    so ``sens² = max_π Σ_{j∈π} ‖C[:, j]‖²`` (computed exactly by dynamic programming over the
    rounds); at most ``√k · max_j ‖C[:, j]‖``, the banded MF paper's Theorem 2, with equality
    when ``k`` columns of the largest norm are ``separation`` apart. ``ValueError`` when ``C``
    is wider than ``separation`` (the theorem does not apply)."""
    n = c_matrix.shape[0]
    rows, cols = torch.nonzero(c_matrix, as_tuple=True)
    width = int((rows - cols).max()) + 1 if rows.numel() else 0
    if width > separation:
        raise ValueError(
            f"C has {width} nonzero diagonals, more than the separation {separation}: "
            "Theorem 2 of the banded MF paper does not apply"
        )
    norms = c_matrix.square().sum(dim=0).tolist()
    # best[j][m]: the largest Σ ‖C[:, i]‖² over patterns in rounds ≥ j with at most m rounds
    best = [[0.0] * (participations + 1) for _ in range(n + separation + 1)]
    for j in reversed(range(n)):
        for m in range(1, participations + 1):
            best[j][m] = max(best[j + 1][m], norms[j] + best[j + separation][m - 1])
    return math.sqrt(best[0][participations])


class Factorization:
    """A streaming lower-triangular strategy ``C`` (module docstring): its matrix for a
    horizon, and the per-round noise ``(C^{-1} Z)_t`` from the rows of ``Z``.

    Attributes:
        name: the strategy's name in a run's privacy report.
    """

    name: ClassVar[str] = ""

    def matrix(self, n: int) -> Tensor:
        """``C`` for ``n`` rounds (float64, ``n × n``, lower-triangular)."""
        raise NotImplementedError

    def memory(self, horizon: int) -> int:
        """How many past noise rows :meth:`round_noise` needs (the state a run keeps)."""
        return 0

    def round_noise(
        self, t: int, z: Callable[[int], Tensor], recent: Tensor, horizon: int
    ) -> Tensor:
        """``(C^{-1} Z)_t``: ``z(j)`` draws row ``j`` of ``Z`` (keyed, so any row can be drawn
        again), ``recent[i]`` holds ``(C^{-1} Z)_{t−1−i}`` for ``i < memory``."""
        raise NotImplementedError

    def describe(self) -> str:
        """The strategy in words."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Bands(Factorization):
    """A ``bands``-banded lower-triangular ``C`` (the two banded strategies below).

    Args:
        bands: ``b̂``, the number of nonzero diagonals (1: independent noise every round).
    """

    bands: int = 1

    def __post_init__(self) -> None:
        check_positive_int("bands", self.bands)


@dataclass(frozen=True)
class BandedToeplitz(_Bands):
    """``bands``-banded lower-triangular Toeplitz ``C`` with coefficients optimized for the
    run's horizon (:func:`optimize_banded_toeplitz`). Round ``t``'s noise is the recursion
    ``w_t = (Z_t − Σ_{i=1}^{b̂−1} c_i w_{t−i}) / c_0`` (``C w = Z``), which keeps the last
    ``b̂ − 1`` noise rows."""

    name: ClassVar[str] = "banded_toeplitz"

    def coefficients(self, horizon: int) -> tuple[float, ...]:
        return optimize_banded_toeplitz(int(horizon), self.bands)

    def matrix(self, n: int, horizon: int | None = None) -> Tensor:
        return toeplitz(list(self.coefficients(horizon or n)), n)

    def memory(self, horizon: int) -> int:
        return len(self.coefficients(horizon)) - 1

    def round_noise(
        self, t: int, z: Callable[[int], Tensor], recent: Tensor, horizon: int
    ) -> Tensor:
        c = self.coefficients(horizon)
        w = z(t)
        for i in range(1, min(len(c), t + 1)):
            w.add_(recent[i - 1], alpha=-c[i])
        return w.div_(c[0])

    def describe(self) -> str:
        return f"{self.bands}-banded Toeplitz C, optimized for the prefix sums (unit columns)"


@dataclass(frozen=True)
class Banded(_Bands):
    """The banded MF paper's general ``bands``-banded lower-triangular ``C`` (entries free
    within the band, unit columns), optimized for the run's horizon ``h``
    (:func:`optimize_banded`); rounds past ``h`` start the factorization again (block diagonal,
    each block the horizon's ``C``). Round ``t = s + τ`` (``s`` its block's first round) adds
    ``w_t = (Z_t − Σ_{i=1}^{min(b̂−1, τ)} C[τ, τ − i] w_{t−i}) / C[τ, τ]``, keeping the last
    ``b̂ − 1`` noise rows."""

    name: ClassVar[str] = "banded"

    def block(self, horizon: int) -> Tensor:
        """The horizon's ``C`` (``h × h``)."""
        return banded_matrix(optimize_banded(int(horizon), self.bands))

    def matrix(self, n: int, horizon: int | None = None) -> Tensor:
        h = int(horizon or n)
        block, out = self.block(h), torch.zeros(n, n, dtype=_F64)
        for s in range(0, n, h):
            e = min(s + h, n)
            out[s:e, s:e] = block[: e - s, : e - s]
        return out

    def memory(self, horizon: int) -> int:
        return min(self.bands, int(horizon)) - 1

    def round_noise(
        self, t: int, z: Callable[[int], Tensor], recent: Tensor, horizon: int
    ) -> Tensor:
        cols = optimize_banded(int(horizon), self.bands)
        tau = t % int(horizon)
        w = z(t)
        for i in range(1, min(cols.shape[1], tau + 1)):
            w.add_(recent[i - 1], alpha=-float(cols[tau - i, i]))
        return w.div_(float(cols[tau, 0]))

    def describe(self) -> str:
        return f"{self.bands}-banded C (general, not Toeplitz), optimized for the prefix sums"


def _valuation(m: int) -> int:
    """The 2-adic valuation of ``m > 0`` (the exponent of its lowest set bit)."""
    return (m & -m).bit_length() - 1


@dataclass(frozen=True)
class TreeAggregation(Factorization):
    """The binary tree of DP-FTRL (Kairouz et al. 2021) with the plain estimator, restarted
    every ``restart`` rounds (``None``: one tree over the whole run). Round ``t`` adds the
    difference of the noises of the binary decompositions of the prefixes ``[0, t]`` and
    ``[0, t − 1]`` of its tree (row ``q`` of ``Z`` is the noise of the node ending at round
    ``q``), drawn again from the keyed rows: no state.

    Args:
        restart: the rounds of one tree (Kairouz et al.'s restarts, e.g. once per epoch), or
            ``None``.
    """

    name: ClassVar[str] = "tree_aggregation"
    restart: int | None = None

    def __post_init__(self) -> None:
        if self.restart is not None:
            check_positive_int("restart", self.restart)

    def _start(self, t: int) -> int:
        return 0 if self.restart is None else (t // self.restart) * self.restart

    def matrix(self, n: int, horizon: int | None = None) -> Tensor:
        c = torch.zeros(n, n, dtype=_F64)
        for t in range(n):
            start = self._start(t)
            size = 1 << _valuation(t - start + 1)
            c[t, t - size + 1 : t + 1] = 1.0
        return c

    def decomposition(self, t: int) -> list[int]:
        """The rows of ``Z`` (the nodes, by the round they end at) whose sum is the noise of
        the prefix ``[start, t]`` of ``t``'s tree."""
        start, rows, end = self._start(t), [], 0
        length = t - start + 1
        for level in reversed(range(length.bit_length())):
            if length >> level & 1:
                end += 1 << level
                rows.append(start + end - 1)
        return rows

    def round_noise(
        self, t: int, z: Callable[[int], Tensor], recent: Tensor, horizon: int
    ) -> Tensor:
        w = None
        for q in self.decomposition(t):
            w = z(q) if w is None else w.add_(z(q))
        if t > self._start(t):
            for q in self.decomposition(t - 1):
                w.sub_(z(q))
        return w

    def describe(self) -> str:
        every = "" if self.restart is None else f", restarted every {self.restart} rounds"
        return f"binary tree aggregation (plain estimator{every})"
