"""Per-client and per-example gradients by layer rules: one batched forward/backward, then a
closed-form rule per layer type.

For every layer with parameters the gradient of a loss is a function of the layer's input
``a`` and of the gradient ``g = ∂loss/∂z`` of its output ``z``: a ``Linear`` layer's weight
gradient is ``Σ_t g_tᵀ a_t`` (over the positions ``t`` of a sequence), a convolution's the same
over the patches of its input (im2col; computed by the native ``convolution_backward``: per
client, and per example with the examples as groups), an ``Embedding``'s a scatter of ``g`` into
the rows of the looked-up indices, a ``LayerNorm``/``GroupNorm``'s ``Σ g ⊙ x̂`` and ``Σ g``
(``x̂`` the normalized input). So one forward over all examples of a chunk of clients (stacked:
``[n·B, ...]``, the centralized pass) and one backward that only propagates ``g`` (no weight
gradients: the parameters do not require grad) give every layer's ``(a, g)`` for every example,
and the rules turn them into

* per-client gradient sums: segment sums over each client's examples (``[n, out, B·T] @
  [n, B·T, in]`` for a ``Linear``);
* per-example gradient norms, by the cheaper of two rules per layer (mixed ghost clipping,
  Bu et al. 2022; Li et al. 2021): the *ghost norm* ``||Gᵀ A||² = ⟨A Aᵀ, G Gᵀ⟩`` (cost ``~T²``
  per example, ``T`` the sequence length or the number of patches) or the *instantiated*
  per-example gradient ``Gᵀ A`` (cost ``~p·d``); ghost when ``2 T² < p·d``;
* per-example clipped sums: the per-client sum rule applied to the reweighted output gradients
  ``s_b g_b`` (``s_b`` the clipping factor of example ``b``), or the weighted sum of the
  instantiated per-example gradients where they were kept: the reweighted reduction of the
  captured tensors that replaces a second backward.

Parameters per client (local steps: every client's model differs) are handled by per-client
forwards of the same layers: a batched matrix product for ``Linear``, a grouped convolution with
the clients as groups for ``Conv1d``/``Conv2d``, an offset lookup into the stacked tables for
``Embedding``, per-client affine maps for the norms; the rules are the same. A chain of
``Linear`` layers and ReLU/Sigmoid/Tanh under the plain cross-entropy (an MLP) propagates the
output gradients by hand instead of by autograd (:meth:`LayerGradients._pass_chain`, what the
former analytic backend did), into the same rules.

Supported (:func:`layer_support` says why not otherwise): any model whose layers with parameters
are ``Linear``, ``Conv1d``, ``Conv2d``, ``Embedding`` (without ``max_norm`` and
``scale_grad_by_freq``), ``LayerNorm`` or ``GroupNorm``, each called once per forward and using
only its own parameters; any parameterless modules and functional code in between (activations,
pooling, reshapes, residual connections, in-place activations); no buffers (``BatchNorm``: use
``GroupNorm``), no ``regularizer``, no dropout; a criterion that is the mean over the minibatch
of a per-example loss (e.g. ``nn.CrossEntropyLoss()``, ``nn.MSELoss()``). Any other layer with
parameters: a ``ValueError`` naming it and the backends that do support it (``vmap``, ``loop``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.profiler import record_function

__all__ = ["LayerGradients", "ParameterLayout", "layer_support"]

_NO_PARAMETERS_NEEDED = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout)


# ============================================================================ the rules
class Rule:
    """A layer type's rule. ``a``: what the forward captured (the input, its patches, the
    normalized input); ``g``: the gradient of the layer's output, ``[N, ...]`` per example."""

    #: parameter names of the layer, in its ``named_parameters`` order
    names: tuple[str, ...] = ("weight", "bias")

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        #: how the last clipped mean computed the per-example norms (``None``: none yet)
        self.mode: str | None = None

    def forward(
        self, x: Tensor, p: dict[str, Tensor | None], n: int | None
    ) -> tuple[Tensor, Tensor]:
        """``(z, a)``: the output (``p`` shared, or per client ``[n, ...]`` when ``n``) and
        the capture for the rules."""
        raise NotImplementedError

    def example_grads(self, a: Tensor, g: Tensor, want: dict[str, bool]) -> dict[str, Tensor]:
        """Every example's gradients ``{name: [N, *shape]}`` of the wanted parameters."""
        raise NotImplementedError

    def client_sums(self, a: Tensor, g: Tensor, n: int, want: dict[str, bool], dest=None) -> dict:
        """Per-client sums ``{name: [n, *shape]}`` of the examples' gradients (a rule may
        write some into ``dest``, views of the flat output, and leave them out)."""
        grads = self.example_grads(a, g, want)
        return {k: v.view(n, -1, *v.shape[1:]).sum(1) for k, v in grads.items()}

    def instantiates(self, a: Tensor, g: Tensor) -> bool:
        """Whether the per-example norms come from the instantiated per-example gradients
        (else :meth:`ghost_norms2`); sets :attr:`mode`."""
        self.mode = "instantiate"
        return True

    def ghost_norms2(self, a: Tensor, g: Tensor, want: dict[str, bool]) -> Tensor:
        """Every example's squared gradient norm ``[N]`` without its gradient."""
        raise NotImplementedError


