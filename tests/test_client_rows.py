"""How a chunk's client rows are represented (:mod:`pl_privfed.engine.rows`): rows of ``d``
(:data:`~pl_privfed.engine.DENSE`) and coordinates in the span of each client's data
(:class:`~pl_privfed.engine.SpanRows`) answer the engine's questions alike where they can (the
same server sums), the span refuses what only ``d``-dimensional rows have, and no code outside
the representation's modules names the span (docs/engine.md, "How client rows are
represented")."""

import io
import re
import tokenize
from pathlib import Path

import pytest
import torch

from pl_privfed.algorithms import EF21, AlphaNormEC
from pl_privfed.engine import DENSE, Reduction, SpanRows, expand_together
from pl_privfed.grads import GradientOracle, RoundOracle
from pl_privfed.layer_rules import ClientSpan
from pl_privfed.models import LogisticRegression

PACKAGE = Path(__file__).resolve().parents[1] / "pl_privfed"

#: where the span may be named: its mathematics (the layer rules), its representation and the
#: engine's exports
SPAN_HOMES = ("layer_rules/", "engine/span.py", "engine/__init__.py")
#: the names of the span allowed elsewhere: the user's option and an algorithm's declaration
SPAN_NAMES_ELSEWHERE = {"client_span", "span_states"}
#: at most this many of them (12 when the test was written: 6 of the option through the module
#: and its wiring, 4 of the declaration in the algorithms' base and two algorithms)
SPAN_MENTIONS_ELSEWHERE = 16


def _names_span(name: str) -> bool:
    """An identifier naming the span as a word (``client_span``, ``SpanRows``), not one that
    only contains the letters (matplotlib's ``axhspan``)."""
    return "Span" in name or re.search(r"(^|_)span(s|_|$)", name) is not None


def _span_names() -> dict[str, list[str]]:
    """Every identifier naming the span (code, not strings or comments) outside its homes."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(SPAN_HOMES):
            continue
        text = path.read_text()
        if "span" not in text.lower():
            continue
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        names = [t.string for t in tokens if t.type == tokenize.NAME and _names_span(t.string)]
        if names:
            found[rel] = names
    return found


def test_only_the_representation_names_the_span():
    found = _span_names()
    odd = {f: sorted(set(n) - SPAN_NAMES_ELSEWHERE) for f, n in found.items()}
    assert not any(odd.values()), f"ask the client rows (ClientRows), not the span: {odd}"
    total = sum(len(n) for n in found.values())
    assert 0 < total <= SPAN_MENTIONS_ELSEWHERE, found


def _span(n=5, m=4, din=7, out=3):
    torch.manual_seed(0)
    examples = torch.randn(n, m, din, dtype=torch.float64)
    basis = ClientSpan.orthonormal(examples)
    return SpanRows(ClientSpan(basis, (0, out), (out * din, out), out * din + out))


def test_span_rows_defer_the_sums_that_dense_rows_add_at_once():
    """Two chunks of coordinates (weighted and not) and a statistic through each
    representation: the same server sums, the span's only once the map is flushed."""
    rows = _span()
    span = rows.span
    coords = torch.randn(span.clients, span.rank, dtype=torch.float64)
    lifted = span.lift(span.basis, coords)  # plain loop, one client at a time
    weights = torch.rand(span.clients, dtype=torch.float64)
    chunks = (torch.arange(0, 2), torch.arange(2, span.clients))
    sums = {}
    for representation, table in ((DENSE, lifted), (rows, coords)):
        reduction = Reduction(span.dim, dtype=torch.float64)
        for ids in chunks:
            representation.add(reduction, "plain", ids, table[ids], None)
            representation.add(reduction, "weighted", ids, table[ids], weights[ids])
            representation.add(reduction, "stat", ids, weights[ids], None)
        assert set(reduction.pending) == (
            {"plain", "weighted"} if representation is rows else set()
        )
        reduction.flush()
        assert not reduction.pending
        sums[representation] = reduction.sums
    for name in ("plain", "weighted", "stat"):
        assert torch.allclose(sums[DENSE][name], sums[rows][name]), name
    assert torch.allclose(sums[rows]["plain"], lifted.sum(0))
    assert torch.allclose(sums[rows]["weighted"], weights @ lifted)


def test_expand_together_groups_reductions_of_one_representation():
    rows = _span()
    coords = torch.randn(rows.span.clients, rows.rank, dtype=torch.float64)
    ids = torch.arange(rows.span.clients)
    alone, together = [], []
    for scale in (1.0, 2.0):
        for out in (alone, together):
            reduction = Reduction(rows.span.dim, dtype=torch.float64)
            rows.add(reduction, "sent", ids, scale * coords, None)
            out.append(reduction)
    for reduction in alone:
        reduction.flush()
    expand_together(together)
    for a, b in zip(alone, together, strict=True):
        assert torch.allclose(a.sums["sent"], b.sums["sent"]) and not b.pending


def test_each_representation_shapes_states_and_chunks():
    rows, dim = _span(), 24
    assert DENSE.state_shape((dim,), linear=True) == (dim,) and DENSE.width(dim) == dim
    assert rows.state_shape((dim,), linear=True) == (rows.rank,)
    assert rows.state_shape((dim,), linear=False) == (dim,)
    assert rows.width(dim) == rows.span.width
    assert DENSE.describe(dim) is None and f"{rows.rank:,} coordinates" in rows.describe(dim)
    assert not DENSE.computes_gradients and rows.computes_gradients


def test_the_span_refuses_what_only_rows_of_d_have():
    rows = _span()
    DENSE.require_dense("per-client noise draws")  # nothing to refuse
    with pytest.raises(ValueError, match="per-client noise draws are not in the clients' data"):
        rows.require_dense("per-client noise draws")
    DENSE.admit(EF21(0.1))
    rows.admit(AlphaNormEC(0.1, beta=0.1, alpha=0.01))
    with pytest.raises(ValueError, match="EF21 cannot run in the clients' data span"):
        rows.admit(EF21(0.1))  # top-k is not norm-based
    model = LogisticRegression(7, 3).double()
    oracle = RoundOracle(GradientOracle(model, torch.nn.CrossEntropyLoss()), None, rows=rows)
    x = torch.zeros(rows.span.dim, dtype=torch.float64)
    with pytest.raises(ValueError, match="per-example gradients"):
        oracle(x, torch.arange(2), per_example=True)
    with pytest.raises(ValueError, match="per-example clipped means"):
        oracle.clipped_mean(x, torch.arange(2), lambda norms: norms)
