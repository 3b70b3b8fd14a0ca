"""Communication graphs and mixing matrices for decentralized algorithms.

Topologies (built with networkx, every random one from an explicit seed): Erdős–Rényi
``G(n, p)`` redrawn until connected, ring, 2-D torus, star, complete. Mixing matrices
(paper 001, ``001-porter.txt`` Def. 1, line 94: ``w_ij = 0`` unless ``i`` and ``j`` are
neighbours, ``W 1 = 1`` and ``Wᵀ 1 = 1``):

* ``"metropolis"`` — Metropolis–Hastings weights ``w_ij = 1/(1 + max(d_i, d_j))`` on edges,
  ``w_ii = 1 − Σ_{j≠i} w_ij``: symmetric, doubly stochastic, non-negative;
* ``"max_degree"`` — ``w_ij = 1/(1 + d_max)`` on edges, ``w_ii = 1 − d_i/(1 + d_max)`` (the
  ``+1`` keeps every diagonal entry positive, so the chain is aperiodic even on bipartite
  graphs such as an even ring): symmetric, doubly stochastic, non-negative;
* ``"fdla"`` — the fastest-distributed-linear-averaging weights of Xiao & Boyd (2004, "Fast
  linear iterations for distributed averaging", Systems & Control Letters 53): minimize
  ``||W − 11ᵀ/n||₂`` over matrices with the graph's sparsity pattern and ``W1 = 1``,
  ``1ᵀW = 1ᵀ``. We solve the **symmetric** FDLA problem (``W = Wᵀ``, their §4 — then
  ``W1 = 1`` gives both conditions and the spectral norm is a convex SDP objective) with cvxpy.
  The weights may be negative (the paper allows it: Def. 1, line 100). The solver's answer is
  projected back exactly onto the constraints (symmetrized, zeros off the pattern, diagonal
  ``w_ii = 1 − Σ_{j≠i} w_ij``), so ``W`` is exactly doubly stochastic.

The mixing rate (paper 001 eq. 2) is ``α = ||W − 11ᵀ/n||_op`` (:func:`mixing_rate`).
:class:`Topology` bundles a graph and a weight rule in a config-friendly object::

    topology:
      graph: erdos_renyi
      p: 0.8
      weights: fdla
      seed: 0
"""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor

from pl_privfed.checks import check_choice, check_int, check_positive_int

if TYPE_CHECKING:
    import networkx as nx
else:

    class _Networkx:
        """networkx, imported on first use: every fit imported it (0.1 s of CPU), and only the
        decentralized algorithms draw graphs."""

        def __getattr__(self, name: str) -> Any:
            return getattr(importlib.import_module("networkx"), name)

    nx = _Networkx()

__all__ = [
    "GraphName",
    "Topology",
    "WeightRule",
    "complete_graph",
    "erdos_renyi_graph",
    "fdla_weights",
    "max_degree_weights",
    "metropolis_weights",
    "mixing_rate",
    "ring_graph",
    "star_graph",
    "torus_graph",
]

GraphName = Literal["erdos_renyi", "ring", "torus", "star", "complete"]
WeightRule = Literal["metropolis", "max_degree", "fdla"]
GRAPHS = ("erdos_renyi", "ring", "torus", "star", "complete")
WEIGHTS = ("metropolis", "max_degree", "fdla")


def _check_nodes(n: int, minimum: int = 1) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < minimum:
        raise ValueError(f"num_nodes must be an integer >= {minimum}, got {n!r}")
    return n


# ---------------------------------------------------------------------------- graphs
def erdos_renyi_graph(n: int, p: float, seed: int = 0, max_tries: int = 100) -> nx.Graph:
    """Erdős–Rényi ``G(n, p)``, redrawn (seeds ``seed, seed+1, …``) until connected.

    Raises:
        ValueError: if none of ``max_tries`` draws is connected (naming ``p`` and ``n``).

    >>> g = erdos_renyi_graph(10, 0.8, seed=0)
    >>> nx.is_connected(g), g.number_of_nodes()
    (True, 10)
    """
    _check_nodes(n)
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p!r}")
    check_positive_int("max_tries", max_tries)
    for attempt in range(max_tries):
        graph = nx.gnp_random_graph(n, p, seed=seed + attempt)
        if nx.is_connected(graph):
            return graph
    raise ValueError(
        f"no connected Erdős–Rényi graph G(n={n}, p={p}) in max_tries={max_tries} draws "
        f"(seeds {seed}..{seed + max_tries - 1}); raise p or max_tries"
    )


def ring_graph(n: int) -> nx.Graph:
    """The cycle ``0 − 1 − … − (n−1) − 0`` (``n >= 2``; ``n = 2`` is one edge)."""
    return nx.cycle_graph(_check_nodes(n, 2))


