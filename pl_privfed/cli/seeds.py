"""One seed fanned out to every seed of a run: ``--seed N`` (or an integer ``--seed_everything
N`` on the command line) sets ``seed_everything`` and every ``seed``/``*_seed`` argument of the
model and the data, except ``split_seed`` (the test set stays fixed).

The fan-out happens while the command line is parsed (:func:`fan_out`, called by
:meth:`PrivFedCLI.parse_arguments <pl_privfed.cli.PrivFedCLI.parse_arguments>`), before
``--print_config`` prints: the printed file names every seed the run uses, so running it
reproduces the seeded run. ``summary.json`` lists them (:class:`RunSeeds`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonargparse import Namespace
from pytorch_lightning import Callback

__all__ = [
    "SEED_RANGE",
    "RunSeeds",
    "check_seed",
    "fan_out",
    "given_on_command_line",
    "seeds_of",
    "set_seeds",
]

#: The seeds numpy (and so ``seed_everything``) accepts.
SEED_RANGE = (0, 2**32 - 1)

#: Seed arguments that ``--seed`` leaves alone: the train/test split stays fixed.
_FIXED_SEEDS = ("split_seed",)


def check_seed(value: Any, option: str) -> None:
    """Refuse a seed numpy does not accept (Lightning's ``seed_everything`` ends in numpy's
    traceback otherwise).

    Args:
        value: the seed given (``None``, ``True`` or ``False`` pass: no seed, a random one).
        option: the option named in the error.

    Raises:
        ValueError: unless ``value`` is an integer from 0 to 2³² − 1.
    """
    if isinstance(value, bool) or value is None:
        return  # seed_everything: true (a random seed) or false (none)
    low, high = SEED_RANGE
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{option} {value} is out of range: a seed is an integer from {low} to {high}"
        )


def _seed_slots(
    node: Any, path: str = "", fixed: bool = False
) -> Iterator[tuple[Namespace, str, str]]:
    """``(namespace, key, dotted path)`` of every seed argument (``seed`` or ``*_seed``) under
    ``node``, a parsed config; the seeds that stay fixed (``split_seed``) only with ``fixed``."""
    if isinstance(node, Namespace):
        for key in list(vars(node)):
            value = getattr(node, key)
            dotted = f"{path}.{key}" if path else key
            seedlike = key == "seed" or (
                key.endswith("_seed") and (fixed or key not in _FIXED_SEEDS)
            )
            if seedlike and (
                value is None or (isinstance(value, int) and not isinstance(value, bool))
            ):
                yield node, key, dotted
            else:
                yield from _seed_slots(value, dotted, fixed)
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            yield from _seed_slots(item, f"{path}[{i}]", fixed)


def set_seeds(config: Namespace, seed: int) -> list[str]:
    """Set every seed of a parsed run config to ``seed``; return the dotted paths set.

    ``seed_everything`` (the model's initialization and any global generator) and every
    ``seed`` or ``*_seed`` argument of the model and the data (the validation split and the
    clients' minibatch streams, the partition, the noise, client sampling, a random graph),
    except ``split_seed``: the train/test split stays fixed, so every seed is measured on the
    same test set. One integer thus gives a consistent, reproducible replicate of a run.

    Args:
        config: a parsed run config (a subcommand's section).
        seed: the seed.

    Returns:
        The dotted paths set, ``seed_everything`` first.
    """
    config["seed_everything"] = seed
    done = ["seed_everything"]
    for section in ("model", "data"):
        for node, key, dotted in _seed_slots(config.get(section), section):
            setattr(node, key, seed)
            done.append(dotted)
    return done


def seeds_of(config: Namespace) -> dict[str, int | None]:
    """Every seed of a parsed run config, ``{dotted path: value}``: ``seed_everything`` and each
    ``seed`` or ``*_seed`` argument of the model and the data (``split_seed`` included)."""
    out: dict[str, int | None] = {"seed_everything": config.get("seed_everything")}
    for section in ("model", "data"):
        for node, key, dotted in _seed_slots(config.get(section), section, fixed=True):
            out[dotted] = getattr(node, key)
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def given_on_command_line(argv: list[str] | tuple[str, ...]) -> bool:
    """Whether ``--seed_everything`` is among the arguments (not only in a config file)."""
    return any(
        str(a) == "--seed_everything" or str(a).startswith("--seed_everything=") for a in argv
    )


def fan_out(config: Namespace, seed_everything_given: bool) -> str | None:
    """Fan the run's one seed out to every seed of ``config`` (:func:`set_seeds`), in place.

    The seed is ``--seed``; else an integer ``seed_everything`` given on the command line
    (``seed_everything_given``), which becomes ``seed`` too, so the config says what the run
    did. A config file's ``seed_everything`` keeps Lightning's meaning (the model's
    initialization): the seeds a config or the command line sets one by one stay.

    Args:
        config: a parsed run config (a subcommand's section).
        seed_everything_given: whether ``--seed_everything`` was on the command line.

    Returns:
        What set the seeds, ``"--seed"`` or ``"seed_everything"``, or ``None``.

    Raises:
        ValueError: a seed out of numpy's range.
    """
    check_seed(config.get("seed"), "--seed")
    check_seed(config.get("seed_everything"), "--seed_everything")
    given = config.get("seed_everything")
    source = "--seed" if config.get("seed") is not None else None
    if source is None and seed_everything_given and _is_int(given):
        config["seed"] = given
        source = "seed_everything"
    if config.get("seed") is not None:
        set_seeds(config, int(config["seed"]))
    return source


class RunSeeds(Callback):
    """Puts the run's seeds in ``summary.json`` (``seeds``: what set them, ``--seed`` or
    ``seed_everything``, and every seed argument's value), through ``summary_entries``.

    Args:
        seeds: ``{"set_by": ..., dotted path: value}``.
    """

    def __init__(self, seeds: dict[str, Any]) -> None:
        self.seeds = dict(seeds)

    def summary_entries(self) -> dict[str, Any]:
        """The ``seeds`` entry of ``summary.json``."""
        return {"seeds": self.seeds}
