"""Per-client gradient oracle with two interchangeable backends.

The oracle maps parameters (shared ``[d]`` or per-client ``[n, d]``) and one stacked minibatch per
client (``inputs [n, B, ...]``, ``targets [n, B, ...]``) to the per-client gradients ``[n, d]`` of
each client's mean minibatch loss, plus the per-client losses ``[n]``.

Backends (same numbers up to floating-point rounding, tested):

* ``"vmap"``: ``torch.func.vmap(grad_and_value(loss))`` over the client axis with
  :func:`torch.func.functional_call`: one batched forward/backward for all clients.
* ``"loop"``: one forward/backward per client (the reference; the only loop over clients in the
  package).
* ``"layers"``: layer rules (:mod:`pl_privfed.layer_rules`): one batched forward/backward over
  the chunk's examples that captures every layer's input and output gradient, then a
  closed-form rule per layer type (the registry: :func:`~pl_privfed.layer_rules.supported_layers`)
  for the per-client sums, the per-example gradients and (ghost clipping) the per-example norms
  and clipped sums.

A backend name enters through :func:`check_backend`.

BatchNorm and other buffers: during training every client normalizes with the statistics of its
own minibatch (each client gets its own copy of the buffers). The running statistics used for
evaluation are updated deterministically once per round: every client applies the usual momentum
update to its copy starting from the global running statistics, and the new global statistics are
the average of the clients' copies, i.e. ``r ← (1 − m) r + m · mean_i(batch statistic_i)``
(``num_batches_tracked`` advances by one per round). The oracle stores that average after each
call with shared parameters; :meth:`GradientOracle.commit_buffers` writes it into the model.

Per-example gradients (``per_example=True``, for record-level clipping as in paper 003 Algorithm 1
and PORTER-DP): ``grads [n, B, d]`` and ``losses [n, B]``, the gradient of each example's own
loss (``criterion`` on a batch of one, plus the model's regularizer if it has one), so that the
mean over ``B`` equals the minibatch gradient. Both backends nest a ``vmap`` over the examples
(the ``loop`` backend inside its loop over clients) — the technique of Opacus' functorch
per-sample gradients. A model with BatchNorm is refused here: its output for one example depends
on the rest of the batch, so per-example gradients are not defined (use ``norm: group``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from pl_privfed.checks import check_choice
from pl_privfed.compat.torch import is_batch_norm, is_convolution
from pl_privfed.engine import DENSE, ChunkOracle, ClientRows, OracleOutput
from pl_privfed.layer_rules import LayerGradients, ParameterLayout, layer_support

__all__ = [
    "BACKENDS",
    "Backend",
    "GradientOracle",
    "OracleOutput",
    "ParameterLayout",
    "RoundOracle",
    "average_client_buffers",
    "call_from_buffers",
    "check_backend",
    "client_copies",
    "resolve_backend",
    "resolve_example_backend",
    "sum_client_buffers",
]

#: the backends by their current names
BACKENDS = ("vmap", "loop", "layers")
#: what a configuration may write (``"auto"`` or a backend)
Backend = Literal["auto", "vmap", "loop", "layers"]


def check_backend(name: str, value: object, auto: bool = True) -> str:
    """``value``, a backend (or ``"auto"`` when ``auto``), else ``ValueError`` naming ``name``,
    ``value`` and the choices.

    >>> check_backend("grad_backend", "layers")
    'layers'
    """
    check_choice(name, value, (("auto",) if auto else ()) + BACKENDS)
    return str(value)


def average_client_buffers(per_client: dict[str, Tensor], dim: int = 0) -> dict[str, Tensor]:
    """The engine's rule for the buffers after a round (module docstring): the mean of the
    clients' updated copies along the client axis ``dim``; integer buffers
    (``num_batches_tracked``) advance alike for every client, so the first client's is kept."""
    return {
        k: v.mean(dim) if v.is_floating_point() else v.select(dim, 0) for k, v in per_client.items()
    }


