"""The privacy–utility frontier: ``pl_privfed.report.frontier`` and ``pl-privfed compare
--frontier`` on small synthetic ``results.csv`` files (written by :mod:`pl_privfed.results`), and
the frontier sweep files of ``configs/sweeps``."""

import csv
import json
import re
import shutil
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
import yaml
from helpers.benchmarks import benchmark_module
from helpers.frontier import (
    EPS,
    NOISE,
    SPREAD,
    STEP,
    TEST,
    nonprivate_sweep,
    private_sweep,
    write_sweep_results,
)
from helpers.sweeps import wandb_agent_command

from pl_privfed.cli import PrivFedCLI, agent_arguments, main
from pl_privfed.report import FRONTIER_SELECTION, frontier, frontier_points, mean_interval
from pl_privfed.report.frontier_record import _slim, keep_runs
from pl_privfed.sweep import grid, load_sweep

REPO = Path(__file__).resolve().parents[1]
FRONTIER_SWEEPS = sorted((REPO / "configs/sweeps").glob("frontier_*.yaml"))
PRIVATE_SWEEPS = [p for p in FRONTIER_SWEEPS if not p.stem.endswith("_nonprivate")]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_selection_on_validation_interval_and_the_non_private_point(tmp_path):
    with pytest.warns(UserWarning, match="1 of 13 runs .* did not finish"):
        points = frontier_points([private_sweep(tmp_path, failed=True), nonprivate_sweep(tmp_path)])
    # the private sweep and its non-private twin are one method, named after the sweep
    assert [(p.method, p.target, p.private) for p in points] == [
        ("mnist_dpsgd", "1", True),
        ("mnist_dpsgd", "8", True),
        ("mnist_dpsgd", "", False),
    ]
    at1, at8, off = points
    # ε = 1: the best validation step size (0.1), with its (worse) test accuracy
    assert at1.selected == {"step_size": "0.1"} and at1.candidates == 2
    expected = mean_interval(TEST[("1.0", 0.1)] + s for s in SPREAD)
    assert (at1.test.n, at1.test.mean) == (3, pytest.approx(expected.mean))
    assert (at1.test.low, at1.test.high) == (
        pytest.approx(expected.low),
        pytest.approx(expected.high),
    )
    assert at1.val.mean == pytest.approx(0.80 + sum(SPREAD) / 3)
    assert at1.certified.mean == pytest.approx(1.001) and at1.adversary == "server"
    assert at8.selected == {"step_size": "1.0"}
    assert at8.test.mean == pytest.approx(0.84 + sum(SPREAD) / 3)
    # non-private: selected on validation too (γ = 1.0), not on test (γ = 0.1 has 0.97)
    assert off.selected == {"step_size": "1.0"} and off.certified.n == 0
    assert off.test.mean == pytest.approx(0.91 + sum(SPREAD) / 3) and off.adversary == ""
    with pytest.raises(ValueError, match="would select on the test set"):
        frontier_points([nonprivate_sweep(tmp_path / "x")], select="final_test_accuracy")


def test_one_configuration_and_seed_run_twice_is_refused_not_pooled(tmp_path):
    """The same point in two files of one method (two records of one sweep, or a run repeated
    with an argument outside the sweep's parameters) would count as two seeds: refused."""
    a = private_sweep(tmp_path / "a")
    b = private_sweep(tmp_path / "b")
    with pytest.raises(ValueError, match=r"mnist_dpsgd: runs \S+ and \S+ have the same .*seed=0"):
        frontier_points([a, b])
    assert len(frontier_points([a, b], labels=["first", "second"])) == 4  # two methods: fine


