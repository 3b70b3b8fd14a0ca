"""The noise test of :class:`~pl_privfed.callbacks.PrivacyAudit`: the realized noise of every
client-level release, or of every record-level client's draw per local step, against the
mechanism the ledger certified (:mod:`pl_privfed.privacy.audit_noise`), its report entry and its
warning."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pytorch_lightning.utilities import rank_zero_warn

from pl_privfed.privacy.audit_noise import (
    RECORD_COORDINATES,
    RECORD_RELEASES,
    RealizedNoise,
    RecordNoise,
    client_order,
    declared_sum_std,
    noise_coordinates,
    noise_tests,
    whiten,
)
from pl_privfed.privacy.correlated import CorrelatedNoise

__all__ = ["NOISE_COORDINATES", "NoiseAudit"]

#: the coordinates of each release kept for the test (all of a smaller model's: the shipped
#: configs' 7,850 and 11,322; a random subset of 2,048 missed coordinates drawn in pairs on
#: MNIST, whose pairs it rarely kept whole)
NOISE_COORDINATES = 16384

DECLARED = {
    "central": "the aggregator's draw N(0, σ² I)",
    "distributed": "the sum of the n senders' shares N(0, (n/t) σ² I)",
    "local": "the sum of the n senders' own draws N(0, n σ² I)",
    "correlated": "the aggregator's (C^-1 Z)_t, whitened: the rows of C X are N(0, σ² I)",
    "record": "each client's own draw N(0, σ² I) per local step, added to its clipped gradient",
}


class NoiseAudit:
    """The monitor on ``algorithm`` (:attr:`~pl_privfed.algorithms.FederatedAlgorithm.
    noise_monitor`) and the test of what it kept. Built for a client-level private run whose
    ledger declares a placement the test knows (every release's noise,
    :class:`~pl_privfed.privacy.audit_noise.RealizedNoise`); for a record-level private run
    :meth:`create` makes a :class:`RecordNoiseAudit` (each client's own draw per local step);
    otherwise it says why not (:attr:`skipped`)."""

    def __init__(self, algorithm: Any, ledger: Any, seed: int, dim: int) -> None:
        self.algorithm, self.ledger = algorithm, ledger
        self.placement = ledger.noise.where
        self.sigma = float(ledger.noise_std)
        self.monitor: Any = self._monitor(seed, dim)
        #: why :meth:`report` tested nothing
        self.reason = "no noised release"

    def _monitor(self, seed: int, dim: int) -> Any:
        """Every release's realized noise on a keyed subset of coordinates."""
        return RealizedNoise(noise_coordinates(dim, NOISE_COORDINATES, seed), self._declared)

    @classmethod
    def create(cls, algorithm: Any, ledger: Any, level: str, seed: int, dim: int) -> Any:
        """A :class:`NoiseAudit`, or the reason (a string) there is none."""
        if ledger is None or getattr(algorithm, "noise", None) is None:
            return "not a private run"
        if level == "record":
            if algorithm.adaptive_clipping() is not None:
                return "record-level noise under an adaptive clip: no declared law known"
            return RecordNoiseAudit(algorithm, ledger, seed, dim)
        if declared_sum_std(ledger.noise.where, 1.0, 1) is None:
            return f"placement {ledger.noise.where!r}: no declared law known to the test"
        return cls(algorithm, ledger, seed, dim)

    @classmethod
    def start(cls, algorithm: Any, ledger: Any, level: str, seed: int, dim: int, state: Any) -> Any:
        """:meth:`create`, attached to ``algorithm`` with a checkpoint's ``state`` loaded."""
        made = cls.create(algorithm, ledger, level, seed, dim)
        if isinstance(made, NoiseAudit):
            if state is not None:
                made.load_state_dict(state)
            made.attach()
        return made

    def _declared(self, senders: int) -> float | None:
        """The declared std of a released sum of ``senders`` senders: the ledger's ``σ`` (times
        an adaptive clip's noise split and ``C_t/C_0``, the ``σ`` the update's release is
        charged with), through the configured placement (:func:`declared_sum_std`)."""
        sigma = self.sigma
        clip = self.algorithm.adaptive_clipping()
        if clip is not None:
            sigma *= clip.noise_factor(self.ledger.noise_std)
        return declared_sum_std(self.placement, sigma, senders)

    def attach(self) -> None:
        self.algorithm.noise_monitor = self.monitor

    def detach(self) -> None:
        if self.algorithm.noise_monitor is self.monitor:
            self.algorithm.noise_monitor = None

    def _sums(self) -> dict[str, Any]:
        """The client-level test: every released sum's rounds, whitened by its declared std."""
        rows = {k: v for k, v in self.monitor.rows.items() if v}
        correlated = isinstance(self.placement, CorrelatedNoise)
        sums: dict[str, Any] = {}
        for key, kept in rows.items():
            rounds = [r for r, _, _ in kept]
            noise = torch.stack([x for _, x, _ in kept]).numpy()
            stds = np.array([s for _, _, s in kept])
            c_matrix = None
            if correlated:
                horizon = self.algorithm.noise.rounds
                c_matrix = self.placement.strategy().matrix(len(rounds), horizon).numpy()
            try:
                w = whiten(rounds, noise, stds, c_matrix)
            except ValueError as err:
                sums[key] = {"skipped": str(err)}
                continue
            sums[key] = noise_tests(w).as_dict()
        return sums

    def report(self, alpha: float) -> dict[str, Any] | None:
        """The test at level ``alpha`` (the run's alarm's share), or ``None`` when no release
        was kept."""
        sums = self._sums()
        if not sums:
            return None
        tested = [s for s in sums.values() if "p_value" in s]
        if not tested:
            self.reason = "; ".join(f"{k}: {v['skipped']}" for k, v in sums.items())
            return None
        p = min(1.0, len(tested) * min(s["p_value"] for s in tested))
        head = sums.get("sent", tested[0])
        return {
            "statistic": self._statistic(head["coordinates"]),
            "declared": DECLARED[self._kind()],
            "sigma": self.sigma,
            "min_contributors": self._min_contributors(),
            "releases": head["releases"],
            "coordinates": head["coordinates"],
            "variance_ratio": head["tests"]["variance"]["statistic"],
            "max_release_correlation": head["tests"]["independence_across_releases"]["statistic"],
            "sums": sums,
            "p_value": p,
            "alarm_level": alpha,
            "flagged": bool(p < alpha),
            "unknown_releases": self.monitor.unknown,
        }

    def _statistic(self, coordinates: int) -> str:
        return (
            "the realized noise of each release (released − clean sum) on "
            f"{coordinates} coordinates, whitened by the declared std"
        )

    def _kind(self) -> str:
        return "correlated" if isinstance(self.placement, CorrelatedNoise) else self.placement.name

    def _min_contributors(self) -> int | None:
        return self.placement.min_contributors

    @staticmethod
    def warn(test: dict[str, Any]) -> None:
        """The run's warning for a flagged noise test."""
        failed = [
            name
            for s in test["sums"].values()
            for name, t in s.get("tests", {}).items()
            if t["p_value"] * len(s["tests"]) < test["alarm_level"]
        ]
        rank_zero_warn(
            f"PRIVACY AUDIT: the realized noise does not match the declared mechanism "
            f"({test['declared']}, σ = {test['sigma']:.4g}): p = {test['p_value']:.3g} below "
            f"{test['alarm_level']:.3g} ({', '.join(sorted(set(failed)))}; realized/declared "
            f"variance {test['variance_ratio']:.4g}, largest correlation between two releases "
            f"{test['max_release_correlation']:.3g}): either the certificate does not describe "
            "the noise that ran (look for a draw reused across rounds, correlated draws, shares "
            "or a draw scaled for the average) or this is a false alarm, which a correct "
            f"mechanism raises with probability at most {test['alarm_level']:.3g} (the test "
            "reads the run's own noise: the same noise seed reads the same)",
            category=UserWarning,
        )

    def state_dict(self) -> dict[str, Any]:
        return self.monitor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.monitor.load_state_dict(state)


class RecordNoiseAudit(NoiseAudit):
    """The noise test of a record-level private run: each client's own draw per local step
    (:class:`~pl_privfed.privacy.audit_noise.RecordNoise`, at most ``RECORD_RELEASES`` draws of
    ``RECORD_COORDINATES`` coordinates), whitened by the ledger's σ."""

    def _monitor(self, seed: int, dim: int) -> Any:
        """The kept draws; the declared std of one draw is the ledger's σ, nothing else."""
        index = noise_coordinates(dim, RECORD_COORDINATES, seed)
        order = client_order(int(self.algorithm.num_clients), seed)
        return RecordNoise(index, self.sigma, order, RECORD_RELEASES)

    def _sums(self) -> dict[str, Any]:
        """The record-level test: every kept draw one release, whitened by the ledger's σ."""
        keys, noise = self.monitor.kept()
        if not len(keys):
            return {}
        w = whiten(list(range(len(keys))), noise, np.full(len(keys), self.monitor.std))
        test = noise_tests(w).as_dict()
        test["clients"] = len(set(keys[:, 1].tolist()))
        test["rounds"] = len(set(keys[:, 0].tolist()))
        return {"client_draws": test}

    def _statistic(self, coordinates: int) -> str:
        return (
            "the realized noise of each client's draw per local step (noised − clean "
            f"gradient) on {coordinates} coordinates, whitened by the ledger's σ; "
            f"the draws kept: at most {self.monitor.releases}, every round and step of the "
            "clients in a keyed order"
        )

    def _kind(self) -> str:
        return "record"

    def _min_contributors(self) -> int | None:
        return None
