"""Batched sweeps: the points of a sweep that can share a federation, trained as one grid.

Points that differ only in arguments of the algorithm (``model.algorithm.init_args.<name>``:
the step size, β, ... and the noise's fields, ``model.algorithm.init_args.noise.epsilon``, the
target ε) and in the run's ``seed`` (``pl-privfed fit --seed``), and agree on everything else
(the data, the config, the overrides) form a *group*. ``pl-privfed sweep --batch`` trains a
group of two or more points as one ``pl-privfed fit`` process (seeded with its first point's
``--seed``) whose model is a grid over exactly those points (``--model.grid='[{...}, ...]'``,
:class:`pl_privfed.grid.GridModule`; the seed is its ``"--seed"`` parameter,
:mod:`pl_privfed.grid.seeds`): every configuration sees the data, the initial model, the
cohorts and the noise streams its separate run sees (the noise of client ``i`` in round ``k``
is keyed by its noise seed, ``k`` and ``i``; a point of another seed gets its own initial
model, validation split, partition and minibatch streams), and has its own privacy ledger (its
σ calibrated to its own ε and its own shard sizes). Seeds the grid cannot reproduce (a model
with its own initialization code or a seed argument, a datamodule seed other than its ``seed``
and its partitioner's, a ``GradientNorm`` callback) make the group's process fail before
training, and its points then run one by one.

When the group's process ends, every point gets what its separate run writes into its own run
folder (``<out>/runs/<index>-<hash>``, the folder its separate run would use): its run record
(:mod:`pl_privfed.record`, made by the same function as a separate run's) as ``summary.json``,
and its ``curves.csv``. Each field of the record comes from where its declaration's ``scope``
says: the point's grid configuration (status, rounds, validation and test metrics, training
loss, ε and privacy report, transmissions, ...), or the group's run (its ``data``, ``seeds``
and ``config``, rewritten with the point's values and seed; for another seed its own
``data``). An entry of the group's ``summary.json`` that no field declares (a callback's, e.g.
``operator_means``, the grid's first live configuration's) is ``None`` in the point and named
in ``batched.not_per_point``; ``batched`` also gives the group's folder, the configuration's
index, the group's size and wall time. ``wall_time_s`` is the point's share of the group's
fit. A configuration whose loss turns non-finite is failed alone (the grid freezes it); a
group refused for memory (its ``summary.json``'s ``error``,
:class:`~pl_privfed.engine.state.GridMemoryRefused`) is split into groups that fit; a group
whose process fails otherwise before training (a configuration error) is run again point by
point, so that each point reports its own error.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

from pl_privfed.grid.seeds import RUN_SEED, is_seed_argument
from pl_privfed.record import make_record, point_entries
from pl_privfed.results import render_value, run_id, write_atomically
from pl_privfed.sweep.files import read_summary

__all__ = [
    "BATCHED_PREFIX",
    "Group",
    "batch_parameter",
    "group_args",
    "groups",
    "split",
    "write_point_records",
]

#: the sweep parameters a group may vary: the algorithm's arguments, and the run's seed
BATCHED_PREFIX = "model.algorithm.init_args."
SEED = "seed"


def batch_parameter(name: str, value: Any) -> str | None:
    """The grid parameter of the sweep parameter ``name`` when points that differ in it can
    share a federation (an argument of the algorithm, ``step_size``, a field of its noise,
    ``noise.epsilon``, or an argument of an object among its arguments,
    ``operator.init_args.threshold`` → ``operator.threshold``, with a plain value; the run's
    ``seed``, an integer: ``"--seed"``), else ``None``."""
    if name == SEED:
        plain = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return RUN_SEED if plain else None
    if not name.startswith(BATCHED_PREFIX):
        return None
    if not (value is None or isinstance(value, bool | int | float | str)):
        return None  # an object (class_path ...) is built by the CLI, not by the grid
    parts = name[len(BATCHED_PREFIX) :].split(".")
    if len(parts) == 1 or (len(parts) == 2 and parts[0] == "noise" and value is not None):
        return ".".join(parts)
    if len(parts) == 3 and parts[1] == "init_args" and value is not None:
        return f"{parts[0]}.{parts[2]}"  # operator.init_args.threshold: the object rebuilt
    return None


class Group:
    """Points of a sweep trained as one federation.

    Attributes:
        indices: the points' indices in the sweep's grid.
        points: their parameters (the sweep's names).
        varying: the sweep parameters that differ between the points (each batchable).
    """

    def __init__(self, indices: list[int], points: list[dict[str, Any]], varying: list[str]):
        self.indices, self.points, self.varying = indices, points, varying

    @property
    def grid(self) -> list[dict[str, Any]]:
        """The ``--model.grid`` points: each point's values of the varying parameters."""
        return [{batch_parameter(k, p[k]): p[k] for k in self.varying} for p in self.points]

    def folder(self, out: Path, args: list[str]) -> Path:
        """The group's run folder: ``<out>/groups/<first index>-<hash of its points>``."""
        payload = {"points": self.points, "indices": self.indices}
        return out / "groups" / run_id(self.indices[0], payload, args)


def groups(points: dict[int, dict[str, Any]]) -> list[Group]:
    """The points (index → parameters) in groups that can share a federation: equal in every
    parameter but the batchable ones, in sweep order; a point alone is a group of one."""
    keys = list(next(iter(points.values()), {}))
    by_rest: dict[str, list[int]] = {}
    for index, params in points.items():
        fixed = {k: v for k, v in params.items() if batch_parameter(k, v) is None}
        by_rest.setdefault(json.dumps(fixed, sort_keys=True, default=str), []).append(index)
    out = []
    for indices in by_rest.values():
        members = [points[i] for i in indices]
        varying = [k for k in keys if len({render_value(p[k]) for p in members}) > 1]
        batchable = all(batch_parameter(k, p[k]) is not None for k in varying for p in members)
        grids = [{batch_parameter(k, p[k]) for k in varying} for p in members]
        if len(indices) > 1 and batchable and varying and len({frozenset(g) for g in grids}) == 1:
            out.append(Group(indices, members, varying))
        else:  # e.g. noise: null beside noise.epsilon values
            out += [Group([i], [points[i]], []) for i in indices]
    return sorted(out, key=lambda g: g.indices[0])


def group_args(group: Group, folder: Path) -> list[str]:
    """What a group's command adds to its first point's: the grid of its points, where the
    grid's results go, and ``grid_memory: refuse`` (a group whose configurations' client state
    would not fit in memory together is refused before training, naming how many fit:
    :func:`split`, rather than memory-mapped)."""
    return [
        f"--model.grid={json.dumps(group.grid)}",
        f"--model.grid_dir={folder / 'grid'}",
        "--model.grid_memory=refuse",
    ]


def split(group: Group, summary: dict[str, Any] | None) -> list[Group] | None:
    """The group in consecutive groups of as many points as its refused process said fit in
    memory (its ``summary.json``'s ``error``: ``{"type": "grid_memory_refused", "fit": n}``,
    :class:`~pl_privfed.engine.state.GridMemoryRefused`), or ``None`` when it did not fail so."""
    error = (summary or {}).get("error")
    if not isinstance(error, dict) or error.get("type") != "grid_memory_refused":
        return None
    size = max(1, int(error["fit"]))
    parts = range(0, len(group.indices), size)
    return [Group(group.indices[i : i + size], group.points[i : i + size], group.varying)
            for i in parts]  # fmt: skip


def _configurations(folder: Path, summary: dict[str, Any] | None) -> dict[int, Path]:
    """The grid's configuration folders by index (``<group>/grid/runs/<k>-<hash>``)."""
    grid_info = (summary or {}).get("grid")
    results = Path(grid_info["results"]) if isinstance(grid_info, dict) else folder / "grid" / "x"
    runs = results.parent / "runs"
    if not runs.is_dir():
        runs = folder / "grid" / "runs"
    found = {}
    for path in sorted(runs.glob("*/summary.json")) if runs.is_dir() else []:
        own = read_summary(path.parent) or {}
        if isinstance(own.get("grid_index"), int):
            found[own["grid_index"]] = path.parent
    return found


def write_point_records(
    group: Group,
    folder: Path,
    run_dirs: list[Path],
    names: list[str],
    code: int,
    seconds: float,
) -> list[dict[str, Any]] | None:
    """Write every point's ``summary.json`` and ``curves.csv`` into its run folder from the
    group's run (module docstring); return the summaries, or ``None`` when the group's process
    wrote no summary (it failed before training: the caller runs the points one by one).
    ``names`` are the points' run names, ``code`` and ``seconds`` the group process's exit
    status and wall time."""
    summary = read_summary(folder)
    if summary is None:
        return None
    configurations = _configurations(folder, summary)
    group_status = str(summary.get("status"))
    if code != 0 and group_status == "finished":
        group_status = f"failed: exit code {code} after the fit finished"
    written = []
    fit_seconds = summary.get("wall_time_s")
    share = fit_seconds / len(group.points) if isinstance(fit_seconds, int | float) else None
    points = zip(group.points, run_dirs, names, strict=True)
    for k, (params, run_dir, name) in enumerate(points):
        own_dir = configurations.get(k)
        own = (read_summary(own_dir) if own_dir is not None else None) or {}
        entries, not_per_point = point_entries(summary, own)
        if SEED in group.varying and isinstance(entries.get("seeds"), dict):
            entries["seeds"] = _point_seeds(entries["seeds"], params[SEED])
        entries["wall_time_s"] = share  # the fit's, as a separate run's (no start-up)
        entries["config"] = _point_config(summary.get("config"), params, group, run_dir, name)
        entries["batched"] = {
            "group": str(folder),
            "configuration": k,
            "points": len(group.points),
            "group_wall_time_s": fit_seconds,
            "group_process_s": seconds,
            "not_per_point": not_per_point,
            "command": str(folder / "command.txt"),
            "output": str(folder / "output.log"),
        }
        status = str(own.get("status", group_status))
        if status == "running" or (group_status != "finished" and status == "finished"):
            status = group_status  # the group stopped while this configuration ran
        point = make_record(status=status, rounds=own.get("rounds"), entries=entries)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(run_dir / "summary.json", json.dumps(point, indent=2, default=str))
        if own_dir is not None and (own_dir / "curves.csv").is_file():
            shutil.copyfile(own_dir / "curves.csv", run_dir / "curves.csv")
        written.append(point)
    return written


def _point_config(
    config: Any, params: dict[str, Any], group: Group, run_dir: Path, name: str
) -> Any:
    """The group's resolved config as the point's separate run's: no grid, the point's values
    of the varying parameters, its own output folder and run name."""
    if not isinstance(config, dict):
        return config
    config = copy.deepcopy(config)
    model = config.get("model")
    if isinstance(model, dict):
        for key in ("grid", "grid_dir", "grid_chunk"):
            if key in model:
                model[key] = None
    for parameter in group.varying:  # model.algorithm.init_args.noise.epsilon
        if parameter == SEED:  # every seed --seed sets, as the point's own run's config
            config[SEED] = params[SEED]
            config["seed_everything"] = params[SEED]
            for section in ("model", "data"):
                _set_seeds(config.get(section), params[SEED])
            continue
        *path, last = parameter.split(".")
        node: Any = config
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node[last] = params[parameter]
    for key, value in (("output_dir", str(run_dir)), ("run_name", name)):
        if key in config:
            config[key] = value
    trainer = config.get("trainer")
    if isinstance(trainer, dict) and "default_root_dir" in trainer:
        trainer["default_root_dir"] = str(run_dir)
    return config


def _set_seeds(node: Any, seed: int) -> None:
    """Set every seed argument (``seed``, ``*_seed`` but ``split_seed``) under a resolved
    config's section to ``seed``, in place: what ``--seed`` does to the point's own run."""
    if isinstance(node, dict):
        for key, value in node.items():
            if is_seed_argument(key, value):
                node[key] = seed
            else:
                _set_seeds(value, seed)
    elif isinstance(node, list):
        for item in node:
            _set_seeds(item, seed)


def _point_seeds(seeds: dict[str, Any], seed: int) -> dict[str, Any]:
    """The group's ``seeds`` entry (``{"set_by": ..., dotted path: value}``) as the point's run
    with ``--seed seed`` lists them."""
    out = dict(seeds)
    for path, value in seeds.items():
        last = path.rsplit(".", 1)[-1]
        if path == "seed_everything" or is_seed_argument(last, value):
            out[path] = seed
    return out
