"""The privacy audit against the catalogue of broken mechanisms, on the shipped configs.

Issue 29, item 2: an audit that can fail must flag every break of the catalogue
(``tests/helpers/audit_breaks.py``: noise ×0.5 at each placement, the client or per-example clip skipped
or at 2× its threshold, distributed shares at σ²/t², central noise on the average instead of
the sum; issue 48: the client's bounding operator (a clip, or α-NormEC's smoothed
normalization) skipped for a subset of clients on one engine path, the round's last chunk or a
chunk's remainder past its last block of 8, each with the config's own chunking, and the
per-example clip skipped for the records of each oracle call's last client; a draw reused across rounds, draws correlated across rounds or coordinates, the sum's
draw scaled for the average, and at record level a client's own draw per local step reused
across rounds, shared by the clients, correlated across rounds or coordinates, or scaled for
the average of the n clients; one client or one record of a chunk left unbounded, which the
exact per-canary check against the declared bound flags) in one run at the shipped ε = 8, and
must not flag the unbroken mechanism. For each
config this script runs the unbroken mechanism, then every break that applies to its mechanism
(its noise placement, or record level), each through the CLI with a ``PrivacyAudit``
(100 canaries), the accounting untouched, and prints one row per run: the certified ε against
whoever sees the models, the white-box estimate with its interval, the black-box estimate (or
record-level lower bound), the noise test's p-value (with the realized over declared variance
and the largest correlation between two releases) and whether the run's alarm was raised, and
by which part (the ε tests, the noise test, the per-canary bound check). ``--seeds N`` adds
the false-alarm rate of the whole alarm (all three parts) for the unbroken mechanism on the catalogue's small problem (the tests'), over ``N`` seeds
of the noise and the canaries per mechanism (correlated placements included). Usage::

    PL_PRIVFED_DATA=../shared/data python benchmarks/audit_breaks.py \\
        configs/private/mnist_dpsgd.yaml configs/demo/fedavg_private.yaml
    python benchmarks/audit_breaks.py --max-steps 100 configs/private/*.yaml
    python benchmarks/audit_breaks.py --seeds 40 --no-configs
    python benchmarks/audit_breaks.py configs/private/*.yaml --breaks "draw reused across rounds"

(``--breaks`` takes every word after it: the configs go before it.)

``--max-steps`` shortens a config's run (the noise is calibrated for the rounds run, so the
certificate stays at ε = 8); the table in docs/privacy.md says which lengths it ran.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.audit_breaks import (  # noqa: E402
    BREAKS,
    CORRELATED,
    MECHANISMS,
    SKIPPED,
    audit_small,
    broken,
)

from pl_privfed.cli import main  # noqa: E402
from pl_privfed.engine import ClientChunk, MessageStage  # noqa: E402
from pl_privfed.operators import Clip  # noqa: E402


@contextlib.contextmanager
def clip_calls():
    """Counts the calls of ``Clip.scale`` (as a break patched it) while the block runs: a clip
    break whose count stays 0 did not touch the run (its operator is not a clip, e.g. the
    smoothed normalization of the α-NormEC family), and its row says so instead of "no"."""
    patched, calls = Clip.scale, [0]

    def counting(self, norms):
        calls[0] += 1
        return patched(self, norms)

    Clip.scale = counting
    try:
        yield calls
    finally:
        Clip.scale = patched


@contextlib.contextmanager
def draw_calls(owner: type = MessageStage, method: str = "noise_of_sum"):
    """Counts the calls of ``owner.method`` (as a break patched it; default the sum's draw,
    ``MessageStage.noise_of_sum``; ``ClientChunk.normal`` for a client's record-level draw): a
    break of a draw whose count stays 0 did not touch the run (its noise is drawn elsewhere)."""
    patched, calls = getattr(owner, method), [0]

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return patched(self, *args, **kwargs)

    setattr(owner, method, counting)
    try:
        yield calls
    finally:
        setattr(owner, method, patched)


def run_config(
    config: Path, max_steps: int | None, audited: bool = True, validate: bool = False
) -> dict:
    """One CLI run of ``config`` (with a PrivacyAudit unless ``audited`` is false; without its
    validation unless ``validate``): its ``summary.json``."""
    with tempfile.TemporaryDirectory() as out:
        argv = ["fit", "--config", str(config), "--trainer.logger", "false",
                "--trainer.enable_progress_bar", "false", "--output_dir", out,
                "--trainer.enable_model_summary", "false"]  # fmt: skip
        if not validate:
            argv += ["--trainer.limit_val_batches", "0"]
        if audited:
            argv.append("--trainer.callbacks+=pl_privfed.callbacks.PrivacyAudit")
        if max_steps is not None:
            argv += ["--trainer.max_steps", str(max_steps)]
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            main(argv)
        return json.loads((Path(out) / "summary.json").read_text())


def mechanism(summary: dict) -> str:
    """The catalogue's name of a run's mechanism: ``"record"`` or its noise placement."""
    audit = summary["privacy"]["audit"]
    return "record" if audit["level"] == "record" else summary["privacy"]["placement"]


def row(config: str, name: str, audit: dict, seconds: float) -> str:
    white = audit["threat_models"].get("white_box")
    if white is None:
        wb = "—"
    else:
        low, high = white["epsilon_interval"]
        wb = f"{white['epsilon_estimate']:.2f} [{low:.2f}, {high:.2f}]"
    if audit["level"] == "record":
        bb = f"≥ {audit['epsilon_lower_bound']:.2f}"
    else:
        bb = f"{audit['epsilon_estimate']:.2f}"
    test = audit.get("noise_test") or {}
    if "p_value" in test:
        noise = f"{test['p_value']:.2g} (var. {test['variance_ratio']:.3g}, r {test['max_release_correlation']:.2f})"
    else:
        noise = "—"
    parts = (
        ("ε tests", audit["exceeds_certified"]),
        ("noise test", test.get("flagged")),
        ("bound check", audit.get("exceeds_bound")),
    )
    by = [where for where, flagged in parts if flagged]
    check = audit.get("bound_check") or {}
    if check.get("flagged"):  # how far over, and from which round
        over, first = check["canaries_over"], check["first_over"]
        by[-1] += (
            f": {over} canar{'y' if over == 1 else 'ies'} over, ratio "
            f"{check['largest_ratio']:.4g}, from round {first['round']}"
        )
    flag = f"**yes** ({', '.join(by)})" if by else "no"
    cert = audit["certified_epsilon"]
    return f"| {config} | {name} | {cert:.2f} | {wb} | {bb} | {noise} | {flag} | {seconds:.0f} |"


def false_alarms(seeds: int, mechanisms: list[str] | None = None) -> None:
    """The unbroken mechanism's false-alarm rate on the catalogue's small problem (every
    mechanism, or ``mechanisms``): the whole alarm (``alarm``: the white and black boxes'
    ε tests, the noise test and the per-canary bound check), and each part."""
    print(f"\nfalse alarms of the unbroken mechanism, small problem, {seeds} seeds each:")
    total = runs = 0
    for name in mechanisms or [*MECHANISMS, *CORRELATED]:
        flagged = by_eps = by_noise = by_bound = 0
        ratios, p_values, largest = [], [], 0.0
        for seed in range(seeds):
            audit = audit_small(name, noise_seed=seed, audit_seed=seed)
            flagged += bool(audit["alarm"])
            by_eps += bool(audit["exceeds_certified"])
            test = audit["noise_test"]
            by_noise += bool(test.get("flagged"))
            by_bound += bool(audit["exceeds_bound"])
            largest = max(largest, audit["bound_check"].get("largest_ratio") or 0.0)
            if "p_value" in test:
                p_values.append(test["p_value"])
            white = audit["threat_models"]["white_box"]
            ratios.append(white["epsilon_estimate"] / audit["certified_epsilon"])
        total, runs = total + flagged, runs + seeds
        ratios.sort()
        noise = f"{by_noise}/{len(p_values)} by the noise test" if p_values else "no noise test"
        print(f"  {name}: {flagged}/{seeds} flagged ({by_eps} by the ε tests, {noise}, "
              f"{by_bound} by the bound check, largest ratio {largest:.8f}); "
              f"white-box / certified: median {ratios[len(ratios) // 2]:.2f}, range "
              f"{ratios[0]:.2f} to {ratios[-1]:.2f}", flush=True)  # fmt: skip
    print(f"  all: {total}/{runs} runs flagged ({total / runs:.1%})")


def shipped_summary(text: str) -> str:
    """One Markdown row per config of a kept catalogue run (this script's rows, several configs
    concatenated): its rounds (the config's ``trainer.max_steps``), its certificate, the unbroken
    run's white box, black box and noise test and whether it raised the alarm, and how many of
    the breaks that applied were flagged (a break the catalogue does not apply to the config's
    mechanism, or that touched no row of its layout, is not counted)."""
    import yaml

    runs: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 8 and cells[0] != "config" and not cells[0].startswith("-"):
            runs.setdefault(cells[0], []).append(cells)
    out = [
        "| config | rounds | certified ε (models) | unbroken: white box [interval] | black box | "
        "noise test p | unbroken flagged | breaks flagged |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config, rows in runs.items():
        (none,) = [r for r in rows if r[1] == "none"]
        applied = [r for r in rows if r[1] != "none" and not r[6].startswith("n/a")]
        flagged = sum(r[6].startswith("**yes**") for r in applied)
        spec = yaml.safe_load((ROOT / "configs" / "private" / f"{config}.yaml").read_text())
        p_value = none[5].split(" ")[0]
        unflagged = "no" if none[6] == "no" else none[6]
        rounds = spec["trainer"]["max_steps"]
        out.append(
            f"| `{config}` | {rounds} | {none[2]} | {none[3]} | {none[4]} | {p_value} | "
            f"{unflagged} | {flagged} of {len(applied)} |"
        )
    return "\n".join(out)


def main_(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="*", type=Path, help="configs to run the catalogue on")
    parser.add_argument("--max-steps", type=int, default=None, help="rounds per run")
    parser.add_argument("--breaks", nargs="*", default=None, help="only these breaks")
    parser.add_argument("--seeds", type=int, default=0, help="false-alarm seeds (small problem)")
    parser.add_argument("--no-configs", action="store_true", help="only the false-alarm rate")
    parser.add_argument("--mechanisms", nargs="*", default=None, choices=[*MECHANISMS, *CORRELATED],
                        help="false alarms of these mechanisms only")  # fmt: skip
    parser.add_argument(
        "--summary", type=Path, default=None, help="one row per config of a kept catalogue run"
    )
    args = parser.parse_args(argv)
    if args.summary is not None:
        print(shipped_summary(args.summary.read_text(encoding="utf-8")))
        return
    if not args.no_configs:
        print("| config | break | certified ε (models) | white box [interval] | black box | "
              "noise test p | flagged | s |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for config in args.configs:
            start = time.perf_counter()
            summary = run_config(config, args.max_steps)
            print(row(config.stem, "none", summary["privacy"]["audit"], time.perf_counter() - start),
                  flush=True)  # fmt: skip
            kind = mechanism(summary)
            for name, spec in BREAKS.items():
                if args.breaks and name not in args.breaks:
                    continue
                if kind not in spec["applies"]:
                    if args.breaks:  # asked for by name: say why it did not run
                        print(f"| {config.stem} | {name} | | | | | n/a: the catalogue does not "
                              f"apply it to {kind} | |", flush=True)  # fmt: skip
                    continue
                start = time.perf_counter()
                drawn = (ClientChunk, "normal") if kind == "record" else ()
                with broken(name), clip_calls() as calls, draw_calls(*drawn) as draws:
                    audit = run_config(config, args.max_steps)["privacy"]["audit"]
                line = row(config.stem, name, audit, time.perf_counter() - start)
                subset = spec.get("subset", False)
                if subset and not SKIPPED[0]:  # a bounding operator of any kind, none skipped
                    line = line.replace("| no |", "| n/a: no row skipped in this mechanism |")
                elif "clip" in name and not subset and not calls[0]:
                    line = line.replace("| no |", "| n/a: no clip in this mechanism |")
                if spec.get("alarm") == "noise_test" and not draws[0]:
                    what = "record-level draw" if kind == "record" else "sum's draw"
                    line = line.replace("| no |", f"| n/a: no {what} in this mechanism |")
                print(line, flush=True)
    if args.seeds:
        false_alarms(args.seeds, args.mechanisms)


if __name__ == "__main__":
    main_()
