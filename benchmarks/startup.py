"""Start-up of each ``pl-privfed`` command against ``python -c "import pytorch_lightning"``,
measured in the same run (same machine, same load): wall and CPU seconds of each process (the
median of ``--repeats`` runs, interleaved so that a change of load hits every command alike),
and each command's ratio to the Lightning import.

The commands: ``--help``, ``report --help``, ``compare --help``, ``report`` of a kept
``results.csv`` (``docs/results/quickstart_grid/results.csv``: parsing, statistics and every
figure), ``report`` refused in one line (a results file without runs: what a test of a
refusal pays), ``fit --print_config`` (the training stack imported and the config resolved: what
every ``fit`` pays before its first round), ``fit`` refused in one line before training (a
negative β: what a test of a refusal pays) and ``fit`` of one round of the digits quickstart
(no logger, no bar, no checkpoint: start-up, one round, the test). The package's own import
beside Lightning's is printed too (``import pl_privfed.cli.app`` above ``import
pytorch_lightning``, in one process), and ``fit``'s start-up above ``import
pytorch_lightning`` for each checkout with its change between checkouts. Usage::

    python benchmarks/startup.py                 # 3 repeats of each
    python benchmarks/startup.py --repeats 5 --only help report
    python benchmarks/startup.py --repo ../main .    # two checkouts: before and after a change
    python benchmarks/startup.py --only fit_print_config fit_refused --repo ../main .
    python benchmarks/startup.py --repeats 1 --only help --imports 25   # where fit's imports go
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "pl_privfed.cli"]
RESULTS = REPO / "docs/results/quickstart_grid/results.csv"
CONFIG = REPO / "configs/algorithms/alpha_normec.yaml"
QUIET = ["--trainer.logger=false", "--trainer.enable_progress_bar=false"]


def commands(scratch: Path) -> dict[str, list[str]]:
    """Each measured command line, by name."""
    one_round = ["--trainer.max_steps=1", "--trainer.val_check_interval=1"]
    return {
        "import_pytorch_lightning": [sys.executable, "-c", "import pytorch_lightning"],
        "help": [*CLI, "--help"],
        "report_help": [*CLI, "report", "--help"],
        "compare_help": [*CLI, "compare", "--help"],
        "report": [*CLI, "report", str(RESULTS), "--out", str(scratch / "report")],
        "report_refused": [*CLI, "report", str(scratch / "empty.csv")],  # no runs: exit 2
        "fit_print_config": [*CLI, "fit", "--config", str(CONFIG), "--print_config"],
        "fit_refused": [  # a one-line ValueError before training: exit 2
            *CLI,
            "fit",
            "--config",
            str(CONFIG),
            *QUIET,
            "--model.algorithm.init_args.beta",
            "-1",
        ],
        "fit_one_round": [
            *CLI,
            "fit",
            "--config",
            str(CONFIG),
            *QUIET,
            "--trainer.enable_checkpointing=false",
            *one_round,
            "--output_dir",
            str(scratch / "fit"),
        ],
    }


#: the exit status each command must end with (0 unless named)
EXPECTED = {"fit_refused": 2, "report_refused": 2}


def timed(cmd: list[str], env: dict[str, str], cwd: Path, code: int = 0) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one process; it must exit with ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != code:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def package_import(env: dict[str, str], cwd: Path) -> str:
    """CPU seconds of ``import pytorch_lightning`` and of the package's CLI above it, in one
    process (what ``fit`` imports beyond Lightning)."""
    code = (
        "import time\n"
        "t = time.process_time(); import pytorch_lightning; a = time.process_time() - t\n"
        "t = time.process_time(); import pl_privfed.cli.app; b = time.process_time() - t\n"
        "print(f'{a:.2f} {b:.2f}')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True)
    return out.stdout.decode().strip()


def import_costs(env: dict[str, str], cwd: Path, top: int) -> None:
    """Where ``fit --print_config``'s imports go (``python -X importtime``): the self time of
    each top-level package, the package's own modules apart, and the ``top`` costliest modules
    with the chain of modules that imported them (the first import of each; times from
    ``-X importtime``, which inflates them somewhat)."""
    cmd = [sys.executable, "-X", "importtime", *CLI[1:], "fit", "--config", str(CONFIG)]
    done = subprocess.run([*cmd, "--print_config"], env=env, cwd=cwd, capture_output=True)
    rows = []  # (self s, cumulative s, depth, module), children before their parent
    for line in done.stderr.decode().splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[0].strip().isdigit():
            name = parts[2].rstrip()
            depth = (len(name) - len(name.lstrip()) - 1) // 2
            rows.append((int(parts[0]) / 1e6, int(parts[1]) / 1e6, depth, name.strip()))
    parent: dict[int, int] = {}
    pending: list[int] = []
    for i, (_, _, depth, _) in enumerate(rows):
        while pending and rows[pending[-1]][2] == depth + 1:
            parent[pending.pop()] = i
        pending.append(i)
    by_package: dict[str, float] = {}
    for own, _, _, name in rows:
        by_package[name.split(".")[0]] = by_package.get(name.split(".")[0], 0.0) + own
    total = sum(by_package.values())
    print(f"\nimports of fit --print_config: {total:.2f} s in all (-X importtime), by package")
    for name, own in sorted(by_package.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {own:6.2f} s  {name}")
    print(f"the {top} costliest modules (cumulative s) and what imported them")
    for i in sorted(range(len(rows)), key=lambda i: -rows[i][1])[:top]:
        chain, j = [rows[i][3]], parent.get(i)
        while j is not None:
            chain.append(rows[j][3])
            j = parent.get(j)
        print(f"  {rows[i][1]:6.2f} s  {' <- '.join(chain[:5])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", help="the commands to measure (with the import)")
    parser.add_argument(
        "--repo",
        type=Path,
        nargs="+",
        default=[REPO],
        help="the checkouts to measure, interleaved in one run (e.g. before and after a change)",
    )
    parser.add_argument(
        "--imports",
        type=int,
        default=0,
        metavar="N",
        help="also print where fit --print_config's imports go: by package and the N costliest",
    )
    args = parser.parse_args()
    repos = [r.resolve() for r in args.repo]
    envs = {r: {**os.environ, "PYTHONPATH": str(r), "WANDB_MODE": "disabled"} for r in repos}
    print(f"python {sys.version.split()[0]}, load average {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "empty.csv").write_text("run,status,final_val_accuracy,run_dir\n")
        cmds = commands(Path(tmp))
        names = [n for n in cmds if not args.only or n in args.only or n.startswith("import")]
        times = {(r, n): [] for r in repos for n in names}
        for repeat in range(args.repeats):
            for name in names:
                for repo in repos:
                    code = EXPECTED.get(name, 0)
                    times[repo, name].append(timed(cmds[name], envs[repo], repo, code))
            print(f"repeat {repeat + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    for repo in repos:
        base_wall = statistics.median(w for w, _ in times[repo, "import_pytorch_lightning"])
        base_cpu = statistics.median(c for _, c in times[repo, "import_pytorch_lightning"])
        print(f"\n{repo} (median of {args.repeats})")
        print(f"{'command':<26} {'wall s':>7} {'cpu s':>7} {'wall/PL':>8} {'cpu/PL':>7}")
        for name in names:
            wall = statistics.median(w for w, _ in times[repo, name])
            cpu = statistics.median(c for _, c in times[repo, name])
            ratio = f"{wall / base_wall:8.2f} {cpu / base_cpu:7.2f}"
            print(f"{name:<26} {wall:7.2f} {cpu:7.2f} {ratio}")
        lightning, package = package_import(envs[repo], repo).split()
        print(
            f"import pytorch_lightning {lightning} s CPU; pl_privfed.cli.app above it {package} s"
        )
    fit_startup(times, repos, names)
    if args.imports:
        import_costs(envs[repos[-1]], repos[-1], args.imports)
    print(f"load average after: {os.getloadavg()}")


def fit_startup(times: dict, repos: list[Path], names: list[str]) -> None:
    """``fit``'s start-up: the CPU seconds of each ``fit`` command that ends before training
    above ``import pytorch_lightning`` (the medians of the same run), for each checkout, and
    the change from the first checkout to each other (before/after a change)."""
    fits = [n for n in names if n in ("fit_print_config", "fit_refused")]
    if not fits:
        return

    def cpu(repo: Path, name: str) -> float:
        return statistics.median(c for _, c in times[repo, name])

    print("\nfit start-up, CPU s above import pytorch_lightning (same run)")
    print(f"{'checkout':<40} " + " ".join(f"{n:>17}" for n in fits))
    for repo in repos:
        base = cpu(repo, "import_pytorch_lightning")
        cells = " ".join(f"{cpu(repo, n) - base:8.2f} of {cpu(repo, n):5.2f}" for n in fits)
        print(f"{str(repo)[-40:]:<40} {cells}")
    for repo in repos[1:]:
        change = " ".join(f"{cpu(repo, n) - cpu(repos[0], n):+17.2f}" for n in fits)
        print(f"{'change ' + repo.name + ' - ' + repos[0].name:<40} {change}")


if __name__ == "__main__":
    main()
