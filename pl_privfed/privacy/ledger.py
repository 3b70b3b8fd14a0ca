"""``PrivacyLedger``: one run's privacy accounting, in one object.

The ledger holds what a private run needs beside its training: the algorithm's declaration
(:class:`~pl_privfed.privacy.Release`), the noise settings and the calibrated noise std, the
accountants of the defensible ε and of the papers' convention, the record of what the noise was
calibrated for (kept in checkpoints and compared on resume), and the report that goes into
``summary.json``. :class:`~pl_privfed.FederatedModule` owns one per private run and calls
:meth:`PrivacyLedger.account` after every round; callbacks read it
(:class:`~pl_privfed.callbacks.PrivacyBudget` reads its ε instead of composing a history of its
own).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from pl_privfed.privacy import plan
from pl_privfed.privacy.accounting import PrivacyAccountant
from pl_privfed.privacy.levels import level_of
from pl_privfed.privacy.mechanism import Mechanism
from pl_privfed.privacy.noise import DPNoise
from pl_privfed.privacy.release import Release

__all__ = ["PrivacyLedger"]

#: checkpoint keys (named before the ledger existed); ``accountant`` is the headline
#: adversary's, ``adversaries`` every adversary's; a checkpoint lacking one is an older version's
#: (:meth:`PrivacyLedger.missing`), refused
_KEYS = {
    "accountant": "privacy_accountant",
    "adversaries": "privacy_accountants",
    "aborted": "privacy_rounds_aborted",
    "paper": "privacy_accountant_paper",
    "calibration": "privacy_calibration",
    "rounds": "privacy_rounds_accounted",
}


class PrivacyLedger:
    """The accounting of one private run (module docstring).

    Args:
        release: what the algorithm releases each round.
        noise: the run's noise settings.
        noise_stds: the calibrated noise std of every configuration the run trains (one for a
            single run; a grid's configurations share their mechanisms, not always their σ).
        rounds: ``K`` the noise was calibrated for.
        warn: how a warning reaches the user (default :func:`warnings.warn`; Lightning's
            ``rank_zero_warn`` under several processes).
    """

    def __init__(
        self,
        release: Release,
        noise: DPNoise,
        noise_stds: Sequence[float],
        rounds: int,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.warn = warn if warn is not None else _warn
        self.release = release
        self.noise = noise
        self.noise_stds = [float(s) for s in noise_stds]
        self.rounds = int(rounds)
        self.adversaries = plan.adversaries(release, noise)
        self.accountants = {a: PrivacyAccountant(noise.accountant) for a in self.adversaries}
        self.paper_accountant = PrivacyAccountant(noise.accountant)
        self.rounds_accounted = 0
        self.rounds_aborted = 0
        self.calibration = self.calibration_record()
        self.not_charged = plan.not_charged(release, noise, self.rounds)
        if self.not_charged:
            self.warn(f"NOT CHARGED: {self.not_charged}")

    @property
    def headline(self) -> str:
        """The adversary of the reported ε (:func:`~pl_privfed.privacy.plan.adversaries`)."""
        return self.adversaries[0]

    @property
    def accountant(self) -> PrivacyAccountant:
        """The headline adversary's accountant."""
        return self.accountants[self.headline]

    @property
    def noise_std(self) -> float:
        return self.noise_stds[0]

    # ------------------------------------------------------------------ releases
    def mechanisms(self, round_index: int, adversary: str | None = None) -> list[Mechanism]:
        """The Gaussian releases of round ``round_index`` against ``adversary`` (default the
        headline; defensible accounting)."""
        return plan.round_mechanisms(
            self.release, self.noise, self.noise_std, round_index, adversary or self.headline
        )

    def paper_mechanisms(self, round_index: int = 0) -> list[Mechanism]:
        """The releases of round ``round_index`` under the papers' convention."""
        return plan.paper_mechanisms(self.release, self.noise_std, self.noise, round_index)

    def last_mechanisms(self) -> list[Mechanism]:
        """The releases of the round last accounted."""
        return self.mechanisms(max(0, self.rounds_accounted - 1))

    def next_mechanisms(self) -> list[Mechanism]:
        """The releases the next round will make (they differ from round to round when a
        record's uses are counted)."""
        return self.mechanisms(self.rounds_accounted)

    def account(self, round_index: int, released: bool = True) -> None:
        """Record round ``round_index``'s releases with every accountant; a round that
        released nothing (distributed noise with too few senders: aborted) is counted but
        composes nothing."""
        if released:
            for adversary, accountant in self.accountants.items():
                for mech in self.mechanisms(round_index, adversary):
                    accountant.step_mechanism(mech)
            for mech in self.paper_mechanisms(round_index):
                self.paper_accountant.step_mechanism(mech)
        else:
            self.rounds_aborted += 1
        self.rounds_accounted += 1

    # ------------------------------------------------------------------ ε
    def epsilon(
        self, delta: float | None = None, adversary: str | None = None, upper: bool = False
    ) -> float:
        """The defensible ε spent so far against ``adversary`` (default the headline), at
        ``delta`` (default the run's δ); with ``upper`` a cheaper upper bound on it
        (:meth:`~pl_privfed.privacy.PrivacyAccountant.get_epsilon_upper`: the PLD at a coarse
        discretization, what a round's log shows; the final round logs the exact ε)."""
        accountant = self.accountants[adversary or self.headline]
        delta = self.noise.delta if delta is None else delta
        return accountant.get_epsilon_upper(delta) if upper else accountant.get_epsilon(delta)

    def epsilon_paper(self, delta: float | None = None, upper: bool = False) -> float:
        """ε under the papers' convention, at ``delta`` (default the run's δ); ``upper`` as
        in :meth:`epsilon`."""
        delta = self.noise.delta if delta is None else delta
        acc = self.paper_accountant
        return acc.get_epsilon_upper(delta) if upper else acc.get_epsilon(delta)

    def epsilon_after(
        self, mechanisms: list[Mechanism], delta: float | None = None, upper: bool = False
    ) -> float:
        """The defensible ε if ``mechanisms`` were released next (the history is unchanged);
        ``upper`` as in :meth:`epsilon`."""
        probe = PrivacyAccountant(self.accountant.mechanism)
        probe.load_state_dict(self.accountant.state_dict())
        for mechanism in mechanisms:
            probe.step_mechanism(mechanism)
        delta = self.noise.delta if delta is None else delta
        return probe.get_epsilon_upper(delta) if upper else probe.get_epsilon(delta)

    # ------------------------------------------------------------------ reports
    def calibration_record(self) -> dict[str, Any]:
        """What the noise std ``σ`` was set for (kept in checkpoints; :meth:`restore`)."""
        noise, release = self.noise, self.release
        rel = plan.relation(release, noise)
        return {
            "noise_std": self.noise_std,
            "grid_noise_std": self.noise_stds[1:],
            "calibration": noise.calibration if noise.epsilon is not None else "noise_multiplier",
            "target_epsilon": noise.epsilon,
            "noise_multiplier": noise.noise_multiplier,
            "delta": noise.delta,
            "constant": noise.constant,
            "rounds": self.rounds,
            "neighbouring_relation": rel,
            "sensitivity": plan.sensitivity(release, rel),
            "message_bound": release.bound,
            "sample_rate": level_of(release).paper_rate,
            "accountant": noise.accountant,
            **noise.where.record(),
            **(
                {
                    "search_mean": noise.search_mean,
                    "search_distribution": noise.search_distribution,
                }
                if noise.calibration == "random_search"
                else {}
            ),
        }

    def report(self) -> dict[str, Any]:
        """What the run spent, per adversary and under the papers' convention (docs/privacy.md).

        ``epsilon`` is the defensible value against the headline adversary (``adversary``),
        by the run's accountant (``accounting.accountant`` names it), and ``epsilon_rdp`` the RDP
        bound on the same releases (equal to ``epsilon`` where RDP is the accountant):
        the algorithm's privacy unit, the neighbouring relation of that adversary,
        amplification only by sampling hidden from it and only as what it is.
        ``adversaries`` holds one entry per party that could see something (its ε, what it
        sees, relation, sensitivity, amplification, accountant, noise multiplier, sample rate,
        releases, and ``history``: every distinct release composed and its count, what a
        report composes again to charge a selection among runs); ``trusted`` what the run trusts. ``epsilon_paper_convention`` is the
        papers' (add/remove, Poisson amplification at the nominal rate). ``accounting`` and
        ``paper_convention`` state what each assumes; ``calibration`` what σ was set for.
        ``not_charged`` names what the run reveals that no ε counts (``None`` normally; the
        abort pattern of distributed noise run with ``allow_aborts``).
        """
        noise, release = self.noise, self.release
        rel = plan.relation(release, noise)
        paper = self.paper_mechanisms()
        entries = {a: self.adversary_report(a) for a in self.adversaries}
        head = entries[self.headline]
        calibration = dict(self.calibration)
        return {
            "epsilon": head["epsilon"],
            "epsilon_rdp": head["epsilon_rdp"],
            "adversary": self.headline,
            "adversary_sees": head["sees"],
            "epsilon_paper_convention": self.epsilon_paper(),
            "delta": noise.delta,
            "privacy_unit": plan.unit(release, noise),
            **noise.where.record(),
            "trusted": plan.trusted(release, noise),
            "neighbouring_relation": rel,
            "sensitivity": plan.sensitivity(release, rel),
            "message_bound": release.bound,
            "adversaries": entries,
            "accounting": {
                key: head[key]
                for key in (
                    "neighbouring_relation",
                    "sensitivity",
                    "amplification",
                    "approximation",
                    "composition",
                    "accountant",
                    "noise_multiplier",
                    "sample_rate",
                    "sampling",
                    "releases",
                    "history",
                )
            },
            "paper_convention": {
                **plan.paper_accounting_basis(release, noise).as_dict(),
                "accountant": self.paper_accountant.library,
                "noise_multiplier": paper[0].noise_multiplier if paper else None,
                "sample_rate": paper[0].sample_rate if paper else None,
                "releases": self.paper_accountant.steps,
            },
            "accountant": noise.accountant,
            "target_epsilon": noise.epsilon,
            "calibration": calibration.pop("calibration"),
            "calibration_rounds": calibration["rounds"],
            "calibrated_for": calibration,
            "noise_std": self.noise_std,
            "noise_multiplier": head["noise_multiplier"],
            "sample_rate": head["sample_rate"],
            "rounds_accounted": self.rounds_accounted,
            "rounds_aborted": self.rounds_aborted,
            "not_charged": self.not_charged,
        }

    def adversary_report(self, adversary: str) -> dict[str, Any]:
        """The guarantee against one adversary (an entry of :meth:`report`)."""
        noise, release = self.noise, self.release
        mechs = self.mechanisms(0, adversary)  # round 0 always releases
        accountant = self.accountants[adversary]
        return {
            "epsilon": self.epsilon(adversary=adversary),
            "epsilon_rdp": accountant.get_epsilon_rdp(noise.delta),
            "sees": plan.describe(release, noise, adversary),
            **plan.accounting_basis(release, noise, adversary).as_dict(),
            "accountant": accountant.library,
            "noise_multiplier": mechs[0].noise_multiplier if mechs else None,
            "sample_rate": mechs[0].sample_rate if mechs else None,
            "sampling": mechs[0].sampling if mechs else None,
            "releases": accountant.steps,
            "history": accountant.history(),
        }

    # ------------------------------------------------------------------ checkpoints
    @staticmethod
    def entries(checkpoint: dict[str, Any]) -> dict[str, Any]:
        """The ledger's part of ``checkpoint`` (what :meth:`load` reads), for a module that
        sets its ledger up after loading (``load_from_checkpoint``, then evaluation)."""
        if _KEYS["accountant"] not in checkpoint:
            return {}
        return {k: checkpoint[k] for k in [*_KEYS.values(), "global_step"] if k in checkpoint}

    @staticmethod
    def calibrated_rounds(checkpoint: dict[str, Any]) -> int | None:
        """The rounds ``K`` the checkpoint's noise was calibrated for, or ``None``."""
        return (checkpoint.get(_KEYS["calibration"]) or {}).get("rounds")

    @staticmethod
    def in_checkpoint(checkpoint: dict[str, Any]) -> bool:
        """Whether ``checkpoint`` was written by a run with a ledger (a private run)."""
        return _KEYS["accountant"] in checkpoint

    def save(self, checkpoint: dict[str, Any]) -> None:
        """Put the ledger into a Lightning checkpoint."""
        checkpoint[_KEYS["accountant"]] = self.accountant.state_dict()
        checkpoint[_KEYS["adversaries"]] = {
            a: acc.state_dict() for a, acc in self.accountants.items()
        }
        checkpoint[_KEYS["aborted"]] = self.rounds_aborted
        checkpoint[_KEYS["paper"]] = self.paper_accountant.state_dict()
        checkpoint[_KEYS["calibration"]] = self.calibration
        checkpoint[_KEYS["rounds"]] = self.rounds_accounted

    def load(self, checkpoint: dict[str, Any]) -> list[float] | None:
        """Restore the ledger from a checkpoint (a no-op for a checkpoint without one).

        Returns the noise stds the run must continue with (:meth:`restore`), or ``None`` when
        they are this configuration's.
        """
        if _KEYS["accountant"] not in checkpoint:
            return None
        missing = self.missing(checkpoint)
        if missing:
            raise ValueError(
                f"the checkpoint was written by an older pl-privfed that kept no "
                f"{', '.join(missing)} in its privacy ledger: this version cannot continue its "
                "accounting; start the private run again"
            )
        stds = self.restore(checkpoint[_KEYS["calibration"]])
        self.paper_accountant.load_state_dict(checkpoint[_KEYS["paper"]])
        self.rounds_accounted = int(checkpoint[_KEYS["rounds"]])
        self.rounds_aborted = int(checkpoint[_KEYS["aborted"]])
        saved = checkpoint[_KEYS["adversaries"]]
        for adversary, accountant in self.accountants.items():
            if adversary in saved:
                accountant.load_state_dict(saved[adversary])
            else:  # replay this adversary's releases (no round was aborted then)
                for k in range(self.rounds_accounted):
                    for mech in self.mechanisms(k, adversary):
                        accountant.step_mechanism(mech)
        return stds

    @staticmethod
    def missing(checkpoint: dict[str, Any]) -> list[str]:
        """The parts of the ledger that ``checkpoint``, written by a private run, lacks (an
        older version's checkpoint: refused); empty for a current one and for a checkpoint
        without a ledger."""
        if _KEYS["accountant"] not in checkpoint:
            return []
        return [key for key in _KEYS.values() if key not in checkpoint]

    def restore(self, saved: dict[str, Any]) -> list[float] | None:
        """Keep the noise the run started with (never recalibrate silently on resume).

        The ledger was calibrated for *this* configuration; ``saved`` says what the run used.
        If only the number of rounds differs (e.g. a larger ``trainer.max_steps``), the saved σ
        is kept (returned, to be set on the algorithms), the accountant goes on composing the
        rounds actually run, and a warning says so (the report's ``calibrated_for`` keeps the
        original K). Any other change that would change σ (ε, δ, the calibration rule, the
        relation, ...) is refused before training: one run cannot honestly report one noise
        level for two.
        """
        current = self.calibration_record()
        if math.isclose(saved["noise_std"], current["noise_std"], rel_tol=1e-9):
            self.calibration = dict(saved)
            return None
        differs = {
            k: (saved.get(k), v)
            for k, v in current.items()
            if k not in ("noise_std", "grid_noise_std", "rounds", "resumed") and saved.get(k) != v
        }
        if differs:
            changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in differs.items())
            raise ValueError(
                f"the checkpoint's noise std {saved['noise_std']:.6g} was calibrated for "
                f"{saved['rounds']} rounds with other privacy settings than this run's "
                f"({changes}), which give {current['noise_std']:.6g}: resume with the "
                "checkpoint's noise settings, or start a new run for the new ones"
            )
        if self.noise.where.round_dependent:
            raise ValueError(
                f"the checkpoint's correlated noise ({self.noise.where.name}) was built for "
                f"{saved['rounds']} rounds and this run asks for {current['rounds']}: its "
                "factorization C and noise cannot change mid-run; resume with noise.rounds: "
                f"{saved['rounds']}"
            )
        if saved["rounds"] == current["rounds"]:  # same settings, another σ: an older solver
            raise ValueError(
                f"the checkpoint's noise std {saved['noise_std']:.6g} was calibrated by an older "
                f"pl-privfed's accountant ({saved['accountant']!r}), which for the same settings "
                f"now gives {current['noise_std']:.6g}: this version cannot continue its "
                "accounting; start the private run again"
            )
        self.warn(self._rounds_changed(saved, current))
        stds = [float(saved["noise_std"]), *(float(s) for s in saved.get("grid_noise_std", []))]
        stds += self.noise_stds[len(stds) :]
        self.noise_stds = stds
        resumed = {"rounds": current["rounds"], "noise_std_not_used": current["noise_std"]}
        self.calibration = {**saved, "resumed": resumed}  # summary.json shows both
        return stds

    @staticmethod
    def _rounds_changed(saved: dict[str, Any], current: dict[str, Any]) -> str:
        return (
            f"resuming a run whose noise was calibrated for {saved['rounds']} rounds "
            f"(noise std {saved['noise_std']:.6g}) with {current['rounds']} rounds: keeping "
            f"noise std {saved['noise_std']:.6g} (not {current['noise_std']:.6g}); epsilon "
            f"accounts the rounds actually run and will exceed what the calibration targeted "
            f"after round {saved['rounds']}. To calibrate for {current['rounds']} rounds, start a "
            f"new run (or set noise.rounds: {current['rounds']} from the start)"
        )


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)
