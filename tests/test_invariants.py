"""The privacy invariants' check mode (pl_privfed/privacy/invariants.py, issue 48 item 3): on in
the suite (tests/conftest.py), silent on unbroken runs of every placement, and each invariant
fails a run where one violation of it is planted (monkeypatch), on a small quadratic problem
(6 clients, d = 10, two or three rounds in process)."""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.training import trainer

from pl_privfed import FederatedModule
from pl_privfed.algorithms import DistributedDPSGD, FedAvgPerSampleClipping
from pl_privfed.datamodules import DigitsDataModule, FixedSizePartitioner, QuadraticDataModule
from pl_privfed.engine import CHUNK_ENV, ClientChunk, MessageStage, SpanRows
from pl_privfed.grid import GridModule
from pl_privfed.models import HalfSquaredError, LogisticRegression, QuadraticModel
from pl_privfed.operators import AdaptiveClip, Clip
from pl_privfed.privacy import (
    BandedMFNoise,
    DistributedNoise,
    DPNoise,
    LocalNoise,
    invariants,
)
from pl_privfed.privacy.correlated import CorrelatedNoiseProcess
from pl_privfed.rng import (
    STREAM_CENTRAL_NOISE,
    STREAM_CORRELATED_NOISE,
    STREAM_NOISE,
    STREAM_SERVER_NOISE,
    KeyedGenerator,
)

CLIENTS, DIM = 6, 10
#: the client-level mechanisms of the small problem: ``DPNoise`` settings by name
PLACEMENTS = {
    "local": {"placement": "local"},
    "local per client": {"placement": "local", "draws": "per_client"},
    "central": {"placement": "central"},
    "distributed": {"placement": "distributed", "min_contributors": 3},
    "banded_mf": {"placement": BandedMFNoise(bands=2)},  # correlated: every client every round
    "record": {},  # record-level (local noise on every client's clipped mean)
}
NOISE_STREAMS = (STREAM_NOISE, STREAM_SERVER_NOISE, STREAM_CENTRAL_NOISE, STREAM_CORRELATED_NOISE)


def _noise(name: str) -> DPNoise:
    return DPNoise(noise_multiplier=1.0, seed=3, **PLACEMENTS[name])


def _algorithm(name: str, operator=None):
    if name == "record":
        return FedAvgPerSampleClipping(
            0.5, clip_threshold=0.05, clip_level="example", noise=_noise(name)
        )
    return DistributedDPSGD(0.5, operator or Clip(0.05), noise=_noise(name))


def fit(algorithm, rounds: int = 2) -> None:
    """``rounds`` rounds of ``algorithm`` on the small problem (the updates' norms are about 1,
    so a clip at 0.05 shortens every one)."""
    module = FederatedModule(QuadraticModel(DIM), algorithm, criterion=HalfSquaredError())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(max_steps=rounds).fit(
            module, datamodule=QuadraticDataModule(num_clients=CLIENTS, dim=DIM, seed=0)
        )


@pytest.fixture(autouse=True)
def _counts():
    invariants.COUNTS.clear()
    yield


MECHANISMS = list(PLACEMENTS)


def test_the_mode_is_on_in_the_suite():
    assert invariants.enabled()
    with invariants.disabled():
        assert not invariants.enabled()
        assert invariants.checks_for("x", 1.0, LocalNoise(), 1.0, False) is None
    assert invariants.enabled()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_unbroken_runs_pass_every_check(mechanism):
    fit(_algorithm(mechanism), rounds=3)
    counts = invariants.COUNTS
    assert counts["drawn"] == 3 and counts["bound"] >= 3
    assert counts["key_once"] == counts["std"] >= 3


# ---------------------------------------------------------------------------- (a) bounds
@pytest.fixture
def one_chunk(monkeypatch):
    """The engine's own chunking (the suite may set PL_PRIVFED_CLIENT_CHUNK): the round of 6
    clients is one chunk, which the plants below (the chunk's last row, a chunk's draw) and the
    per-chunk counts assume."""
    monkeypatch.delenv(CHUNK_ENV, raising=False)


