import math

import pytest
import torch
from opacus.accountants import PRVAccountant, RDPAccountant

from pl_privfed.algorithms import AlphaNormEC, DistributedDPSGD
from pl_privfed.operators import Clip
from pl_privfed.privacy import DPNoise, PrivacyAccountant, paper_noise_std


def test_paper_calibration_certifies_about_13_not_8():
    """The fact docs/privacy.md shows: σ = sqrt(K log(1/δ))/ε at K=300, ε=8, δ=1e-5."""
    sigma = paper_noise_std(sensitivity=1.0, epsilon=8.0, delta=1e-5, rounds=300)
    assert sigma == pytest.approx(math.sqrt(300 * math.log(1e5)) / 8)
    acc = PrivacyAccountant("rdp")
    acc.step(noise_multiplier=sigma, sample_rate=1.0, num_steps=300)
    eps = acc.get_epsilon(1e-5)
    assert 12.5 < eps < 13.5


@pytest.mark.parametrize("name, cls", [("rdp", RDPAccountant), ("prv", PRVAccountant)])
def test_golden_values_equal_opacus(name, cls):
    ours, theirs = PrivacyAccountant(name), cls()
    for _ in range(50):
        ours.step(noise_multiplier=0.9, sample_rate=0.3)
        theirs.step(noise_multiplier=0.9, sample_rate=0.3)
    assert ours.get_epsilon(1e-5) == pytest.approx(theirs.get_epsilon(delta=1e-5), rel=1e-9)


def test_accountant_state_roundtrip_and_validation():
    acc = PrivacyAccountant()
    assert acc.get_epsilon(1e-5) == 0.0
    acc.step(noise_multiplier=2.0, sample_rate=1.0, num_steps=7)
    other = PrivacyAccountant()
    other.load_state_dict(acc.state_dict())
    assert other.steps == 7 and other.get_epsilon(1e-5) == acc.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.step(noise_multiplier=0.0, sample_rate=1.0)
    with pytest.raises(ValueError, match="sample_rate"):
        acc.step(noise_multiplier=1.0, sample_rate=1.5)
    with pytest.raises(ValueError, match="accountant"):
        PrivacyAccountant("gdp2")


def _noise_of_one_round(alg, n=200, d=500):
    """Run one round at a point where the messages are known; return message − expected."""
    alg.setup(num_clients=n, dim=d, num_rounds=10)
    alg.initialized.fill_(True)
    captured = {}
    original = alg._gaussian

    def spy(*shape):
        z = original(*shape)
        captured["z"] = z.clone()  # the algorithm may add its message into z in place
        return z

    alg._gaussian = spy
    alg.round(torch.zeros(d), lambda p: torch.ones(n, d))
    return captured["z"]


@pytest.mark.parametrize(
    "make, std",
    [  # std = noise_multiplier × sensitivity (1 for Norm_α, τ = 2 for clipping)
        (lambda s: AlphaNormEC(0.1, 0.1, 0.01, noise=DPNoise(noise_multiplier=1.5, seed=s)), 1.5),
        (
            lambda s: DistributedDPSGD(0.1, Clip(2.0), noise=DPNoise(noise_multiplier=1.5, seed=s)),
            3.0,
        ),
    ],
)
def test_noise_moments_and_seeding(make, std):
    z1, z2, z3 = (_noise_of_one_round(make(s)) for s in (0, 0, 1))
    assert torch.equal(z1, z2) and not torch.equal(z1, z3)
    assert z1.shape == (200, 500)  # one noise vector per client
    assert abs(z1.mean().item()) < 5 * std / math.sqrt(z1.numel())
    assert z1.std().item() == pytest.approx(std, rel=0.01)


def test_server_noise_is_one_vector():
    alg = DistributedDPSGD(1.0, Clip(1.0), noise=DPNoise(noise_multiplier=1.0, seed=0),
                           noise_placement="server")  # fmt: skip
    z = _noise_of_one_round(alg, n=50, d=20_000)
    assert z.shape == (20_000,)
    assert z.std().item() == pytest.approx(1.0, rel=0.02)
