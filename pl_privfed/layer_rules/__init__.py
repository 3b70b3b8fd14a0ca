"""Layer rules: per-client and per-example gradients (and clipped means) from one batched
forward/backward and a closed-form rule per layer type (``grad_backend: layers``).

The rules form an open registry (as Opacus's ``grad_sample``): one module per layer family,
each rule registered for its layer types by :func:`register_rule`. A rule for another layer
type is a :class:`Rule` subclass and one decorator line (docs/engine.md, "Adding a layer
rule"); :func:`supported_layers` and :func:`rule_table` read the registry.

* :mod:`~pl_privfed.layer_rules.registry`: :class:`Rule`, :func:`register_rule`, the registry;
* :mod:`~pl_privfed.layer_rules.linear`, :mod:`~pl_privfed.layer_rules.conv`,
  :mod:`~pl_privfed.layer_rules.embedding`, :mod:`~pl_privfed.layer_rules.norms`: the rules;
* :mod:`~pl_privfed.layer_rules.layout`: :class:`ParameterLayout`, the flat parameter vector;
* :mod:`~pl_privfed.layer_rules.support`: :func:`layer_support`, which models are covered;
* :mod:`~pl_privfed.layer_rules.capture`, :mod:`~pl_privfed.layer_rules.chain`: the passes
  that give every layer's input and output gradient;
* :mod:`~pl_privfed.layer_rules.gradients`: :class:`LayerGradients`, the entry points;
* :mod:`~pl_privfed.layer_rules.span`: :class:`ClientSpan`, a linear model's client gradients
  as coordinates in the span of each client's data.
"""

from __future__ import annotations

# the built-in rules register themselves on import, in this order (that of supported_layers)
from pl_privfed.layer_rules.linear import LinearRule  # isort: skip
from pl_privfed.layer_rules.conv import ConvRule  # isort: skip
from pl_privfed.layer_rules.embedding import EmbeddingRule  # isort: skip
from pl_privfed.layer_rules.norms import GroupNormRule, LayerNormRule  # isort: skip
from pl_privfed.layer_rules.gradients import LayerGradients
from pl_privfed.layer_rules.layout import ParameterLayout
from pl_privfed.layer_rules.registry import (
    NormMode,
    Rule,
    register_rule,
    registered_rules,
    rule_for,
    rule_table,
    supported_layers,
)
from pl_privfed.layer_rules.span import ClientSpan
from pl_privfed.layer_rules.support import layer_support

__all__ = [
    "ClientSpan",
    "ConvRule",
    "EmbeddingRule",
    "GroupNormRule",
    "LayerGradients",
    "LayerNormRule",
    "LinearRule",
    "NormMode",
    "ParameterLayout",
    "Rule",
    "layer_support",
    "register_rule",
    "registered_rules",
    "rule_for",
    "rule_table",
    "supported_layers",
]
