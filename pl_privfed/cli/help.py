"""What ``pl-privfed --help`` and ``pl-privfed fit --help`` say, in the package's terms."""

from __future__ import annotations

from typing import Any

from jsonargparse import ArgumentParser

from pl_privfed.cli.registry import COMMANDS
from pl_privfed.compat.jsonargparse import parser_actions, subcommand_help_entries

__all__ = ["TRAINER_COMMANDS", "list_subcommands", "short_module_help"]

#: one-line help of the Trainer subcommands, in the package's terms
TRAINER_COMMANDS = {
    "fit": "Train a federation: one training step is one communication round (--config <yaml>).",
    "validate": "Evaluate a model on the held-out set (--ckpt_path <checkpoint> to load one).",
    "test": "Test a model on the held-out set (--ckpt_path <checkpoint> to load one).",
}

#: arguments typed ``nn.Module``, whose help listed every subclass in torch and Opacus (some
#: 1,400 lines): it names the package's own and says that any class_path is accepted
_MODULE_ARGUMENTS = {
    "model.model": "e.g. torch.nn.Linear, torchvision.models.resnet18",
    "model.criterion": "e.g. torch.nn.CrossEntropyLoss, torch.nn.MSELoss",
}


def list_subcommands(action: Any) -> None:
    """List the registered subcommands (:data:`~.registry.COMMANDS`) in ``pl-privfed --help``
    beside the Trainer's, and give the Trainer's theirs in the package's terms.

    Args:
        action: the root parser's subcommands action (``parser.add_subcommands()``).
    """
    for name, command in COMMANDS.items():  # for --help; main() runs them
        sub = ArgumentParser(prog=f"pl-privfed {name}", description=command.help)
        action.add_subcommand(name, sub, help=command.help)
    for choice in subcommand_help_entries(action):
        choice.help = TRAINER_COMMANDS.get(choice.dest, choice.help)


def short_module_help(parser: ArgumentParser) -> None:
    """Show the package's classes, not every ``nn.Module`` subclass, in the help of the
    arguments typed ``nn.Module``; any ``nn.Module`` is still accepted through its
    ``class_path``.

    Args:
        parser: a subcommand's parser, after the model's arguments were added.
    """
    from torch import nn

    import pl_privfed.models as models

    own = [
        f"{models.__name__}.{name}"
        for name in models.__all__
        if isinstance(getattr(models, name), type) and issubclass(getattr(models, name), nn.Module)
    ]
    losses = [path for path in own if path.endswith(("Loss", "Error"))]
    listed = {"model.model": [p for p in own if p not in losses], "model.criterion": losses}
    for action in parser_actions(parser):
        if action.dest in _MODULE_ARGUMENTS and hasattr(action, "extra_help"):
            text = (
                f", the package's: {', '.join(listed[action.dest])}; or any torch.nn.Module by "
                f"its class_path ({_MODULE_ARGUMENTS[action.dest]}, your own)"
            )
            action.extra_help = lambda text=text: text