def _flat_seq(t: Tensor) -> Tensor:
    """``[N, ..., f]`` as ``[N, T, f]``."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


class LinearRule(Rule):
    """``z = a Wᵀ + b`` over inputs ``[N, ..., in]`` (sequences: ``T`` positions)."""

    def forward(self, x, p, n):
        w, b = p["weight"], p["bias"]
        if n is None:
            return F.linear(x, w, b), x
        xs = x.reshape(n, -1, x.shape[-1])
        z = torch.baddbmm(b.unsqueeze(1), xs, w.transpose(1, 2)) if b is not None else xs @ w.mT
        return z.view(*x.shape[:-1], w.shape[1]), x

    def example_grads(self, a, g, want):
        a, g = _flat_seq(a), _flat_seq(g)
        out = {}
        if want["weight"]:
            out["weight"] = torch.bmm(g.transpose(1, 2), a)
        if want["bias"]:
            out["bias"] = g.sum(1)
        return out

    def client_sums(self, a, g, n, want, dest=None):
        a = a.reshape(n, -1, a.shape[-1])
        g = g.reshape(n, -1, g.shape[-1])
        out = {}
        if want["weight"]:
            view = None if dest is None else dest["weight"]
            if view is not None and view.is_contiguous():  # straight into the flat vector
                torch.bmm(g.transpose(1, 2), a, out=view)
            else:
                out["weight"] = torch.bmm(g.transpose(1, 2), a)
        if want["bias"]:
            out["bias"] = g.sum(1)
        return out

    def instantiates(self, a, g):
        steps = a[0].numel() // a.shape[-1]
        ghost = steps == 1 or 2 * steps * steps < a.shape[-1] * g.shape[-1]
        self.mode = "ghost" if ghost else "instantiate"
        return not ghost

    def ghost_norms2(self, a, g, want):
        a, g = _flat_seq(a), _flat_seq(g)
        total = a.new_zeros(a.shape[0])
        if want["weight"]:
            if a.shape[1] == 1:  # the outer product δ aᵀ: ||δ||² ||a||²
                total += g.square().sum((1, 2)) * a.square().sum((1, 2))
            else:
                total += (torch.bmm(a, a.mT) * torch.bmm(g, g.mT)).sum((1, 2))
        if want["bias"]:
            total += g.sum(1).square().sum(1)
        return total


class ConvRule(Rule):
    """``Conv1d``/``Conv2d`` (any stride, padding and padding mode, dilation, groups): the
    linear rule over the input's patches (``unfold``, im2col)."""

    def __init__(self, module):
        super().__init__(module)
        self.dims = module.weight.dim() - 2
        self.fn = F.conv1d if self.dims == 1 else F.conv2d

    def _pad(self, x: Tensor) -> Tensor:
        m = self.module
        pads = m._reversed_padding_repeated_twice
        if not any(pads):
            return x
        mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
        return F.pad(x, pads, mode=mode)

    def forward(self, x, p, n):
        m, w, b = self.module, p["weight"], p["bias"]
        if n is None:
            return m._conv_forward(x, w, b), x
        # clients as groups: [n·B, C, ...] -> [B, n·C, ...], weights [n·out, C/g, ...]
        batch = x.shape[0] // n
        xs = self._pad(x).view(n, batch, *x.shape[1:2], *self._pad(x[:1]).shape[2:])
        xs = xs.transpose(0, 1).reshape(batch, -1, *xs.shape[3:])
        bias = b.reshape(-1) if b is not None else None
        z = self.fn(xs, w.reshape(-1, *w.shape[2:]), bias, m.stride, 0, m.dilation, m.groups * n)
        z = z.view(batch, n, -1, *z.shape[2:]).transpose(0, 1)
        return z.reshape(n * batch, *z.shape[2:]), x

    def _padded(self, a: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """The input and the padding to give ``convolution_backward``."""
        m = self.module
        if m.padding_mode == "zeros" and not isinstance(m.padding, str):
            return a, tuple(m.padding)
        return self._pad(a), (0,) * self.dims

    def _weight_grad(self, a: Tensor, g: Tensor, groups: int, rows: int) -> Tensor:
        """``convolution_backward``'s weight gradient, for a weight of ``rows`` output
        channels and ``groups`` groups (the native kernels of a centralized backward)."""
        m = self.module
        x, padding = self._padded(a)
        weight = x.new_empty(rows, *m.weight.shape[1:])
        return torch.ops.aten.convolution_backward(
            g, x, weight, None, list(m.stride), list(padding), list(m.dilation), False,
            [0] * self.dims, groups, [False, True, False],
        )[1]  # fmt: skip

    def example_grads(self, a, g, want):
        """Every example's weight gradient in one grouped ``convolution_backward`` (the
        examples as groups: ``[1, N·C, ...]``)."""
        out, count, m = {}, a.shape[0], self.module
        if want["weight"]:
            x = a.reshape(1, -1, *a.shape[2:])
            grad = g.reshape(1, -1, *g.shape[2:])
            weight = self._weight_grad(x, grad, m.groups * count, m.out_channels * count)
            out["weight"] = weight.view(count, *m.weight.shape)
        if want["bias"]:
            out["bias"] = g.flatten(2).sum(2)
        return out

    def client_sums(self, a, g, n, want, dest=None):
        out, m = {}, self.module
        if want["weight"]:
            parts = [self._weight_grad(x, grad, m.groups, m.out_channels)
                     for x, grad in zip(a.chunk(n), g.chunk(n))]  # fmt: skip
            out["weight"] = torch.stack(parts)
        if want["bias"]:
            out["bias"] = g.flatten(2).sum(2).view(n, -1, g.shape[1]).sum(1)
        return out

    def _patches(self, a: Tensor) -> Tensor:
        """``[N, groups, C/g·k, L]``: every output position's input patch."""
        m = self.module
        a = self._pad(a)
        if self.dims == 1:
            cols = F.unfold(a.unsqueeze(2), (1, m.kernel_size[0]), dilation=(1, m.dilation[0]),
                            stride=(1, m.stride[0]))  # fmt: skip
        else:
            cols = F.unfold(a, m.kernel_size, dilation=m.dilation, stride=m.stride)
        return cols.view(a.shape[0], m.groups, -1, cols.shape[-1])

    def instantiates(self, a, g):
        m = self.module
        positions = g[0, 0].numel()
        rows = m.weight[0].numel()  # C/g · k
        ghost = 2 * positions * positions < rows * (m.out_channels // m.groups)
        self.mode = "ghost" if ghost else "instantiate"
        return not ghost

    def ghost_norms2(self, a, g, want):
        total = a.new_zeros(a.shape[0])
        if want["weight"]:
            cols = self._patches(a)
            gs = g.reshape(g.shape[0], self.module.groups, -1, g[0, 0].numel())
            total += (cols.mT @ cols).mul_(gs.mT @ gs).sum((1, 2, 3))
        if want["bias"]:
            total += g.flatten(2).sum(2).square().sum(1)
        return total


class EmbeddingRule(Rule):
    """``z = W[idx]``: the gradient scatters ``g`` into the looked-up rows (none for
    ``padding_idx``); per-example norms by the ghost rule ``Σ_{t,t'} [i_t = i_t'] ⟨g_t, g_t'⟩``."""

    names = ("weight",)

    def forward(self, x, p, n):
        w = p["weight"]
        if n is None:
            return F.embedding(x, w), x
        rows = w.shape[1]
        offset = torch.arange(n, device=x.device).repeat_interleave(x.shape[0] // n) * rows
        idx = x + offset.view(-1, *([1] * (x.dim() - 1)))
        return F.embedding(idx, w.reshape(-1, w.shape[-1])), x

    def _masked(self, a: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
        idx, g = a.reshape(a.shape[0], -1), g.reshape(g.shape[0], -1, g.shape[-1])
        pad = self.module.padding_idx
        if pad is not None:
            g = g * (idx != pad).unsqueeze(-1).to(g.dtype)
        return idx, g

    def _scatter(self, idx: Tensor, g: Tensor, groups: int) -> Tensor:
        """``[groups, V, D]``: the rows of ``g`` added at ``idx`` for ``groups`` equal parts."""
        vocab, width = self.module.weight.shape
        out = g.new_zeros(groups * vocab, width)
        per = idx.shape[0] // groups
        offset = torch.arange(groups, device=idx.device).repeat_interleave(per) * vocab
        out.index_add_(0, (idx + offset.unsqueeze(1)).reshape(-1), g.reshape(-1, width))
        return out.view(groups, vocab, width)

    def example_grads(self, a, g, want):
        idx, g = self._masked(a, g)
        return {"weight": self._scatter(idx, g, idx.shape[0])} if want["weight"] else {}

    def client_sums(self, a, g, n, want, dest=None):
        idx, g = self._masked(a, g)
        return {"weight": self._scatter(idx, g, n)} if want["weight"] else {}

    def instantiates(self, a, g):
        self.mode = "ghost"
        return False

    def ghost_norms2(self, a, g, want):
        idx, g = self._masked(a, g)
        same = (idx.unsqueeze(2) == idx.unsqueeze(1)).to(g.dtype)
        return (same * torch.bmm(g, g.mT)).sum((1, 2))


class LayerNormRule(Rule):
    """``z = x̂ ⊙ w + b`` over the trailing ``normalized_shape``: per example
    ``Σ g ⊙ x̂`` and ``Σ g`` over the leading positions (instantiated: they are small)."""

    def _normalize(self, x: Tensor) -> Tensor:
        m = self.module
        return F.layer_norm(x, m.normalized_shape, None, None, m.eps)

    def _affine(self, xhat: Tensor, p: dict, n: int | None) -> Tensor:
        w, b = p["weight"], p["bias"]
        if n is None:
            z = xhat * w if w is not None else xhat
            return z + b if b is not None else z
        view = xhat.view(n, -1, *xhat.shape[1:])
        shape = (n, *([1] * (view.dim() - 1 - len(self._param_shape()))), *self._param_shape())
        z = view * w.view(shape) if w is not None else view
        z = z + b.view(shape) if b is not None else z
        return z.view(xhat.shape)

    def _param_shape(self) -> tuple[int, ...]:
        return tuple(self.module.normalized_shape)

    def forward(self, x, p, n):
        xhat = self._normalize(x)
        return self._affine(xhat, p, n), xhat.detach()

    def _reduce_dims(self, g: Tensor) -> tuple[int, ...]:
        return tuple(range(1, g.dim() - len(self.module.normalized_shape)))

    def example_grads(self, a, g, want):
        dims, out = self._reduce_dims(g), {}
        if want["weight"]:
            out["weight"] = (g * a).sum(dims) if dims else g * a
        if want["bias"]:
            out["bias"] = g.sum(dims) if dims else g
        return out


class GroupNormRule(LayerNormRule):
    """``z = x̂ ⊙ w_c + b_c`` per channel ``c`` of ``[N, C, ...]``: per example
    ``Σ_positions g ⊙ x̂`` and ``Σ_positions g``."""

    def _normalize(self, x):
        m = self.module
        return F.group_norm(x, m.num_groups, None, None, m.eps)

    def _affine(self, xhat, p, n):
        w, b = p["weight"], p["bias"]
        extra = (1,) * (xhat.dim() - 2)
        if n is None:
            z = xhat * w.view(-1, *extra) if w is not None else xhat
            return z + b.view(-1, *extra) if b is not None else z
        view = xhat.view(n, -1, *xhat.shape[1:])
        z = view * w.view(n, 1, -1, *extra) if w is not None else view
        z = z + b.view(n, 1, -1, *extra) if b is not None else z
        return z.view(xhat.shape)

    def _reduce_dims(self, g):
        return tuple(range(2, g.dim()))


RULES: dict[type, type[Rule]] = {
    nn.Linear: LinearRule,
    nn.Conv1d: ConvRule,
    nn.Conv2d: ConvRule,
    nn.Embedding: EmbeddingRule,
    nn.LayerNorm: LayerNormRule,
    nn.GroupNorm: GroupNormRule,
}


# ============================================================================ support
def _unsupported(model: nn.Module) -> str | None:
    for name, module in model.named_modules():
        if isinstance(module, _NO_PARAMETERS_NEEDED) and module.p > 0 and module.training:
            return f"{name} is {type(module).__name__} (random per call)"
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        if type(module) not in RULES:
            return (
                f"layer {name or '(root)'} is {type(module).__name__}, which has no layer rule "
                "(supported: Linear, Conv1d, Conv2d, Embedding, LayerNorm, GroupNorm)"
            )
        if isinstance(module, nn.Embedding) and (
            module.max_norm is not None or module.scale_grad_by_freq
        ):
            return f"layer {name} is an Embedding with max_norm or scale_grad_by_freq"
    return None


def layer_support(model: nn.Module, criterion: object) -> str | None:
    """``None`` when :class:`LayerGradients` computes ``model``'s gradients under
    ``criterion``, else the reason it does not.

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


class ParameterLayout:
    """Maps a module's parameters to and from one flat vector of length ``d``.

    The order is that of ``module.named_parameters()`` (trainable parameters only). Defined
    here, below :mod:`pl_privfed.grads` (which exports it), so that the layer rules use the
    same layout.
    """

    def __init__(self, module: nn.Module) -> None:
        named = [(k, p) for k, p in module.named_parameters() if p.requires_grad]
        self.names = [k for k, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.dim = sum(self.numels)
        starts = itertools.accumulate(self.numels, initial=0)
        #: name → (first column in the flat vector, shape)
        self.slots = {k: (s, tuple(shape)) for k, s, shape in zip(self.names, starts, self.shapes)}

    def flatten(self, module: nn.Module) -> Tensor:
        """The module's current parameters as one detached vector ``[d]``."""
        params = dict(module.named_parameters())
        return torch.cat([params[k].detach().reshape(-1) for k in self.names])

    def unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        """Views of ``flat [..., d]`` shaped like the parameters (leading dims kept)."""
        lead = flat.shape[:-1]
        chunks = torch.split(flat, self.numels, dim=-1)
        return {k: c.view(*lead, *s) for k, c, s in zip(self.names, chunks, self.shapes)}

    @torch.no_grad()
    def assign(self, module: nn.Module, flat: Tensor) -> None:
        """Copy ``flat [d]`` into the module's parameters in place."""
        params = dict(module.named_parameters())
        for k, v in self.unflatten(flat).items():
            params[k].copy_(v)


# ============================================================================ the mechanism
@dataclass
class _Layer:
    name: str
    rule: Rule
    # per parameter name: (offset in the flat vector, shape) for trainable ones, else None
    slots: dict[str, tuple[int, tuple[int, ...]] | None]


class LayerGradients:
    """``(params, inputs [n, B, ...], targets [n, B, ...]) -> (grads [n, d], losses [n])``
    by layer rules (module docstring); also :meth:`per_example` and :meth:`clipped_mean`.

    Args:
        model: a model :func:`layer_support` accepts (else ``ValueError`` with the reason).
        criterion: the loss, a mean over the minibatch of per-example losses.

    ``params``: shared ``[d]`` or per client ``[n, d]``, laid out as
    :class:`~pl_privfed.grads.ParameterLayout` (trainable ``named_parameters`` in order).
    """

    def __init__(self, model: nn.Module, criterion: nn.Module) -> None:
        reason = layer_support(model, criterion)
        if reason is not None:
            raise ValueError(f"grad_backend 'layers' does not support this model: {reason}")
        self.model = model
        self.criterion = criterion
        #: bytes of one layer's per-example gradients that :meth:`clipped_mean` keeps
        self.keep_bytes = 256 * 2**20
        self.layout = ParameterLayout(model)
        self.dim = self.layout.dim
        self._probed = False  # whether one capturing pass has checked the model (__call__)
        self.layers: list[_Layer] = []
        for name, module in model.named_modules():
            if type(module) not in RULES:
                continue
            rule = RULES[type(module)](module)
            slots = {}
            for pname in rule.names:
                full = f"{name}.{pname}" if name else pname
                slots[pname] = self.layout.slots.get(full)
            if any(s is not None for s in slots.values()):
                self.layers.append(_Layer(name, rule, slots))
        self._chain = self._linear_chain()

    def _linear_chain(self) -> list[nn.Module] | None:
        """The activations between the layers when the model is a chain of ``Linear`` layers
        and ReLU/Sigmoid/Tanh (an ``nn.Sequential``, or one as ``.net``, with an optional
        leading ``Flatten``) under the plain cross-entropy, else ``None``. Such a chain's output
        gradients are propagated by hand (``δ_l = (δ_{l+1} W_{l+1}) ⊙ σ'(z_l)``) instead of by
        autograd, whose per-operator bookkeeping is most of a small network's cost."""
        model, crit = self.model, self.criterion
        net = model if isinstance(model, nn.Sequential) else getattr(model, "net", None)
        if not isinstance(net, nn.Sequential) or type(crit) is not nn.CrossEntropyLoss:
            return None
        if crit.label_smoothing != 0.0:
            return None
        layers = list(net)
        if layers and isinstance(layers[0], nn.Flatten):
            if (layers[0].start_dim, layers[0].end_dim) != (1, -1):
                return None
            layers = layers[1:]
        if not layers or len(layers) % 2 == 0:
            return None
        for k, layer in enumerate(layers):
            allowed = (nn.Linear,) if k % 2 == 0 else (nn.ReLU, nn.Sigmoid, nn.Tanh)
            if type(layer) not in allowed:
                return None
        linears = layers[0::2]
        if [layer.rule.module for layer in self.layers] != linears:
            return None  # a Linear with every parameter frozen
        return layers[1::2]

    def _pass_chain(self, params: Tensor, inputs: Tensor, targets: Tensor, factor: float):
        """:meth:`_pass` for a chain of ``Linear`` layers (:meth:`_linear_chain`)."""
        n, batch = inputs.shape[:2]
        per_client = None if params.dim() == 1 else n
        a = inputs.reshape(n * batch, -1).to(params.dtype)
        acts, pre, weights = [], [], []
        for k, layer in enumerate(self.layers):
            p = self._params(layer, params, per_client)
            z, _ = layer.rule.forward(a, p, per_client)
            acts.append(a)
            pre.append(z)
            weights.append(p["weight"])
            if k < len(self._chain):
                a = self._chain[k](z)
        logp = z.log_softmax(-1)
        index = targets.reshape(-1, 1).long()
        losses = -logp.gather(-1, index).squeeze(-1)
        delta = logp.exp_()
        delta.scatter_add_(-1, index, delta.new_full(index.shape, -1.0))  # softmax − onehot
        if factor != 1.0:
            delta.mul_(factor)
        result = [None] * len(self.layers)
        for k in range(len(self.layers) - 1, -1, -1):
            result[k] = (self.layers[k], acts[k], delta)
            if k == 0:
                break
            w = weights[k]
            if per_client is None:
                back = delta @ w
            else:
                back = torch.bmm(delta.view(n, batch, -1), w).view(n * batch, -1)
            act, z, out = self._chain[k - 1], pre[k - 1], acts[k]
            if isinstance(act, nn.ReLU):
                delta = back.mul_(z > 0)
            elif isinstance(act, nn.Sigmoid):
                delta = back.mul_(out * (1 - out))
            else:
                delta = back.mul_(1 - out * out)
        return result, losses.view(n, batch)

    # ------------------------------------------------------------------ the batched pass
    def _params(self, layer: _Layer, params: Tensor, n: int | None) -> dict[str, Tensor | None]:
        out = {}
        for pname in layer.rule.names:
            slot = layer.slots[pname]
            if slot is None:  # frozen or absent (bias=False): the module's own tensor
                own = getattr(layer.rule.module, pname, None)
                if own is not None and n is not None:
                    own = own.detach().unsqueeze(0).expand(n, *own.shape)
                out[pname] = None if own is None else own.detach().to(params.dtype)
            else:
                start, shape = slot
                numel = int(torch.Size(shape).numel())
                lead = params.shape[:-1]
                out[pname] = params[..., start : start + numel].view(*lead, *shape)
        return out

    @contextlib.contextmanager
    def _patched(self, params: Tensor, n: int | None, captured: list):
        """Every rule's module runs the rule's forward (with the flat ``params``), capturing
        ``(a, z)`` and a hook for ``g``."""
        calls: dict[int, int] = {}

        def make(k: int, layer: _Layer):
            p = self._params(layer, params, n)

            def forward(x, *rest):
                if rest:
                    raise ValueError(f"layer {layer.name} was called with extra arguments")
                calls[k] = calls.get(k, 0) + 1
                if calls[k] > 1:
                    raise ValueError(
                        f"layer {layer.name} ({type(layer.rule.module).__name__}) is called more "
                        "than once per forward (shared weights): use the vmap or loop backend"
                    )
                if x.is_floating_point() and x.dtype != params.dtype:
                    x = x.to(params.dtype)
                z, a = layer.rule.forward(x, p, n)
                start = z
                if not z.requires_grad:  # the first layers: the graph starts at their output
                    start = z.detach().requires_grad_()
                    z = start.clone()  # (an in-place activation may follow)
                slot = [a, None, start, z]
                captured.append((layer, slot))

                def hook(grad, slot=slot):
                    slot[1] = grad

                z.register_hook(hook)  # the gradient of z before any in-place change
                return z

            return forward

        modules = [layer.rule.module for layer in self.layers]
        try:
            for k, (layer, module) in enumerate(zip(self.layers, modules)):
                module.forward = make(k, layer)
            yield
        finally:
            for module in modules:
                module.__dict__.pop("forward", None)

    def _example_losses(self, out: Tensor, targets: Tensor) -> Tensor:
        """``[N]``: the criterion on each example as a batch of one."""
        crit = self.criterion
        if type(crit) is nn.CrossEntropyLoss:
            return F.cross_entropy(out, targets, reduction="none",
                                   ignore_index=crit.ignore_index,
                                   label_smoothing=crit.label_smoothing)  # fmt: skip
        if type(crit) is nn.MSELoss:
            return F.mse_loss(out, targets.to(out.dtype), reduction="none").flatten(1).mean(1)
        return vmap(lambda o, t: crit(o.unsqueeze(0), t.unsqueeze(0)))(out, targets)

    def _pass(self, params: Tensor, inputs: Tensor, targets: Tensor, factor: float = 1.0):
        """One forward/backward over the ``n·B`` stacked examples: ``(layers with (a, g),
        example losses [n, B])``; ``g`` is the gradient of each example's own loss times
        ``factor``."""
        if self._chain is not None:
            with record_function("layer_rules.forward_backward"), torch.no_grad():
                return self._pass_chain(params.detach(), inputs, targets, factor)
        n, batch = inputs.shape[:2]
        if params.dim() == 2 and n == 1:  # one client's own weights: the ordinary forward
            params = params[0]
        shared = params.dim() == 1
        x = inputs.reshape(n * batch, *inputs.shape[2:])
        if x.is_floating_point():
            x = x.to(params.dtype)
        y = targets.reshape(n * batch, *targets.shape[2:])
        captured: list = []
        with (
            record_function("layer_rules.forward_backward"),
            torch.enable_grad(),
            self._patched(params.detach(), None if shared else n, captured),
        ):
            out = self.model(x)
            losses = self._example_losses(out, y)
            starts = [slot[2] for _, slot in captured]
            if starts:  # runs the hooks; the values are the hooks' (before in-place changes)
                total = losses.sum() if factor == 1.0 else losses.sum() * factor
                torch.autograd.grad(total, starts, allow_unused=True)
        result = []
        for layer, slot in captured:
            a, g, _, z = slot
            if g is None:  # the layer's output does not reach the loss
                g = torch.zeros_like(z)
            result.append((layer, a.detach(), g.detach()))
            slot.clear()  # z → its graph → the hook → slot → z: break the cycle, free the graph
        return result, losses.detach().view(n, batch)

    def _want(self, layer: _Layer) -> dict[str, bool]:
        return {k: layer.slots.get(k) is not None for k in layer.rule.names}

    def _views(self, out: Tensor, layer: _Layer) -> dict[str, Tensor | None]:
        """The layer's parameters' columns of ``out [n, d]`` as ``[n, *shape]`` views."""
        views = {}
        for pname, slot in layer.slots.items():
            if slot is not None:
                start, shape = slot
                numel = int(torch.Size(shape).numel())
                views[pname] = out[:, start : start + numel].view(out.shape[0], *shape)
        return views

    def _write(self, out: Tensor, layer: _Layer, grads: dict[str, Tensor]) -> None:
        for pname, value in grads.items():
            start, shape = layer.slots[pname]
            numel = int(torch.Size(shape).numel())
            out[..., start : start + numel].copy_(value.reshape(*out.shape[:-1], numel))

    # ------------------------------------------------------------------ entry points
    def __call__(self, params: Tensor, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Per-client gradients of the mean minibatch loss ``[n, d]`` and the losses ``[n]``."""
        n, batch = inputs.shape[:2]
        if n == 1 and self._chain is None:
            if not self._probed:  # the capturing pass refuses what the rules cannot do (e.g.
                # shared weights) whatever the chunk: run it once, on one example, to check
                self._pass(params, inputs[:, :1], targets[:, :1])
                self._probed = True
            return self._one_client(params.reshape(-1), inputs[0], targets[0])
        layers, losses = self._pass(params, inputs, targets, factor=1.0 / batch)
        out = params.new_empty(n, self.dim)  # every trainable parameter has its rule
        with record_function("layer_rules.client_sums"):
            for layer, a, g in layers:
                sums = layer.rule.client_sums(a, g, n, self._want(layer), self._views(out, layer))
                self._write(out, layer, sums)
        return out, losses.mean(1)

    def _one_client(self, flat: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """One client's gradient ``[1, d]`` and loss ``[1]``: with nothing to batch over, the
        per-client sum of every rule is autograd's own parameter gradient, so the model runs
        its ordinary forward and backward on leaves that are views of ``flat`` (no capturing
        hooks; each gradient lands in its parameter's columns once). Measured on the CNN, one
        client step with its SGD update: 1.02× the plain loop's, where the capturing pass took
        1.25× (docs/performance.md)."""
        with record_function("layer_rules.one_client"), torch.enable_grad():
            leaves = {
                k: v.detach().requires_grad_() for k, v in self.layout.unflatten(flat).items()
            }
            if x.is_floating_point():
                x = x.to(flat.dtype)
            out = functional_call(self.model, leaves, (x,), strict=False)
            loss = self._example_losses(out, y).mean()
            grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        # a parameter that does not reach the loss has gradient 0
        flat_grads = [(torch.zeros_like(v) if g is None else g).reshape(-1)
                      for v, g in zip(leaves.values(), grads)]  # fmt: skip
        return torch.cat(flat_grads)[None], loss.detach().view(1)

    def per_example(self, params: Tensor, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Every example's gradient ``[n, B, d]`` and loss ``[n, B]``."""
        n, batch = inputs.shape[:2]
        layers, losses = self._pass(params, inputs, targets)
        out = params.new_empty(n * batch, self.dim)
        for layer, a, g in layers:
            self._write(out, layer, layer.rule.example_grads(a, g, self._want(layer)))
        return out.view(n, batch, self.dim), losses

    def clipped_mean(
        self, params: Tensor, inputs: Tensor, targets: Tensor, scale: Callable[[Tensor], Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(1/B) Σ_b s(||g_b||) g_b`` per client without a second backward:
        ``(grads [n, d], example losses [n, B], example gradient norms [n, B])``.

        Each layer's per-example squared norms by its rule (ghost, or from the instantiated
        per-example gradients, which are then kept while they fit in :attr:`keep_bytes` per
        layer); the clipped sum is the weighted sum of the kept per-example gradients, or the
        per-client sum rule on the reweighted output gradients ``s_b g_b / B``."""
        n, batch = inputs.shape[:2]
        layers, losses = self._pass(params, inputs, targets)
        squared = params.new_zeros(n * batch)
        kept: list[dict[str, Tensor] | None] = []
        with record_function("layer_rules.norms"):
            for layer, a, g in layers:
                want = self._want(layer)
                if layer.rule.instantiates(a, g):
                    grads = layer.rule.example_grads(a, g, want)
                    for v in grads.values():
                        squared += torch.linalg.vector_norm(v.flatten(1), dim=1).square_()
                    size = sum(v.numel() for v in grads.values()) * params.element_size()
                    kept.append(grads if size <= self.keep_bytes else None)
                else:
                    squared += layer.rule.ghost_norms2(a, g, want)
                    kept.append(None)
        norms = squared.sqrt_()
        weights = scale(norms).div(batch)
        out = params.new_empty(n, self.dim)
        with record_function("layer_rules.clipped_sums"):
            for (layer, a, g), grads in zip(layers, kept):
                if grads is not None:  # Σ_b w_b G_b per client: [n, 1, B] @ [n, B, p]
                    w = weights.view(n, 1, batch)
                    sums = {k: torch.bmm(w, v.reshape(n, batch, -1)) for k, v in grads.items()}
                else:
                    g = g * weights.view(-1, *([1] * (g.dim() - 1)))
                    views = self._views(out, layer)
                    sums = layer.rule.client_sums(a, g, n, self._want(layer), views)
                self._write(out, layer, sums)
        return out, losses, norms.view(n, batch)

    def modes(self) -> dict[str, str]:
        """Each layer's per-example norm rule of the last :meth:`clipped_mean` (``ghost`` or
        ``instantiate``)."""
        return {layer.name: layer.rule.mode for layer in self.layers}
