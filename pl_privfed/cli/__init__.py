"""The ``pl-privfed`` command: LightningCLI over :class:`FederatedModule` and the datamodules.

``pl-privfed fit --config configs/quickstart.yaml`` trains; every value can be overridden on the
command line (``--model.algorithm.init_args.beta 0.1``); ``--print_config`` shows the resolved
config; ``validate`` and ``test`` evaluate a checkpoint (``--ckpt_path``). ``pl-privfed sweep
<sweep.yaml>`` runs a grid sweep file locally (:mod:`pl_privfed.sweep`) and ``pl-privfed report
<results.csv>`` draws its figures and table (:mod:`pl_privfed.report`); ``pl-privfed compare
<a/results.csv> <b/results.csv> --out DIR`` draws the best configuration of each sweep against
rounds and bits (with ``--frontier``, the privacy–utility frontier: test accuracy against
certified ε); ``pl-privfed demo`` runs the demo (:mod:`pl_privfed.demo`). ``pl-privfed
--help`` lists them all.

Beside the LightningCLI arguments, ``fit`` takes ``--seed N`` (every seed of the run, see
:func:`set_seeds`; an integer ``--seed_everything N`` on the command line without ``--seed`` is
taken as ``--seed N``; ``--print_config`` prints the seeds so set, and ``summary.json`` lists
every seed used), ``--output_dir`` (the run's summary, curves and the loggers' files),
``--run_name`` and ``--run_group`` (its W&B run's name and group). Arguments as ``wandb agent``
writes them are accepted (:func:`agent_arguments`): every file in ``configs/sweeps`` runs
unchanged under ``wandb sweep`` + ``wandb agent``, from any working directory of a checkout.

An error the user can fix ends the command with one line, ``pl-privfed: error: <what>``, and exit
status 2 (:func:`error_line`); ``--debug`` or ``PL_PRIVFED_DEBUG=1`` shows the traceback.

One job per module: :mod:`.app` (the LightningCLI class), :mod:`.errors` (one-line errors),
:mod:`.registry` and :mod:`.commands` (the extra subcommands, a typed function and one
registration each), :mod:`.seeds` (one seed fanned out), :mod:`.print_config`, :mod:`.folders`
(the run's folders), :mod:`.arguments` (arguments as ``wandb agent`` writes them), :mod:`.help`,
:mod:`.environment` (the process environment) and :mod:`.entry` (:func:`main`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pl_privfed.cli.entry import main
from pl_privfed.lazy import lazy_exports

if TYPE_CHECKING:
    from pl_privfed.cli.app import LoggedConfig, PrivFedCLI
    from pl_privfed.cli.arguments import agent_arguments, nested_nulls
    from pl_privfed.cli.environment import tune_allocator, wandb_offline_unless_logged_in
    from pl_privfed.cli.errors import check_config_files, condense_parser_error, error_line
    from pl_privfed.cli.registry import COMMANDS, Subcommand, subcommand
    from pl_privfed.cli.seeds import check_seed, seeds_of, set_seeds

__all__ = [
    "COMMANDS",
    "LoggedConfig",
    "PrivFedCLI",
    "Subcommand",
    "agent_arguments",
    "check_config_files",
    "check_seed",
    "condense_parser_error",
    "error_line",
    "main",
    "nested_nulls",
    "seeds_of",
    "set_seeds",
    "subcommand",
    "tune_allocator",
    "wandb_offline_unless_logged_in",
]

#: each name → its module, imported on first use: ``pl-privfed --help``, ``report`` and
#: ``compare`` never import the training stack (torch, Lightning)
_LAZY = {
    "COMMANDS": "registry",
    "LoggedConfig": "app",
    "PrivFedCLI": "app",
    "Subcommand": "registry",
    "agent_arguments": "arguments",
    "check_config_files": "errors",
    "check_seed": "seeds",
    "condense_parser_error": "errors",
    "error_line": "errors",
    "nested_nulls": "arguments",
    "seeds_of": "seeds",
    "set_seeds": "seeds",
    "subcommand": "registry",
    "tune_allocator": "environment",
    "wandb_offline_unless_logged_in": "environment",
}


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
