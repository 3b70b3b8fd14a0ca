"""Differential privacy: accounting over Opacus, noise settings, calibration."""

from pl_privfed.privacy.accounting import AccountantName, PrivacyAccountant
from pl_privfed.privacy.calibration import calibrate_noise_multiplier, paper_noise_std
from pl_privfed.privacy.noise import Calibration, DPNoise, Neighbouring

__all__ = [
    "AccountantName",
    "Calibration",
    "DPNoise",
    "Neighbouring",
    "PrivacyAccountant",
    "calibrate_noise_multiplier",
    "paper_noise_std",
]
