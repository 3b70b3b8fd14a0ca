"""The run's seed as a grid parameter: ``"--seed"``, what ``pl-privfed fit --seed`` sets.

A grid point ``{"--seed": s, ...}`` is the configuration that its separate run with ``--seed s``
would train (:func:`pl_privfed.cli.set_seeds`: ``seed_everything`` and every ``seed`` or
``*_seed`` argument of the model and the data, except ``split_seed``). Per configuration:

* **its algorithm** (:func:`seed_overrides`): every seed argument of the algorithm, and of the
  objects among its arguments (its noise settings, a topology, a secure aggregation, ...), is
  ``s``: its noise streams ``(noise seed, round, client)``, its cohorts ``(sampling_seed,
  round)``, its compressors and sampled output ``(seed, ...)`` and its random graph;
* **its initial model** (:func:`initial_parameters`): the model's ``reset_parameters()`` in
  module order after ``torch.manual_seed(s)``, which is how a model is initialized when it is
  built right after ``seed_everything(s)`` (the CLI's order); the grid checks this on the model
  it is given (``ValueError`` when the model is not that initialization at the first point's
  seed, e.g. a model with its own initialization code);
* **its data** (:meth:`pl_privfed.datamodules.FederatedDataModule.reseeded`): a copy of the
  datamodule with every seed argument (its ``seed``, its partitioner's) set to ``s`` and set up
  again: its own validation split, partition, minibatch streams and augmentation, sharing the
  loaded dataset when the datamodule's data do not depend on its seed.

So nothing random is shared between configurations of different seeds; only the test set (the
fixed ``split_seed``) is common, as between separate runs.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

import torch
from torch import nn

from pl_privfed.checks import check_int

__all__ = [
    "RUN_SEED",
    "check_initialization",
    "initial_parameters",
    "is_seed_argument",
    "kept_arguments",
    "reseed",
    "seed_overrides",
]

#: The grid parameter of the run's seed (``pl-privfed fit --seed``); it is no argument of an
#: algorithm (an algorithm's own ``seed`` argument keeps its name).
RUN_SEED = "--seed"
#: Seed arguments that ``--seed`` leaves alone (the CLI's rule: the test set stays fixed).
_FIXED = ("split_seed",)


def is_seed_argument(name: str, value: Any) -> bool:
    """Whether ``--seed`` sets the argument ``name`` holding ``value`` (the CLI's rule: ``seed``
    or ``*_seed`` but ``split_seed``, an integer or unset)."""
    seedlike = name == "seed" or (name.endswith("_seed") and name not in _FIXED)
    plain = value is None or (isinstance(value, int) and not isinstance(value, bool))
    return seedlike and plain


def kept_arguments(obj: Any) -> list[str]:
    """The constructor arguments of ``obj`` that it keeps as attributes of the same name."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [f.name for f in dataclasses.fields(obj)]
    params = inspect.signature(type(obj).__init__).parameters
    names = [k for k, p in params.items() if k != "self" and p.kind is p.POSITIONAL_OR_KEYWORD]
    return [name for name in names if hasattr(obj, name)]


def _nested(value: Any) -> bool:
    """Whether ``--seed`` may reach into ``value``: settings or an object of the package."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return True
    return type(value).__module__.startswith("pl_privfed.") and not isinstance(value, type)


def reseed(obj: Any, seed: int) -> tuple[Any, bool]:
    """``(a copy of obj with every seed argument set to seed, recursively, whether any was)``;
    ``obj`` itself when it has none."""
    changes: dict[str, Any] = {}
    for name in kept_arguments(obj):
        value = getattr(obj, name)
        if is_seed_argument(name, value):
            if value != seed:
                changes[name] = seed
        elif _nested(value):
            new, changed = reseed(value, seed)
            if changed:
                changes[name] = new
    if not changes:
        return obj, False
    if dataclasses.is_dataclass(obj):
        return dataclasses.replace(copy.deepcopy(obj), **changes), True  # validated
    new = copy.deepcopy(obj)
    for name, value in changes.items():
        setattr(new, name, value)
    return new, True


def seed_overrides(algorithm: Any, seed: int) -> dict[str, Any]:
    """The arguments of ``algorithm`` that ``--seed seed`` changes: ``{argument: value}`` for a
    rebuild (its seed arguments, and copies of its objects with theirs set)."""
    check_int(RUN_SEED, seed)
    if seed < 0:
        raise ValueError(f"grid parameter {RUN_SEED} must be a seed >= 0, got {seed!r}")
    out: dict[str, Any] = {}
    for name in kept_arguments(algorithm):
        value = getattr(algorithm, name)
        if is_seed_argument(name, value):
            out[name] = seed
        elif _nested(value):
            new, changed = reseed(value, seed)
            if changed:
                out[name] = new
    return out


def _reset(model: nn.Module) -> None:
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()


@torch.no_grad()
def initial_parameters(model: nn.Module, seed: int) -> nn.Module:
    """A copy of ``model`` initialized as if built right after ``seed_everything(seed)``: each
    submodule's ``reset_parameters()`` in module order from ``torch.manual_seed(seed)`` (the
    global generator is left as it was)."""
    fresh = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        _reset(fresh)
    return fresh


def check_initialization(model: nn.Module, seed: int) -> None:
    """``ValueError`` unless ``model``'s parameters and buffers are its initialization at
    ``seed`` (:func:`initial_parameters`): then the other seeds' initializations are what their
    separate runs start from."""
    params = inspect.signature(type(model).__init__).parameters
    for name, param in params.items():
        if is_seed_argument(name, None if param.default is param.empty else param.default):
            raise ValueError(
                f"grid parameter {RUN_SEED}: {type(model).__name__} takes a seed ({name}) that "
                "a grid cannot set per configuration; run the seeds separately"
            )
    again = initial_parameters(model, seed)
    own = dict(model.state_dict())
    for name, value in again.state_dict().items():
        if not torch.equal(own[name], value):
            raise ValueError(
                f"grid parameter {RUN_SEED}: the model's {name} is not its initialization at the "
                f"first point's seed {seed} (reset_parameters() in module order after "
                f"torch.manual_seed({seed})), so the other seeds' initial models could not be "
                "their separate runs'; build the model right after seed_everything(first seed), "
                "or run the seeds separately"
            )
