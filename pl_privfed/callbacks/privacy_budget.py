"""``PrivacyBudget``: stop training before the step that would exceed a privacy budget."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_info
from typing_extensions import override

from pl_privfed.privacy import AccountantName, PrivacyAccountant

__all__ = ["PrivacyBudget"]


def _pairs(mechanisms: Iterable[Any]) -> list[tuple[float, float]]:
    out = []
    for m in mechanisms:
        if isinstance(m, tuple | list):
            out.append((float(m[0]), float(m[1])))
        else:
            out.append((float(m.noise_multiplier), float(m.sample_rate)))
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

    Where the mechanisms come from, per step:

    * a module with a ``privacy_mechanisms()`` method (e.g. :class:`~pl_privfed.FederatedModule`)
      returning objects with ``noise_multiplier`` and ``sample_rate`` attributes, or
      ``(noise_multiplier, sample_rate)`` pairs, one per Gaussian mechanism of the step;
    * otherwise the ``noise_multiplier`` and ``sample_rate`` given here (e.g. those of an Opacus
      ``PrivacyEngine``: one mechanism per optimizer step).

    Args:
        epsilon: the budget ε > 0.
        delta: the δ at which ε is computed.
        noise_multiplier: per-step noise multiplier for modules without the protocol.
        sample_rate: per-step sampling rate for modules without the protocol.
        accountant: ``"rdp"`` or ``"prv"``.
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
        accountant: AccountantName = "rdp",
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
        self.spent = 0.0
        self.stop_reason: str | None = None
        self.stopped_step: int | None = None

    @property
    def state_key(self) -> str:
        return self._generate_state_key(epsilon=self.epsilon, delta=self.delta)

    def step_mechanisms(self, pl_module: pl.LightningModule) -> list[tuple[float, float]]:
        """The ``(noise_multiplier, sample_rate)`` pairs of one training step."""
        protocol = getattr(pl_module, "privacy_mechanisms", None)
        if callable(protocol):
            return _pairs(protocol())
        if self.noise_multiplier is None:
            raise ValueError(
                f"PrivacyBudget: {type(pl_module).__name__} has no privacy_mechanisms() method; "
                "pass noise_multiplier and sample_rate to PrivacyBudget"
            )
        return [(self.noise_multiplier, self.sample_rate)]

    def _epsilon_after(self, mechanisms: list[tuple[float, float]], steps: int = 1) -> float:
        probe = PrivacyAccountant(self.accountant.mechanism)
        probe.load_state_dict(self.accountant.state_dict())
        for _ in range(steps):
            for nm, q in mechanisms:
                probe.step(noise_multiplier=nm, sample_rate=q)
        return probe.get_epsilon(self.delta)

    def _check_next(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        mechanisms = self.step_mechanisms(pl_module)
        if not mechanisms:
            return
        upcoming = self._epsilon_after(mechanisms)
        if upcoming > self.epsilon:
            step = trainer.global_step
            self.stopped_step = step
            self.stop_reason = (
                f"privacy budget: step {step + 1} would spend epsilon={upcoming:.4f} > "
                f"{self.epsilon} (delta={self.delta:g}); stopped after {step} steps at "
                f"epsilon={self.spent:.4f}"
            )
            trainer.should_stop = True
            if self.verbose:
                rank_zero_info(f"[PrivacyBudget] {self.stop_reason}")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_next(trainer, pl_module)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        for nm, q in self.step_mechanisms(pl_module):
            self.accountant.step(noise_multiplier=nm, sample_rate=q)
        self.spent = self.accountant.get_epsilon(self.delta)
        if not callable(getattr(pl_module, "privacy_report", None)):
            pl_module.log("privacy/epsilon", self.spent)  # else the module logs its own ε
        pl_module.log("privacy/budget_remaining", self.epsilon - self.spent)
        self._check_next(trainer, pl_module)

    def summary_entries(self) -> dict[str, Any]:
        """ε spent against the budget, for ``summary.json``."""
        return {
            "privacy_budget": {
                "epsilon_spent": self.spent,
                "epsilon_budget": self.epsilon,
                "delta": self.delta,
                "accountant": self.accountant.mechanism,
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
        self.spent = state_dict["spent"]
        self.stop_reason = state_dict["stop_reason"]
        self.stopped_step = state_dict["stopped_step"]
