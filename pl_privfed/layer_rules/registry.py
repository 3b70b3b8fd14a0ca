"""The open registry of layer rules: :class:`Rule`, the base of every rule, and
:func:`register_rule`, the decorator that makes a rule the one of a layer type (as Opacus's
``register_grad_sampler``). The supported layers, the refusal message and the table in
docs/engine.md ("Layer rules") are all read from here.

A rule is found by the exact type of a module (``type(module)``, not ``isinstance``: a subclass
of ``nn.Linear`` with its own forward is a new layer and needs its own rule)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

from torch import Tensor, nn

__all__ = [
    "NormMode",
    "Rule",
    "register_rule",
    "registered_rules",
    "rule_for",
    "rule_table",
    "supported_layers",
]

#: how a rule computes the per-example gradient norms: without the gradients, or from them
NormMode = Literal["ghost", "instantiate"]

#: layer type → its rule class, in the order of registration
_RULES: dict[type[nn.Module], type[Rule]] = {}

R = TypeVar("R", bound="type[Rule]")


class Rule:
    """A layer type's rule: the layer's forward on given parameters, and its gradients as
    closed-form functions of the layer's input and of the gradient of its output.

    ``a``: what :meth:`forward` captured (the input, or e.g. a norm's normalized input);
    ``g``: the gradient of the layer's output, ``[N, ...]`` per example; ``want``: per parameter
    name whether its gradient is needed (frozen and absent parameters are not).

    A subclass implements :meth:`forward`, :meth:`example_grads` and, where the per-example
    norms have a cheaper rule than the instantiated gradients, :meth:`norm_mode` and
    :meth:`ghost_norms2`; :meth:`client_sums` defaults to summing :meth:`example_grads`.
    Register it with :func:`register_rule`.
    """

    #: parameter names of the layer, in its ``named_parameters`` order
    names: tuple[str, ...] = ("weight", "bias")
    #: one line for the docs' table (:func:`rule_table`): what the rule computes
    summary: str = ""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    @classmethod
    def refusal(cls, module: nn.Module) -> str | None:
        """Why this rule cannot compute ``module``'s gradients (completing "layer x is ..."),
        or ``None`` when it can (the default)."""
        return None

    def forward(
        self, x: Tensor, p: dict[str, Tensor | None], n: int | None
    ) -> tuple[Tensor, Tensor]:
        """``(z, a)``: the output (``p`` shared, or per client ``[n, ...]`` when ``n``) and the
        capture for the rules."""
        raise NotImplementedError

    def example_grads(self, a: Tensor, g: Tensor, want: dict[str, bool]) -> dict[str, Tensor]:
        """Every example's gradients ``{name: [N, *shape]}`` of the wanted parameters."""
        raise NotImplementedError

    def client_sums(
        self,
        a: Tensor,
        g: Tensor,
        n: int,
        want: dict[str, bool],
        dest: dict[str, Tensor | None] | None = None,
    ) -> dict[str, Tensor]:
        """Per-client sums ``{name: [n, *shape]}`` of the examples' gradients (a rule may write
        some into ``dest``, views of the flat output, and leave them out)."""
        grads = self.example_grads(a, g, want)
        return {k: v.view(n, -1, *v.shape[1:]).sum(1) for k, v in grads.items()}

    def norm_mode(self, a: Tensor, g: Tensor) -> NormMode:
        """How the per-example norms are computed for these ``(a, g)``: ``"instantiate"`` (from
        :meth:`example_grads`; the default) or ``"ghost"`` (:meth:`ghost_norms2`). A pure
        function of the shapes: it changes nothing."""
        return "instantiate"

    def ghost_norms2(self, a: Tensor, g: Tensor, want: dict[str, bool]) -> Tensor:
        """Every example's squared gradient norm ``[N]`` without its gradient."""
        raise NotImplementedError


def register_rule(*layer_types: type[nn.Module], replace: bool = False) -> Callable[[R], R]:
    """Class decorator: the decorated :class:`Rule` computes the gradients of ``layer_types``.

    Args:
        layer_types: the module classes the rule covers (matched by exact type).
        replace: allow replacing the rule of a type that already has one.

    Raises ``ValueError`` when no layer type is given, one is not an ``nn.Module`` class, the
    decorated class is not a :class:`Rule`, or a type already has a rule and not ``replace``.

    Example (a layer ``Scale`` with a parameter ``weight``; see docs/engine.md, "Adding a
    layer rule", for a whole rule)::

        @register_rule(Scale)
        class ScaleRule(Rule):
            names = ("weight",)
            ...
    """
    if not layer_types:
        raise ValueError("register_rule needs at least one layer type, got none")
    for kind in layer_types:
        if not (isinstance(kind, type) and issubclass(kind, nn.Module)):
            raise ValueError(f"register_rule's layer types must be nn.Module classes, got {kind!r}")
        if kind in _RULES and not replace:
            raise ValueError(
                f"layer type {kind.__name__} already has the rule {_RULES[kind].__name__} "
                "(pass replace=True to replace it)"
            )

    def decorate(rule: R) -> R:
        if not (isinstance(rule, type) and issubclass(rule, Rule)):
            raise ValueError(f"register_rule decorates a Rule subclass, got {rule!r}")
        for kind in layer_types:
            _RULES[kind] = rule
        return rule

    return decorate


def registered_rules() -> dict[type[nn.Module], type[Rule]]:
    """A copy of the registry: layer type → rule class, in the order of registration."""
    return dict(_RULES)


def rule_for(module: nn.Module) -> Rule | None:
    """The rule of ``module``'s exact type, built for it, or ``None`` when it has none."""
    rule = _RULES.get(type(module))
    return None if rule is None else rule(module)


def supported_layers() -> tuple[str, ...]:
    """The names of the layer types with a rule, in the order of registration."""
    return tuple(kind.__name__ for kind in _RULES)


def rule_table() -> str:
    """The registry as the Markdown table of docs/engine.md ("Layer rules"): one row per layer
    type, its rule class, the module that defines the rule and its :attr:`Rule.summary`."""
    rows = ["| layer | rule | defined in | what the rule computes |", "| --- | --- | --- | --- |"]
    for kind, rule in _RULES.items():
        rows.append(
            f"| `{kind.__name__}` | `{rule.__name__}` | `{rule.__module__}` | {rule.summary} |"
        )
    return "\n".join(rows)