def test_files_figure_and_caption(tmp_path):
    a = private_sweep(tmp_path)
    b = private_sweep(tmp_path, name="frontier_mnist_dp_clip21")
    written = frontier([a, nonprivate_sweep(tmp_path), b], tmp_path / "out")
    assert [p.name for p in written] == ["frontier.png", "frontier.csv", "frontier.md"]
    assert written[0].stat().st_size > 10_000
    table = read_csv(written[1])
    assert [(r["method"], r["target_epsilon"]) for r in table] == [
        ("mnist_dpsgd", "1"),
        ("mnist_dpsgd", "8"),
        ("mnist_dpsgd", ""),
        ("mnist_dp_clip21", "1"),
        ("mnist_dp_clip21", "8"),
    ]
    first = table[0]
    assert first["selected"] == "step_size=0.1" and first["seeds"] == "3"
    assert float(first["final_test_accuracy_mean"]) == pytest.approx(50.333333, abs=1e-4)
    assert first["adversary"] == "server" and first["private"] == "true"
    assert float(first["certified_epsilon"]) == pytest.approx(1.001)
    md = written[2].read_text()
    assert FRONTIER_SELECTION in md and "whatever the validation data" in md
    # these summaries record no history: the ε with selection is left empty (with a warning)
    assert "| mnist_dpsgd | 1 | 1 |  (6 runs) | server | step_size=0.1 | 3 |" in md
    assert "| mnist_dpsgd | non-private | — | — | — | step_size=1.0 | 3 | 91.33 ± " in md
    assert first["selection_runs"] == "6" and first["epsilon_with_selection"] == ""
    assert first["selected_step_size"] == "0.1"


def test_compare_frontier_command(tmp_path, capsys):
    a, b = private_sweep(tmp_path, name="one"), nonprivate_sweep(tmp_path, name="two")
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "compare",
                "--frontier",
                str(a),
                str(b),
                "--out",
                str(out),
                "--labels",
                "DP-SGD",
                "DP-SGD",
            ]
        )
    assert exit_.value.code == 0
    printed = capsys.readouterr().out
    assert str(out / "frontier.png") in printed and FRONTIER_SELECTION in printed
    assert {r["method"] for r in read_csv(out / "frontier.csv")} == {"DP-SGD"}
    assert len(read_csv(out / "frontier.csv")) == 3
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(a), "--out", str(out), "--labels", "x"])
    assert exit_.value.code == 2 and "--labels goes with --frontier" in capsys.readouterr().err
    # without labels, the folders' names: two methods, one of them only non-private
    frontier([a, b], tmp_path / "two")
    assert [r["method"] for r in read_csv(tmp_path / "two" / "frontier.csv")] == [
        "one",
        "one",
        "two",
    ]


