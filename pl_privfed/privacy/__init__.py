"""Differential privacy: accounting over Opacus and dp-accounting, noise settings, calibration."""

from pl_privfed.privacy.accounting import AccountantName, PrivacyAccountant
from pl_privfed.privacy.calibration import (
    calibrate_noise_multiplier,
    calibrate_noise_std,
    epsilon_of_plan,
    paper_noise_std,
)
from pl_privfed.privacy.mechanism import AccountingBasis, Mechanism, Sampling
from pl_privfed.privacy.noise import Calibration, DPNoise, Neighbouring, relation_factor
from pl_privfed.privacy.secagg import SecureAggregation

__all__ = [
    "AccountantName",
    "AccountingBasis",
    "Calibration",
    "DPNoise",
    "Mechanism",
    "Neighbouring",
    "PrivacyAccountant",
    "Sampling",
    "SecureAggregation",
    "calibrate_noise_multiplier",
    "calibrate_noise_std",
    "epsilon_of_plan",
    "paper_noise_std",
    "relation_factor",
]
