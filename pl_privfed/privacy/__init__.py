"""Differential privacy: accounting over Opacus, noise settings, calibration."""

from pl_privfed.privacy.accounting import AccountantName, PrivacyAccountant
from pl_privfed.privacy.calibration import calibrate_noise_multiplier, paper_noise_std
from pl_privfed.privacy.noise import Calibration, DPNoise, Neighbouring
from pl_privfed.privacy.secagg import SecureAggregation

__all__ = [
    "AccountantName",
    "Calibration",
    "DPNoise",
    "Neighbouring",
    "PrivacyAccountant",
    "SecureAggregation",
    "calibrate_noise_multiplier",
    "paper_noise_std",
]
