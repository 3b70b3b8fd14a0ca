"""The audit's per-canary check against the declared bound (issue 48): exact, not statistical.

In a simulation the auditor knows each inserted canary's contribution to every release before
its noise (the white-box auditor's ``c_j``, :class:`~pl_privfed.privacy.audit.WhiteBox`): a
canary client's clean message (the chunk's operator call and the algorithm's lines,
:meth:`~pl_privfed.privacy.audit.ClientCanaries.sent`), a canary record's part of its host's
noised average (``Ψ(G·u_j)/b`` through the per-example path,
:meth:`~pl_privfed.privacy.audit_records.RecordJoin.finish`; or ``β Ψ(v) − β Ψ(v − a_j)`` where
the algorithm clips the whole minibatch gradient,
:meth:`~pl_privfed.privacy.audit_records.RecordCanaries.operator_applied`). The certificate
rests on one unit moving a noised release by at most its declared add/remove sensitivity
(:func:`~pl_privfed.privacy.plan.sensitivity`: the client's ``Φ``, times ``C_t/C_0`` for an
adaptive clip's round; a record's ``c/b`` for per-example clipping, ``2c`` where the clipped
minibatch gradient can flip). A canary is a unit whose vector before the operator is
``overshoot`` times the bound, so one whose released contribution exceeds that bound by more
than the float rounding of a clip (:data:`NORM_RTOL`, the check mode's,
:mod:`pl_privfed.privacy.invariants`) was not bounded on its path: a certain violation, whatever
the other canaries say. The Gaussian fit of the white box pools the canaries, so a break that
reaches one canary in ten is diluted there (its spread is theirs); this check is not.

What it cannot see: a break on a path no canary takes (a client or a record place no canary
lands in), a bound the declaration itself overstates (the check compares with the declaration),
and anything after the contribution is formed (the noise: :mod:`pl_privfed.privacy.audit_noise`
and the white box).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pl_privfed.privacy.invariants import NORM_ATOL, NORM_RTOL

__all__ = ["BOUND_STATISTIC", "CanaryBound", "operator_ratio"]

BOUND_STATISTIC = (
    "each inserted canary's contribution to each release before its noise, ||c_j||, against "
    "the declared add/remove bound of one unit's contribution (times C_t/C_0 for an adaptive "
    "clip's round)"
)


def operator_ratio(operator: Any) -> float:
    """``C_t/C_0``: the operator's bound this round over the bound the run's noise is
    calibrated at (:attr:`~pl_privfed.operators.Operator.reference_bound`; 1 for every operator
    whose bound does not move, or that declares none)."""
    bound = getattr(operator, "bound", None)
    reference = getattr(operator, "reference_bound", None)
    if bound is None or reference is None or not reference > 0:
        return 1.0
    return float(bound) / float(reference)


class CanaryBound:
    """The largest ``||c_j||`` over each canary's releases against the declared bound (module
    docstring); the canaries' hooks call :meth:`add` with the contributions they computed.

    Args:
        count: the canaries ``m``.
        declared: the declared add/remove bound of one unit's contribution.
        minibatch: the bound of a canary record joined to a minibatch gradient that the
            algorithm then clips whole (the declaration's replace-one sensitivity, ``2c``: the
            difference of two clipped vectors; at ``b = 1`` the canary and the host's one
            record make a minibatch the add/remove declaration does not model).
    """

    def __init__(self, count: int, declared: float, minibatch: float | None = None) -> None:
        self.declared = float(declared)
        self.minibatch = None if minibatch is None else float(minibatch)
        #: per canary: the largest ``||c_j|| / bound`` over its releases (0 before any)
        self.worst = np.zeros(count)
        #: per canary: the releases checked
        self.releases = np.zeros(count, dtype=np.int64)
        #: per canary: the releases over the bound
        self.over = np.zeros(count, dtype=np.int64)
        #: the first release over the bound: canary, round, ``||c_j||``, the bound
        self.first: dict[str, Any] | None = None

    def add(self, round_index: int, index: Any, norms: Any, bound: float | None = None) -> None:
        """Canaries ``index`` (``[a]``) contributed ``norms`` (``[a]``, ``||c_j||``) to a
        release of round ``round_index`` whose bound is ``bound`` (default :attr:`declared`)."""
        index = torch.as_tensor(index).cpu().numpy().astype(np.int64).reshape(-1)
        norms = torch.as_tensor(norms).detach().double().cpu().numpy().reshape(-1)
        if not index.size:
            return
        limit = self.declared if bound is None else float(bound)
        np.maximum.at(self.worst, index, norms / limit if limit > 0 else np.inf)
        np.add.at(self.releases, index, 1)
        over = norms > limit * (1 + NORM_RTOL) + NORM_ATOL
        np.add.at(self.over, index[over], 1)
        if self.first is None and bool(over.any()):
            k = int(np.flatnonzero(over)[0])
            self.first = {
                "canary": int(index[k]),
                "round": int(round_index),
                "norm": float(norms[k]),
                "bound": limit,
            }

    def report(self) -> dict[str, Any]:
        """The check's entry of ``privacy.audit`` (``flagged`` when any release of any canary
        exceeded the bound: no test level, the check has no false alarms)."""
        checked = self.releases > 0
        return {
            "statistic": BOUND_STATISTIC,
            "declared_bound": self.declared,
            "minibatch_bound": self.minibatch,
            "relation": "add_remove",
            "tolerance": {"relative": NORM_RTOL, "absolute": NORM_ATOL},
            "canaries_checked": int(checked.sum()),
            "releases_checked": int(self.releases.sum()),
            "largest_ratio": float(self.worst.max()) if checked.any() else None,
            "canaries_over": int((self.over > 0).sum()),
            "releases_over": int(self.over.sum()),
            "first_over": self.first,
            "flagged": bool(self.over.any()),
        }

    def state_dict(self) -> dict[str, Any]:
        """Tensors and plain values (a checkpoint loads with ``weights_only``)."""
        return {
            "worst": torch.from_numpy(self.worst.copy()),
            "releases": torch.from_numpy(self.releases.copy()),
            "over": torch.from_numpy(self.over.copy()),
            "first": None if self.first is None else dict(self.first),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.worst = torch.as_tensor(state["worst"]).double().numpy().copy()
        self.releases = torch.as_tensor(state["releases"]).long().numpy().copy()
        self.over = torch.as_tensor(state["over"]).long().numpy().copy()
        self.first = None if state["first"] is None else dict(state["first"])
