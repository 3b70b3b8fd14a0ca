"""The noise the references draw: the same keyed streams as the package's
(:mod:`pl_privfed.rng`), so that a reference and a run share the noise definition (the
seed and the key) and nothing else."""

import math

import torch

from pl_privfed.rng import STREAM_CENTRAL_NOISE, STREAM_NOISE, STREAM_SERVER_NOISE, stream_key


def client_noise(seed, round_index, client, dim, std, extra=0, dtype=torch.float64):
    """Client ``client``'s ``N(0, std² I)`` draw in round ``round_index`` (``extra``: local step)."""
    gen = torch.Generator().manual_seed(stream_key(seed, STREAM_NOISE, round_index, client, extra))
    return torch.empty(dim, dtype=dtype).normal_(0.0, std, generator=gen).tolist()


def noise_sum(seed, round_index, count, dim, std, dtype=torch.float64):
    """The server's draw of ``Σ_{i ≤ count} z_i ~ N(0, count·std² I)`` in round ``round_index``."""
    if count == 0:
        return [0.0] * dim
    gen = torch.Generator().manual_seed(stream_key(seed, STREAM_SERVER_NOISE, round_index))
    scale = std * math.sqrt(count)
    return torch.empty(dim, dtype=dtype).normal_(0.0, scale, generator=gen).tolist()


def server_noise(seed, round_index, dim, std, dtype=torch.float64):
    """The trusted aggregator's own ``N(0, std² I)`` draw on the sum in round ``round_index``
    (central noise: its own stream, never the clients' noise sum's)."""
    gen = torch.Generator().manual_seed(stream_key(seed, STREAM_CENTRAL_NOISE, round_index))
    return torch.empty(dim, dtype=dtype).normal_(0.0, std, generator=gen).tolist()


def share_noise(seed, round_index, client, dim, std, t, dtype=torch.float64):
    """Client ``client``'s share ``N(0, std²/t · I)`` of distributed noise in round
    ``round_index`` (its own stream, as :func:`client_noise`)."""
    return client_noise(seed, round_index, client, dim, std / math.sqrt(t), dtype=dtype)


def share_noise_sum(seed, round_index, count, dim, std, t, dtype=torch.float64):
    """The server's draw of the sum of ``count`` senders' shares, ``N(0, count·std²/t · I)``
    (``draws: aggregate``; the clients' noise-sum stream, as :func:`noise_sum`)."""
    return noise_sum(seed, round_index, count, dim, std / math.sqrt(t), dtype=dtype)
