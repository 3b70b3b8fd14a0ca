"""Where a round's time goes with the layer-rule backend (``grad_backend: layers``).

Runs ``FederatedModule`` on MNIST (IID, B = 32, one local step) with the model and workload of
``benchmarks/peers.py`` under ``torch.profiler`` and splits the timed rounds into the layer
rules' phases (the labels :mod:`pl_privfed.layer_rules` records: ``forward_backward``, the one
batched forward/backward that captures every layer's input and output gradient; ``norms``, the
per-example norms; ``clipped_sums``, the reweighted reduction; ``client_sums``, the per-client
sums of a non-private round) and the rest (the algorithm's own work: local step, noise,
messages; the engine; the data), beside the floor: one centralized forward/backward over the
same examples, timed in the same process. One thread. Usage::

    python benchmarks/layer_profile.py --model cnn --workload per_example_dp --clients 10
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_artefact import Artefact, add_json_argument  # noqa: E402

LABELS = ("forward_backward", "norms", "clipped_sums", "client_sums", "one_client")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=("mlp", "cnn", "text"))
    parser.add_argument(
        "--workload", default="per_example_dp", choices=("fedavg", "per_example_dp")
    )
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-steps", type=int, default=1, help="T (FedAvg's local steps)")
    parser.add_argument("--ops", type=int, default=0, help="also print the N costliest operators")
    parser.add_argument("--rounds", type=int, default=4, help="profiled rounds (after one warm-up)")
    add_json_argument(parser)
    args = parser.parse_args()
    record = Artefact("layer_profile")
    os.environ.setdefault("PL_PRIVFED_DATA", str(ROOT.parent / "shared" / "data"))
    import peers
    import pytorch_lightning as pl
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pl_privfed import FederatedModule

    torch.set_num_threads(1)
    spec = dict(workload=args.workload, n=args.clients, T=args.local_steps, rounds=args.rounds + 1, warmup=1,
                cache=tempfile.mkdtemp(prefix="layer-profile-"), model=args.model)  # fmt: skip
    dm = peers._data(spec)
    module = FederatedModule(peers._model(spec), peers._algorithm(spec))
    ends: list[float] = []
    prof = profile(activities=[ProfilerActivity.CPU])

    class Hook(pl.Callback):
        def on_train_batch_end(self, trainer, *rest) -> None:
            ends.append(time.perf_counter())
            if len(ends) == 1:
                prof.__enter__()

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=args.rounds + 1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                         callbacks=[Hook()])  # fmt: skip
    trainer.fit(module, datamodule=dm)
    prof.__exit__(None, None, None)
    rounds = len(ends) - 1
    total = (ends[-1] - ends[0]) / rounds
    phases = {label: 0.0 for label in LABELS}
    for event in prof.key_averages():
        name = event.key.removeprefix("layer_rules.")
        if name in phases:
            phases[name] = event.cpu_time_total / 1e6 / rounds

    model = peers._model(spec)
    idx = dm.round_indices(0).reshape(-1)
    x, y = dm.train_inputs[idx], dm.train_targets[idx]
    criterion = torch.nn.CrossEntropyLoss()

    def central() -> None:
        model.zero_grad()
        criterion(model(x), y).backward()

    central()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        central()
        times.append(time.perf_counter() - start)
    floor = sorted(times)[2]
    print(f"# {args.model}, {args.workload}, {args.clients} clients × 32 × T = {args.local_steps}, "
          "backend "
          f"{module.oracle.backend}, chunk {module.chunk_size()}, rules "
          f"{module.oracle._example_layers.modes() if module.oracle._example_layers else None}; "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'part':>34} {'s/round':>8} {'share':>6} {'× floor':>8}")
    rest = total - sum(phases.values())
    rows = [*((f"layer rules: {k}", v) for k, v in phases.items() if v),
            ("the rest (algorithm, engine, data)", rest), ("round", total),
            ("floor: one centralized fwd/bwd", floor)]  # fmt: skip
    table = record.table(
        f"{args.model}_{args.workload}",
        ["model, workload", "n × T", "part", "s/round", "share of the round", "× floor"],
    )
    for name, value in rows:
        print(f"{name:>34} {value:8.4f} {value / total:6.1%} {value / floor:8.2f}")
        cells = f"{args.clients} × {args.local_steps}", name, value, value / total, value / floor
        table.append([f"{args.model}, {args.workload}", *cells])
    record.write(args.json)
    if args.ops:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.ops))


if __name__ == "__main__":
    main()