def torus_graph(n: int, rows: int | None = None) -> nx.Graph:
    """A 2-D torus (periodic ``rows × n/rows`` grid), nodes relabelled ``0..n−1`` row-major.

    Args:
        n: number of nodes.
        rows: grid rows; default the largest divisor of ``n`` that is ``<= sqrt(n)``.

    Raises:
        ValueError: if ``rows`` does not divide ``n`` or the grid would be a single line.
    """
    _check_nodes(n, 4)
    if rows is None:
        rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 2 or n % rows or n // rows < 2:
        raise ValueError(
            f"rows must divide num_nodes={n} into a grid of at least 2 × 2, got rows={rows!r}"
        )
    grid = nx.grid_2d_graph(rows, n // rows, periodic=True)
    return nx.convert_node_labels_to_integers(grid, ordering="sorted")


def star_graph(n: int) -> nx.Graph:
    """Node 0 connected to every other node (``n >= 2``)."""
    return nx.star_graph(_check_nodes(n, 2) - 1)


def complete_graph(n: int) -> nx.Graph:
    """Every pair of nodes connected."""
    return nx.complete_graph(_check_nodes(n))


# ---------------------------------------------------------------------------- weights
def _adjacency(graph: nx.Graph) -> np.ndarray:
    n = graph.number_of_nodes()
    adj = nx.to_numpy_array(graph, nodelist=range(n), dtype=np.float64)
    np.fill_diagonal(adj, 0.0)
    return (adj != 0).astype(np.float64)


def _fill_diagonal(w: np.ndarray) -> np.ndarray:
    """Set ``w_ii = 1 − Σ_{j≠i} w_ij`` so that every row sums to one exactly."""
    np.fill_diagonal(w, 0.0)
    np.fill_diagonal(w, 1.0 - w.sum(axis=1))
    return w


def metropolis_weights(graph: nx.Graph) -> Tensor:
    """Metropolis–Hastings weights ``w_ij = 1/(1 + max(d_i, d_j))`` (float64 ``[n, n]``).

    >>> metropolis_weights(nx.path_graph(3))
    tensor([[0.6667, 0.3333, 0.0000],
            [0.3333, 0.3333, 0.3333],
            [0.0000, 0.3333, 0.6667]], dtype=torch.float64)
    """
    adj = _adjacency(graph)
    deg = adj.sum(axis=1)
    w = adj / (1.0 + np.maximum(deg[:, None], deg[None, :]))
    return torch.from_numpy(_fill_diagonal(w))


def max_degree_weights(graph: nx.Graph) -> Tensor:
    """Max-degree weights ``w_ij = 1/(1 + d_max)`` on edges (float64 ``[n, n]``)."""
    adj = _adjacency(graph)
    return torch.from_numpy(_fill_diagonal(adj / (1.0 + adj.sum(axis=1).max())))


def fdla_weights(graph: nx.Graph, solver: str | None = None) -> Tensor:
    """Symmetric FDLA weights (Xiao & Boyd 2004): ``min ||W − 11ᵀ/n||₂`` on the graph's pattern.

    Solved with cvxpy (``W`` symmetric, ``W_ij = 0`` off the pattern, ``W1 = 1``), then
    projected exactly onto the constraints (see the module docstring). float64 ``[n, n]``.

    Args:
        graph: a connected graph on nodes ``0..n−1``.
        solver: a cvxpy solver name (default: cvxpy's choice for an SDP, e.g. CLARABEL or SCS).
    """
    import cvxpy as cp

    adj = _adjacency(graph)
    n = adj.shape[0]
    if n == 1:
        return torch.ones(1, 1, dtype=torch.float64)
    w = cp.Variable((n, n), symmetric=True)
    off_pattern = (1.0 - adj) * (1.0 - np.eye(n))
    constraints = [w @ np.ones(n) == np.ones(n), cp.multiply(off_pattern, w) == 0]
    problem = cp.Problem(cp.Minimize(cp.sigma_max(w - np.full((n, n), 1.0 / n))), constraints)
    problem.solve(solver=solver)
    if w.value is None or problem.status not in ("optimal", "optimal_inaccurate"):
        raise RuntimeError(f"FDLA solve failed with status {problem.status!r}")
    sym = (w.value + w.value.T) / 2 * adj  # exact pattern (diagonal refilled below)
    return torch.from_numpy(_fill_diagonal(sym))


def mixing_rate(weights: Tensor) -> float:
    """``α = ||W − 11ᵀ/n||_op`` (paper 001 eq. 2, line 98): 0 for exact averaging.

    >>> mixing_rate(torch.full((4, 4), 0.25))
    0.0
    """
    n = weights.shape[0]
    avg = torch.full_like(weights, 1.0 / n)
    return float(torch.linalg.matrix_norm(weights - avg, ord=2))


# ---------------------------------------------------------------------------- config object
class Topology:
    """A communication graph and a mixing-matrix rule, built once the number of agents is known.

    Args:
        graph: ``"erdos_renyi"``, ``"ring"``, ``"torus"``, ``"star"`` or ``"complete"``.
        p: edge probability of ``"erdos_renyi"`` (paper 001 §5: 0.8).
        weights: ``"metropolis"``, ``"max_degree"`` or ``"fdla"`` (paper 001 §5: FDLA).
        seed: seed of the random graph.
        max_tries: Erdős–Rényi draws before giving up on connectivity.
        rows: rows of the ``"torus"`` grid (default: the most square factorization).
        matrix: an explicit mixing matrix (overrides ``graph`` and ``weights``; its non-zero
            pattern is the graph). It must satisfy paper 001 Def. 1: ``W1 = 1``, ``1ᵀW = 1ᵀ``
            (it need be neither symmetric nor non-negative).

    >>> t = Topology(graph="complete", weights="metropolis")
    >>> round(t.rate(4), 12)
    0.0
    """

    def __init__(
        self,
        graph: GraphName = "erdos_renyi",
        p: float = 0.8,
        weights: WeightRule = "fdla",
        seed: int = 0,
        max_tries: int = 100,
        rows: int | None = None,
        matrix: list[list[float]] | None = None,
    ) -> None:
        check_choice("graph", graph, GRAPHS)
        check_choice("weights", weights, WEIGHTS)
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
            raise ValueError(f"p must be in (0, 1], got {p!r}")
        check_int("seed", seed)
        check_positive_int("max_tries", max_tries)
        self.graph_name = graph
        self.p = float(p)
        self.weights = weights
        self.seed = seed
        self.max_tries = max_tries
        self.rows = rows
        self.matrix = None if matrix is None else self._check_matrix(matrix)

    @staticmethod
    def _check_matrix(matrix: list[list[float]]) -> Tensor:
        try:
            w = torch.tensor(matrix, dtype=torch.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"matrix must be a square list of lists, got {matrix!r}") from err
        if w.dim() != 2 or w.shape[0] != w.shape[1] or not torch.isfinite(w).all():
            raise ValueError(f"matrix must be a finite square matrix, got {matrix!r}")
        ones = torch.ones(w.shape[0], dtype=torch.float64)
        if not (torch.allclose(w @ ones, ones) and torch.allclose(w.T @ ones, ones)):
            raise ValueError(f"matrix must satisfy W1 = 1 and 1ᵀW = 1ᵀ, got {matrix!r}")
        return w

    def __repr__(self) -> str:
        if self.matrix is not None:
            return f"Topology(matrix={self.matrix.tolist()!r})"
        extra = f", p={self.p}" if self.graph_name == "erdos_renyi" else ""
        return f"Topology(graph={self.graph_name!r}{extra}, weights={self.weights!r}, seed={self.seed})"

    def build_graph(self, num_nodes: int) -> nx.Graph:
        """The communication graph on ``num_nodes`` agents (nodes ``0..n−1``)."""
        _check_nodes(num_nodes)
        if self.matrix is not None:
            if self.matrix.shape[0] != num_nodes:
                raise ValueError(
                    f"matrix is {self.matrix.shape[0]} × {self.matrix.shape[0]} but there are "
                    f"{num_nodes} agents"
                )
            pattern = (self.matrix != 0).numpy() | (self.matrix.T != 0).numpy()
            np.fill_diagonal(pattern, False)
            return nx.from_numpy_array(pattern.astype(np.float64))
        if num_nodes == 1:
            return complete_graph(1)
        if self.graph_name == "erdos_renyi":
            return erdos_renyi_graph(num_nodes, self.p, self.seed, self.max_tries)
        if self.graph_name == "torus":
            return torus_graph(num_nodes, self.rows)
        builders = {"ring": ring_graph, "star": star_graph, "complete": complete_graph}
        return builders[self.graph_name](num_nodes)

    def mixing_matrix(self, num_nodes: int) -> Tensor:
        """``W`` (float64 ``[n, n]``) on the graph of :meth:`build_graph`."""
        if self.matrix is not None:
            self.build_graph(num_nodes)  # size check
            return self.matrix.clone()
        graph = self.build_graph(num_nodes)
        rule = {
            "metropolis": metropolis_weights,
            "max_degree": max_degree_weights,
            "fdla": fdla_weights,
        }
        return rule[self.weights](graph)

    def rate(self, num_nodes: int) -> float:
        """The mixing rate ``α`` of :meth:`mixing_matrix`."""
        return mixing_rate(self.mixing_matrix(num_nodes))
