"""A catalogue of broken mechanisms for checking a privacy audit (issue 29, item 2).

Each break changes what a run does, one way at a time, and leaves the accounting untouched: the
certificate still says what the configuration asks (ε = 8 for the shipped private configs). An
audit that can fail must flag every one of them; :func:`broken` applies one for the duration of
a ``with`` block (:func:`unittest.mock.patch`, so nothing outlives the block). Used by
``tests/test_audit_breaks.py`` (a small quadratic problem) and ``benchmarks/audit_breaks.py``
(the shipped configs).

``BREAKS[name]``: ``patch`` (a function returning the ``mock.patch.object`` context),
``applies`` (where the break exists: a client-level placement, ``"local"``, ``"central"``,
``"distributed"``, ``"banded_mf"``, ``"tree_aggregation"``, or ``"record"`` for record-level
DP), ``alarm``, the part of the audit that must flag it: ``"white_box"`` (the default),
``"noise_test"`` (issue 48: the realized noise against the declared mechanism,
``tests/test_audit_noise.py``; the breaks of the draw itself: reused across rounds, correlated,
scaled for the average; at record level a client's own draw per local step, through
:meth:`ClientChunk.normal`, reused across rounds, shared by the clients, correlated across
rounds or coordinates, scaled for the average) or ``"bound"`` (issue 48: the exact per-canary check against the
declared bound, :mod:`pl_privfed.privacy.audit_bound`; one unit of a chunk unbounded), ``subset`` (issue 48: a break for some rows of one engine path only,
which canaries must land in to be seen; :data:`SKIPPED` counts the rows it touched) and, for
a break that exists only where a round has several chunks, ``client_chunk`` (the small
problem's chunk size for it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from unittest import mock

import torch

from helpers.training import trainer
from pl_privfed import FederatedModule
from pl_privfed.algorithms import DistributedDPSGD, FedAvgPerSampleClipping
from pl_privfed.callbacks import PrivacyAudit
from pl_privfed.datamodules import QuadraticDataModule
from pl_privfed.engine import ClientChunk, MessageStage
from pl_privfed.engine import round as engine_round
from pl_privfed.grads import GradientOracle
from pl_privfed.models import HalfSquaredError, QuadraticModel
from pl_privfed.operators import Clip
from pl_privfed.privacy import (
    BandedMFNoise,
    DistributedNoise,
    DPNoise,
    LocalNoise,
    TreeNoise,
    invariants,
)

EPSILON = 8.0  # the shipped private configs' target

_noise_of_sum = MessageStage.noise_of_sum
_clip_scale = Clip.scale
_distributed_std = DistributedNoise.sender_std
_normal = ClientChunk.normal
_scales = ClientChunk.scales
_chunk_ids = engine_round.chunk_ids
_oracle_clipped_mean = GradientOracle.clipped_mean


def _central_scaled(factor: Callable[[int], float]) -> Any:
    def noise_of_sum(self, count, round_index, keyed, like):
        out = _noise_of_sum(self, count, round_index, keyed, like)
        return out * factor(count) if self.placement.aggregator_draws else out

    return mock.patch.object(MessageStage, "noise_of_sum", noise_of_sum)


def _clip_times(factor: float | None) -> Any:
    def scale(self, norms):  # min(1, factor·τ/||v||), or 1 (no clip) for None
        return torch.ones_like(norms) if factor is None else _clip_scale(self, norms / factor)

    return mock.patch.object(Clip, "scale", scale)


def _record_noise_times(factor: float) -> Any:
    def normal(self, seed, std, extra=0, select=None):
        return _normal(self, seed, std * factor, extra, select)

    return mock.patch.object(ClientChunk, "normal", normal)


def _record_keyed(change: Callable[[tuple], tuple]) -> Any:
    """A client's record-level draw (:meth:`ClientChunk.normal`) from the key ``change(key)``
    instead of its own ``(seed, noise, round, client, extra)``: a key that forgets a part."""

    def normal(self, seed, std, extra=0, select=None):
        keyed = self.ctx.keyed
        self.ctx.keyed = lambda *key: keyed(*change(key))
        try:
            return _normal(self, seed, std, extra, select)
        finally:
            self.ctx.keyed = keyed

    return mock.patch.object(ClientChunk, "normal", normal)


def _record_changed(change: Callable[[ClientChunk, Any, int, Any], Any]) -> Any:
    """A client's record-level draw replaced by ``change(chunk, out, extra, ids)`` (``out`` the
    unbroken draw ``[c, d]`` of the clients ``ids``)."""

    def normal(self, seed, std, extra=0, select=None):
        out = _normal(self, seed, std, extra, select)
        ids = self.ids if select is None else self.ids[select.cpu()]
        return change(self, out, extra, ids)

    return mock.patch.object(ClientChunk, "normal", normal)


def _record_correlated_across_rounds(rho: float) -> Any:
    """Each client's draw at a step ``ρ z_{k−1} + √(1−ρ²) e_k``, ``z_{k−1}`` its draw at the
    same step of its previous round (a noise state carried over per client)."""
    last: dict[tuple[int, int], Any] = {}

    def change(chunk, out, extra, ids):
        z = out.clone()
        for row, client in zip(z, ids.tolist()):
            prev = last.get((client, extra))
            if prev is not None:
                row.mul_(math.sqrt(1 - rho * rho)).add_(prev, alpha=rho)
            last[(client, extra)] = row.clone()
        return z

    return _record_changed(change)


#: rows a subset break left unbounded in the last ``with broken(...)`` block (client messages,
#: or clients whose records skipped the clip; ``benchmarks/audit_breaks.py`` reports "n/a" for a
#: subset break that touched none)
SKIPPED = [0]


def _bounding(operator: Any) -> bool:
    """Whether ``operator`` is what bounds a client's message (a clip, an adaptive clip, the
    α-NormEC family's smoothed normalization): norm-based, with a bound, not the identity."""
    return bool(operator.norm_based) and operator.bound is not None and not operator.is_identity


