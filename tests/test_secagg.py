import math

import pytest
import torch
from helpers.algorithms import problem, ref_error_feedback, run, smoothed

from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.privacy import SecureAggregation


def client_vectors(n=6, d=50, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_exact_fixed_point_sum():
    agg = SecureAggregation(fraction_bits=20, modulus_bits=48, seed=3)
    v = client_vectors()
    encoded = agg.encode(v)
    masked = agg.mask(encoded, round_index=5)
    # the masks cancel exactly: the server's sum is the sum of the encodings, bit for bit
    assert torch.equal(
        torch.remainder(masked.sum(0), agg.modulus), torch.remainder(encoded.sum(0), agg.modulus)
    )
    total = agg.unmask_sum(masked)
    assert (total - v.sum(0)).abs().max().item() <= agg.error_bound(6)
    assert agg.error_bound(6) == 6 * 2.0**-21
    # negative totals decode correctly (two's complement in Z_2^b)
    assert torch.allclose(agg.sum(-v.abs()), -v.abs().sum(0), atol=agg.error_bound(6))


def test_masked_vector_reveals_nothing_about_the_client_vector():
    agg = SecureAggregation(fraction_bits=16, modulus_bits=32, seed=1)
    draws = 3000
    gen = torch.Generator().manual_seed(7)
    values = torch.randn(draws, 3, 1, generator=gen, dtype=torch.float64)  # 3 clients, d = 1
    seen = torch.stack([agg.mask(agg.encode(values[r]), round_index=r)[0, 0] for r in range(draws)])
    x, y = values[:, 0, 0], seen.double()
    corr = torch.corrcoef(torch.stack([x, y]))[0, 1].item()
    assert abs(corr) < 4 / math.sqrt(draws)
    # and the masked value is spread uniformly over the ring
    assert abs(y.mean().item() / agg.modulus - 0.5) < 0.03


def test_cohort_masks_cancel_among_participants():
    agg = SecureAggregation(seed=2)
    v = client_vectors(n=4)
    cohort = torch.tensor([7, 2, 11, 5])
    masked = agg.mask(agg.encode(v), round_index=1, cohort=cohort)
    assert torch.allclose(agg.unmask_sum(masked), v.sum(0), atol=agg.error_bound(4))
    # a different cohort gets different masks for the same rows
    other = agg.mask(agg.encode(v), round_index=1, cohort=torch.tensor([0, 1, 2, 3]))
    assert not torch.equal(masked, other)
    with pytest.raises(ValueError, match="distinct"):
        agg.mask(agg.encode(v), cohort=torch.tensor([1, 1, 2, 3]))


def test_validation_and_overflow():
    with pytest.raises(ValueError, match="modulus_bits"):
        SecureAggregation(modulus_bits=63)
    with pytest.raises(ValueError, match="fraction_bits"):
        SecureAggregation(fraction_bits=40, modulus_bits=40)
    agg = SecureAggregation(fraction_bits=8, modulus_bits=16)
    with pytest.raises(ValueError, match="overflow"):
        agg.sum(torch.full((2, 3), 100.0))


@pytest.mark.parametrize("every_round", [False, True])
def test_alpha_normec_with_secure_aggregation(every_round):
    """ĝ⁰ from secure aggregation (paper 002 Appendix C.3): iterates stay within rounding."""
    b, x0 = problem()
    agg = SecureAggregation(fraction_bits=40, modulus_bits=60, every_round=every_round)
    alg = AlphaNormEC(
        0.05, 0.4, 0.5, server_normalization=False, memory_init="gradient", secure_aggregation=agg
    )
    xs = run(alg, b, x0)
    ref = ref_error_feedback(
        b, x0, lambda v: smoothed(v, 0.5), 0.4, 0.05, False, len(xs), init="gradient"
    )
    for a, r in zip(xs, ref):
        torch.testing.assert_close(a, r, atol=1e-9, rtol=0)
    assert int(alg.rounds_done) == len(xs)
