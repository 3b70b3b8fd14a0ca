"""The alarm of :class:`~pl_privfed.callbacks.PrivacyAudit`: its statistical tests (each gives its
value at a confidence and a number of tests sharing it, Bonferroni), the white-box threat model
whose fit and bound are among them, the exact per-canary check against the declared bound
(:mod:`pl_privfed.privacy.audit_bound`), and the run's warnings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pytorch_lightning.utilities import rank_zero_warn

from pl_privfed.privacy import plan
from pl_privfed.privacy.audit import gaussian_estimate, one_run_audit
from pl_privfed.privacy.audit_bound import CanaryBound

__all__ = [
    "THREAT_MODELS",
    "WHITE_BOX_STATISTIC",
    "bound",
    "bound_check",
    "fit_low",
    "warn_bound",
    "warn_exceeds",
    "white_box",
]

#: the threat models audited: the final model only, and every round's model
THREAT_MODELS = {
    "final_model": "the final model only",
    "every_round": "every round's model (what the server releases after each round)",
    "white_box": (
        "the white-box auditor: every contribution to each release known except each canary's "
        "(Nasr et al. 2021, 2023), the rest subtracted"
    ),
}
WHITE_BOX_STATISTIC = (
    "Σ over releases of ⟨release − every known contribution, u_j⟩: the noise the certificate "
    "counts on (the sum's, central and distributed; the canary's own, local and record level) "
    "plus, inserted, the canary's contribution through the run's operator"
)

Alarms = list[tuple[str, Callable[[float, int], float]]]


def fit_low(
    inserted: np.ndarray, held_out: np.ndarray, delta: float
) -> Callable[[float, int], float]:
    """The low end of a Gaussian fit's ε interval at ``1 − (1 − confidence)/tests``."""

    def low(confidence: float, tests: int) -> float:
        level = 1.0 - (1.0 - confidence) / tests
        return gaussian_estimate(inserted, held_out, delta, level).epsilon_low

    return low


def bound(scores: np.ndarray, inserted: np.ndarray, delta: float) -> Callable[[float, int], float]:
    """A one-run lower bound with ``tests`` audits sharing the confidence (Bonferroni)."""

    def value(confidence: float, tests: int) -> float:
        return one_run_audit(scores, inserted, delta, confidence, tests=tests).epsilon

    return value


def white_box(
    canaries: Any,
    inserted: np.ndarray,
    delta: float,
    confidence: float,
    ledger: Any,
    adversary: str | None,
    alarms: Alarms,
) -> dict[str, Any] | None:
    """The white-box threat model (:class:`~pl_privfed.privacy.audit.WhiteBox`): the Gaussian
    fit of its statistic read under the certificate's neighbouring relation (the inserted
    canary against its opposite under replace-one: twice its contribution), and the one-run
    lower bound of the same scores under add/remove of the canary (record level, where each
    canary is inserted independently with probability 1/2); the fit's low end and, under
    add/remove, the bound join the run's ``alarms``."""
    relation = "add_remove"
    if ledger is not None and adversary is not None:
        relation = plan.relation(ledger.release, ledger.noise, adversary)
    factor = 2.0 if relation == "replace_one" else 1.0
    scores = canaries.white.values(factor)
    if scores is None or inserted.all() or not inserted.any():
        return None
    fit = gaussian_estimate(scores[inserted], scores[~inserted], delta, confidence)
    alarms.append(("white_box", fit_low(scores[inserted], scores[~inserted], delta)))
    lower = None
    if canaries.level == "record":
        added = canaries.white.values(1.0)
        lower = one_run_audit(added, inserted, delta, confidence)
        if relation == "add_remove":
            alarms.append(("white_box", bound(added, inserted, delta)))
    return {
        "threat_model": THREAT_MODELS["white_box"],
        "statistic": WHITE_BOX_STATISTIC,
        "relation": relation,
        "releases": canaries.white.releases,
        **fit.as_dict(),
        "epsilon_estimate": fit.epsilon,
        "epsilon_interval": [fit.epsilon_low, fit.epsilon_high],
        "epsilon_lower_bound": None if lower is None else lower.epsilon,
        "lower_bound": None if lower is None else lower.as_dict(),
    }


def bound_check(canaries: Any, ledger: Any, state: dict[str, Any] | None) -> str | None:
    """Puts the per-canary check against the declared bound on ``canaries`` (their
    :attr:`bound`: a :class:`~pl_privfed.privacy.audit_bound.CanaryBound` at the certified
    release's add/remove sensitivity, and its replace-one sensitivity for canary records in a
    minibatch gradient the algorithm clips whole), a checkpoint's ``state`` loaded; or returns
    why there is none."""
    canaries.bound = None
    if ledger is None:
        return "not a private run"
    release = ledger.release
    if release.bound is None and release.sensitivity is None:
        return "the release declares no bound on a unit's contribution"
    declared = plan.sensitivity(release, "add_remove")
    minibatch = plan.sensitivity(release, "replace_one") if canaries.level == "record" else None
    canaries.bound = CanaryBound(canaries.count, declared, minibatch)
    if state is not None:
        canaries.bound.load_state_dict(state)
    return None


def warn_exceeds(entry: dict[str, Any], value: float, where: str) -> None:
    """The run's warning for an ε test over the certified ε (``value`` from ``where``)."""
    if where == "white_box":
        fit = entry["threat_models"][where]
        what = (
            f"white-box ε estimate {fit['epsilon_estimate']:.4g} ({value:.4g} at the low end "
            f"of its {entry['alarm_confidence']:.2%} interval or its lower bound)"
        )
    elif entry["level"] == "record":
        what = f"ε lower bound {value:.4g} ({entry['alarm_confidence']:.2%} confidence)"
    else:
        fit = entry["threat_models"][where]
        what = (
            f"ε estimate {fit['epsilon_estimate']:.4g} (Gaussian fit; {value:.4g} at the "
            f"low end of its {entry['alarm_confidence']:.2%} interval)"
        )
    rank_zero_warn(
        f"PRIVACY AUDIT: the audit's {what} from {THREAT_MODELS[where]} EXCEEDS the certified "
        f"ε {entry['certified_epsilon']:.4g} against {entry['certified_adversary']} at "
        f"δ={entry['delta']:g}: the run that ran is less private than its certificate says "
        "(look for noise added to the wrong tensor, a clip skipped, a reused key or a "
        "sensitivity off by a factor)",
        category=UserWarning,
    )


def warn_bound(check: dict[str, Any], level: str) -> None:
    """The run's warning for a canary whose contribution exceeded the declared bound."""
    first = check["first_over"]
    rank_zero_warn(
        f"PRIVACY AUDIT: a canary {level}'s contribution EXCEEDS THE DECLARED BOUND: canary "
        f"{first['canary']} in round {first['round']} contributed a vector of norm "
        f"{first['norm']:.6g} before its noise, the declared bound is {first['bound']:.6g} "
        f"({check['canaries_over']} of {check['canaries_checked']} canaries, "
        f"{check['releases_over']} of {check['releases_checked']} releases over it; largest "
        f"ratio {check['largest_ratio']:.4g}): a unit on that path was not bounded, so the "
        "certificate does not hold there (look for a clip skipped on one path: a chunk, a "
        "client, a block of examples)",
        category=UserWarning,
    )