def test_empty_input_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"needs at least one results\.csv"):
        frontier([], tmp_path / "out")
    with pytest.raises(ValueError, match="no such results file"):
        frontier([tmp_path / "missing.csv"], tmp_path / "out")
    with pytest.raises(ValueError, match=r"2 label.* for 1 results file"):
        frontier([nonprivate_sweep(tmp_path)], tmp_path / "out", labels=["a", "b"])
    failed = write_sweep_results(
        tmp_path, "failed", [({"seed": 0, EPS: 1.0, STEP: 0.1}, {"status": "failed: boom"})]
    )
    with pytest.warns(UserWarning, match="did not finish"):
        with pytest.raises(ValueError, match="no finished run with a final_val_accuracy"):
            frontier([failed], tmp_path / "out")
    with pytest.warns(UserWarning), pytest.raises(SystemExit) as exit_:
        main(["compare", "--frontier", str(failed), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pl-privfed: error: no finished run") and "\n" not in err


def test_the_target_of_a_sweep_without_an_epsilon_column_comes_from_the_runs(tmp_path):
    """A sweep at the config's ε (no ε parameter, e.g. paper002_dp_clip21_eps8) is grouped by
    the target in its runs' configs; two such sweeps pool under one label."""
    paths = []
    for eps in (1.0, 8.0):
        runs = [
            (
                {"seed": seed, STEP: step},
                {
                    "final_val_accuracy": 0.5 + step / 10 + eps / 100,
                    "final_test_accuracy": 0.4,
                    "epsilon": eps,
                },
            )
            for step in (0.1, 1.0)
            for seed in (0, 1)
        ]
        paths.append(write_sweep_results(tmp_path, f"eps{eps:g}", runs, config_epsilon=eps))
    points = frontier_points(paths, labels=["clip21", "clip21"])
    assert [(p.method, p.target, p.selected) for p in points] == [
        ("clip21", "1", {"step_size": "1.0"}),
        ("clip21", "8", {"step_size": "1.0"}),
    ]
    assert [p.certified.mean for p in points] == [1.0, 8.0]


def test_kept_runs_draw_the_same_frontier_without_the_sweeps_folders(tmp_path, capsys):
    """--keep-runs copies each results file and its runs' summaries; the copy alone (the
    sweeps' folders gone) gives the same frontier, and a later slice merges run by run."""
    sweeps, record = tmp_path / "sweeps", tmp_path / "record"
    a, b = private_sweep(sweeps), nonprivate_sweep(sweeps)
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_:
        main(
            [
                "compare",
                "--frontier",
                str(a),
                str(b.parent),
                "--out",
                str(out),
                "--keep-runs",
                str(record),
            ]
        )
    assert exit_.value.code == 0
    assert str(record / "frontier_mnist_dpsgd" / "results.csv") in capsys.readouterr().out
    before = read_csv(out / "frontier.csv")
    shutil.rmtree(sweeps)
    kept = sorted(record.glob("*/results.csv"))
    assert all(r["run_dir"] == "" for f in kept for r in read_csv(f))
    # compact: one summaries.jsonl per sweep, one line a run, no folder per run
    assert (
        sorted(p.name for p in record.glob("*/*")) == ["results.csv"] * 2 + ["summaries.jsonl"] * 2
    )
    lines = [json.loads(line) for f in record.glob("*/summaries.jsonl") for line in f.open()]
    assert len(lines) == 12 + 6 and all(set(line) == {"run", "summary"} for line in lines)
    sizes = {"client_sizes": [5] * 10_000, "shuffle": True}  # a long list kept as its summary
    assert _slim({"data": sizes, "few": [1, 2]}) == {
        "data": {
            "client_sizes": {"length": 10_000, "min": 5, "max": 5, "sum": 50_000},
            "shuffle": True,
        },
        "few": [1, 2],
    }
    assert read_csv(frontier(kept, tmp_path / "again")[1]) == before
    # a slice with one more (failed) run: merged, the others' rows kept once
    keep_runs([private_sweep(tmp_path / "later", failed=True)], record)
    assert len(read_csv(record / "frontier_mnist_dpsgd" / "results.csv")) == 13
    assert len((record / "frontier_mnist_dpsgd" / "summaries.jsonl").read_text().splitlines()) == 13
    # a record in the folder-per-run form is read, merged and rewritten compactly
    (old := tmp_path / "old" / "frontier_mnist_dpsgd").mkdir(parents=True)
    shutil.copy(kept[0], old / "results.csv")
    for line in (record / kept[0].parent.name / "summaries.jsonl").read_text().splitlines()[:12]:
        item = json.loads(line)
        (old / "runs" / item["run"]).mkdir(parents=True)
        (old / "runs" / item["run"] / "summary.json").write_text(json.dumps(item["summary"]))
    keep_runs([record / "frontier_mnist_dpsgd"], old.parent)  # from a compact record, too
    assert sorted(p.name for p in old.iterdir()) == ["results.csv", "summaries.jsonl"]
    assert (old / "summaries.jsonl").read_text() == (
        record / "frontier_mnist_dpsgd" / "summaries.jsonl"
    ).read_text()
    with pytest.raises(ValueError, match="holds the sweep"):
        keep_runs([old], old.parent)
    broken = private_sweep(tmp_path / "broken")
    (broken.parent / "runs" / read_csv(broken)[0]["run"] / "summary.json").write_text("{")
    with pytest.raises(ValueError, match=r"summary\.json: not JSON"):
        keep_runs([broken], tmp_path / "x")
    with pytest.raises(ValueError, match="no such results file"):
        keep_runs([tmp_path / "nothing.csv"], tmp_path / "x")
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(a), "--out", str(out), "--keep-runs", str(record)])
    assert exit_.value.code == 2 and "--keep-runs goes with --frontier" in capsys.readouterr().err


