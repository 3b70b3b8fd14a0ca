"""Differential privacy: accounting over Opacus, noise configuration and calibration."""

from pl_privfed.privacy.accounting import AccountantName, PrivacyAccountant
from pl_privfed.privacy.noise import DPNoise, paper_noise_std

__all__ = ["AccountantName", "DPNoise", "PrivacyAccountant", "paper_noise_std"]
