"""Which models the layer rules differentiate: :func:`layer_support`, whose refusal names the
layer and the layer types that have a rule (read from the registry)."""

from __future__ import annotations

from torch import nn

from pl_privfed.layer_rules.registry import registered_rules, supported_layers

__all__ = ["layer_support"]

#: modules without parameters that the rules cannot replay (random per call) while training
_RANDOM = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)


def _unsupported(model: nn.Module) -> str | None:
    """The first module the rules cannot differentiate, described, or ``None``."""
    rules = registered_rules()
    for name, module in model.named_modules():
        if isinstance(module, _RANDOM) and module.p > 0 and module.training:
            return f"{name} is {type(module).__name__} (random per call)"
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        rule = rules.get(type(module))
        if rule is None:
            return (
                f"layer {name or '(root)'} is {type(module).__name__}, which has no layer rule "
                f"(supported: {', '.join(supported_layers())})"
            )
        refusal = rule.refusal(module)
        if refusal is not None:
            return f"layer {name} is {refusal}"
    return None


def layer_support(model: nn.Module, criterion: object) -> str | None:
    """``None`` when the layer rules (:class:`~pl_privfed.layer_rules.LayerGradients`) compute
    ``model``'s gradients under ``criterion``, else the reason they do not.

    Supported: every layer with trainable parameters has a registered rule
    (:func:`~pl_privfed.layer_rules.supported_layers`) and is called once per forward, using
    only its own parameters; anything parameterless in between (activations, also in place;
    pooling; reshapes; residual connections); no buffers (``BatchNorm``: use ``GroupNorm``), no
    ``regularizer``, no dropout while training; a criterion that is the mean over the minibatch
    of a per-example loss (e.g. ``nn.CrossEntropyLoss()``, ``nn.MSELoss()``).

    >>> from pl_privfed.models import MLP, SimpleCNN
    >>> layer_support(SimpleCNN(1, 28), nn.CrossEntropyLoss()) is None
    True
    >>> layer_support(MLP(64, [32], 10, batch_norm=True), nn.CrossEntropyLoss())
    'the model has buffers (e.g. BatchNorm statistics): use GroupNorm, or the vmap or loop backend'
    """
    if not isinstance(criterion, nn.Module) or getattr(criterion, "reduction", "mean") != "mean":
        return "the criterion is not a loss module with reduction='mean'"
    if getattr(criterion, "weight", None) is not None:
        return "the criterion has class weights (not a mean over examples)"
    if callable(getattr(model, "regularizer", None)):
        return "the model has a regularizer"
    if any(True for _ in model.buffers()):
        return (
            "the model has buffers (e.g. BatchNorm statistics): use GroupNorm, or the vmap or "
            "loop backend"
        )
    reason = _unsupported(model)
    if reason is not None:
        return reason + ": use the vmap or loop backend"
    return None
