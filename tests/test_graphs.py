"""Topologies and mixing matrices (paper 001 Def. 1; Xiao & Boyd 2004 FDLA)."""

import networkx as nx
import pytest
import torch

from pl_privfed.graphs import (
    Topology,
    erdos_renyi_graph,
    fdla_weights,
    max_degree_weights,
    metropolis_weights,
    mixing_rate,
    ring_graph,
    star_graph,
    torus_graph,
)

GRAPHS = {
    "erdos_renyi": lambda: erdos_renyi_graph(10, 0.5, seed=3),
    "ring": lambda: ring_graph(8),
    "torus": lambda: torus_graph(12),
    "star": lambda: star_graph(6),
}
RULES = {"metropolis": metropolis_weights, "max_degree": max_degree_weights, "fdla": fdla_weights}


def check_mixing_matrix(w, graph):
    n = graph.number_of_nodes()
    ones = torch.ones(n, dtype=torch.float64)
    torch.testing.assert_close(w @ ones, ones, rtol=0, atol=1e-12)  # W1 = 1
    torch.testing.assert_close(w.T @ ones, ones, rtol=0, atol=1e-12)  # 1ᵀW = 1ᵀ
    torch.testing.assert_close(w, w.T, rtol=0, atol=0)  # symmetric (all three rules)
    for i in range(n):
        for j in range(n):
            if i != j and not graph.has_edge(i, j):
                assert w[i, j] == 0, (i, j)  # sparsity pattern of the graph


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("name", GRAPHS)
def test_mixing_matrices_respect_definition_1(name, rule):
    graph = GRAPHS[name]()
    w = RULES[rule](graph)
    check_mixing_matrix(w, graph)
    if rule != "fdla":  # Metropolis and max-degree are non-negative (stochastic)
        assert (w >= 0).all()
    assert 0 <= mixing_rate(w) < 1  # connected graph: strictly contracting


@pytest.mark.parametrize("name", GRAPHS)
def test_fdla_mixes_no_slower_than_metropolis(name):
    graph = GRAPHS[name]()
    fdla, metropolis = mixing_rate(fdla_weights(graph)), mixing_rate(metropolis_weights(graph))
    assert fdla <= metropolis + 1e-6
    assert fdla <= mixing_rate(max_degree_weights(graph)) + 1e-6


def test_fdla_known_value_on_a_path_and_star():
    # By symmetry the optimal weights are W = I − w L (L the Laplacian, eigenvalues λ_i), and
    # α = min_w max(|1 − w λ_2|, |1 − w λ_n|) = (λ_n − λ_2)/(λ_n + λ_2) at w = 2/(λ_2 + λ_n).
    # Path on 3 nodes: λ = 0, 1, 3 → α = 1/2.
    assert mixing_rate(fdla_weights(nx.path_graph(3))) == pytest.approx(0.5, abs=1e-5)
    # Star on n nodes: λ = 0, 1 (n − 2 times), n → α = (n − 1)/(n + 1); hub weight (3 − n)/(n + 1)
    w = fdla_weights(star_graph(6))
    assert mixing_rate(w) == pytest.approx(5 / 7, abs=1e-5)
    assert w[0, 0].item() == pytest.approx(-3 / 7, abs=1e-4)
    assert w[0, 0] < 0  # FDLA may use negative weights (paper 001 Def. 1 allows it)


def test_complete_graph_averages_in_one_step():
    for rule in ("metropolis", "max_degree", "fdla"):
        w = Topology(graph="complete", weights=rule).mixing_matrix(7)
        torch.testing.assert_close(
            w, torch.full((7, 7), 1 / 7, dtype=torch.float64), atol=1e-7, rtol=0
        )
        assert mixing_rate(w) < 1e-6


def test_erdos_renyi_is_seeded_and_connected():
    a, b = erdos_renyi_graph(10, 0.3, seed=5), erdos_renyi_graph(10, 0.3, seed=5)
    assert sorted(a.edges) == sorted(b.edges) and nx.is_connected(a)
    t = Topology(graph="erdos_renyi", p=0.8, weights="fdla", seed=0)
    torch.testing.assert_close(t.mixing_matrix(10), t.mixing_matrix(10))


def test_erdos_renyi_gives_up_with_a_clear_error():
    with pytest.raises(ValueError, match=r"no connected Erdős–Rényi graph G\(n=30, p=0.01\)"):
        erdos_renyi_graph(30, 0.01, seed=0, max_tries=3)


def test_graph_shapes():
    assert ring_graph(5).number_of_edges() == 5
    torus = torus_graph(12)  # 3 × 4 periodic grid: every node has degree 4
    assert torus.number_of_nodes() == 12 and {d for _, d in torus.degree} == {4}
    assert sorted(d for _, d in star_graph(5).degree) == [1, 1, 1, 1, 4]
    with pytest.raises(ValueError, match="rows"):
        torus_graph(7)  # prime: no 2-D grid


def test_explicit_matrix_and_validation():
    w = [[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.5, 0.0, 0.5]]  # non-symmetric, doubly stochastic
    t = Topology(matrix=w)
    torch.testing.assert_close(t.mixing_matrix(3), torch.tensor(w, dtype=torch.float64))
    assert t.build_graph(3).number_of_edges() == 3
    with pytest.raises(ValueError, match="agents"):
        t.mixing_matrix(4)
    with pytest.raises(ValueError, match="W1 = 1"):
        Topology(matrix=[[0.9, 0.2], [0.1, 0.8]])
    for kwargs, name in [
        ({"graph": "hypercube"}, "graph"),
        ({"weights": "uniform"}, "weights"),
        ({"p": 0.0}, "p"),
        ({"p": 1.5}, "p"),
        ({"max_tries": 0}, "max_tries"),
        ({"seed": 0.5}, "seed"),
    ]:
        with pytest.raises(ValueError, match=name):
            Topology(**kwargs)