# --------------------------------------------------------------------------- the sweep files


#: the family's own knob, tuned with the step size where its paper tunes one (paper 002 App.
#: D.1/D.3: β for DP-α-NormEC, τ for DP-Clip21; paper 004 App. D: β for DP-Fed-α-NormEC and
#: the clipping threshold of DP-FedAvg)
KNOBS = {
    "frontier_mnist_dp_fedavg_clip": "operator.init_args.threshold",
    "frontier_mnist_dp_alpha_normec": "beta",
    "frontier_mnist_dp_alpha_normec_no_sn": "beta",
    "frontier_mnist_dp_clip21": "clip_threshold",
    "frontier_mnist_dp_fed_alpha_normec": "beta",
    "frontier_mnist_dp_fedadam": "server_optimizer.init_args.tau",
}


#: values added outside c/3 … 3c where the selection sat on the grid's edge (distributed DP-SGD at
#: ε ≤ 1 selected 0.3 and then 0.3 again; DP-Clip21 selected γ = 0.01, below its grid, at ε = 1
#: for claim D1; DP-α-NormEC without server normalization selected γ = 0.3 at ε ≤ 1 and 3 at
#: ε = 8; DP-Fed-α-NormEC selected β = 0.017, then 0.006: docs/privacy.md), per (sweep,
#: parameter)
WIDENED = {
    ("frontier_mnist_dpsgd_distributed", "step_size"): [0.1, 0.3],
    ("frontier_mnist_dp_clip21", "step_size"): [0.003, 0.01, 1.0],
    ("frontier_mnist_dp_clip21", "clip_threshold"): [0.01],
    ("frontier_mnist_dp_alpha_normec_no_sn", "step_size"): [0.1, 10.0],
    ("frontier_mnist_dp_fed_alpha_normec", "beta"): [0.002, 0.006],
}


def widened(sweep: str, name: str) -> list[float]:
    """The values added outside c/3 … 3c to ``name`` (a sweep parameter) of ``sweep``."""
    return WIDENED.get((sweep, name.removeprefix("model.algorithm.init_args.")), [])


def around(values, centre, extra=()):
    """``values`` are c/3, c, 3c around ``centre`` and the ``extra`` values outside them
    (smaller than c/3 or larger than 3c), increasing."""
    assert sorted(values) == values and set(extra) <= set(values)
    core = [v for v in values if v not in extra]
    assert len(core) == 3 and core[1] == centre
    assert core[0] == pytest.approx(centre / 3, rel=0.15)
    assert core[2] == pytest.approx(centre * 3, rel=0.15)
    assert all(v < core[0] or v > core[2] for v in extra)