def _clip_skipped_on(rows_of: Callable[[ClientChunk], Any]) -> Any:
    """The client's bounding operator (its clip, or the smoothed normalization that bounds
    α-NormEC's messages) skipped on one engine path: for the rows ``rows_of(chunk)`` of a
    chunk's client messages (an index, or ``None`` for none) the operator's scale is left at
    the factor, as a branch that forgot the clip would; every other row, and the accounting,
    as they were."""

    def scales(self, operator, v, *, factor=1.0, statistics=True):
        scale = _scales(self, operator, v, factor=factor, statistics=statistics)
        rows = rows_of(self) if _bounding(operator) and v.dim() == 2 else None
        if scale is not None and rows is not None:
            scale = scale.clone()
            scale[rows] = factor
            SKIPPED[0] += int(scale[rows].numel())
        return scale

    return mock.patch.object(ClientChunk, "scales", scales)


def _last_client_records_unclipped() -> Any:
    """The per-example clip skipped for the records of each oracle call's last client: the
    oracle's clipped mean (:meth:`GradientOracle.clipped_mean`, every per-example clipped run
    of a model) never puts that client's examples through the operator's scale (an
    off-by-one in a loop over the clients), so they keep their norms; every other client's
    records, and the accounting, as they were."""

    def clipped_mean(self, params, inputs, targets, scale, *args, **kwargs):
        clients, batch = inputs.shape[:2]
        done = [0]

        def forgetful(norms):
            rows = norms.reshape(-1, batch)
            done[0] += rows.shape[0]
            if done[0] < clients:
                return scale(norms)
            out = torch.ones_like(rows)
            if rows.shape[0] > 1:
                out[:-1] = scale(rows[:-1]).reshape(-1, batch)
            SKIPPED[0] += 1
            return out.reshape(norms.shape)

        return _oracle_clipped_mean(self, params, inputs, targets, forgetful, *args, **kwargs)

    return mock.patch.object(GradientOracle, "clipped_mean", clipped_mean)


