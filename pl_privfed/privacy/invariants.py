"""Privacy invariants checked on the real path of a run (a check mode, off by default).

With the environment variable ``PL_PRIVFED_CHECK_INVARIANTS=1`` (read once, when this module is
imported; the test suite sets it in ``tests/conftest.py``) every private algorithm gets a
:class:`RunChecks` at its ``setup`` (:func:`checks_for`), which the engine's hooks call at the
points where a release is bounded and where its noise is drawn, and which asserts, raising
:class:`InvariantViolation` (an ``AssertionError``) that names the invariant, the run, the round
and the release:

* **(a) bound** — every released client contribution (a message the clients' ``transmit``
  sends in a noised round) has norm at most the declared bound ``Φ`` of the algorithm's
  :class:`~pl_privfed.privacy.Release` before its noise (an adaptive clip's: ``Φ · C_t/C_0``,
  that round's bound); at record level every clipped example (or clipped minibatch gradient)
  has norm at most the clip bound its operator declares, and every client's clipped mean too;
* **(b) key once** — every noise key (the seed of :class:`~pl_privfed.rng.KeyedGenerator` a
  noise draw actually used: a client's ``(seed, STREAM_NOISE, round, client, step)``, the
  sum's ``(seed, STREAM_SERVER_NOISE, round)``, the aggregator's ``(seed, STREAM_CENTRAL_NOISE,
  round)``, the adaptive count's, and for correlated noise the strategy's fresh row ``z_t``
  ``(seed, STREAM_CORRELATED_NOISE, t)``) is used once in a run (a configuration of a grid is
  a run of its own); rows of ``Z`` that correlated noise reads again are not fresh draws;
* **(c) std** — the std each draw is given equals the one the plan declared for it: the
  calibrated ``σ`` the ledger composes, through the placement's definition written here again
  (a client's ``σ`` under local noise, ``σ/√t`` a share of distributed noise, ``√n`` times a
  sender's for the senders' noises drawn as their sum, ``σ`` for the trusted aggregator and
  for the rows ``z_t`` of correlated noise; times an adaptive clip's noise split and
  ``C_t/C_0``; the count's ``σ_b`` likewise);
* **(d) drawn** — every round the ledger charges drew its noise: a sum draw (aggregate,
  central, correlated), or a draw of its own for every client whose bounded contribution the
  round released (:func:`charged`, called where the ledger accounts the round).

Every check counts itself in :data:`COUNTS` (the tests read the counters to see that each
check ran). What the mode does not check: the sampling (who takes part) and the accounting
itself; that a draw's values follow the std it was given (torch's sampler); the noise a
process other than this one draws; per-example norms the layers backend never forms (the
ghost-clipping path is checked through the scales it applied and the norm of each client's
clipped mean, not through the examples' clipped gradients); an audit's canaries (their own
streams); anything a client does to its message after the stage (compression of an already
noised message is post-processing).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pl_privfed.privacy.placement import (
    CentralNoise,
    DistributedNoise,
    LocalNoise,
    NoisePlacement,
)

__all__ = [
    "COUNTS",
    "ENV",
    "InvariantViolation",
    "RunChecks",
    "charged",
    "checks_for",
    "disabled",
    "enabled",
]

#: the environment variable that switches the mode on (``1``, ``true``, ``yes``)
ENV = "PL_PRIVFED_CHECK_INVARIANTS"
_ENABLED = os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")

#: how many times each invariant was checked in this process: ``bound`` (a chunk's released
#: rows), ``key_once`` and ``std`` (a draw), ``drawn`` (a charged round)
COUNTS: Counter[str] = Counter()

#: relative and absolute tolerance of a norm against its bound (float32 clipping rounds up to a
#: few ulps), and relative tolerance of a std against the declared one
NORM_RTOL, NORM_ATOL, STD_RTOL = 1e-4, 1e-12, 1e-6


class InvariantViolation(AssertionError):
    """A privacy invariant broken on a run's real path (module docstring)."""