def _skip_clip_for_last_client(monkeypatch):
    """A clip skipped on one path for some clients: the last client of every chunk."""
    clip_scale = Clip.scale

    def scale(self, norms):
        out = clip_scale(self, norms)
        out[-1] = 1.0  # the last row (client, or example) keeps its norm
        return out

    monkeypatch.setattr(Clip, "scale", scale)


@pytest.mark.parametrize("mechanism", ["local", "local per client", "central", "record"])
def test_a_clip_skipped_for_one_client_fails_the_bound(mechanism, monkeypatch, one_chunk):
    _skip_clip_for_last_client(monkeypatch)
    with pytest.raises(invariants.InvariantViolation, match=r"\(a\) bound.*round 0.*client 5"):
        fit(_algorithm(mechanism))


def test_the_adaptive_bound_is_this_rounds(monkeypatch, one_chunk):
    """C_t grows (every update is clipped at C_0 = 0.05): the messages at C_1 > C_0 pass the
    check against round 1's bound, and a clip at 1.5 C_t fails it."""
    algorithm = _algorithm("local", AdaptiveClip(0.05, learning_rate=1.0, count_stddev=5.0))
    fit(algorithm, rounds=3)
    assert algorithm.invariants.ratio == pytest.approx(torch.e)  # C_2 = e^(2 η_C γ) C_0
    assert invariants.COUNTS["bound"] == 3 and invariants.COUNTS["std"] == 6  # + the counts
    monkeypatch.setattr(AdaptiveClip, "scale", lambda self, n: (1.5 * self.norm / n).clamp(max=1))
    with pytest.raises(invariants.InvariantViolation, match=r"\(a\) bound.*round 0"):
        fit(_algorithm("local", AdaptiveClip(0.05, learning_rate=1.0, count_stddev=5.0)))


# ---------------------------------------------------------------------------- (b) keys once
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_noise_key_that_forgets_the_round_fails(mechanism, monkeypatch):
    """The same noise draw reused across rounds: every noise stream's key loses its round."""
    call = KeyedGenerator.__call__

    def forgetful(self, seed, *keys):
        if keys and keys[0] in NOISE_STREAMS and len(keys) > 1:
            keys = (keys[0], 0, *keys[2:])
        return call(self, seed, *keys)

    monkeypatch.setattr(KeyedGenerator, "__call__", forgetful)
    with pytest.raises(invariants.InvariantViolation, match=r"\(b\) key once.*round 1"):
        fit(_algorithm(mechanism))


# ---------------------------------------------------------------------------- (c) stds
def test_distributed_shares_of_sigma_over_t_fail_the_std(monkeypatch):
    monkeypatch.setattr(DistributedNoise, "sender_std", lambda self, s: s / self.min_contributors)
    with pytest.raises(invariants.InvariantViolation, match=r"\(c\) std.*round 0.*sum"):
        fit(_algorithm("distributed"))


def test_local_noise_at_half_the_std_fails(monkeypatch):
    monkeypatch.setattr(LocalNoise, "sender_std", lambda self, s: 0.5 * s)
    with pytest.raises(invariants.InvariantViolation, match=r"\(c\) std.*client 0"):
        fit(_algorithm("local per client"))


def _std_halved(monkeypatch, owner, name: str) -> None:
    """``owner.name(self, first, std, ...)`` draws at half the ``std`` it is given."""
    real = getattr(owner, name)
    monkeypatch.setattr(
        owner, name, lambda self, first, std, *a, **k: real(self, first, 0.5 * std, *a, **k)
    )


def test_record_noise_at_half_the_std_fails(monkeypatch):
    _std_halved(monkeypatch, ClientChunk, "normal")
    with pytest.raises(invariants.InvariantViolation, match=r"\(c\) std.*round 0"):
        fit(_algorithm("record"))


def test_correlated_rows_at_half_the_std_fail(monkeypatch):
    _std_halved(monkeypatch, CorrelatedNoiseProcess, "draw")
    with pytest.raises(invariants.InvariantViolation, match=r"\(c\) std.*correlated"):
        fit(_algorithm("banded_mf"))