def _last_record_unclipped() -> Any:
    """The per-example clip skipped for one record of each call: the clip's scale over a
    ``[clients, examples]`` block of per-example norms leaves its last element at 1 (a kernel
    whose loop stops one short), so the last client's last record of every chunk keeps its
    norm; the clients' messages (one norm each), every other record, and the accounting, as
    they were."""

    def scale(self, norms):
        out = _clip_scale(self, norms)
        if norms.dim() == 2 and norms.numel():
            out = out.clone()
            out[-1, -1] = 1.0
            SKIPPED[0] += 1
        return out

    return mock.patch.object(Clip, "scale", scale)


@contextmanager
def _last_chunk_unclipped() -> Iterator[None]:
    """The round's last chunk skips the client clip (a branch for the partial last chunk that
    forgot it): the engine's chunking is watched for the round's last piece."""
    last: dict[str, Any] = {}

    def chunk_ids(ids, size):
        pieces = _chunk_ids(ids, size)
        last["ids"] = pieces[-1] if pieces else None
        return pieces

    with ExitStack() as stack:
        stack.enter_context(mock.patch.object(engine_round, "chunk_ids", chunk_ids))
        stack.enter_context(
            _clip_skipped_on(lambda chunk: slice(None) if chunk.ids is last.get("ids") else None)
        )
        yield


def _remainder(chunk: ClientChunk) -> Any:
    """A chunk's rows past its last full block of 8 (a vectorized kernel's remainder)."""
    tail = chunk.size % 8
    return slice(chunk.size - tail, None) if tail else None


def _last_row(chunk: ClientChunk) -> Any:
    """A chunk's last row (a loop over the clients that stops one short)."""
    return slice(chunk.size - 1, None)


def _noise_of_sum_patched(change: Callable[[Any, Any, int, int, Callable[[int], Any]], Any]) -> Any:
    """``noise_of_sum`` replaced by ``change(stage, out, round, count, draw)``, ``draw(k)`` the
    unbroken draw of round ``k`` (every placement: the senders' sum, the aggregator's draw, the
    correlated process's row)."""

    def noise_of_sum(self, count, round_index, keyed, like):
        def draw(k):
            return _noise_of_sum(self, count, k, keyed, like)

        return change(self, draw(round_index), round_index, count, draw)

    return mock.patch.object(MessageStage, "noise_of_sum", noise_of_sum)


def _correlated_across_rounds(rho: float) -> Any:
    """Each round's draw ``ρ z_{k−1} + √(1−ρ²) e_k``: the right variance, rounds correlated
    (a noise state carried over, as a buggy stateful generator would)."""
    last: dict[str, Any] = {}

    def change(stage, out, round_index, count, draw):
        prev = last.get("z")
        z = out if prev is None else rho * prev + math.sqrt(1 - rho * rho) * out
        last["z"] = z
        return z

    return _noise_of_sum_patched(change)


def _correlated_coordinates(stage, out, round_index, count, draw):
    """Odd coordinates copy the even ones before them: each coordinate's variance is right,
    pairs of coordinates are one draw."""
    z = out.clone()
    half = z.numel() // 2 * 2
    z.view(-1)[1:half:2] = z.view(-1)[0:half:2]
    return z