def resolve_backend(
    backend: Backend,
    device: torch.device,
    model: nn.Module | None = None,
    criterion: object | None = None,
) -> Literal["vmap", "loop", "layers"]:
    """Pick the backend of the per-client gradients (for per-example gradients and clipped
    means see :func:`resolve_example_backend`); explicit names pass through
    (:func:`check_backend`).

    ``"auto"`` → ``"vmap"`` on CUDA (level with ``layers`` there for FedAvg on the CNN, both
    0.1× the plain loop on an H200). On the CPU → ``"layers"`` for the models its layer rules
    support (:func:`~pl_privfed.layer_rules.layer_support`) except models with an
    ``Embedding`` (small sequence models, where the plain per-client loop was 1.27× faster than
    the batched layer rules) → ``"loop"``; for other models ``"loop"`` if convolutional, else
    ``"vmap"``. The choice depends only on the device and the model, so a resumed run makes
    it again; it follows measurements on a 2-core x86 CPU and an H200
    (``benchmarks/peers.py``, see docs/performance.md).
    """
    backend = check_backend("grad_backend", backend)
    if backend == "auto":
        if device.type == "cuda":
            return "vmap"
        if model is not None and layer_support(model, criterion) is None:
            sequence = any(isinstance(m, nn.Embedding) for m in model.modules())
            return "loop" if sequence else "layers"
        convolutional = model is not None and any(is_convolution(m) for m in model.modules())
        return "loop" if convolutional else "vmap"
    return backend


def resolve_example_backend(
    backend: Backend,
    device: torch.device,
    model: nn.Module | None = None,
    criterion: object | None = None,
) -> Literal["vmap", "loop", "layers"]:
    """Pick the backend of per-example gradients and clipped means (per-example clipping).

    ``"auto"`` → ``"layers"`` wherever the layer rules support the model, on any device (ghost
    norms and one reweighted sum instead of per-example gradients: 0.57–0.76× Opacus's ghost
    clipping on the CPU, 5× faster than ``vmap`` on an H200); else what
    :func:`resolve_backend` picks. An explicit name is used for both kinds of gradient.
    """
    if backend == "auto" and model is not None and layer_support(model, criterion) is None:
        return "layers"
    return resolve_backend(backend, device, model, criterion)


