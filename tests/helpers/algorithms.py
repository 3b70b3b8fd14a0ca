"""Plain references of the algorithms on quadratic clients f_i(x) = ½||x − b_i||²."""

import math

import torch

from helpers.noise import client_noise, noise_sum
from pl_privfed.engine import run_round

DT = torch.float64
ROUNDS = 25


def problem(n=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(n, d, generator=g, dtype=DT) * 3
    x0 = torch.randn(d, generator=g, dtype=DT)
    return b, x0


def grad_fn_for(b):
    def grad_fn(params, clients=None):
        rows = b if clients is None else b[clients]
        return (params.unsqueeze(0) if params.dim() == 1 else params) - rows

    return grad_fn


def run(alg, b, x0, rounds=ROUNDS, chunk=None):
    alg.setup(num_clients=b.shape[0], dim=b.shape[1], num_rounds=rounds, dtype=DT)
    x, xs = x0.clone(), []
    for _ in range(rounds):
        x = run_round(alg, x, grad_fn_for(b), chunk_size=chunk).params
        xs.append(x.clone())
    return xs


# ---------------------------------------------------------------------------- plain references
def norm(v):
    return math.sqrt(sum(c * c for c in v))


def smoothed(v, alpha):
    s = alpha + norm(v)
    return [c / s for c in v] if s > 0 else [0.0] * len(v)


def ref_error_feedback(
    b, x0, psi, beta, gamma, sn, rounds, init="zeros", std=0.0, seed=0, D=0.0, draws="aggregate"
):
    n, d = b.shape
    b = b.tolist()
    x = x0.tolist()

    def grad(i, x):
        return [x[j] - b[i][j] for j in range(d)]

    if init == "zeros":
        g = [[0.0] * d for _ in range(n)]
    else:
        g = [grad(i, x) for i in range(n)]
        if init == "gradient_offset":
            for i in range(n):
                g[i][0] += D / math.sqrt(rounds + 1)
    ghat = [sum(g[i][j] for i in range(n)) / n for j in range(d)]
    out = []
    for k in range(rounds):
        per_client = std > 0 and draws == "per_client"
        sent_sum = [0.0] * d
        for i in range(n):  # each client
            delta = psi([grad(i, x)[j] - g[i][j] for j in range(d)])
            g[i] = [g[i][j] + beta * delta[j] for j in range(d)]
            z = client_noise(seed, k, i, d, std) if per_client else [0.0] * d
            sent = [delta[j] + z[j] for j in range(d)]
            sent_sum = [sent_sum[j] + sent[j] for j in range(d)]
        if std > 0 and not per_client:  # the clients' noises, drawn as their sum
            total = noise_sum(seed, k, n, d, std)
            sent_sum = [sent_sum[j] + total[j] for j in range(d)]
        ghat = [ghat[j] + beta / n * sent_sum[j] for j in range(d)]
        if sn:
            ng = norm(ghat)
            step = [c / ng for c in ghat] if ng > 0 else [0.0] * d
        else:
            step = ghat
        x = [x[j] - gamma * step[j] for j in range(d)]
        out.append(torch.tensor(x, dtype=DT))
    return out
