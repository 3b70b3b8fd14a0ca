"""The white-box audit against a catalogue of broken mechanisms (issue 29, items 1–2).

Every break leaves the accounting untouched (the certificate still says ε = 8, the shipped
target) and changes what the run does, one way at a time: less noise, a looser or skipped clip,
distributed shares that do not add up to the certified variance, the central draw scaled for the
average instead of the sum. The white-box auditor (:class:`~pl_privfed.privacy.audit.WhiteBox`)
subtracts every known contribution from each release, so its statistic is the mechanism's own:
each break must be flagged in one run, and the unbroken mechanism must not be (its false-alarm
rate over seeds is measured in ``benchmarks/audit_breaks.py`` and stated in docs/privacy.md).

The catalogue itself (``BREAKS``) is ``tests/_audit_breaks.py``, which ``benchmarks/audit_breaks.py``
also runs on the shipped configs; here it runs on a 2,000-dimensional quadratic with 10 clients
and 50 rounds (about 3 s a run), every client every round.
"""

from __future__ import annotations

import pytest
from _audit_breaks import BREAKS, EPSILON, MECHANISMS, audit_small, broken

CASES = [(name, mechanism) for name, spec in BREAKS.items() for mechanism in spec["applies"]]


@pytest.mark.parametrize(("brk", "mechanism"), CASES, ids=[f"{b}-{m}" for b, m in CASES])
def test_every_break_is_flagged_in_one_run_at_the_shipped_epsilon(brk, mechanism):
    """Each break of the catalogue, on each mechanism it applies to, calibrated to the shipped
    ε = 8 (the headline adversary's: the server under local and distributed noise, where the
    models' certificate is 3.58): the white-box estimate's low end exceeds the certified ε of
    the audited adversary (whoever sees the models), so the run ends flagged."""
    with broken(brk):
        audit = audit_small(mechanism)
    white = audit["threat_models"]["white_box"]
    assert audit["headline_epsilon"] == pytest.approx(EPSILON, abs=0.05)  # what the run asked
    assert white["epsilon_low"] > audit["certified_epsilon"], white
    assert audit["exceeds_certified"]


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
@pytest.mark.parametrize("seed", [1, 2])
def test_the_unbroken_mechanism_is_not_flagged_and_the_white_box_reaches_half_the_certificate(
    mechanism, seed
):
    """The unbroken mechanism at ε = 8, two seeds of its noise and canaries: not flagged, and
    the white-box estimate is at least half the certificate: its statistic is the mechanism's
    own (under distributed noise with t = n/2, the t honest shares: the other senders collude
    with the server, as the certificate assumes)."""
    audit = audit_small(mechanism, noise_seed=seed, audit_seed=seed)
    white = audit["threat_models"]["white_box"]
    assert not audit["exceeds_certified"], white
    assert white["epsilon_estimate"] >= 0.5 * audit["certified_epsilon"], white
