import math

import pytest
import torch

from pl_privfed.operators import (
    Clip,
    Identity,
    RandKBiased,
    RandKUnbiased,
    SmoothClip,
    SmoothedNormalization,
    TopK,
    clip,
    gaussian_noise,
    smooth_clip,
    smoothed_normalize,
    top_k,
)


@pytest.fixture
def vectors():
    g = torch.Generator().manual_seed(0)
    v = torch.randn(50, 17, generator=g, dtype=torch.float64)
    v *= torch.logspace(-3, 3, 50, dtype=torch.float64)[:, None]  # norms over 6 decades
    v[0] = 0.0
    return v


@pytest.mark.parametrize("alpha", [0.0, 0.01, 1.0, 10.0])
@pytest.mark.parametrize("beta", [0.01, 0.5, 1.0, 3.0])
def test_smoothed_normalization_lemma1(vectors, alpha, beta):
    """Paper 002 Lemma 1: ||Norm_α(g)|| <= 1 and
    ||g − β Norm_α(g)||² = (1 − β/(α+||g||))² ||g||²."""
    out = smoothed_normalize(vectors, alpha)
    norms = vectors.norm(dim=1)
    assert (out.norm(dim=1) <= 1 + 1e-12).all()
    nz = norms > 0
    lhs = (vectors - beta * out).norm(dim=1) ** 2
    rhs = (1 - beta / (alpha + norms)) ** 2 * norms**2
    torch.testing.assert_close(lhs[nz], rhs[nz], rtol=1e-10, atol=1e-12)
    assert torch.equal(out[0], torch.zeros(17, dtype=torch.float64))  # 0/0 = 0 for α = 0


def test_smoothed_normalization_formula(vectors):
    out = smoothed_normalize(vectors, 0.1)
    for i in range(vectors.shape[0]):
        expected = vectors[i] / (0.1 + math.sqrt(float((vectors[i] ** 2).sum())))
        torch.testing.assert_close(out[i], expected)


def test_clip_matches_definition_and_bound(vectors):
    tau = 2.5
    out = clip(vectors, tau)
    for i in range(vectors.shape[0]):
        n = float(vectors[i].norm())
        expected = vectors[i] * min(1.0, tau / n) if n > 0 else vectors[i]
        torch.testing.assert_close(out[i], expected)
    assert (out.norm(dim=1) <= tau + 1e-12).all()


def test_smooth_clip_matches_definition_and_bound(vectors):
    tau = 0.7
    out = smooth_clip(vectors, tau)
    expected = vectors * (tau / (tau + vectors.norm(dim=1, keepdim=True)))
    torch.testing.assert_close(out, expected)
    assert (out.norm(dim=1) < tau).all()


def test_top_k_keeps_largest(vectors):
    out = top_k(vectors, 3)
    assert ((out != 0).sum(dim=1) <= 3).all()
    for i in range(1, vectors.shape[0]):
        kept = set((out[i] != 0).nonzero().flatten().tolist())
        largest = set(vectors[i].abs().argsort(descending=True)[:3].tolist())
        assert kept == largest
    # contractive: ||C(g) − g||² <= (1 − k/d) ||g||²
    lhs = (out - vectors).norm(dim=1) ** 2
    assert (lhs <= (1 - 3 / 17) * vectors.norm(dim=1) ** 2 + 1e-12).all()


def test_rand_k_biased_and_unbiased_statistics():
    d, k = 40, 10
    v = torch.arange(1.0, d + 1, dtype=torch.float64).expand(20000, d)
    g = torch.Generator().manual_seed(1)
    biased = RandKBiased(k=k)
    biased.setup(d)
    out = biased(v, g)
    assert set(torch.unique(out[0]).tolist()) <= set(v[0].tolist()) | {0.0}  # no rescaling
    keep_rate = (out != 0).double().mean().item()
    assert abs(keep_rate - k / d) < 0.005
    unbiased = RandKUnbiased(k=k)
    unbiased.setup(d)
    mean = unbiased(v, g).mean(0)
    torch.testing.assert_close(mean, v[0], rtol=0.05, atol=0.0)
    # same generator state -> same mask
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(biased(v[:3], g1), biased(v[:3], g2))


def test_operator_bounds():
    assert Clip(2.0).bound == 2.0
    assert SmoothClip(3.0).bound == 3.0
    assert SmoothedNormalization(0.1).bound == 1.0
    assert Identity().bound is None
    assert TopK(k=1).bound is None


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: Clip(0.0), "threshold"),
        (lambda: Clip(-1.0), "threshold"),
        (lambda: SmoothClip(float("nan")), "threshold"),
        (lambda: SmoothedNormalization(-0.1), "alpha"),
        (lambda: TopK(k=0), "k"),
        (lambda: TopK(), "k or ratio"),
        (lambda: RandKBiased(ratio=1.5), "ratio"),
    ],
)
def test_operator_validation(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_top_k_k_larger_than_dimension():
    op = TopK(k=20)
    with pytest.raises(ValueError, match="k must be in"):
        op.setup(10)


def test_gaussian_noise_generator_determinism_and_moments():
    a = gaussian_noise((200_000,), 2.0, torch.Generator().manual_seed(3))
    b = gaussian_noise((200_000,), 2.0, torch.Generator().manual_seed(3))
    c = gaussian_noise((200_000,), 2.0, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.mean().item()) < 0.02
    assert abs(a.std().item() - 2.0) < 0.02
    with pytest.raises(ValueError, match="Generator"):
        gaussian_noise((3,), 1.0, None)
