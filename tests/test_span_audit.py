"""An audit's canary clients in the clients' data span (``client_span``, issue 48 item 1).

A canary client of a run in the span is a client of that representation
(:class:`~pl_privfed.engine.SpanRows`): a basis of its own, made from its direction by the code
that makes every client's (:meth:`~pl_privfed.layer_rules.ClientSpan.fit`), its gradient, state
rows and message as coordinates, through the chunk's operator call, and its message summed by
the span's own ``add`` and expansion. So a run audited in the span reads the canaries of the
same run in ``d`` dimensions (where a basis holds the direction: the directions are the same),
and a clip skipped by the span's code only is flagged in one run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.training import trainer

from pl_privfed import FederatedModule
from pl_privfed.algorithms import DistributedDPSGD
from pl_privfed.callbacks import PrivacyAudit
from pl_privfed.datamodules import DigitsDataModule, FixedSizePartitioner
from pl_privfed.engine import DENSE, SpanRows
from pl_privfed.layer_rules import ClientSpan
from pl_privfed.models import LogisticRegression
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise


def _audited(tmp_path, span, examples=12, rounds=3):
    """DP-SGD under distributed noise (σ = 1) on 100 digit clients of ``examples`` images
    (minibatches of 4, chunks of 30), audited by 20 canary clients."""
    torch.manual_seed(0)
    partitioner = FixedSizePartitioner(examples_per_client=examples, concentration=1.0, seed=0)
    data = DigitsDataModule(num_clients=100, batch_size=4, partitioner=partitioner)
    alg = DistributedDPSGD(0.5, Clip(1.0), noise=DPNoise(noise_multiplier=1.0, seed=5))
    module = FederatedModule(LogisticRegression(64, 10), alg, client_span=span, client_chunk=30)
    audit = PrivacyAudit(canaries=20)
    trainer(tmp_path / span, max_steps=rounds, callbacks=[audit]).fit(module, datamodule=data)
    return module, audit


def test_a_canary_client_of_the_span_sends_a_unit_direction_of_its_own_basis():
    """:meth:`ClientSpan.fit`: orthonormal bases, unit coordinates whose lift is the
    direction; a direction a basis can hold (``r >= out``) is kept, otherwise its projection
    on the span of its weight's first ``r`` rows (a plain loop, one canary at a time)."""
    torch.manual_seed(0)
    din, out = 9, 3
    d = out * din + out
    vectors = torch.randn(4, d, dtype=torch.float64)
    vectors /= vectors.norm(dim=1, keepdim=True)
    for r in (2, 4):
        span = ClientSpan(
            torch.zeros(1, r, din, dtype=torch.float64), (0, out), (out * din, out), d
        )
        basis, coords = span.fit(vectors)
        eye = torch.eye(r, dtype=torch.float64).expand(4, r, r)
        assert torch.allclose(basis @ basis.mT, eye)
        assert torch.allclose(coords.norm(dim=1), torch.ones(4, dtype=torch.float64))
        lifted = span.lift(basis, coords)
        assert torch.allclose(span.coordinates(basis, lifted), coords)
        for j in range(4):
            weight = vectors[j, : out * din].view(out, din)
            rows = weight[: min(r, out)]
            projector = torch.linalg.pinv(rows) @ rows  # onto the span of those rows
            want = torch.cat([(weight @ projector).flatten(), vectors[j, out * din :]])
            assert torch.allclose(lifted[j], want / want.norm()), (r, j)
        if r >= out:
            assert torch.allclose(lifted, vectors)


def test_an_audited_run_in_the_span_reads_the_canaries_of_the_dense_run(tmp_path):
    """Bases of 12 rows hold the canaries' directions (10 outputs): the same directions, the
    same white-box statistic per canary (noise and contribution), the same cosines and the
    same model as the run that forms every row in ``d`` dimensions; not flagged."""
    dense, dense_audit = _audited(tmp_path, "off")
    spanned, span_audit = _audited(tmp_path, "on")
    assert dense.algorithm.client_rows is DENSE
    assert isinstance(spanned.algorithm.client_rows, SpanRows)
    a, b = dense_audit.canaries, span_audit.canaries
    assert torch.allclose(a.directions, b.directions, atol=1e-6)
    assert a.rounds_sent == b.rounds_sent == 3 and a.messages_sent == b.messages_sent > 0
    assert np.abs(b.white.shift).max() > 0.9  # the inserted canaries' clipped contributions
    np.testing.assert_allclose(a.white.shift, b.white.shift, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a.white.base, b.white.base, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dense_audit._sum, span_audit._sum, rtol=1e-4, atol=1e-6)
    for p, q in zip(dense.model.parameters(), spanned.model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-5)
    report = span_audit.report()
    assert not report["alarm"] and not report["exceeds_bound"]
    assert report["bound_check"]["largest_ratio"] == pytest.approx(1.0, rel=1e-4)


def test_a_clip_skipped_by_the_spans_sum_only_is_flagged_in_one_run(tmp_path, monkeypatch):
    """A break of the span's code only: its sum adds the last row of every call unscaled (the
    clip skipped for a chunk's last client). Shards of 6 (bases narrower than the 10 outputs:
    each canary sends its direction's projection). The real clients' round changes, and every
    canary's message, summed by the same code, is ``overshoot`` = 100 times the bound: flagged
    by the exact per-canary check, in one run of three rounds."""
    unbroken, clean = _audited(tmp_path / "clean", "on", examples=6)
    assert not clean.report()["alarm"]
    add = SpanRows.add

    def skips_the_last_clip(self, reduction, name, ids, rows, weights):
        if weights is not None and rows.dim() == 2 and weights.numel():
            weights = weights.clone()
            weights[-1] = 1.0
        add(self, reduction, name, ids, rows, weights)

    monkeypatch.setattr(SpanRows, "add", skips_the_last_clip)
    with pytest.warns(UserWarning, match="EXCEEDS THE DECLARED BOUND"):
        module, audit = _audited(tmp_path / "broken", "on", examples=6)
    report = audit.report()
    assert report["alarm"] and report["exceeds_bound"]
    assert report["bound_check"]["largest_ratio"] == pytest.approx(100.0, rel=1e-3)
    moved = [not torch.allclose(p, q) for p, q in zip(unbroken.parameters(), module.parameters())]
    assert any(moved)  # the real clients' round changed too
