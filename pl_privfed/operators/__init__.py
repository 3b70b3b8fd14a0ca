"""Operators on client-stacked ``[n, d]`` tensors: clipping, normalization, compression, noise."""

from pl_privfed.operators import functional
from pl_privfed.operators.adaptive import AdaptiveClip
from pl_privfed.operators.base import (
    Clip,
    Identity,
    Operator,
    RandKBiased,
    RandKUnbiased,
    SmoothClip,
    SmoothedNormalization,
    TopK,
)
from pl_privfed.operators.functional import (
    clip,
    gaussian_noise,
    rand_k_biased,
    rand_k_unbiased,
    smooth_clip,
    smoothed_normalize,
    top_k,
)

__all__ = [
    "AdaptiveClip",
    "Clip",
    "Identity",
    "Operator",
    "RandKBiased",
    "RandKUnbiased",
    "SmoothClip",
    "SmoothedNormalization",
    "TopK",
    "clip",
    "functional",
    "gaussian_noise",
    "rand_k_biased",
    "rand_k_unbiased",
    "smooth_clip",
    "smoothed_normalize",
    "top_k",
]
