"""Client streams: the vectorized ``ClientStreams`` against the per-client loop, in one process.

Two measurements, each a ratio of new to old timed in the same process (the machine is shared:
the load average, ``os.getloadavg()``, is printed beside every figure):

* ``indices``: one round's training indices for ``n`` clients of ``size`` examples, asked chunk
  by chunk as the engine asks them, by :class:`~pl_privfed.datamodules.ClientStreams` (new) and
  :class:`~pl_privfed.datamodules.ReferenceClientStreams` (the per-client loop it replaced);
* ``round``: the median wall time of a round of a config (default: the quickstart, 10,000
  clients) in a real Trainer after a warm-up, with the datamodule's streams swapped between the
  two; fits alternate old, new, old, new, and the final parameters of every fit are compared
  (the streams are the same, so the iterates are too).

Usage::

    python benchmarks/streams.py                          # 10,000 and 100,000 clients + quickstart
    python benchmarks/streams.py --clients 10000 --no-round
    python benchmarks/streams.py --threads 1              # torch on one thread

Needs MNIST under ``$PL_PRIVFED_DATA`` for the round.
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import time

import numpy as np
import pytorch_lightning as pl
import torch
from bench_artefact import Artefact, add_json_argument
from noise_placement import RoundTimer  # benchmarks/ is the script's own folder

from pl_privfed.datamodules import ClientStreams, ReferenceClientStreams


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def time_indices(clients: int, size: int, batch: int, chunk: int, rounds: int) -> dict[str, float]:
    """Median seconds of one round's indices, asked ``chunk`` clients at a time."""
    shards = [np.arange(size * i, size * (i + 1)) for i in range(clients)]
    chunks = torch.arange(clients).split(chunk)
    out = {}
    for name, cls in (("old", ReferenceClientStreams), ("new", ClientStreams)):
        streams = cls(shards, batch, seed=0)
        times = []
        for k in range(rounds + 1):  # round 0 warms up
            start = time.perf_counter()
            for ids in chunks:
                streams.indices(k, ids)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times[1:])
    return out


def time_rounds(config: str, warmup: int, rounds: int, repeats: int) -> dict[str, object]:
    """Median seconds per round of ``config`` with the old and the new streams."""
    from pl_privfed.cli.app import PrivFedCLI

    cli = PrivFedCLI(args=["--config", config, "--trainer.logger", "false"], run=False)
    dm, model = cli.datamodule, cli.model
    dm.setup("fit")
    new = dm.streams
    old = ReferenceClientStreams(dm.shards, new.batch_size, new.seed, new.shuffle, new.sampling)
    log_every = cli.trainer.log_every_n_steps
    times: dict[str, list[float]] = {"old": [], "new": []}
    params: dict[str, list[torch.Tensor]] = {"old": [], "new": []}
    for _ in range(repeats):
        for name, streams in (("old", old), ("new", new)):
            dm.streams = streams
            module = copy.deepcopy(model)
            timer = RoundTimer()
            trainer = pl.Trainer(
                accelerator="cpu", devices=1, max_steps=warmup + rounds, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=0,
                num_sanity_val_steps=0, log_every_n_steps=log_every, callbacks=[timer],
                enable_model_summary=False,
            )  # fmt: skip
            trainer.fit(module, datamodule=dm)
            times[name] += timer.times[warmup:]
            params[name].append(torch.cat([p.detach().flatten() for p in module.parameters()]))
    same = all(torch.equal(p, params["old"][0]) for p in params["old"] + params["new"])
    return {
        "old": statistics.median(times["old"]),
        "new": statistics.median(times["new"]),
        "rounds": len(times["new"]),
        "chunk": module._chunk_size,
        "same": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--size", type=int, default=5, help="examples per client")
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--chunk", type=int, default=88, help="clients per indices call")
    parser.add_argument("--index-rounds", type=int, default=5)
    parser.add_argument("--config", default="configs/quickstart.yaml")
    parser.add_argument("--no-round", action="store_true", help="time the indices only")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds per fit")
    parser.add_argument("--repeats", type=int, default=2, help="fits per streams (alternating)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    add_json_argument(parser)
    args = parser.parse_args()
    record = Artefact("streams")
    table = record.table("streams", ["what", "old ms", "new ms", "new / old", "load after"])
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# {platform.machine()} {platform.processor() or ''}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, threads={torch.get_num_threads()}; {load()}"
    )
    for n in args.clients:
        t = time_indices(n, args.size, args.batch, args.chunk, args.index_rounds)
        print(
            f"indices n={n} size={args.size} B={args.batch} chunk={args.chunk}: "
            f"old {t['old'] * 1e3:.1f} ms, new {t['new'] * 1e3:.1f} ms, "
            f"new/old {t['new'] / t['old']:.3f}; {load()}"
        )
        row = [1e3 * t["old"], 1e3 * t["new"], t["new"] / t["old"], os.getloadavg()[0]]
        table.append([f"indices, {n:,} clients", *row])
    if not args.no_round:
        r = time_rounds(args.config, args.warmup, args.rounds, args.repeats)
        print(
            f"round {args.config} (chunk {r['chunk']}, median of {r['rounds']} rounds each): "
            f"old {r['old'] * 1e3:.0f} ms, new {r['new'] * 1e3:.0f} ms, "
            f"new/old {r['new'] / r['old']:.3f}, same parameters: {r['same']}; {load()}"
        )
        row = [1e3 * r["old"], 1e3 * r["new"], r["new"] / r["old"], os.getloadavg()[0]]
        table.append([f"round of {args.config} (chunk {r['chunk']})", *row])
        record.note("streams", "every fit ended at the same parameters", r["same"])
    record.write(args.json)


if __name__ == "__main__":
    main()
