"""One client's step, interleaved in one process: the layer rules against a plain PyTorch step
and Opacus's ghost clipping (the shared machine's load changes between processes; alternating
the systems call by call in one process keeps their ratios comparable).

For each model (``benchmarks/peers.py``'s: ``mlp``, ``cnn``, ``text``) on one client's MNIST
minibatch (B = 32), the median over ``--repeats`` of

* ``plain``: ``model`` forward/backward and an SGD step (a plain loop's work per client);
* ``layers``: ``grad_backend: layers``, the client's gradient (``LayerGradients``, shared
  parameters) and the SGD step on the flat vector;
* ``plain_dp_floor``: as ``plain`` plus one Gaussian draw of size ``d`` (what any private step
  pays for its noise);
* ``opacus_ghost``: Opacus's fast gradient clipping step (``GradSampleModuleFastGradientClipping``
  with ghost clipping, ``DPLossFastGradientClipping``, ``DPOptimizerFastGradientClipping``:
  norms, a second backward, noise, the step);
* ``layers_dp``: the clipped mean of the layer rules, one Gaussian draw of size ``d`` and the
  step;
* ``opacus_hooks``: Opacus's ``GradSampleModule`` and ``DPOptimizer`` (per-sample gradients).

Ratios are of the minima over the repeats (medians printed beside them).

Every call starts from the same parameters (reset outside the timing). One thread. Usage: ``python benchmarks/layer_rules.py --models cnn text mlp --repeats 30``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_artefact import Artefact, add_json_argument  # noqa: E402

LR, CLIP, NOISE, BATCH = 0.1, 1.0, 1.0, 32


def systems(kind: str, x, y):
    import peers
    import torch
    from opacus import GradSampleModule
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    from pl_privfed.layer_rules import LayerGradients
    from pl_privfed.operators import Clip

    spec = {"model": kind}
    criterion = torch.nn.CrossEntropyLoss()
    plain_model = peers._model(spec)
    plain_opt = torch.optim.SGD(plain_model.parameters(), lr=LR)
    d = sum(p.numel() for p in plain_model.parameters())

    def plain(noise: bool = False):
        plain_opt.zero_grad()
        criterion(plain_model(x), y).backward()
        if noise:
            torch.randn(d)
        plain_opt.step()

    rules = LayerGradients(peers._model(spec), criterion)
    flat = torch.cat([p.detach().reshape(-1) for p in rules.model.parameters()])
    xs, ys = x.unsqueeze(0), y.unsqueeze(0)
    scale = Clip(CLIP).scale

    def layers():
        grads, _ = rules(flat, xs, ys)
        flat.sub_(grads[0], alpha=LR)

    def layers_dp():
        grads, _, _ = rules.clipped_mean(flat, xs, ys, scale)
        flat.sub_(grads[0].add_(torch.randn(d), alpha=NOISE * CLIP / BATCH), alpha=LR)

    ghost = GradSampleModuleFastGradientClipping(peers._model(spec), max_grad_norm=CLIP,
                                                 use_ghost_clipping=True)  # fmt: skip
    ghost_opt = DPOptimizerFastGradientClipping(torch.optim.SGD(ghost.parameters(), lr=LR),
                                                noise_multiplier=NOISE, max_grad_norm=CLIP,
                                                expected_batch_size=BATCH)  # fmt: skip
    ghost_loss = DPLossFastGradientClipping(ghost, ghost_opt, torch.nn.CrossEntropyLoss())

    def opacus_ghost():
        ghost_opt.zero_grad()
        ghost_loss(ghost(x), y).backward()
        ghost_opt.step()

    hooks = GradSampleModule(peers._model(spec))
    hooks_opt = DPOptimizer(torch.optim.SGD(hooks.parameters(), lr=LR), noise_multiplier=NOISE,
                            max_grad_norm=CLIP, expected_batch_size=BATCH)  # fmt: skip

    def opacus_hooks():
        hooks_opt.zero_grad()
        criterion(hooks(x), y).backward()
        hooks_opt.step()

    start = [p.detach().clone() for p in plain_model.parameters()]
    flat0 = flat.clone()

    @torch.no_grad()
    def reset() -> None:
        """Every system back to the same initial parameters (untimed): noisy steps drift the
        parameters to where float32 denormals slow every system down."""
        flat.copy_(flat0)
        for module in (plain_model, ghost, hooks):
            for p, p0 in zip(module.parameters(), start):
                p.copy_(p0)

    fns = {
        "plain": plain,
        "layers": layers,
        "plain_dp_floor": lambda: plain(True),
        "opacus_ghost": opacus_ghost,
        "layers_dp": layers_dp,
        "opacus_hooks": opacus_hooks,
    }
    return fns, d, reset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "text", "mlp"])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument(
        "--flush-denormal",
        action="store_true",
        help="torch.set_flush_denormal(True) (float32 denormals flushed to 0)",
    )
    add_json_argument(parser)
    args = parser.parse_args()
    record = Artefact("layer_rules")
    os.environ.setdefault("PL_PRIVFED_DATA", str(ROOT.parent / "shared" / "data"))
    import peers
    import torch

    torch.set_num_threads(1)
    if args.flush_denormal:
        torch.set_flush_denormal(True)
    import tempfile

    dm = peers._data(dict(n=10, T=1, cache=tempfile.mkdtemp(prefix="layer-rules-")))
    idx = dm.round_indices(0).reshape(10, BATCH)[0]
    x, y = dm.train_inputs[idx], dm.train_targets[idx]
    names = ["plain", "layers", "plain_dp_floor", "opacus_ghost", "layers_dp", "opacus_hooks"]
    table = record.table(
        "steps",
        [
            "model",
            "d",
            *(f"{name} ms" for name in names),
            "layers / plain",
            "layers_dp / opacus_ghost",
            "layers_dp / layers",
            "load",
        ],
    )
    for kind in args.models:
        fns, d, reset = systems(kind, x, y)
        names = list(fns)
        for fn in fns.values():  # warm-up
            reset()
            fn()
        times = {name: [] for name in names}
        for rep in range(args.repeats):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                reset()
                start = time.perf_counter()
                fns[name]()
                times[name].append(time.perf_counter() - start)
        # the minimum: on a shared machine a call is often preempted (a time slice of another
        # process, several ms), which the median of short calls does not remove
        med = {name: min(v) for name, v in times.items()}
        medians = {name: statistics.median(v) for name, v in times.items()}
        print(f"\n## {kind} (d = {d:,}), one client step, B = {BATCH}, minimum (median) of "
              f"{args.repeats} interleaved; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        for name in names:
            print(f"{name:>15} {med[name] * 1e3:9.2f} ms ({medians[name] * 1e3:.2f})")
        print(
            f"layers / plain: {med['layers'] / med['plain']:.2f}x; "
            f"layers_dp / opacus_ghost: {med['layers_dp'] / med['opacus_ghost']:.2f}x; "
            f"layers_dp / opacus_hooks: {med['layers_dp'] / med['opacus_hooks']:.2f}x; "
            f"layers_dp / layers: {med['layers_dp'] / med['layers']:.2f}x; "
            f"layers_dp / plain_dp_floor: {med['layers_dp'] / med['plain_dp_floor']:.2f}x"
        )
        sys.stdout.flush()
        ratios = [
            med["layers"] / med["plain"],
            med["layers_dp"] / med["opacus_ghost"],
            med["layers_dp"] / med["layers"],
        ]
        table.append([kind, d, *(1e3 * med[name] for name in names), *ratios, os.getloadavg()[0]])
    record.write(args.json)


if __name__ == "__main__":
    main()