CLIENT = ("local", "central", "distributed")
#: the placements the noise breaks apply to: every placement whose sum's draw is noise_of_sum
NOISE_DRAWN = (*CLIENT, "banded_mf", "tree_aggregation")
BREAKS: dict[str, dict[str, Any]] = {
    "noise x0.5": {
        "applies": ("local",),
        "patch": lambda: mock.patch.object(LocalNoise, "sender_std", lambda self, s: 0.5 * s),
    },
    "central noise x0.5": {
        "applies": ("central",),
        "patch": lambda: _central_scaled(lambda n: 0.5),
    },
    "shares x0.5": {
        "applies": ("distributed",),
        "patch": lambda: mock.patch.object(
            DistributedNoise, "sender_std", lambda self, s: 0.5 * _distributed_std(self, s)
        ),
    },
    "shares at sigma^2/t^2": {
        "applies": ("distributed",),
        "patch": lambda: mock.patch.object(
            DistributedNoise, "sender_std", lambda self, s: s / self.min_contributors
        ),
    },
    "central noise on the average": {
        "applies": ("central",),
        "patch": lambda: _central_scaled(lambda n: 1.0 / max(1, n)),
    },
    # issue 48: breaks of the draw itself, which the noise test catches (the white box need not)
    "draw reused across rounds": {  # a noise key that forgets the round
        "applies": NOISE_DRAWN,
        "alarm": "noise_test",
        "patch": lambda: _noise_of_sum_patched(lambda st, out, k, n, draw: draw(0)),
    },
    "draws correlated across rounds": {
        "applies": NOISE_DRAWN,
        "alarm": "noise_test",
        "patch": lambda: _correlated_across_rounds(0.5),
    },
    "draws correlated across coordinates": {
        "applies": NOISE_DRAWN,
        "alarm": "noise_test",
        "patch": lambda: _noise_of_sum_patched(_correlated_coordinates),
    },
    "noise on the average": {  # the sum's draw scaled for the mean of its n senders
        "applies": ("local", "distributed", "banded_mf", "tree_aggregation"),
        "alarm": "noise_test",
        "patch": lambda: _noise_of_sum_patched(lambda st, out, k, n, draw: out / max(1, n)),
    },
    "client clip skipped": {"applies": CLIENT, "patch": lambda: _clip_times(None)},
    "client clip at 2x": {"applies": CLIENT, "patch": lambda: _clip_times(2.0)},
    "client clip skipped in the last chunk": {
        "subset": True,
        "applies": CLIENT,
        "patch": _last_chunk_unclipped,
        "client_chunk": 8,
    },
    "client clip skipped in a chunk's remainder": {
        "subset": True,
        "applies": CLIENT,
        "patch": lambda: _clip_skipped_on(_remainder),
    },
    # issue 48: one unit of a chunk left unbounded, the round in one chunk: a canary lands
    # there every round (the covering places, a host's last place), but it is one canary of
    # fifty, which the pooled tests dilute; the exact per-canary check against the declared
    # bound must flag it (``alarm: bound``)
    "client clip skipped for a chunk's last client": {
        "subset": True,
        "applies": (*CLIENT, "banded_mf", "tree_aggregation"),
        "alarm": "bound",
        "patch": lambda: _clip_skipped_on(_last_row),
    },
    "per-example clip skipped for one record of a chunk": {
        "applies": ("record",),
        "subset": True,
        "alarm": "bound",
        "patch": _last_record_unclipped,
    },
    "record noise x0.5": {"applies": ("record",), "patch": lambda: _record_noise_times(0.5)},
    # issue 48: the per-example clip skipped for some real records on the real path (the canary
    # records are records of that path, their norms in the oracle's calls of the scale)
    "per-example clip skipped for a chunk's last client": {
        "applies": ("record",),
        "subset": True,
        "patch": _last_client_records_unclipped,
        "client_chunk": 4,  # the small problem's 10 clients in chunks of 4, 4 and 2
    },
    # issue 48: breaks of a client's record-level draw (per client and local step, added to
    # its clipped gradient), which the record-level noise test catches
    "record draw reused across rounds": {  # a client's noise key that forgets the round
        "applies": ("record",),
        "alarm": "noise_test",
        "patch": lambda: _record_keyed(lambda key: (*key[:2], 0, *key[3:])),
    },
    "record draw shared by the clients": {  # a noise key that forgets the client
        "applies": ("record",),
        "alarm": "noise_test",
        "patch": lambda: _record_keyed(lambda key: (*key[:3], 0, *key[4:])),
    },
    "record draws correlated across rounds": {
        "applies": ("record",),
        "alarm": "noise_test",
        "patch": lambda: _record_correlated_across_rounds(0.5),
    },
    "record draws correlated across coordinates": {
        "applies": ("record",),
        "alarm": "noise_test",
        "patch": lambda: _record_changed(
            lambda chunk, out, extra, ids: _correlated_coordinates(None, out, 0, 0, None)
        ),
    },
    "record noise on the average": {  # each client's draw scaled for the mean of the n clients
        "applies": ("record",),
        "alarm": "noise_test",
        "patch": lambda: _record_changed(lambda chunk, out, extra, ids: out / chunk.ctx.clients),
    },
    "per-example clip skipped": {"applies": ("record",), "patch": lambda: _clip_times(None)},
    "record clip at 2x": {"applies": ("record",), "patch": lambda: _clip_times(2.0)},
}


