"""``PrivacyAudit``: an empirical privacy audit beside the certified ε, from the run itself."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_only, rank_zero_warn
from torch import Tensor
from typing_extensions import override

from pl_privfed.callbacks._audit_alarm import (
    THREAT_MODELS,
    bound_check,
    fit_low,
    warn_bound,
    warn_exceeds,
    white_box,
)
from pl_privfed.callbacks._audit_alarm import bound as lower_bound
from pl_privfed.callbacks._audit_noise import NoiseAudit
from pl_privfed.callbacks._logging import warn_once
from pl_privfed.checks import check_choice
from pl_privfed.privacy import level_of
from pl_privfed.privacy.audit import (
    ClientCanaries,
    canary_directions,
    canary_membership,
    gaussian_estimate,
    one_run_audit,
)
from pl_privfed.privacy.audit_records import RecordCanaries, record_hosts

__all__ = ["AuditLevel", "PrivacyAudit"]

AuditLevel = Literal["auto", "client", "record"]

ROUND_STATISTICS = {
    "sum": "Σ_k cos(x^{k+1} − x^k, u_j)/√K",
    "max": "max_k cos(x^{k+1} − x^k, u_j)",
}
METHODS = {
    "client": (
        "one-shot empirical privacy estimation (Andrew, Kairouz, Oh, Oprea, McMahan & "
        "Suriyakumar, ICLR 2024): canary clients, Gaussian fit of the cosines, ε of μ-GDP"
    ),
    "record": (
        "privacy auditing with one training run (Steinke, Nasr & Jagielski, NeurIPS 2023): "
        "canary records inserted with probability 1/2, ε lower bound from the correct guesses"
    ),
}


class PrivacyAudit(pl.Callback):
    """Plants canaries at fit start, and at fit end reports an empirical ε beside the certified one.

    On a :class:`~pl_privfed.FederatedModule` run (private or not): ``--trainer.callbacks+=
    pl_privfed.callbacks.PrivacyAudit`` on the command line. What it plants depends on the
    privacy unit (``level``, by default the algorithm's declaration,
    :meth:`~pl_privfed.algorithms.FederatedAlgorithm.release`):

    * **client-level DP** (every noise placement: local, central, distributed; full
      participation, Poisson or fixed-size cohorts): ``canaries`` canary clients, half of them
      inserted, as clients of the round (:class:`~pl_privfed.privacy.audit.ClientCanaries`:
      placed among the real ones, through the same chunks, operator call and noise draw, with
      the cohort's rate; their gradient a fixed direction). After
      training, the cosine between the model's change and each canary's direction, for the
      final model and summed over every round's change, gives Andrew et al.'s ε **estimate**
      (Gaussian fit, μ-GDP at δ);
    * **record-level DP** (FedAvg with per-sample clipping, PORTER-DP, SoteriaFL, the demo):
      ``canaries`` canary records, each inserted with probability 1/2 into one client's data
      (hosts keyed over every client), whose gradient is a fixed direction
      (:class:`~pl_privfed.privacy.audit_records.RecordCanaries`: examples of the real
      per-example path, at keyed places among their host's examples, through the same
      operator calls and noise draw as every other record). The scores give Steinke et al.'s ε **lower bound** at ``confidence`` (and a
      Gaussian-fit estimate beside it).

    Beside either method, the **white-box** threat model (``threat_models["white_box"]``; Nasr
    et al. 2021, 2023): the auditor knows every contribution to each release except whether each
    canary took part, subtracts them, and fits the rest
    (:class:`~pl_privfed.privacy.audit.WhiteBox`): for a correct Gaussian mechanism its statistic
    is the mechanism's own, so its estimate lands near the certificate and a mechanism that
    leaks more (less noise, a looser clip) is flagged by the same rule.

    The canaries' randomness has its own stream (:data:`pl_privfed.rng.STREAM_AUDIT`): no other
    client's noise, cohort or data order changes. The model does change: the canaries' messages
    (client level) or records (record level) are trained on, like a real client's or record's.

    The report (``summary.json`` → ``privacy.audit``, the result line, the loggers'
    ``audit/*``): the method, the canaries inserted and held out, the statistic, the estimate or
    lower bound per threat model (``final_model``, ``every_round``), and the certified ε of the
    same adversary beside it (the run's ledger: whoever sees the models; the headline adversary's
    too). A run whose audit exceeds its certified ε ends with a warning naming both numbers:
    flagged when the low end of an estimate's interval or a lower bound exceeds the certified ε,
    each of the run's ``m`` tests (``alarm_tests``: the threat models' fits or bounds, the white
    box's) read at ``1 − (1 − confidence)/m`` (``alarm_confidence``, Bonferroni), so that a run
    of a correct mechanism is flagged with probability at most ``1 − confidence`` whatever
    ``m``; the intervals reported stay at ``confidence``. One of the ``m`` is the **noise
    test** (private runs; ``noise_test``, :mod:`pl_privfed.privacy.audit_noise`): at client
    level each release's realized noise against the ledger's σ and placement, at record level
    each client's own draw per local step against the ledger's σ (a bounded keyed set of
    draws); flagged, it warns too.
    Beside the tests, an exact check (``bound_check``, ``exceeds_bound``; private runs,
    :mod:`pl_privfed.privacy.audit_bound`): every inserted canary's contribution to every
    release before its noise against the declared bound of one unit's; one canary over it by
    more than float rounding raises the alarm and warns (no test's share: no false alarms).
    Attached to another LightningModule (no ``algorithm`` and ``layout``) it warns once and
    audits nothing. An
    audit is never a certificate: a low value says the canaries were not found, not that the run
    is private (docs/audit.md).

    Args:
        canaries: the canaries ``m`` (inserted and held out together).
        level: ``"client"``, ``"record"`` or ``"auto"`` (the algorithm's privacy unit; needed
            for a non-private run whose algorithm declares no record use).
        seed: the audit's seed (directions, membership, participation).
        overshoot: a canary's vector before the clip is ``overshoot`` times the clip's bound, so
            a clip that is skipped shows as a canary that many times too loud.
        canary_norm: that norm, given directly (for an operator that bounds nothing).
        confidence: the joint confidence of the record-level lower bounds.
        delta: the δ of the audit's ε (default: the run's, else 1e-5).
        round_statistic: how every round's cosines are combined: ``"sum"`` (divided by
            ``√K``: the likelihood-ratio statistic of a mean shift repeated every round) or
            ``"max"``.
    """

    def __init__(
        self,
        canaries: int = 100,
        level: AuditLevel = "auto",
        seed: int = 0,
        overshoot: float = 100.0,
        canary_norm: float | None = None,
        confidence: float = 0.95,
        delta: float | None = None,
        round_statistic: Literal["sum", "max"] = "sum",
    ) -> None:
        if isinstance(canaries, bool) or not isinstance(canaries, int) or canaries < 4:
            raise ValueError(f"canaries must be an integer >= 4, got {canaries!r}")
        check_choice("level", level, ("auto", "client", "record"))
        if not (isinstance(overshoot, int | float) and overshoot >= 1):
            raise ValueError(f"overshoot must be >= 1, got {overshoot!r}")
        if canary_norm is not None and not canary_norm > 0:
            raise ValueError(f"canary_norm must be positive, got {canary_norm!r}")
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        if delta is not None and not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        check_choice("round_statistic", round_statistic, ("sum", "max"))
        self.count = canaries
        self.level = level
        self.seed = int(seed)
        self.overshoot = float(overshoot)
        self.canary_norm = canary_norm
        self.confidence = float(confidence)
        self.delta = delta
        self.round_statistic = round_statistic
        self.canaries: ClientCanaries | RecordCanaries | None = None
        self._ledger: Any = None
        self._algorithm: Any = None
        self._report: dict[str, Any] | None = None
        self._x0: Tensor | None = None
        self._last: Tensor | None = None
        self._before: Tensor | None = None
        self._white_state: dict[str, Any] | None = None
        self._noise: NoiseAudit | str | None = None  # the noise test, or why there is none
        self._noise_state: dict[str, Any] | None = None
        self._bound: str | None = None  # why there is no per-canary bound check (None: there is)
        self._bound_state: dict[str, Any] | None = None
        self._reset_statistics()

    def _reset_statistics(self) -> None:
        self._sum = np.zeros(self.count)
        self._max = np.full(self.count, -np.inf)
        self._min = np.full(self.count, np.inf)
        self._rounds = 0
        self._alignment = 0.0  # Σ_k <x^{k+1} − x^k, received sum_k>: how the server follows it

    # ------------------------------------------------------------------ planting
    @staticmethod
    def _params(pl_module: pl.LightningModule) -> Tensor:
        """The flat parameters in the engine's layout (the space the canaries live in)."""
        return pl_module.layout.flatten(pl_module.model).detach()

    def _release(self, algorithm: Any) -> Any:
        try:
            return algorithm.release()
        except (NotImplementedError, ValueError):
            return None

    def _resolve_level(self, release: Any) -> str:
        if self.level != "auto":
            return self.level
        if release is None:
            raise ValueError(
                "PrivacyAudit: the algorithm declares no release, so the privacy unit is "
                "unknown; give PrivacyAudit(level='client') or level='record'"
            )
        return level_of(release).name

    def _plant(self, algorithm: Any, x: Tensor) -> ClientCanaries | RecordCanaries:
        release = self._release(algorithm)
        level = self._resolve_level(release)
        directions = canary_directions(
            self.count, x.numel(), self.seed, device=x.device, dtype=x.dtype
        )
        rows = getattr(algorithm, "client_rows", None)
        if level == "client":  # each a client of the run's row representation
            directions = directions if rows is None else rows.canary_directions(directions)
            rate = float(getattr(algorithm, "participation_rate", 1.0))
            participation = release.participation if release is not None else rate
            return ClientCanaries(
                directions,
                canary_membership(self.count, self.seed, half=True),
                participation=participation,
                seed=self.seed,
                overshoot=self.overshoot,
                norm=self.canary_norm,
                operator=getattr(algorithm, "operator", None),
            )
        if rows is not None:  # records join the clients' d-dimensional gradients
            rows.require_dense("an audit's canary records")
        records = None if release is None else release.records
        size = records.release_size if records else int(getattr(algorithm, "batch_size", 1))
        rate = min(1.0, records.positions / records.population) if records else 1.0
        norm = minibatch_norm = self.canary_norm
        if norm is None:
            bound = None if release is None else release.bound
            if bound is None:
                raise ValueError(
                    "PrivacyAudit: the algorithm declares no bound on a record's gradient, so a "
                    "canary record has no norm to be clipped to; give "
                    "PrivacyAudit(canary_norm=...)"
                )
            norm = self.overshoot * float(bound) * size
            minibatch_norm = norm * size  # its part of the average outweighs the others'
        inserted = canary_membership(self.count, self.seed, half=False)
        return RecordCanaries(
            directions,
            inserted,
            record_hosts(inserted, int(algorithm.num_clients), self.seed),
            release_size=size,
            norm=norm,
            rate=rate,
            seed=self.seed,
            minibatch_norm=minibatch_norm,
        )

    #: canary records join d-dimensional gradients (no data span; canary clients are clients of
    #: the run's rows), and canary clients count towards the chunk size's cap (wiring)
    needs_client_rows = property(lambda self: self.level == "record")
    extra_client_rows = property(lambda self: self.count // 2)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        algorithm = getattr(pl_module, "algorithm", None)
        if algorithm is None or not hasattr(pl_module, "layout"):
            missing = [a for a in ("algorithm", "layout") if getattr(pl_module, a, None) is None]
            warn_once(
                self,
                "module",
                f"it audits a FederatedModule's run: {type(pl_module).__name__} has no "
                f"{' and no '.join(missing)} attribute (where canaries are planted), so "
                "nothing is audited",
            )
            self.canaries = None
            return
        configurations = getattr(pl_module, "algorithms", None)
        if callable(configurations) and len(configurations()) != 1:
            raise ValueError(
                "PrivacyAudit audits one configuration; run the grid's points as separate runs "
                "(pl-privfed sweep) to audit them"
            )
        x = self._params(pl_module)
        self.canaries = self._plant(algorithm, x)
        if self._white_state is not None:  # a resumed run's white-box statistic goes on
            self.canaries.white.load_state_dict(self._white_state)
            self._white_state = None
        algorithm.canaries = self.canaries
        self._algorithm = algorithm
        self._ledger = getattr(pl_module, "privacy_ledger", None)
        args = (self.canaries.level, self.seed, x.numel(), self._noise_state)
        self._noise = NoiseAudit.start(algorithm, self._ledger, *args)
        self._bound = bound_check(self.canaries, self._ledger, self._bound_state)
        self._bound_state = None
        self._report = None
        if self._x0 is None:  # a resumed run keeps the start its checkpoint recorded
            self._x0 = x.clone()
        self._x0 = self._x0.to(x.device, x.dtype)
        if self._last is not None:
            self._last = self._last.to(x.device, x.dtype)

    def _detach(self) -> None:
        if self._algorithm is not None and self._algorithm.canaries is self.canaries:
            self._algorithm.canaries = None
        if isinstance(self._noise, NoiseAudit):
            self._noise.detach()

    # ------------------------------------------------------------------ watching
    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.canaries is not None:
            self._before = self._params(pl_module).clone()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.canaries is None or self._before is None:
            return
        after = self._params(pl_module)
        change = after - self._before
        cosines = self._cosines(change)
        self._sum += cosines
        np.maximum(self._max, cosines, out=self._max)
        np.minimum(self._min, cosines, out=self._min)
        self._rounds += 1
        received = self.canaries.last_received
        if received is not None:
            self._alignment += float(torch.dot(change.double(), received.double()))
            self.canaries.last_received = None
        self._last, self._before = after.clone(), None

    def _cosines(self, change: Tensor) -> np.ndarray:
        """``cos(change, u_j)`` for every canary (0 for a model that did not move)."""
        norm = float(torch.linalg.vector_norm(change.double()))
        if not norm > 0:
            return np.zeros(self.count)
        directions = self.canaries.directions
        inner = directions @ change.to(directions.device, directions.dtype)
        return inner.double().cpu().numpy() / norm

    # ------------------------------------------------------------------ the report
    def _delta(self) -> float:
        if self.delta is not None:
            return self.delta
        ledger = self._ledger
        return float(ledger.noise.delta) if ledger is not None else 1e-5

    def _certified(self, delta: float) -> dict[str, Any]:
        ledger = self._ledger
        if ledger is None:
            return {"certified_epsilon": None, "certified_adversary": None}
        adversary = "models" if "models" in ledger.adversaries else ledger.headline
        return {
            "certified_epsilon": ledger.epsilon(delta, adversary=adversary),
            "certified_adversary": adversary,
            "headline_adversary": ledger.headline,
            "headline_epsilon": ledger.epsilon(delta),
        }

    def _statistics(self, sign: float) -> dict[str, np.ndarray]:
        final = None
        if self._last is not None and self._x0 is not None:
            final = self._cosines(self._last - self._x0.to(self._last.device))
        if self.round_statistic == "sum":
            rounds = self._sum / math.sqrt(self._rounds)
        else:
            rounds = self._max if sign > 0 else -self._min
            rounds = np.where(np.isfinite(rounds), rounds, 0.0)
        out = {"every_round": sign * rounds if self.round_statistic == "sum" else rounds}
        if final is not None:
            out["final_model"] = sign * final
        return out

    def report(self) -> dict[str, Any] | None:
        """The audit (computed once, at the end of fit): ``None`` before any round."""
        if self._report is not None:
            return self._report
        canaries = self.canaries
        if canaries is None or self._rounds == 0:
            return None
        delta = self._delta()
        inserted = canaries.inserted.numpy()
        # the direction the server's step follows the sum it receives, measured from the run,
        # times that of the canary clients' messages along u_j (client level: the algorithm's,
        # not which canaries were inserted); a canary record is a gradient, always descended
        sign = -1.0 if canaries.level != "client" else (1.0 if self._alignment > 0 else -1.0)
        sign *= canaries.message_sign if canaries.level == "client" else 1.0
        stats = self._statistics(sign)
        certified = self._certified(delta)
        entry: dict[str, Any] = {
            "method": METHODS[canaries.level],
            "level": canaries.level,
            "canaries": canaries.count,
            "canaries_inserted": int(inserted.sum()),
            "canaries_held_out": int((~inserted).sum()),
            "delta": delta,
            "rounds": self._rounds,
            "statistic": (
                "cosine between the model's change and each canary's direction: final model "
                f"cos(x^K − x^0, u_j); every round {ROUND_STATISTICS[self.round_statistic]}; "
                f"signed by the server's step ({'+' if sign > 0 else '−'})"
            ),
            "threat_model": "every_round",
            **certified,
        }
        threats: dict[str, Any] = {}
        #: the run's tests for the alarm: (where, its value at a confidence and a test count)
        alarms: list[tuple[str, Callable[[float, int], float]]] = []
        if canaries.level == "client":
            entry["participation"] = canaries.participation
            entry["canary_input_norm"] = canaries.input_norm_used
            entry["canary_message_norm"] = canaries.message_norm
            entry["canary_messages"] = canaries.messages_sent
            entry["confidence"] = self.confidence
            for name, s in stats.items():
                fit = gaussian_estimate(s[inserted], s[~inserted], delta, self.confidence)
                threats[name] = {
                    "threat_model": THREAT_MODELS[name],
                    **fit.as_dict(),
                    "epsilon_estimate": fit.epsilon,
                }
                alarms.append((name, fit_low(s[inserted], s[~inserted], delta)))
            head = threats["every_round"]
            entry["epsilon_estimate"] = head["epsilon_estimate"]
            entry["epsilon_interval"] = [head["epsilon_low"], head["epsilon_high"]]
        else:
            entry["confidence"] = self.confidence
            entry["record_rate"] = canaries.rate
            entry["release_size"] = canaries.release_size
            entry["canary_gradient_norm"] = canaries.norm
            entry["canary_uses"] = int(canaries.uses.sum())
            for name, s in stats.items():
                bound = one_run_audit(s, inserted, delta, self.confidence, tests=len(stats))
                fit = gaussian_estimate(s[inserted], s[~inserted], delta, self.confidence)
                details = bound.as_dict().items()
                threats[name] = {
                    "threat_model": THREAT_MODELS[name],
                    "epsilon_lower_bound": bound.epsilon,
                    **{
                        f"lower_bound_{k}": v
                        for k, v in details
                        if k not in ("epsilon", "delta", "confidence")
                    },
                    "gaussian_fit": fit.as_dict(),
                    "epsilon_estimate": fit.epsilon,
                }
                alarms.append((name, lower_bound(s, inserted, delta)))
            entry["epsilon_lower_bound"] = threats["every_round"]["epsilon_lower_bound"]
            entry["ceiling"] = threats["every_round"]["lower_bound_ceiling"]
        adversary = certified["certified_adversary"]
        args = (delta, self.confidence, self._ledger, adversary, alarms)
        white = white_box(canaries, inserted, *args)
        if white is not None:
            threats["white_box"] = white
            entry["white_box_epsilon_estimate"] = white["epsilon_estimate"]
            entry["white_box_epsilon_interval"] = [white["epsilon_low"], white["epsilon_high"]]
        entry["threat_models"] = threats
        if not entry.get("canary_messages", entry.get("canary_uses")):
            reads = (
                "reads no sum through the message stage's received()"
                if canaries.level == "client"
                else "computes no minibatch gradient or clipped mean through its chunks"
            )
            rank_zero_warn(
                f"PrivacyAudit: no canary {canaries.level} entered the run (the algorithm "
                f"{reads}): the audit measured nothing; try the other level",
                category=UserWarning,
            )
        # the alarm's false-alarm rate is the run's, over its tests (Bonferroni): each test at
        # 1 − (1 − confidence)/m, as the record level's lower bounds already are among themselves
        noise = self._noise if isinstance(self._noise, NoiseAudit) else None
        test = None if noise is None else noise.report((1 - self.confidence) / (len(alarms) + 1))
        tests = len(alarms) + (test is not None)
        entry["noise_test"] = test or {"skipped": self._noise if noise is None else noise.reason}
        entry["alarm_tests"] = tests
        entry["alarm_confidence"] = 1.0 - (1.0 - self.confidence) / tests
        values = [(value(self.confidence, tests), where) for where, value in alarms]
        cert = certified["certified_epsilon"]
        top, where = max(values)
        entry["exceeds_certified"] = bool(cert is not None and top > cert)
        check = canaries.bound.report() if canaries.bound is not None else None
        entry["bound_check"] = check or {"skipped": self._bound}
        entry["exceeds_bound"] = bool(check and check["flagged"])  # exact: no test's share
        entry["alarm"] = entry["exceeds_certified"] or bool(test and test["flagged"])
        entry["alarm"] = entry["alarm"] or entry["exceeds_bound"]
        self._report = entry
        if entry["exceeds_certified"]:
            warn_exceeds(entry, top, where)
        if test and test["flagged"]:
            NoiseAudit.warn(test)
        if entry["exceeds_bound"]:
            warn_bound(check, canaries.level)
        return entry

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        report = self.report()
        self._detach()
        if report is not None:
            self._log(trainer, report)

    @override
    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._detach()

    @rank_zero_only
    def _log(self, trainer: pl.Trainer, report: dict[str, Any]) -> None:
        key = "epsilon_lower_bound" if report["level"] == "record" else "epsilon_estimate"
        metrics = {f"audit/{key}": report[key]}
        for name, threat in report["threat_models"].items():
            metrics[f"audit/{key}_{name}"] = threat.get(key)
        white = report["threat_models"].get("white_box")
        if white is not None:
            metrics["audit/epsilon_estimate_white_box"] = white["epsilon_estimate"]
        if report["certified_epsilon"] is not None:
            metrics["audit/epsilon_certified"] = report["certified_epsilon"]
        metrics = {k: float(v) for k, v in metrics.items() if v is not None}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def summary_entries(self) -> dict[str, Any]:
        """``privacy.audit`` for ``summary.json`` (nested under the run's privacy report)."""
        report = self.report()
        return {} if report is None else {"privacy": {"audit": report}}

    # ------------------------------------------------------------------ checkpoints
    @override
    def state_dict(self) -> dict[str, Any]:
        """The statistics so far (a resumed run's audit goes on from them; the canaries'
        directions and draws are keyed, so they need no state)."""
        bound = None if self.canaries is None else self.canaries.bound
        return {
            "x0": None if self._x0 is None else self._x0.cpu(),
            "last": None if self._last is None else self._last.cpu(),
            "sum": torch.from_numpy(self._sum.copy()),
            "max": torch.from_numpy(self._max.copy()),
            "min": torch.from_numpy(self._min.copy()),
            "rounds": self._rounds,
            "alignment": self._alignment,
            "white_box": None if self.canaries is None else self.canaries.white.state_dict(),
            "noise_test": self._noise.state_dict() if isinstance(self._noise, NoiseAudit) else None,
            "bound_check": None if bound is None else bound.state_dict(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = int(state_dict["sum"].numel())
        if saved != self.count:
            raise ValueError(
                f"PrivacyAudit: the checkpoint's audit has {saved} canaries, this one {self.count}"
            )
        self._x0, self._last = state_dict["x0"], state_dict["last"]
        self._sum = state_dict["sum"].double().numpy().copy()
        self._max = state_dict["max"].double().numpy().copy()
        self._min = state_dict["min"].double().numpy().copy()
        self._rounds, self._alignment = int(state_dict["rounds"]), float(state_dict["alignment"])
        self._white_state = state_dict.get("white_box")  # applied when the canaries are planted
        self._noise_state = state_dict.get("noise_test")
        self._bound_state = state_dict.get("bound_check")
