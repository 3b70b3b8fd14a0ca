"""Time per communication round: loop vs vmap gradient backends vs the centralized floor.

For each number of clients n, with B samples per client, it times

* ``loop``: the per-client loop backend of :class:`pl_privfed.GradientOracle`;
* ``vmap``: the ``torch.func.vmap(grad)`` backend;
* ``layers`` (the models the layer rules support, e.g. the MLPs; the former ``analytic``
  column): :mod:`pl_privfed.layer_rules`, what ``grad_backend: auto`` picks for them on a CPU;
* ``graph`` (CUDA only): the vmap backend replayed from a CUDA graph (``cuda_graphs: true``);
* ``central``: one forward/backward over the same n·B samples with shared parameters
  (the physical floor: the same arithmetic without per-client gradients);
* ``algorithm``: the algorithm's own work in a round (DP-α-NormEC: operators, memories,
  noise), with precomputed gradients;

and prints the ratios measured in the same run. Usage::

    python benchmarks/round_time.py                       # quickstart MLP, n = 10, 100, 1000
    python benchmarks/round_time.py --model mlp270k --clients 100
    python benchmarks/round_time.py --device cuda --model resnet20 --clients 10 20 100

On CUDA, TF32 is off unless ``--tf32`` is given (fp32 numbers, comparable with the issue's
reference figures).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch
from bench_artefact import Artefact, add_json_argument  # benchmarks/, the script's own folder
from torch import nn

from pl_privfed.algorithms import AlphaNormEC
from pl_privfed.engine import run_round
from pl_privfed.grads import GradientOracle
from pl_privfed.layer_rules import layer_support
from pl_privfed.models import MLP, resnet20
from pl_privfed.privacy import DPNoise

MODELS = {
    # the quickstart network on 8x8 digits (d = 2,410)
    "mlp": (lambda: MLP(64, [32], 10), (64,)),
    # an MLP on 28x28 inputs with d ≈ 270k parameters (the size of ResNet-20)
    "mlp270k": (lambda: MLP(784, [330, 32], 10), (784,)),
    # a BatchNorm MLP (exercises per-client batch statistics)
    "mlp_bn": (lambda: MLP(64, [32], 10, batch_norm=True), (64,)),
    # the papers' CIFAR-10 network (d = 269,722), with BatchNorm
    "resnet20": (lambda: resnet20(), (3, 32, 32)),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timeit(fn, device: torch.device, repeats: int, warmup: int = 3) -> float:
    """Median wall time of ``fn`` in milliseconds."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return 1e3 * times[len(times) // 2]


def bench(model_name: str, n: int, batch: int, device: torch.device, repeats: int) -> dict:
    factory, in_shape = MODELS[model_name]
    torch.manual_seed(0)
    model = factory().to(device)
    criterion = nn.CrossEntropyLoss()
    inputs = torch.randn(n, batch, *in_shape, device=device)
    targets = torch.randint(0, 10, (n, batch), device=device)
    loop = GradientOracle(model, criterion, "loop")
    vmapped = GradientOracle(model, criterion, "vmap")
    x = loop.layout.flatten(model)
    params = [p for p in model.parameters()]
    flat_in, flat_t = inputs.reshape(n * batch, *in_shape), targets.reshape(-1)

    def central():
        loss = criterion(model(flat_in), flat_t)
        return torch.autograd.grad(loss, params)

    out = {"model": model_name, "d": loop.layout.dim, "n": n, "B": batch}
    out["central_ms"] = timeit(central, device, repeats)
    out["vmap_ms"] = timeit(lambda: vmapped(x, inputs, targets), device, repeats)
    # the loop is slow for many clients: fewer repeats keep the benchmark short
    out["loop_ms"] = timeit(lambda: loop(x, inputs, targets), device, max(3, repeats // 4), 1)
    out["analytic_ms"] = float("nan")
    if layer_support(model, criterion) is None:
        analytic = GradientOracle(model, criterion, "layers")
        out["analytic_ms"] = timeit(lambda: analytic(x, inputs, targets), device, repeats)
    out["graph_ms"] = float("nan")
    if device.type == "cuda":
        graphed = GradientOracle(model, criterion, "vmap", cuda_graph=True)
        out["graph_ms"] = timeit(lambda: graphed(x, inputs, targets), device, repeats)

    grads = vmapped(x, inputs, targets).grads
    alg = AlphaNormEC(0.1, 0.1, 0.01, noise=DPNoise(epsilon=8.0))
    alg.setup(num_clients=n, dim=loop.layout.dim, num_rounds=300, device=device)
    alg.initialized.fill_(True)
    out["algorithm_ms"] = timeit(
        lambda: run_round(alg, x, lambda p, clients, **_: grads[clients]), device, repeats
    )
    out["clone_ms"] = timeit(lambda: grads.clone(), device, repeats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 on CUDA")
    parser.add_argument(
        "--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True"
    )
    add_json_argument(parser)
    args = parser.parse_args()
    record = Artefact("round_time")
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(
        f"# device={device} ({name or platform.machine()}), torch {torch.__version__}, "
        f"threads={torch.get_num_threads()}, tf32={args.tf32}, "
        f"cudnn_benchmark={args.cudnn_benchmark}"
    )
    header = (
        f"{'model':>8} {'d':>8} {'n':>5} {'B':>3} {'central ms':>10} {'vmap ms':>9} "
        f"{'loop ms':>9} {'layers ms':>11} {'graph ms':>9} {'vmap/floor':>10} "
        f"{'layers/floor':>14} {'graph/floor':>11} "
        f"{'loop/floor':>10} {'loop/vmap':>9} {'alg/vmap':>8}"
    )
    print(header)
    columns = ["model", "d", "n", "central ms", "vmap ms", "loop ms", "layers ms"]
    columns += ["graph ms"] if device.type == "cuda" else []
    columns += ["vmap/floor", "layers/floor", "loop/floor", "loop/vmap", "alg/vmap"]
    table = record.table("rounds", columns)
    for n in args.clients:
        r = bench(args.model, n, args.batch, device, args.repeats)
        alg = max(r["algorithm_ms"] - r["clone_ms"], 0.0)
        print(
            f"{r['model']:>8} {r['d']:>8} {r['n']:>5} {r['B']:>3} {r['central_ms']:>10.3f} "
            f"{r['vmap_ms']:>9.3f} {r['loop_ms']:>9.3f} {r['analytic_ms']:>11.3f} "
            f"{r['graph_ms']:>9.3f} {r['vmap_ms'] / r['central_ms']:>10.2f} "
            f"{r['analytic_ms'] / r['central_ms']:>14.2f} {r['graph_ms'] / r['central_ms']:>11.2f} "
            f"{r['loop_ms'] / r['central_ms']:>10.2f} {r['loop_ms'] / r['vmap_ms']:>9.2f} "
            f"{alg / r['vmap_ms']:>8.3f}"
        )
        central = r["central_ms"]
        row = [r["model"], r["d"], r["n"], central, r["vmap_ms"], r["loop_ms"], r["analytic_ms"]]
        row += [r["graph_ms"]] if device.type == "cuda" else []
        row += [r["vmap_ms"] / central, r["analytic_ms"] / central, r["loop_ms"] / central]
        table.append([*row, r["loop_ms"] / r["vmap_ms"], alg / r["vmap_ms"]])
    record.write(args.json)


if __name__ == "__main__":
    main()