def test_frontier_sweeps_cover_every_private_config():
    configs = sorted(p.stem for p in (REPO / "configs/private").glob("*.yaml"))
    assert [p.stem.removeprefix("frontier_") for p in PRIVATE_SWEEPS] == configs
    for path in PRIVATE_SWEEPS:
        twin = path.with_name(f"{path.stem}_nonprivate.yaml")
        private, nonprivate = load_sweep(path), load_sweep(twin)
        assert private.name == path.stem and nonprivate.name == twin.stem
        knob = KNOBS.get(path.stem)
        knobs = [f"model.algorithm.init_args.{knob}"] if knob else []
        size = 1  # configurations: each swept value (3 and the widened ones) of each knob
        for name in [STEP, *knobs]:
            size *= 3 + len(widened(path.stem, name))
        assert len(grid(private)) == 15 * size and len(grid(nonprivate)) == 3 * size
        assert private.parameters["seed"] == nonprivate.parameters["seed"] == [0, 1, 2]
        assert private.parameters[EPS] == [0.5, 1.0, 2.0, 4.0, 8.0]
        assert nonprivate.parameters[NOISE] == [None]
        assert set(nonprivate.parameters) == {"seed", NOISE, STEP, *knobs}
        assert set(private.parameters) == {"seed", EPS, STEP, *knobs}
        config = REPO / "configs/private" / f"{path.stem.removeprefix('frontier_')}.yaml"
        centre = yaml.safe_load(config.read_text())["model"]["algorithm"]["init_args"]
        for name in [STEP, *knobs]:  # c/3, c, 3c around the config's c, in both sweeps
            assert nonprivate.parameters[name] == private.parameters[name], (path.name, name)
            value = centre
            for part in name.removeprefix("model.algorithm.init_args.").split("."):
                value = value[part]
            around(private.parameters[name], value, widened(path.stem, name))
        for sweep in (private, nonprivate):
            command = sweep.command
            assert command[command.index("--config") + 1] == f"configs/private/{config.name}"
            assert "--trainer.enable_checkpointing=false" in command
            assert sweep.metric["name"] == "val/acc" and sweep.project == "pl-privfed"
            assert "ε with selection" in sweep.path.read_text()


@pytest.mark.parametrize("name", ["frontier_mnist_dpsgd", "frontier_mnist_dpsgd_nonprivate"])
def test_a_frontier_point_parses_in_the_cli(name, tmp_path, monkeypatch):
    """One grid point's command line, as ``wandb agent`` builds it, is parsed and instantiated
    (every value of every frontier sweep: tests/test_sweep.py's shipped-sweeps test)."""
    monkeypatch.chdir(tmp_path)
    path = REPO / "configs/sweeps" / f"{name}.yaml"
    params = grid(load_sweep(path))[0]
    cmd = wandb_agent_command(path, params)
    cli = PrivFedCLI(args=[*agent_arguments(cmd[3:]), "--trainer.logger=false"], run=False)
    algorithm = cli.model.algorithm
    assert algorithm.step_size == params[STEP] and cli.config["seed_everything"] == 0
    if EPS in params:
        assert algorithm.noise.epsilon == 0.5
    else:
        assert algorithm.noise is None
    assert not cli.trainer.checkpoint_callbacks


def test_the_results_pages_are_what_the_kept_record_draws(tmp_path):
    """``make results`` (benchmarks/results_pages.py) draws docs/results/ from the runs kept in
    docs/frontier_runs/: drawing them again gives every kept table (the frontier tables and
    their data, and the overview docs/privacy.md leads with), so a number cannot drift from
    its record."""
    pages = benchmark_module("results_pages")
    block = pages.regenerate(tmp_path)
    kept = REPO / "docs/results"
    for name in pages.GROUPS:
        assert read_csv(tmp_path / name / "frontier.csv") == read_csv(kept / name / "frontier.csv")
        for page in (Path(name) / "frontier.md", Path(name) / "frontier.png"):
            assert (kept / page).is_file(), f"docs/results/{page} missing: run make results"
        assert (tmp_path / name / "frontier.md").read_text() == (
            kept / name / "frontier.md"
        ).read_text()
    assert (tmp_path / "frontier.md").read_text() == (kept / "frontier.md").read_text()
    assert pages.privacy_block() == block, "docs/privacy.md's frontier block: run make results"
    # the frontier at equal total ε: its data, its page and docs/privacy.md's leading block
    total = Path(pages.TOTAL)
    if pages.total_families():
        assert read_csv(tmp_path / total / "total.csv") == read_csv(kept / total / "total.csv")
        assert (tmp_path / total / "total.md").read_text() == (
            kept / total / "total.md"
        ).read_text()
        assert (kept / total / "total.png").is_file(), "docs/results/frontier_total: make results"
    assert pages.privacy_block(begin=pages.TOTAL_BEGIN, end=pages.TOTAL_END) == (
        pages.total_overview_of()
    ), "docs/privacy.md's equal-total-ε block: run make results"
    # paper 002's claims D1 and D2 at equal total ε, in docs/paper_experiments.md
    assert (
        pages.privacy_block(
            page=pages.PAPER_EXPERIMENTS, begin=pages.CLAIMS_BEGIN, end=pages.CLAIMS_END
        )
        == pages.claims_block()
    ), "docs/paper_experiments.md's D1/D2 block: run make results"