class GradientOracle:
    """Per-client gradients of ``criterion(model(inputs_i), targets_i)``.

    Args:
        model: the network; its parameters define the layout of the flat vector.
        criterion: a loss returning the mean over the minibatch (e.g. ``nn.CrossEntropyLoss()``).
        backend: ``"vmap"``, ``"loop"`` or ``"layers"`` (module docstring; a former name:
            :func:`check_backend`).
        example_backend: the backend of per-example gradients and clipped means
            (:meth:`clipped_mean`); ``None``: ``backend``.
        cuda_graph: on CUDA, capture the gradient computation in a CUDA graph on the first call
            with each input signature and replay it afterwards: one launch instead of hundreds of
            kernel launches, which is what bounds small federations (10 clients × 32) on a GPU.
            The model's architecture and its parameters' layout must not change afterwards.

    A model with a ``regularizer(params: dict[str, Tensor]) -> Tensor`` method (e.g.
    :class:`~pl_privfed.models.NonconvexLogisticRegression`) has it added to every client's loss.
    The model is run in training mode (BatchNorm uses batch statistics) and its own parameters
    and buffers are never modified by a call.
    """

    def __init__(
        self,
        model: nn.Module,
        criterion: Callable[[Tensor, Tensor], Tensor],
        backend: str = "loop",
        cuda_graph: bool = False,
        example_backend: str | None = None,
    ) -> None:
        backend = check_backend("backend", backend, auto=False)
        if example_backend is None:
            example_backend = backend
        example_backend = check_backend("example_backend", example_backend, auto=False)
        # the layer rules refuse a model they cannot differentiate (ValueError naming why)
        rules = LayerGradients(model, criterion) if "layers" in (backend, example_backend) else None
        self._layers = rules if backend == "layers" else None
        #: the layer rules of per-example gradients and clipped means (``None``: ``backend``'s)
        self._example_layers = rules if example_backend == "layers" else None
        self.example_backend = example_backend
        if not isinstance(cuda_graph, bool):
            raise ValueError(f"cuda_graph must be a bool, got {cuda_graph!r}")
        self.cuda_graph = cuda_graph
        self._graphs: dict[tuple, tuple] = {}
        self.model = model
        self.criterion = criterion
        self.backend = backend
        regularizer = getattr(model, "regularizer", None)
        self.regularizer: Callable[[dict[str, Tensor]], Tensor] | None = (
            regularizer if callable(regularizer) else None
        )
        self.layout = ParameterLayout(model)
        self.buffer_names = [k for k, b in model.named_buffers() if b is not None]
        self._pending_buffers: dict[str, Tensor] | None = None
        #: the clients' updated buffers after a call with ``buffers=`` (else ``None``)
        self.client_buffers: dict[str, Tensor] | None = None
        self._vmapped: dict[tuple[bool, bool], Callable] = {}
        self.has_batchnorm = any(is_batch_norm(m) for m in model.modules())
        self._rules: LayerGradients | None = rules

    def layer_rules(self) -> LayerGradients:
        """The model's layer rules whatever the backend (made on the first call; a
        ``ValueError`` names what they do not cover), e.g. for a row representation of the
        clients (:func:`~pl_privfed.engine.choose_client_rows`)."""
        if self._rules is None:
            self._rules = LayerGradients(self.model, self.criterion)
        return self._rules

    # ------------------------------------------------------------------ helpers
    def _loss(self, flat: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        params = self.layout.unflatten(flat)
        out = functional_call(self.model, (params, buffers), (x,))
        loss = self.criterion(out, y)
        if self.regularizer is not None:
            loss = loss + self.regularizer(params)
        return loss

    def _example_loss(
        self, flat: Tensor, buffers: dict[str, Tensor], x: Tensor, y: Tensor
    ) -> Tensor:
        """Loss of one example (``x`` without its batch axis), as a batch of one."""
        return self._loss(flat, buffers, x.unsqueeze(0), y.unsqueeze(0))

    def _per_example(self) -> Callable:
        """``(flat [d], buffers, x [B, ...], y [B]) -> (grads [B, d], losses [B])``."""
        return vmap(
            grad_and_value(self._example_loss, argnums=0),
            in_dims=(None, None, 0, 0),
            randomness="different",
        )

    def _client_buffers(self, n: int) -> dict[str, Tensor]:
        bufs = dict(self.model.named_buffers())
        return {k: bufs[k].detach().unsqueeze(0).repeat(n, *([1] * bufs[k].dim())) for k in bufs}

    # ------------------------------------------------------------------ main entry
    def __call__(
        self,
        params: Tensor,
        inputs: Tensor,
        targets: Tensor,
        per_example: bool = False,
        buffers: dict[str, Tensor] | None = None,
    ) -> OracleOutput:
        """Gradients at ``params`` (``[d]`` shared by all clients, or ``[n, d]`` per client).

        ``per_example=True`` returns every example's gradient, ``grads [n, B, d]`` (see the
        module docstring).

        ``buffers``: every client's own buffers ``{name: [n, ...]}`` (e.g. the BatchNorm running
        statistics of the model each client trains, as in a batch of several configurations)
        instead of copies of the model's; the call leaves them untouched and stores the
        clients' updated copies in :attr:`client_buffers`.
        """
        n = inputs.shape[0]
        d = self.layout.dim
        shared = params.dim() == 1
        if params.shape[-1] != d or (not shared and params.shape[0] != n):
            raise ValueError(
                f"params must have shape [{d}] or [{n}, {d}], got {tuple(params.shape)}"
            )
        if per_example and self.has_batchnorm:
            raise ValueError(
                "per-example gradients are not defined for a model with BatchNorm (an example's "
                "output depends on its batch); use a GroupNorm model (e.g. ResNet norm: group)"
            )
        params = params.detach()
        if buffers is not None:
            buffers = self._check_client_buffers(buffers, n)
        if self.cuda_graph:
            if params.device.type != "cuda":
                raise ValueError(f"cuda_graph=True needs CUDA tensors, got {params.device}")
            grads, losses, averaged, updated = self._graphed(
                params, inputs, targets, shared, per_example, buffers
            )
        else:
            grads, losses, averaged, updated = self._compute(
                params, inputs, targets, shared, per_example, buffers
            )
        self._pending_buffers = averaged if buffers is None else None
        self.client_buffers = updated if buffers is not None else None
        sums = None
        if averaged:  # the engine sums the clients' buffers over chunks
            sums = {k: v * n if v.is_floating_point() else v for k, v in averaged.items()}
        return OracleOutput(grads=grads, losses=losses.detach(), buffer_sums=sums)

    def clipped_mean(
        self,
        params: Tensor,
        inputs: Tensor,
        targets: Tensor,
        scale: Callable[[Tensor], Tensor],
        max_bytes: int = 64 * 2**20,
    ) -> OracleOutput:
        """``(1/B) Σ_b s(||g_b||) g_b`` for every client, with ``g_b`` example ``b``'s
        gradient and ``s`` a norm-based operator's factor (clipping): ``grads [n, d]``, the
        examples' losses ``[n, B]`` and gradient norms ``norms [n, B]``.

        The ``layers`` backend never forms the per-example gradients where a cheaper rule
        exists: for a ``Linear`` layer with input ``a_b`` and output gradient ``δ_b``, example
        ``b``'s weight gradient is ``δ_b a_bᵀ``, of norm ``||δ_b|| ||a_b||``, so the norms come
        from the layers' factors (ghost norms; over sequences and patches ``⟨A Aᵀ, G Gᵀ⟩`` or
        the instantiated gradient, whichever is cheaper) and the clipped sum is one product
        ``(s ⊙ δ)ᵀ A`` per layer (the identity behind Opacus's ghost clipping); see
        :mod:`pl_privfed.layer_rules`. The other backends compute per-example gradients for as
        many clients at a time as fit in ``max_bytes``.
        """
        if self._example_layers is not None:
            rules = self._example_layers
            grads, losses, norms = rules.clipped_mean(params.detach(), inputs, targets, scale)
            return OracleOutput(grads=grads, losses=losses.detach(), norms=norms)
        n, batch = inputs.shape[:2]
        per = max(1, max_bytes // max(1, batch * self.layout.dim * params.element_size()))
        grads, losses, norms = [], [], []
        for lo in range(0, n, per):
            part = params if params.dim() == 1 else params[lo : lo + per]
            out = self(part, inputs[lo : lo + per], targets[lo : lo + per], per_example=True)
            g = out.grads
            norm = torch.linalg.vector_norm(g, dim=-1)
            weights = scale(norm).div_(batch)  # s(||g_b||)/B
            grads.append(torch.einsum("cb,cbd->cd", weights, g))
            losses.append(out.losses)
            norms.append(norm)
        return OracleOutput(
            grads=torch.cat(grads) if len(grads) > 1 else grads[0],
            losses=torch.cat(losses) if len(losses) > 1 else losses[0],
            norms=torch.cat(norms) if len(norms) > 1 else norms[0],
        )

    def _check_client_buffers(self, buffers: dict[str, Tensor], n: int) -> dict[str, Tensor]:
        """Copies of the given per-client buffers, checked against the model's."""
        own = dict(self.model.named_buffers())
        if set(buffers) != set(own):
            raise ValueError(
                f"buffers must have the model's buffers {sorted(own)}, got {sorted(buffers)}"
            )
        out = {}
        for k, v in buffers.items():
            if tuple(v.shape) != (n, *own[k].shape):
                raise ValueError(
                    f"buffer {k!r} must have shape {(n, *own[k].shape)}, got {tuple(v.shape)}"
                )
            out[k] = v.detach().clone()
        return out

    def _compute(self, params, inputs, targets, shared, per_example, client_buffers=None):
        """Gradients, losses, (shared parameters, model buffers only) the client-averaged
        buffers, and the clients' updated buffers."""
        given = client_buffers is not None
        buffers = client_buffers if given else self._client_buffers(inputs.shape[0])
        backend = self.example_backend if per_example else self.backend
        if backend == "layers":  # no buffers: nothing to average
            rules = self._example_layers.per_example if per_example else self._layers
            grads, losses = rules(params, inputs, targets)
        elif backend == "vmap":
            grads, losses = self._vmap(params, buffers, inputs, targets, shared, per_example)
        else:
            grads, losses = self._loop(params, buffers, inputs, targets, shared, per_example)
        averaged = average_client_buffers(buffers) if shared and buffers and not given else None
        return grads, losses, averaged, buffers

    def _graphed(self, params, inputs, targets, shared, per_example, client_buffers=None):
        """:meth:`_compute` captured once per input signature in a CUDA graph, then replayed.

        The graph reads the model's buffers in place (they keep their storage:
        :meth:`commit_buffers` copies into them) and copies of ``params``, ``inputs`` and
        ``targets`` (and of given per-client buffers) held by the graph; outputs are cloned out
        of the graph's static memory.
        """
        tensors = [params, inputs, targets]
        names = sorted(client_buffers) if client_buffers is not None else []
        tensors += [client_buffers[k] for k in names]
        signature = [(tuple(t.shape), t.dtype, t.device) for t in tensors]
        key = (shared, per_example, tuple(names), *signature)
        entry = self._graphs.get(key)
        if entry is None:
            static = [t.clone() for t in tensors]

            def compute():
                bufs = dict(zip(names, static[3:])) if client_buffers is not None else None
                return self._compute(*static[:3], shared, per_example, bufs)

            side = torch.cuda.Stream(device=params.device)
            side.wait_stream(torch.cuda.current_stream(params.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside capture (cuDNN autotuning, allocations)
                    for dst, src in zip(static, tensors):
                        dst.copy_(src)  # the warm-up updated the static buffers in place
                    compute()
            torch.cuda.current_stream(params.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = compute()
            entry = self._graphs[key] = (graph, static, outputs)
        graph, static, (grads, losses, averaged, updated) = entry
        for dst, src in zip(static, tensors):
            dst.copy_(src)
        graph.replay()
        if averaged is not None:
            averaged = {k: v.clone() for k, v in averaged.items()}
        if client_buffers is not None:  # else the model's copies, which nobody reads
            updated = {k: v.clone() for k, v in updated.items()}
        return grads.clone(), losses.clone(), averaged, updated

    def _vmap(self, params, buffers, inputs, targets, shared, per_example=False):
        fn = self._vmapped.get((shared, per_example))
        if fn is None:
            inner = self._per_example() if per_example else grad_and_value(self._loss, argnums=0)
            fn = vmap(inner, in_dims=(None if shared else 0, 0, 0, 0), randomness="different")
            self._vmapped[(shared, per_example)] = fn
        return fn(params, buffers, inputs, targets)

    def _loop(self, params, buffers, inputs, targets, shared, per_example=False):
        n, batch = inputs.shape[0], inputs.shape[1]
        lead = (n, batch) if per_example else (n,)
        grads = torch.empty(*lead, self.layout.dim, device=params.device, dtype=params.dtype)
        losses = torch.empty(*lead, device=params.device, dtype=params.dtype)
        with torch.enable_grad():
            for i in range(n):
                leaf = (params if shared else params[i]).clone().requires_grad_(not per_example)
                client_buffers = {k: v[i] for k, v in buffers.items()}
                if per_example:
                    grads[i], losses[i] = self._per_example()(
                        leaf, client_buffers, inputs[i], targets[i]
                    )
                    continue
                loss = self._loss(leaf, client_buffers, inputs[i], targets[i])
                (grads[i],) = torch.autograd.grad(loss, leaf)
                losses[i] = loss.detach()
        return grads, losses

    @torch.no_grad()
    def commit_buffers(self) -> None:
        """Write the client-averaged running statistics of the last shared-parameter call."""
        if not self._pending_buffers:
            return
        bufs = dict(self.model.named_buffers())
        for k, v in self._pending_buffers.items():
            bufs[k].copy_(v)
        self._pending_buffers = None


def call_from_buffers(
    oracle: GradientOracle,
    params: Tensor,
    inputs: Tensor,
    targets: Tensor,
    buffers: dict[str, Tensor] | None,
) -> OracleOutput:
    """The clients' gradients (``oracle(params, inputs, targets)``) with every client starting
    from its own copy of a grid configuration's model ``buffers`` (``None``: the model's own);
    at shared parameters ``[d]`` the output carries the sums over the clients of their updated
    buffers (``buffer_sums``), which per-client parameters ``[c, d]`` leave to the caller."""
    copies = None if buffers is None else client_copies(buffers, inputs.shape[0])
    out = oracle(params, inputs, targets, buffers=copies)
    if copies is not None and params.dim() == 1:
        out.buffer_sums = sum_client_buffers(oracle.client_buffers)
    return out


class RoundOracle(ChunkOracle):
    """The round's :class:`~pl_privfed.engine.ChunkOracle`: a :class:`GradientOracle` over the
    round's data (a :class:`~pl_privfed.datamodules.RoundBatch`), for the chunk of clients
    asked for.

    Args:
        oracle: the gradient oracle.
        batch: the round's data; ``batch.clients(ids)`` gives the clients' minibatches.
        local_batches: ``T``, the minibatches per client and round (``[c, T, B, ...]`` data).
        buffers: for a grid configuration, its own model buffers ``{name: tensor}``, which each
            client of a chunk starts from (instead of the model's).
        rows: how the clients' rows are represented (:class:`~pl_privfed.engine.ClientRows`):
            one that computes its own gradients (:attr:`~pl_privfed.engine.ClientRows.
            computes_gradients`: coordinates in the clients' data span) gives them from the
            round's data; the default: the oracle's ``[c, d]``.
    """

    def __init__(
        self,
        oracle: GradientOracle,
        batch,
        local_batches: int = 1,
        buffers: dict[str, Tensor] | None = None,
        rows: ClientRows = DENSE,
    ) -> None:
        self.oracle = oracle
        self.batch = batch
        self.local_batches = local_batches
        self.buffers = buffers
        self.rows = rows
        self._cached: tuple[Tensor, Tensor, Tensor] | None = None

    def data(self, clients: Tensor, step: int | None = None) -> tuple[Tensor, Tensor]:
        """The clients' local minibatch ``step``, or with ``None`` all their data of the round
        (with ``local_batches: T > 1`` the inputs are ``[c, T, B, ...]``: ``[c, T·B, ...]``)."""
        if self._cached is None or self._cached[0] is not clients:
            self._cached = (clients, *self.batch.clients(clients))
        _, inputs, targets = self._cached
        stacked = self.local_batches > 1
        if step is not None:
            if not 0 <= step < self.local_batches:
                raise ValueError(
                    f"step={step} but the datamodule delivers local_batches="
                    f"{self.local_batches} minibatches per round"
                )
            return (inputs[:, step], targets[:, step]) if stacked else (inputs, targets)
        return (inputs.flatten(1, 2), targets.flatten(1, 2)) if stacked else (inputs, targets)

    def __call__(
        self, params: Tensor, clients: Tensor, *, per_example: bool = False, step: int | None = None
    ) -> OracleOutput:
        if self.rows.computes_gradients:  # at the broadcast, no inputs gathered
            if per_example or step is not None or params.dim() != 1:
                self.rows.require_dense(
                    "per-example gradients, local steps and per-client parameters"
                )
            (out,) = self.rows.gradients(params[None], clients, self.batch)
            return out
        inputs, targets = self.data(clients, step)
        if per_example:
            return self.oracle(params, inputs, targets, per_example=True)
        return call_from_buffers(self.oracle, params, inputs, targets, self.buffers)

    def clipped_mean(
        self, params: Tensor, clients: Tensor, scale, *, step: int | None = None
    ) -> OracleOutput:
        self.rows.require_dense("per-example clipped means")
        inputs, targets = self.data(clients, step)
        return self.oracle.clipped_mean(params, inputs, targets, scale)


def client_copies(buffers: dict[str, Tensor], count: int) -> dict[str, Tensor]:
    """``count`` clients' copies of one model's ``buffers`` (expanded views, no copy): what
    each client of a chunk starts from."""
    return {k: v.unsqueeze(0).expand(count, *v.shape) for k, v in buffers.items()}


def sum_client_buffers(per_client: dict[str, Tensor], dim: int = 0) -> dict[str, Tensor]:
    """The clients' updated buffers summed along the client axis ``dim`` (integer buffers:
    the first client's, which all share); divided by the number of clients this is
    :func:`average_client_buffers`."""
    return {
        k: v.sum(dim) if v.is_floating_point() else v.select(dim, 0) for k, v in per_client.items()
    }
