"""Past one process and one memory: clients sharded over DDP processes, and large populations.

Two measurements, printed as tables (nothing here is a timed test):

* ``--ddp``: α-NormEC (β = 0.1, α = 0.01, full participation) on MNIST with the MLP
  784-200-200-10 (d = 199,210) and 1,000 IID clients of B = 32, on 1 process and on 2 processes
  (``torchrun --nproc_per_node 2``, ``Trainer(strategy="ddp")``, gloo, one torch thread each):
  the median round time, the throughput ratio (2 processes vs 1) and the per-rank bytes of
  client state;
* ``--population``: Fed-α-NormEC with cohorts (``participation: practical`` — only the sampled
  clients compute and update their memory, α-NormEC with partial participation; Bernoulli
  sampling with ``p = m/N`` for an expected cohort of ``m = 100``) on MNIST with every client
  holding 32 examples (``FixedSizePartitioner``, Dirichlet(0.5) label skew), for ``N`` of
  1,000, 10,000 and 100,000 clients with multinomial logistic regression over the pixels
  (d = 7,850: 3.1 GB of error-feedback memories at N = 100,000), and for N = 10,000 with the
  200k-parameter MLP (8 GB of memories, which the engine memory-maps on disk): the median
  round time, the peak resident memory of the process and where the state lives.

Each configuration runs in a fresh process (one torch thread) for ``--rounds`` rounds, the
first ``--warmup`` not counted, with evaluation and checkpoints off. Needs the MNIST copy
(``$PL_PRIVFED_DATA``; default ``../shared/data``).

Usage::

    python benchmarks/scale.py --ddp --population
    python benchmarks/scale.py --population --clients 1000 100000 --rounds 30
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_artefact import Artefact, add_json_argument  # noqa: E402


def _trainer(rounds: int, callbacks: list, **kwargs):
    import pytorch_lightning as pl

    return pl.Trainer(accelerator="cpu", max_steps=rounds, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
                      callbacks=callbacks, **kwargs)  # fmt: skip


def _timer():
    import pytorch_lightning as pl

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_train_batch_end(self, *args) -> None:
            self.ends.append(time.perf_counter())

    return Timer()


def _median_round(ends: list[float], warmup: int) -> float:
    steps = [b - a for a, b in itertools.pairwise(ends)][max(0, warmup - 1) :]
    return statistics.median(steps)


def _mnist(num_clients: int, partitioner, cache: str):
    from pl_privfed.datamodules import MNISTDataModule

    return MNISTDataModule(num_clients=num_clients, batch_size=32, seed=0, partitioner=partitioner,
                           cache=cache, val_fraction=0.0)  # fmt: skip


# ---------------------------------------------------------------------------- workers
def ddp_worker(spec: dict) -> None:
    """One process of the DDP measurement (run under torchrun, or alone for 1 process)."""
    import torch
    import torch.distributed as dist

    from pl_privfed import FederatedModule
    from pl_privfed.algorithms import AlphaNormEC
    from pl_privfed.datamodules import IIDPartitioner
    from pl_privfed.engine.distributed import close_process_group
    from pl_privfed.models import MLP

    torch.set_num_threads(1)
    processes = spec["processes"]
    torch.manual_seed(0)
    module = FederatedModule(MLP(784, [200, 200], 10), AlphaNormEC(0.1, 0.1, 0.01))
    timer = _timer()
    trainer = _trainer(spec["rounds"], [timer], devices=processes,
                       strategy="ddp" if processes > 1 else "auto")  # fmt: skip
    trainer.fit(module, datamodule=_mnist(spec["clients"], IIDPartitioner(seed=0), spec["cache"]))
    state = module.algorithm.state.nbytes()
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        out = {"round_s": _median_round(timer.ends, spec["warmup"]), "state_bytes": state,
               "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip
        Path(spec["out"]).write_text(json.dumps(out))
    close_process_group()


def population_worker(spec: dict) -> None:
    """One population configuration in this process."""
    import torch

    from pl_privfed import FederatedModule
    from pl_privfed.algorithms import FedAlphaNormEC
    from pl_privfed.datamodules import FixedSizePartitioner
    from pl_privfed.models import MLP, LogisticRegression

    torch.set_num_threads(1)
    n = spec["clients"]
    torch.manual_seed(0)
    model = MLP(784, [200, 200], 10) if spec["model"] == "mlp" else LogisticRegression(784, 10)
    algorithm = FedAlphaNormEC(0.1, 0.1, beta=0.1, alpha=0.01, participation="practical",
                               participation_prob=min(1.0, spec["cohort"] / n))  # fmt: skip
    module = FederatedModule(model, algorithm, state_dir=spec["state_dir"])
    dm = _mnist(n, FixedSizePartitioner(32, concentration=0.5, seed=0), spec["cache"])
    start = time.perf_counter()
    dm.setup("fit")
    setup_s = time.perf_counter() - start
    timer = _timer()
    _trainer(spec["rounds"], [timer], devices=1).fit(module, datamodule=dm)
    out = {
        "round_s": _median_round(timer.ends, spec["warmup"]),
        "setup_s": setup_s,
        "state_bytes": module.algorithm.state.nbytes(),
        "placement": module.algorithm.state.placement,
        "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "dim": module.layout.dim,
    }
    Path(spec["out"]).write_text(json.dumps(out))


# ---------------------------------------------------------------------------- the driver
def _env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.setdefault("PL_PRIVFED_DATA", str(ROOT.parent / "shared" / "data"))
    return env


def run_ddp(args, tmp: Path, record: Artefact) -> None:
    print("\n## Clients sharded over processes: α-NormEC, MNIST, MLP (d = 199,210), "
          f"{args.ddp_clients} clients, B = 32")  # fmt: skip
    print(f"{'processes':>9} {'s/round':>9} {'rounds/s':>9} {'state MB/rank':>14} {'peak MB':>8}")
    columns = [
        "processes",
        "s/round",
        "rounds/s",
        "client state MB per rank",
        "peak RSS MB (rank 0)",
    ]
    table = record.table("ddp", columns)
    results = {}
    for processes in (1, 2):
        runs = []
        for rep in range(args.repeats):
            out = tmp / f"ddp-{processes}-{rep}.json"
            spec = dict(processes=processes, clients=args.ddp_clients, rounds=args.rounds,
                        warmup=args.warmup, cache=str(tmp / "cache"), out=str(out))  # fmt: skip
            worker = [str(Path(__file__).resolve()), "--worker-ddp", json.dumps(spec)]
            if processes > 1:
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc_per_node={processes}", *worker]  # fmt: skip
            else:
                cmd = [sys.executable, *worker]
            proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, cwd=tmp)
            if proc.returncode or not out.is_file():
                print(f"# {processes} processes failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
                continue
            runs.append(json.loads(out.read_text()))
        if runs:
            median = statistics.median(r["round_s"] for r in runs)
            results[processes] = median
            print(f"{processes:>9} {median:9.3f} {1 / median:9.2f} "
                  f"{runs[0]['state_bytes'] / 2**20:14.1f} {runs[0]['peak_mb']:8.0f}")  # fmt: skip
            state = runs[0]["state_bytes"] / 2**20
            table.append([processes, median, 1 / median, state, runs[0]["peak_mb"]])
    if 1 in results and 2 in results:
        print(f"throughput of 2 processes / 1: {results[1] / results[2]:.2f}x")
        record.note("ddp", "throughput of 2 processes / 1 (target ≥ 1.6)", results[1] / results[2])


def run_population(args, tmp: Path, record: Artefact) -> None:
    print(f"\n## Populations with cohorts of m = {args.cohort}: Fed-α-NormEC (practical "
          "participation), MNIST, 32 examples per client")  # fmt: skip
    print(f"{'model':>8} {'N':>8} {'d':>8} {'state GB':>9} {'placement':>9} {'setup s':>8} "
          f"{'s/round':>9} {'peak MB':>8}")  # fmt: skip
    columns = [
        "model",
        "N",
        "d",
        "client state GB",
        "placement",
        "data setup s",
        "s/round",
        "vs the smallest N",
        "peak RSS MB",
    ]
    table = record.table("population", columns)
    configs = [("logistic", n) for n in args.clients] + [("mlp", n) for n in args.mlp_clients]
    base = {}
    for model, n in configs:
        out = tmp / f"pop-{model}-{n}.json"
        spec = dict(model=model, clients=n, cohort=args.cohort, rounds=args.rounds,
                    warmup=args.warmup, cache=str(tmp / "cache"), out=str(out),
                    state_dir=str(tmp / f"state-{model}-{n}"))  # fmt: skip
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-population",
               json.dumps(spec)]  # fmt: skip
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, cwd=tmp)
        if proc.returncode or not out.is_file():
            print(f"# {model} N={n} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        r = json.loads(out.read_text())
        base.setdefault(model, r["round_s"])
        print(f"{model:>8} {n:>8} {r['dim']:>8} {r['state_bytes'] / 1e9:9.2f} "
              f"{r['placement']:>9} {r['setup_s']:8.1f} {r['round_s']:9.4f} {r['peak_mb']:8.0f}"
              f"   ({r['round_s'] / base[model]:.2f}x the smallest N)")  # fmt: skip
        sys.stdout.flush()
        row = [model, n, r["dim"], r["state_bytes"] / 1e9, r["placement"], r["setup_s"]]
        table.append([*row, r["round_s"], r["round_s"] / base[model], r["peak_mb"]])
    logistic = [row for row in table if row[0] == "logistic"]
    if len(logistic) > 1:
        largest = logistic[-1]
        key = f"round at N = {largest[1]:,} over N = {logistic[0][1]:,} (target ≤ 1.3)"
        record.note("population", key, largest[7])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--population", action="store_true")
    parser.add_argument("--ddp-clients", type=int, default=1000)
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--mlp-clients", type=int, nargs="*", default=[10_000])
    parser.add_argument("--cohort", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--worker-ddp", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-population", default=None, help=argparse.SUPPRESS)
    add_json_argument(parser)
    args = parser.parse_args()
    if args.worker_ddp:
        ddp_worker(json.loads(args.worker_ddp))
        return
    if args.worker_population:
        population_worker(json.loads(args.worker_population))
        return
    import platform

    import torch

    print(f"# {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, one thread "
          f"per process; {time.strftime('%Y-%m-%d')}")  # fmt: skip
    record = Artefact("scale")
    tmp = Path(tempfile.mkdtemp(prefix="scale-"))
    if args.ddp:
        run_ddp(args, tmp, record)
    if args.population:
        run_population(args, tmp, record)
    record.write(args.json, torch_threads=1)  # every worker's (the driver only waits)


if __name__ == "__main__":
    main()