def _config_value(config: dict, path: str):
    """The value at a sweep parameter's dotted path in a config (``init_args`` may be implied)."""
    node = config
    for part in path.split("."):
        if part not in node and part == "init_args":
            continue
        node = node[part] if part in node else node["init_args"][part]
    return node


def _kept_run(name: str, private: bool) -> dict[str, str]:
    """The kept frontier run of ``configs/private/<name>.yaml`` as shipped: seed 0, its own step
    size and knob, at ε = 8 (``private``) or in its non-private twin's sweep."""
    stem = f"frontier_{name}" if private else f"frontier_{name}_nonprivate"
    sweep = yaml.safe_load((REPO / "configs/sweeps" / f"{stem}.yaml").read_text())
    config = yaml.safe_load((REPO / "configs/private" / f"{name}.yaml").read_text())
    runs = read_csv(REPO / "docs/frontier_runs" / stem / "results.csv")
    want = {}
    for key, spec in sweep["parameters"].items():
        if "values" in spec:
            column = key if key in runs[0] else key.split(".")[-1]
            value = 0 if key == "seed" else 8.0 if key == EPS else _config_value(config, key)
            want[column] = float(value)
    (run,) = [r for r in runs if all(float(r[c]) == v for c, v in want.items())]
    return run


def _pct(value: str) -> str:
    """A recorded accuracy as the tables print it: percent, one decimal, halves rounded up."""
    return str((Decimal(value) * 100).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def test_the_private_configs_tables_are_their_kept_runs():
    """README's and docs/configs.md's tables of configs/private/ (seed 0, ε = 8, the config as
    shipped, and its non-private twin) quote the runs kept in docs/frontier_runs/ (a9a's runs
    were not kept)."""
    readme = (REPO / "README.md").read_text()
    quoted = re.findall(r"^\| `(mnist_\w+)`.*\| ([\d.]+) % \| ([\d.]+) % \|$", readme, re.M)
    configs = (REPO / "docs/configs.md").read_text()
    detailed = re.findall(
        r"^\| `(mnist_\w+)` \|[^|]*\|[^|]*\| \*\*([\d.]+) %\*\* \| ([^|]*) \| ([\d.]+) % \|",
        configs,
        re.M,
    )
    assert len(quoted) == len(detailed) == len(list((REPO / "configs/private").glob("mnist_*")))
    for name, private, twin in quoted:
        run, plain = _kept_run(name, True), _kept_run(name, False)
        assert (private, twin) == (
            _pct(run["final_test_accuracy"]),
            _pct(plain["final_test_accuracy"]),
        ), name
    for name, private, epsilons, twin in detailed:
        run, plain = _kept_run(name, True), _kept_run(name, False)
        assert private == _pct(run["final_test_accuracy"]), name
        assert twin == _pct(plain["final_test_accuracy"]), name
        assert f"{float(run['epsilon']):.3f}" in epsilons, name
    # docs/privacy.md's example result line is mnist_dp_fedavg_clip's run
    run = _kept_run("mnist_dp_fedavg_clip", True)
    line = (
        f"rounds=300, val accuracy={float(run['final_val_accuracy']):.4f} (round 300), test "
        f"accuracy={float(run['final_test_accuracy']):.4f}, train loss="
        f"{float(run['final_train_loss']):.4f}, epsilon={float(run['epsilon']):.3f} against "
        "whoever sees the models"
    )
    assert line in (REPO / "docs/privacy.md").read_text()