def enabled() -> bool:
    """Whether the check mode is on (the environment variable, read once, or :func:`disabled`)."""
    return _ENABLED


@contextmanager
def disabled() -> Iterator[None]:
    """Runs started inside the block are not checked (a deliberately broken mechanism, e.g.
    the audit's catalogue of breaks, which must run to the end to be audited)."""
    global _ENABLED
    before, _ENABLED = _ENABLED, False
    try:
        yield
    finally:
        _ENABLED = before


@dataclass
class _Round:
    released: set[int] = field(default_factory=set)
    noised: set[int] = field(default_factory=set)
    sum_noised: bool = False


@dataclass
class RunChecks:
    """One run's invariants (module docstring).

    Args:
        label: the run, in the messages (the algorithm's class, a grid's configuration).
        noise_std: the calibrated ``σ`` the ledger composes (a client's under local noise, the
            sum's under central and distributed noise).
        placement: where the noise goes.
        bound: ``Φ``, the declared bound of one client's message (client level).
        record_level: whether the release is record-level (bounds are the operator's clip).
        split: an adaptive clip's update noise split ``z_Δ/z`` (1 without one).
        count_std: an adaptive clip's count noise ``σ_b`` (``None`` without one).
    """

    label: str
    noise_std: float
    placement: NoisePlacement
    bound: float | None
    record_level: bool = False
    split: float = 1.0
    count_std: float | None = None
    #: this round's ``C_t/C_0`` (an adaptive clip; set by the algorithm's message stage)
    ratio: float = 1.0
    used: dict[int, tuple[int, ...]] = field(default_factory=dict)
    rounds: dict[int, _Round] = field(default_factory=dict)

    def _fail(self, invariant: str, round_index: int, release: str, detail: str) -> None:
        raise InvariantViolation(
            f"privacy invariant {invariant} broken in {self.label}, round {round_index}, "
            f"release {release!r}: {detail}"
        )

    def _round(self, round_index: int) -> _Round:
        return self.rounds.setdefault(round_index, _Round())

    # ------------------------------------------------------------------ (a) bounds
    def message_bound(self) -> float | None:
        """This round's declared bound of a client's message: ``Φ · C_t/C_0``."""
        return None if self.bound is None else self.bound * self.ratio

    def bounded(
        self,
        round_index: int,
        ids: Any,
        norms: Any,
        release: str,
        bound: float | None = None,
    ) -> None:
        """(a): the released contributions of the clients ``ids`` (a tensor, or one norm per
        row of ``norms``, ``[c]`` or ``[c, B]`` per example) are at most ``bound`` (default
        :meth:`message_bound`); the clients count as released in the round."""
        COUNTS["bound"] += 1
        limit = self.message_bound() if bound is None else float(bound)
        if limit is None:
            self._fail("(a) bound", round_index, release, "no declared bound to check against")
        flat = norms.reshape(norms.shape[0], -1) if norms.dim() > 1 else norms.unsqueeze(1)
        if flat.numel():
            worst = flat.max(dim=1).values
            over = worst > limit * (1 + NORM_RTOL) + NORM_ATOL
            if bool(over.any()):
                row = int(over.nonzero()[0, 0])
                self._fail(
                    "(a) bound",
                    round_index,
                    release,
                    f"client {int(ids[row])}'s contribution has norm {float(worst[row]):.6g} "
                    f"> the declared bound {limit:.6g} before noise "
                    f"({int(over.sum())} of {len(over)} clients of the chunk over it)",
                )
        self._round(round_index).released.update(int(i) for i in ids.tolist())

    # ------------------------------------------------------------------ (b), (c) draws
    def expected_std(self, kind: str, count: int = 1) -> float:
        """The std the plan declares for a draw of ``kind`` (module docstring, (c))."""
        sigma = self.noise_std
        if kind == "clip_count":
            sigma = float(self.count_std)
        elif not self.record_level:
            sigma = sigma * self.split * self.ratio
        placement = self.placement
        if kind in ("central", "correlated"):
            return sigma
        if isinstance(placement, DistributedNoise):
            share = sigma / math.sqrt(placement.min_contributors)
        elif isinstance(placement, CentralNoise):
            share = 0.0
        elif isinstance(placement, LocalNoise) or self.record_level:
            share = sigma
        else:  # a user's placement: its own definition
            share = placement.sender_std(sigma)
        if kind == "clip_count" and placement.aggregator_draws:
            return sigma
        return share if kind == "client" else share * math.sqrt(count)

    def drew(
        self,
        round_index: int,
        kind: str,
        keyed: Any,
        std: float,
        count: int = 1,
        client: int | None = None,
        release: str = "noise",
    ) -> None:
        """(b) and (c) for a draw just made from ``keyed`` (its :attr:`~pl_privfed.rng.
        KeyedGenerator.last_key` and seed): ``kind`` ``"client"`` (one client's, ``client``),
        ``"sum"`` (``count`` senders' noises as their sum), ``"central"``, ``"correlated"``
        (the fresh row ``z_t``) or ``"clip_count"``."""
        COUNTS["key_once"] += 1
        seed, key = keyed.last_seed, tuple(keyed.last_key)
        if seed in self.used:
            self._fail(
                "(b) key once",
                round_index,
                release,
                f"the {kind} draw's noise key {key} was already used by the draw of key "
                f"{self.used[seed]} in this run",
            )
        self.used[seed] = key
        COUNTS["std"] += 1
        expected = self.expected_std(kind, count)
        if not math.isclose(float(std), expected, rel_tol=STD_RTOL, abs_tol=1e-300):
            who = f" (client {client})" if client is not None else ""
            self._fail(
                "(c) std",
                round_index,
                release,
                f"the {kind} draw{who} has std {float(std):.6g}, the plan declares "
                f"{expected:.6g} (σ = {self.noise_std:.6g}, placement {self.placement.name!r}"
                + (f", {count} senders" if kind in ("sum", "clip_count") else "")
                + ")",
            )
        if kind in ("sum", "central", "correlated"):
            self._round(round_index).sum_noised = True
        elif kind == "client" and client is not None:
            self._round(round_index).noised.add(int(client))

    # ------------------------------------------------------------------ (d) charged rounds
    def charged(self, round_index: int) -> None:
        """(d): the ledger charges round ``round_index``: it drew its noise."""
        COUNTS["drawn"] += 1
        state = self.rounds.pop(round_index, _Round())
        if state.sum_noised:
            return
        if self.placement.aggregator_draws and not self.record_level:
            self._fail(
                "(d) drawn",
                round_index,
                "the aggregator's sum",
                "the ledger charges the round but the trusted aggregator drew no noise",
            )
        missing = sorted(state.released - state.noised)
        if missing:
            self._fail(
                "(d) drawn",
                round_index,
                "the clients' messages",
                f"the ledger charges the round but {len(missing)} released clients drew no "
                f"noise (first: {missing[:5]}) and no sum draw covered them",
            )


def checks_for(
    label: str,
    noise_std: float,
    placement: NoisePlacement,
    bound: float | None,
    record_level: bool,
    split: float = 1.0,
    count_std: float | None = None,
) -> RunChecks | None:
    """A run's :class:`RunChecks`, or ``None`` when the mode is off."""
    if not _ENABLED:
        return None
    return RunChecks(label, float(noise_std), placement, bound, record_level, split, count_std)


def charged(algorithm: Any, round_index: int, released: bool = True) -> None:
    """(d) for ``algorithm``'s round ``round_index``, which its ledger has just accounted
    (charged where ``released``; a no-op when the mode is off, the algorithm has no checks, or
    the round released nothing)."""
    checks = getattr(algorithm, "invariants", None)
    if checks is not None and released:
        checks.charged(round_index)
