"""``PrivacyBudget``: stop training before the step that would exceed a privacy budget."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from pl_privfed.callbacks._logging import warn_once
from pl_privfed.compat.lightning import callback_state_key
from pl_privfed.privacy import AccountantName, Mechanism, PrivacyAccountant

__all__ = ["PrivacyBudget"]


def _mechanisms(mechanisms: Iterable[Any]) -> list[Mechanism]:
    """``Mechanism`` objects (kept as they are: with their sampling), objects with
    ``noise_multiplier`` and ``sample_rate`` attributes, or ``(noise_multiplier, sample_rate)``
    pairs (Poisson sampling)."""
    out = []
    for m in mechanisms:
        if isinstance(m, Mechanism):
            out.append(m)
        elif isinstance(m, tuple | list):
            out.append(Mechanism(float(m[0]), float(m[1])))
        else:
            out.append(Mechanism(float(m.noise_multiplier), float(m.sample_rate)))
    return out


class PrivacyBudget(pl.Callback):
    """Tracks ε with an Opacus accountant and stops before the step that would exceed ``epsilon``.

    In the spirit of Lightning's ``EarlyStopping``: after every training step it records the
    Gaussian mechanisms the step applied, logs ``privacy/epsilon`` (the package's one ε key; a
    module with its own ``privacy_report()``, such as :class:`~pl_privfed.FederatedModule`,
    logs it already) and ``privacy/budget_remaining``, and if one more identical step would
    take ε above the budget it sets
    ``trainer.should_stop``, so no step ever exceeds the budget; the reason is kept in
    :attr:`stop_reason` (``RunSummary`` writes it to ``summary.json``). Its accountant is saved
    in checkpoints, so a resumed run continues the same accounting.

    **What it assumes.** The callback certifies only what it is told: ε is the accountant's
    bound for Gaussian releases with the given noise multiplier (noise std divided by the
    *sensitivity* of the noised quantity: how far one protected unit can move it) and the given
    sampling. It cannot see the training step. With ``noise_multiplier`` and ``sample_rate``
    given here, each step must be a release whose noise std is ``noise_multiplier`` times its
    sensitivity, on a batch in which every unit took part independently with probability
    ``sample_rate`` (Poisson sampling, add/remove relation): e.g. Opacus's ``PrivacyEngine``
    with its ``DPDataLoader`` and per-example clipping, whose sensitivity is the clipping norm.
    Clipping an averaged minibatch gradient to ``C`` gives sensitivity ``C`` for the mean, not
    ``C/B``; a shuffling ``DataLoader`` is not Poisson sampling. Declaring either anyway makes
    the reported ε a number for another mechanism.

    Where ε comes from, per step:

    * a module with a ``privacy_ledger`` (:class:`~pl_privfed.FederatedModule` of a private
      run): the ledger's ε, the run's one accounting, at this callback's δ (nothing is composed
      twice; the module's checkpoints carry the ledger);
    * a module with a ``privacy_mechanisms()`` method (e.g. :class:`~pl_privfed.FederatedModule`)
      returning :class:`~pl_privfed.privacy.Mechanism` objects (with their sampling: none,
      Poisson or without replacement), objects with ``noise_multiplier`` and ``sample_rate``
      attributes, or ``(noise_multiplier, sample_rate)`` pairs, one per Gaussian mechanism of the
      step; a ``next_privacy_mechanisms()`` method, if present, gives the next step's (they may
      differ from step to step) for the stopping decision;
    * otherwise the ``noise_multiplier`` and ``sample_rate`` given here (one Poisson-subsampled
      Gaussian mechanism per optimizer step, as Opacus's ``PrivacyEngine`` applies);
    * with neither, it warns once (naming ``privacy_mechanisms()`` and the two arguments),
      accounts nothing, enforces no budget and puts no ε into ``summary.json``.

    Per step the callback reads the accountant's cheaper upper bound on ε
    (:meth:`~pl_privfed.privacy.PrivacyAccountant.get_epsilon_upper`: for the PLD accountant its
    ε at a coarse discretization, within about 1 % of the exact one at a tenth of the
    cost), so ``privacy/epsilon`` and ``privacy/budget_remaining`` are on the safe side; the
    stopping decision computes the exact ε whenever the bound would exceed the budget, and
    ``summary.json``'s ``epsilon_spent`` is the exact ε.

    A run that adds no noise (a :class:`~pl_privfed.FederatedModule` without ``noise``, or a
    module whose ``privacy_mechanisms()`` announce none) is not private: no finite ε covers
    its releases. The callback then warns once, logs no ε and ``summary.json`` says
    ``private: false`` (not ε = 0).

    Args:
        epsilon: the budget ε > 0.
        delta: the δ at which ε is computed.
        noise_multiplier: per-step noise multiplier for modules without the protocol.
        sample_rate: per-step sampling rate for modules without the protocol.
        accountant: ``"auto"``, ``"pld"``, ``"rdp"`` or ``"prv"``
            (:class:`~pl_privfed.privacy.PrivacyAccountant`; the run's ledger's when it has one).
        verbose: print a line when the budget stops training.

    Example::

        trainer = pl.Trainer(callbacks=[PrivacyBudget(epsilon=3.0, delta=1e-5,
                                                      noise_multiplier=1.1, sample_rate=0.01)])
    """

    def __init__(
        self,
        epsilon: float,
        delta: float = 1e-5,
        noise_multiplier: float | None = None,
        sample_rate: float | None = None,
        accountant: AccountantName = "auto",
        verbose: bool = True,
    ) -> None:
        if not (isinstance(epsilon, int | float) and epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon must be a positive number, got {epsilon!r}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if (noise_multiplier is None) != (sample_rate is None):
            raise ValueError(
                "give both noise_multiplier and sample_rate, or neither, got "
                f"noise_multiplier={noise_multiplier!r}, sample_rate={sample_rate!r}"
            )
        if noise_multiplier is not None and not noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier!r}")
        if sample_rate is not None and not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.noise_multiplier = noise_multiplier
        self.sample_rate = sample_rate
        self.verbose = verbose
        self.accountant = PrivacyAccountant(accountant)
        self.accountant_used = accountant  # the run's ledger's, when it has one
        self.spent = 0.0  # an upper bound during training (exact in summary_entries)
        self._exact = lambda: 0.0  # the exact ε spent so far
        self.stop_reason: str | None = None
        self.stopped_step: int | None = None
        self.not_private: str | None = None  # why the run is not private, if it is not
        #: a module without privacy_mechanisms() and no noise_multiplier: nothing accounted
        self.unaccounted = False

    @property
    def state_key(self) -> str:
        return callback_state_key(self, epsilon=self.epsilon, delta=self.delta)

    def step_mechanisms(self, pl_module: pl.LightningModule, upcoming: bool = False) -> list:
        """The Gaussian mechanisms (:class:`~pl_privfed.privacy.Mechanism`) of the step just
        taken, or with ``upcoming`` of the next one."""
        protocol = getattr(pl_module, "privacy_mechanisms", None)
        if callable(protocol):
            upcoming_protocol = getattr(pl_module, "next_privacy_mechanisms", None)
            if upcoming and callable(upcoming_protocol):
                return _mechanisms(upcoming_protocol())
            return _mechanisms(protocol())
        if self.noise_multiplier is None:
            self.unaccounted = True
            warn_once(
                self,
                "mechanisms",
                f"{type(pl_module).__name__} has no privacy_mechanisms() method and no "
                "noise_multiplier and sample_rate were given, so it accounts nothing and "
                "enforces NO budget (and summary.json claims no ε); pass "
                "PrivacyBudget(noise_multiplier=..., sample_rate=...)",
            )
            return []
        return [Mechanism(self.noise_multiplier, self.sample_rate)]

    @staticmethod
    def _ledger(pl_module: pl.LightningModule) -> Any:
        """The module's privacy ledger, if it keeps one (then it is the accounting read)."""
        return getattr(pl_module, "privacy_ledger", None)

    def _epsilon_after(self, mechanisms: list, steps: int = 1, upper: bool = False) -> float:
        probe = PrivacyAccountant(self.accountant.mechanism)
        probe.load_state_dict(self.accountant.state_dict())
        for _ in range(steps):
            for mechanism in _mechanisms(mechanisms):
                probe.step_mechanism(mechanism)
        return probe.get_epsilon_upper(self.delta) if upper else probe.get_epsilon(self.delta)

    def _check_next(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        mechanisms = self.step_mechanisms(pl_module, upcoming=True)
        if not mechanisms:
            return
        ledger = self._ledger(pl_module)

        def upcoming(upper: bool) -> float:
            if ledger is not None:
                return ledger.epsilon_after(_mechanisms(mechanisms), self.delta, upper=upper)
            return self._epsilon_after(mechanisms, upper=upper)

        # the cheap upper bound first; the exact ε only where the bound would stop the run
        if upcoming(True) > self.epsilon and (after := upcoming(False)) > self.epsilon:
            step = trainer.global_step
            self.stopped_step = step
            self.spent = self._exact()
            self.stop_reason = (
                f"privacy budget: step {step + 1} would spend epsilon={after:.4f} > "
                f"{self.epsilon} (delta={self.delta:g}); stopped after {step} steps at "
                f"epsilon={self.spent:.4f}"
            )
            trainer.should_stop = True
            if self.verbose:
                rank_zero_info(f"[PrivacyBudget] {self.stop_reason}")

    def _noiseless(self, pl_module: pl.LightningModule) -> bool:
        """Whether the module adds no noise: a federation without a ledger, or a module whose
        protocol announces no Gaussian mechanism for the next step."""
        if self._ledger(pl_module) is not None:
            return False
        if hasattr(pl_module, "privacy_ledger"):  # a federation trained without noise
            return True
        protocol = getattr(pl_module, "privacy_mechanisms", None)
        return callable(protocol) and not self.step_mechanisms(pl_module, upcoming=True)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._noiseless(pl_module):
            self.not_private = (
                f"{type(pl_module).__name__} adds no noise: the run is not private (no finite "
                "epsilon covers its releases), so PrivacyBudget has nothing to account"
            )
            rank_zero_warn(f"PrivacyBudget: {self.not_private}", category=UserWarning)
            return
        self._check_next(trainer, pl_module)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.not_private is not None:
            return
        ledger = self._ledger(pl_module)
        if ledger is not None:  # the module has accounted the round already
            self.spent = ledger.epsilon(self.delta, upper=True)
            self.accountant_used = ledger.noise.accountant
            self._exact = lambda: ledger.epsilon(self.delta)
        else:
            mechanisms = self.step_mechanisms(pl_module)
            if self.unaccounted:  # nothing to account (warned once)
                return
            for mechanism in mechanisms:
                self.accountant.step_mechanism(mechanism)
            self.spent = self.accountant.get_epsilon_upper(self.delta)
            self._exact = lambda: self.accountant.get_epsilon(self.delta)
        if not callable(getattr(pl_module, "privacy_report", None)):
            pl_module.log("privacy/epsilon", self.spent)  # else the module logs its own ε
        pl_module.log("privacy/budget_remaining", self.epsilon - self.spent)
        self._check_next(trainer, pl_module)

    def summary_entries(self) -> dict[str, Any]:
        """ε spent against the budget, for ``summary.json`` (``private: false`` and no ε for a
        run without noise; nothing when it accounted nothing: no ε is claimed)."""
        if self.unaccounted:
            return {}
        if self.not_private is not None:
            return {
                "privacy_budget": {
                    "private": False,
                    "epsilon_spent": None,
                    "epsilon_budget": self.epsilon,
                    "delta": self.delta,
                    "note": self.not_private,
                }
            }
        self.spent = self._exact()
        return {
            "privacy_budget": {
                "private": True,
                "epsilon_spent": self.spent,
                "epsilon_budget": self.epsilon,
                "delta": self.delta,
                "accountant": self.accountant_used,
                "stopped_step": self.stopped_step,
            }
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.accountant.state_dict(),
            "spent": self.spent,
            "stop_reason": self.stop_reason,
            "stopped_step": self.stopped_step,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state_dict["accountant"])
        self.spent = spent = state_dict["spent"]
        if self.accountant.steps:  # this callback's own accounting (else the ledger's, next step)
            self._exact = lambda: self.accountant.get_epsilon(self.delta)
        else:
            self._exact = lambda: spent
        self.stop_reason = state_dict["stop_reason"]
        self.stopped_step = state_dict["stopped_step"]