#: the catalogue's small problem (tests, and the false-alarm rate of benchmarks/audit_breaks.py):
#: an algorithm from its noise settings, and the noise settings of each mechanism
MECHANISMS = {
    "local": (lambda noise: DistributedDPSGD(0.5, Clip(1.0), noise=noise), {"placement": "local"}),
    "central": (
        lambda noise: DistributedDPSGD(0.5, Clip(1.0), noise=noise),
        {"placement": "central"},
    ),
    "distributed": (  # t = n/2, as the shipped configs: the sum holds 2σ², the certificate
        # counts σ² (the t honest shares the white-box auditor cannot subtract)
        lambda noise: DistributedDPSGD(0.5, Clip(1.0), noise=noise),
        {"placement": "distributed", "min_contributors": 5},
    ),
    "record": (
        lambda noise: FedAvgPerSampleClipping(
            0.5, clip_threshold=1.0, clip_level="example", noise=noise
        ),
        {},
    ),
}


#: correlated noise on the small problem (the noise test's; every client every round)
CORRELATED = {
    "banded_mf": (
        lambda noise: DistributedDPSGD(0.5, Clip(1.0), noise=noise),
        {"placement": BandedMFNoise(bands=4)},
    ),
    "tree_aggregation": (
        lambda noise: DistributedDPSGD(0.5, Clip(1.0), noise=noise),
        {"placement": TreeNoise()},
    ),
}


def cases(alarm: str) -> list[tuple[str, str]]:
    """``(break, mechanism)`` for every break the catalogue expects ``alarm`` to flag, on every
    mechanism it applies to (the parametrization of the suite's catalogue tests)."""
    return [
        (name, mechanism)
        for name, spec in BREAKS.items()
        if spec.get("alarm") == alarm
        for mechanism in spec["applies"]
    ]


def audit_small(
    mechanism: str,
    *,
    noise_seed: int = 0,
    audit_seed: int = 0,
    dim: int = 2000,
    client_chunk: int | str = "auto",
    rounds: int = 50,
    callbacks: tuple = (),
    ckpt_path: str | None = None,
    **trainer_args: Any,
):
    """One run of the catalogue's small problem (a 2,000-dimensional quadratic, 10 clients,
    every client every round, 50 rounds) at ε = 8 with a :class:`PrivacyAudit`: its report.
    The round is one chunk (its 10 clients and the canary clients that take part) unless
    ``client_chunk`` says otherwise; ``callbacks``, ``ckpt_path`` and ``trainer_args`` go to
    the trainer and its fit (a checkpointed or resumed run)."""
    build, settings = {**MECHANISMS, **CORRELATED}[mechanism]
    noise = DPNoise(epsilon=EPSILON, delta=1e-5, calibration="target", seed=noise_seed, **settings)
    module = FederatedModule(
        QuadraticModel(dim), build(noise), criterion=HalfSquaredError(), client_chunk=client_chunk
    )
    audit = PrivacyAudit(seed=audit_seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the alarm is read from the report
        trainer(max_steps=rounds, callbacks=[audit, *callbacks], **trainer_args).fit(
            module,
            datamodule=QuadraticDataModule(num_clients=10, dim=dim, seed=0),
            ckpt_path=ckpt_path,
        )
    return audit.report()


@contextmanager
def broken(name: str) -> Iterator[None]:
    """Run the ``with`` block with break ``name`` of :data:`BREAKS` applied, the privacy
    invariants' check mode off (it would stop the broken run, which the audit must read)."""
    SKIPPED[0] = 0
    with invariants.disabled(), BREAKS[name]["patch"]():
        yield


def mechanism_of(placement: str | None, record: bool) -> str:
    """The catalogue's name of a run's mechanism: its placement, or ``"record"``."""
    return "record" if record else str(placement)
