"""Differential privacy: declarations, accounting over Opacus and dp-accounting, noise settings,
calibration, a run's ledger and secure aggregation.

* :mod:`~pl_privfed.privacy.release` — :class:`Release`, what an algorithm declares it releases;
* :mod:`~pl_privfed.privacy.levels` — the kinds of privacy unit as types: :class:`ClientLevel`
  and :class:`RecordLevel` (:func:`level_of` a release), each owning its adversaries, relation,
  releases per round and what its ε assumes;
* :mod:`~pl_privfed.privacy.placement` — where the noise goes: :class:`LocalNoise`,
  :class:`CentralNoise`, :class:`DistributedNoise` and their registry
  (:func:`register_placement`);
* :mod:`~pl_privfed.privacy.correlated` and :mod:`~pl_privfed.privacy.factorization` — noise
  correlated across rounds (the matrix factorization mechanism: :class:`BandedMFNoise`,
  :class:`TreeNoise`) and the strategies' matrices and sensitivities;
* :mod:`~pl_privfed.privacy.plan` — pure functions from a declaration to mechanisms, the bases of
  each ε and the calibration;
* :mod:`~pl_privfed.privacy.ledger` — :class:`PrivacyLedger`, one run's accountants and reports;
* :mod:`~pl_privfed.privacy.audit` — an empirical audit beside the certified ε: canary clients
  and canary records, their statistics, ε estimates and one-run lower bounds;
* :mod:`~pl_privfed.privacy.invariants` — the check mode (``PL_PRIVFED_CHECK_INVARIANTS=1``,
  on in the test suite): bounds, noise keys used once, declared stds and no skipped draw,
  asserted on the run's real path;
* :mod:`~pl_privfed.privacy.pld` — dp-accounting's privacy loss distributions of the releases'
  tight dominating pairs (Zhu, Dong & Wang 2022 for sampling without replacement), the PLD
  accountant behind ``accountant: auto`` / ``pld``;
* :mod:`~pl_privfed.privacy.selection` — the cost of selecting among runs on the same data
  (candidate runs composed; Papernot & Steinke's random-search bound by dp-accounting);
* :mod:`~pl_privfed.privacy.accounting`, :mod:`~pl_privfed.privacy.calibration`,
  :mod:`~pl_privfed.privacy.mechanism`, :mod:`~pl_privfed.privacy.noise`,
  :mod:`~pl_privfed.privacy.secagg`.
"""

from pl_privfed.privacy import audit, invariants, plan
from pl_privfed.privacy.accounting import AccountantName, PrivacyAccountant
from pl_privfed.privacy.calibration import (
    calibrate_noise_multiplier,
    calibrate_noise_std,
    epsilon_of_plan,
    paper_noise_std,
)
from pl_privfed.privacy.correlated import BandedMFNoise, CorrelatedNoise, TreeNoise
from pl_privfed.privacy.factorization import Banded, BandedToeplitz, Factorization, TreeAggregation
from pl_privfed.privacy.ledger import PrivacyLedger
from pl_privfed.privacy.levels import ClientLevel, PrivacyLevel, RecordLevel, level_of
from pl_privfed.privacy.mechanism import AccountingBasis, Mechanism, ReleaseKey, Sampling
from pl_privfed.privacy.noise import Calibration, DPNoise, Neighbouring, Placement, relation_factor
from pl_privfed.privacy.placement import (
    MAX_ABORT_PROBABILITY,
    PLACEMENTS,
    CentralNoise,
    DistributedNoise,
    LocalNoise,
    NoisePlacement,
    abort_probability,
    largest_min_contributors,
    register_placement,
    resolve_placement,
    run_abort_probability,
)
from pl_privfed.privacy.release import BatchSampling, Cohort, RecordUse, Release
from pl_privfed.privacy.secagg import SecureAggregation

__all__ = [
    "MAX_ABORT_PROBABILITY",
    "PLACEMENTS",
    "AccountantName",
    "AccountingBasis",
    "Banded",
    "BandedMFNoise",
    "BandedToeplitz",
    "BatchSampling",
    "Calibration",
    "CentralNoise",
    "ClientLevel",
    "Cohort",
    "CorrelatedNoise",
    "DPNoise",
    "DistributedNoise",
    "Factorization",
    "LocalNoise",
    "Mechanism",
    "Neighbouring",
    "NoisePlacement",
    "Placement",
    "PrivacyAccountant",
    "PrivacyLedger",
    "PrivacyLevel",
    "RecordLevel",
    "RecordUse",
    "Release",
    "ReleaseKey",
    "Sampling",
    "SecureAggregation",
    "TreeAggregation",
    "TreeNoise",
    "abort_probability",
    "audit",
    "calibrate_noise_multiplier",
    "calibrate_noise_std",
    "epsilon_of_plan",
    "invariants",
    "largest_min_contributors",
    "level_of",
    "paper_noise_std",
    "plan",
    "register_placement",
    "relation_factor",
    "resolve_placement",
    "run_abort_probability",
]
