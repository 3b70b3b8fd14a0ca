"""Run every CPU benchmark docs/performance.md shows, at its documented size, and render the page.

Each benchmark runs in its own process with one torch thread (``OMP_NUM_THREADS=1``) and writes
its artefact, ``docs/results/benchmarks/<name>.json`` (``--json``: the command line, the machine,
the load average at start and end, the tables); then ``benchmarks/results_pages.py
--performance`` renders docs/performance.md's tables from the artefacts. One benchmark failing
(or running past its time limit) names itself and the others still run; the command then exits
with status 1, and that benchmark's previous artefact, if any, stays as it was.

The sizes are chosen so that the whole command takes about 25 minutes on this project's quiet
2-core CPU (``ESTIMATE_S``, from the per-cell times of earlier runs); cells that cost more (the
ResNet-20 at 100 clients, the CNN at 100 clients, the MLP at 1,000 clients in ``peers.py``, the
shipped frontier sweep in ``batched_sweep.py``) are left out and said so in the page.

Usage::

    python benchmarks/run_cpu.py                      # everything, documented sizes (~25 min)
    python benchmarks/run_cpu.py --only streams scale # some of them
    python benchmarks/run_cpu.py --tiny               # every benchmark at a tiny size (a check)
    python benchmarks/run_cpu.py --device cuda        # the GPU set, into docs/results/benchmarks/gpu/
    python benchmarks/run_cpu.py --list               # what would run, and its estimated time
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "results" / "benchmarks"

#: name: (script, documented arguments, tiny arguments (a check), estimated seconds on the quiet 2-core CPU)
CPU = {
    "round_time_mlp": (
        "round_time.py",
        "--threads 1 --clients 10 100 1000",
        "--threads 1 --clients 10 --repeats 2",
        60,
    ),
    "round_time_mlp_bn": (
        "round_time.py",
        "--threads 1 --model mlp_bn --clients 10 100",
        "--threads 1 --model mlp_bn --clients 10 --repeats 2",
        20,
    ),
    "round_time_mlp270k": (
        "round_time.py",
        "--threads 1 --model mlp270k --clients 10 100",
        "--threads 1 --model mlp270k --clients 10 --repeats 2",
        30,
    ),
    "round_time_resnet20": (
        "round_time.py",
        "--threads 1 --model resnet20 --clients 10 --repeats 3",
        "--threads 1 --model resnet20 --clients 2 --repeats 1",
        60,
    ),
    "peers_mlp": (
        "peers.py",
        "--model mlp --clients 10 100 --local-steps 1 --repeats 1",
        "--model mlp --workloads fedavg per_example_dp --clients 10 --local-steps 1 --repeats 1 --rounds 3",
        400,
    ),
    "peers_cnn": (
        "peers.py",
        "--model cnn --workloads fedavg per_example_dp --clients 10 --local-steps 1 --repeats 1",
        "--model cnn --workloads fedavg --clients 2 --local-steps 1 --repeats 1 --rounds 3",
        190,
    ),
    "peers_text": (
        "peers.py",
        "--model text --workloads fedavg per_example_dp --clients 100 --local-steps 1 --repeats 1",
        "--model text --workloads fedavg --clients 2 --local-steps 1 --repeats 1 --rounds 3",
        120,
    ),
    "layer_rules": ("layer_rules.py", "--repeats 25", "--repeats 2", 60),
    "layer_profile_cnn_dp": (
        "layer_profile.py",
        "--model cnn --workload per_example_dp --clients 10",
        "--model cnn --workload per_example_dp --clients 2 --rounds 1",
        30,
    ),
    "layer_profile_cnn_fedavg": (
        "layer_profile.py",
        "--model cnn --workload fedavg --clients 10",
        "--model cnn --workload fedavg --clients 2 --rounds 1",
        30,
    ),
    "noise_placement": (
        "noise_placement.py",
        "--clients 1000 --rounds 40 --warmup 8 --repeats 3",
        "--clients 100 --rounds 4 --warmup 1 --repeats 1",
        180,
    ),
    "streams": (
        "streams.py",
        "--threads 1 --rounds 16",
        "--threads 1 --clients 1000 --index-rounds 2 --warmup 1 --rounds 1 --repeats 1",
        180,
    ),
    "batched_sweep": (
        "batched_sweep.py",
        "--config configs/private/mnist_dp_fedavg_clip.yaml --rounds 300 --seeds 0 1 2 --epsilons 0.5 1 2 4 8 --step-sizes 0.17 0.5 1.5 --separate-sample 2",
        "--rounds 3 --epsilons 8 --step-sizes 0.5 1.0",
        120,
    ),
    "sweep_vs_point": (
        "sweep_vs_point.py",
        "--repeats 2",
        "--repeats 1",
        600,
    ),
    "scale": (
        "scale.py",
        "--ddp --population",
        "--ddp --ddp-clients 20 --repeats 1 --population --clients 100 200 --mlp-clients --rounds 4 "
        "--warmup 1",
        300,
    ),
}

#: the GPU set (``--device cuda``): artefacts into docs/results/benchmarks/gpu/
GPU = {
    "round_time_resnet20": (
        "round_time.py",
        "--device cuda --model resnet20 --clients 10 20 100 --cudnn-benchmark --repeats 10",
        "--device cuda --model resnet20 --clients 2 --repeats 2",
        120,
    ),
    "round_time_mlp": (
        "round_time.py",
        "--device cuda --clients 10 100 1000",
        "--device cuda --clients 10 --repeats 2",
        60,
    ),
    "peers_cnn": (
        "peers.py",
        "--device cuda --model cnn --workloads fedavg per_example_dp --clients 10 100 --local-steps 1 --repeats 2",
        "--device cuda --model cnn --workloads fedavg --clients 2 --local-steps 1 --repeats 1 --rounds 3",
        240,
    ),
}


def run(
    name: str, script: str, args: str, out: Path, limit: float, size: str = "documented"
) -> str | None:
    """Run one benchmark into ``out/<name>.json`` (``size``: "documented" or "tiny", kept in
    the artefact and said on the page); None on success, else why it failed."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.setdefault("PL_PRIVFED_DATA", str(REPO.parent / "shared" / "data"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    target = out / f"{name}.json"
    partial = out / f".{name}.json.partial"
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / script),
        *shlex.split(args),
        "--json",
        str(partial),
    ]
    print(f"\n### {name}: {' '.join(cmd[1:])}", flush=True)
    # its own process group, so that an overrun ends the workers it started too
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
    try:
        code = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        partial.unlink(missing_ok=True)
        return f"ran past its limit of {limit:.0f} s"
    if code or not partial.is_file():
        partial.unlink(missing_ok=True)
        return f"exit status {code}" + ("" if partial.is_file() else ", no artefact")
    # the artefact's command names the kept path, not the temporary one
    data = json.loads(partial.read_text(encoding="utf-8"))
    data["command"] = data["command"].replace(str(partial), target.relative_to(REPO).as_posix())
    data["size"] = size
    target.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    partial.unlink()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: a check, not a result")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--list", action="store_true", help="list the benchmarks and stop")
    parser.add_argument(
        "--limit-factor", type=float, default=4.0, help="time limit = factor × the estimate"
    )
    args = parser.parse_args(argv)
    table = GPU if args.device == "cuda" else CPU
    out = OUT / "gpu" if args.device == "cuda" else OUT
    names = args.only or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        raise SystemExit(f"--only: unknown benchmark(s) {unknown}; known: {list(table)}")
    total = sum(table[n][3] for n in names)
    if args.list:
        for n in names:
            script, sizes, tiny, estimate = table[n]
            shown = tiny if args.tiny else sizes
            print(f"{n:<26} ~{estimate:4d} s  python benchmarks/{script} {shown}")
        where = "a lent GPU" if args.device == "cuda" else "a quiet 2-core CPU"
        print(f"estimated total: {total / 60:.0f} min (documented sizes, {where})")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    start = time.perf_counter()
    for n in names:
        script, sizes, tiny, estimate = table[n]
        limit = args.limit_factor * estimate + 60
        size = "tiny" if args.tiny else "documented"
        why = run(n, script, tiny if args.tiny else sizes, out, limit, size)
        if why:
            failed[n] = why
            print(f"### {n} FAILED: {why}", file=sys.stderr, flush=True)
    if args.device == "cpu":
        page = [sys.executable, str(REPO / "benchmarks" / "results_pages.py"), "--performance"]
        if subprocess.run(page, cwd=REPO, check=False).returncode:
            failed["docs/performance.md"] = "its tables could not be rendered"
    minutes = (time.perf_counter() - start) / 60
    ran = len([n for n in names if n not in failed])
    print(f"\n{ran} of {len(names)} benchmarks ran in {minutes:.1f} min")
    for n, why in failed.items():
        print(f"FAILED {n}: {why}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