def test_adaptive_noise_that_does_not_follow_the_bound_fails(monkeypatch):
    """The update's std stuck at C_0's while the bound moves to C_1: caught in round 1."""
    factor = AdaptiveClip.noise_factor
    monkeypatch.setattr(
        AdaptiveClip,
        "noise_factor",
        lambda self, s: factor(self, s) * self.initial_norm / self.norm,
    )
    with pytest.raises(invariants.InvariantViolation, match=r"\(c\) std.*round 1"):
        fit(_algorithm("local", AdaptiveClip(0.05, learning_rate=1.0, count_stddev=5.0)))


# ---------------------------------------------------------------------------- (d) draws
@pytest.mark.parametrize("mechanism", ["local", "central", "banded_mf"])
def test_a_release_without_its_sum_draw_fails(mechanism, monkeypatch):
    monkeypatch.setattr(
        MessageStage, "noise_of_sum", lambda self, count, k, keyed, like: torch.zeros_like(like)
    )
    with pytest.raises(invariants.InvariantViolation, match=r"\(d\) drawn.*round 0"):
        fit(_algorithm(mechanism))


@pytest.mark.parametrize("mechanism", ["local per client", "record"])
def test_clients_without_their_own_draw_fail(mechanism, monkeypatch, one_chunk):
    """Only the first client of a chunk draws: the others' releases carry no noise."""
    normal = ClientChunk.normal

    def first_only(self, seed, std, extra=0, select=None):
        keep = torch.zeros(self.size, dtype=torch.bool)
        keep[0] = True
        if select is not None:
            keep &= select.cpu()
        out = torch.zeros(self.size if select is None else int(select.sum()), self.ctx.dim)
        drawn = normal(self, seed, std, extra, keep)
        out[: drawn.shape[0]] = drawn
        return out.to(self.ctx.dtype)

    monkeypatch.setattr(ClientChunk, "normal", first_only)
    with pytest.raises(invariants.InvariantViolation, match=r"\(d\) drawn.*round 0.*5 released"):
        fit(_algorithm(mechanism))


def test_the_expected_stds_of_each_placement():
    """(c)'s declared stds, written from the placements' definitions."""
    sigma = 2.0
    local = invariants.RunChecks("x", sigma, LocalNoise(), 1.0)
    distributed = invariants.RunChecks("x", sigma, DistributedNoise(4), 1.0)
    assert local.expected_std("client") == sigma
    assert local.expected_std("sum", 9) == pytest.approx(3 * sigma)
    assert distributed.expected_std("client") == pytest.approx(sigma / 2)
    assert distributed.expected_std("sum", 16) == pytest.approx(2 * sigma)
    assert distributed.expected_std("central") == sigma


def _grid_in_span() -> GridModule:
    """Two configurations of DP-SGD (local noise, clip 0.05) in one federation of 40 digits
    clients, each client in the span of its 6 examples (coordinates, never rows of d)."""
    torch.manual_seed(0)
    noise = DPNoise(noise_multiplier=1.0, seed=5)
    alg = DistributedDPSGD(0.5, Clip(0.05), noise=noise)
    grid = [{"step_size": 0.1}, {"step_size": 0.3}]
    return GridModule(LogisticRegression(64, 10), alg, grid=grid, client_span="on")


def _fit_grid(module: GridModule) -> None:
    partitioner = FixedSizePartitioner(examples_per_client=6, concentration=1.0, seed=0)
    data = DigitsDataModule(num_clients=40, batch_size=4, partitioner=partitioner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer(max_steps=2).fit(module, datamodule=data)


def test_a_grid_in_the_span_is_checked_configuration_by_configuration(monkeypatch):
    module = _grid_in_span()
    _fit_grid(module)
    assert all(isinstance(module.grid_rows(k), SpanRows) for k in range(2))
    counts = invariants.COUNTS  # two configurations, two rounds each, their own keys
    assert counts["drawn"] == 4 and counts["key_once"] == counts["std"] == 4, dict(counts)
    _skip_clip_for_last_client(monkeypatch)
    with pytest.raises(invariants.InvariantViolation, match=r"\(a\) bound.*round 0"):
        _fit_grid(_grid_in_span())


def test_the_command_checks_the_variable_the_mode_reads():
    """The command line refuses a bad value of the variable without importing the mode's
    module (torch): both spell the same name."""
    from pl_privfed.cli.environment import INVARIANTS_ENV

    assert INVARIANTS_ENV == invariants.ENV
