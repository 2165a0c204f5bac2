"""Per-sample gradient clipping in one backward pass (DP-SGD, Abadi et al. 2016, Alg. 1 lines 5-7).

For a batch of B samples with per-sample losses L_i, DP-SGD needs the clipped sum
``sum_i c_i * grad L_i`` with ``c_i = min(1, C / ||grad L_i||)``. For a linear layer y = W a + b on
2-D inputs, grad_W L_i = g_i a_i^T (g_i = dL/dy_i), so ``||grad_W L_i|| = ||a_i|| ||g_i||`` and the
clipped sum is ``G^T diag(c) A``: one matmul, the same cost as the plain weight gradient.

:class:`PerSampleClipper` records each layer's input A (forward hook) and the gradient edge of its
output, runs ONE ``torch.autograd.grad`` to the layer outputs only (autograd then skips every weight
gradient and everything upstream of the module, e.g. a GAN generator), computes all per-sample norms,
then writes ``p.grad``. Layers with 3-D inputs use the ghost norm (Li et al. 2022)
``||sum_t g_t a_t^T||^2 = sum_{t,t'} (a_t . a_t')(g_t . g_t')`` or materialise the per-sample
gradient, whichever is cheaper; unsupported layers use Opacus' per-sample gradient samplers.

Contract (not checkable here): ``per_sample_loss[i]`` depends on sample i only (no batch statistics,
no BatchNorm, no batch-mean losses). This module never adds noise nor divides by the batch size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient, prepare_layer
from opacus.validators import ModuleValidator
from opacus.validators.errors import IllegalModuleConfigurationError
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

log = logging.getLogger(__name__)

MODES = ("auto", "fast", "opacus")
_FAST_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.LayerNorm, nn.GroupNorm, nn.Embedding)
Grads = list[tuple[nn.Parameter, Tensor]]
Finisher = Callable[[Tensor], Grads]


# ----------------------------------------------------------------------------------------- pure math
def clip_factors(norms: Tensor, max_grad_norm: float) -> Tensor:
    """Clipping factors ``c_i = min(1, C / (||g_i|| + 1e-6))`` (Opacus' convention).

    >>> clip_factors(torch.tensor([0.5, 4.0]), 2.0)
    tensor([1.0000, 0.5000])
    """
    return (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)


def outer_norms_sq(a: Tensor, g: Tensor) -> Tensor:
    """Squared norms ``||g_i a_i^T||^2 = ||a_i||^2 ||g_i||^2`` for a (B, d_in), g (B, d_out) -> (B,)."""
    return torch.linalg.vecdot(a, a) * torch.linalg.vecdot(g, g)


def ghost_norms_sq(a: Tensor, g: Tensor) -> Tensor:
    """Squared norms ``||sum_t g_t a_t^T||^2`` via Gram matrices, a (B, T, d_in), g (B, T, d_out) -> (B,)."""
    return (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))  # (B, T, T)


def clipped_outer_sum(a: Tensor, g: Tensor, c: Tensor) -> Tensor:
    """``G^T diag(c) A`` for a (B, d_in), g (B, d_out), c (B,) -> (d_out, d_in); scales the narrower side."""
    if a.shape[1] <= g.shape[1]:
        return torch.mm(g.t(), a * c[:, None])
    return torch.mm((g * c[:, None]).t(), a)


def conv_grad_sample(x: Tensor, g: Tensor, conv: nn.Conv1d | nn.Conv2d | nn.Conv3d) -> Tensor:
    """Per-sample conv weight grads (B, C_out, C_in/groups, *k): one conv backward with groups*B groups.

    The batch is folded into channels, x (1, B*C_in, *S) and g (1, B*C_out, *S'), so the backend's
    weight-gradient kernel computes every sample's gradient at once (no im2col).
    """
    n, dims = x.shape[0], x.dim() - 2
    weight_grad = (F.grad.conv1d_weight, F.grad.conv2d_weight, F.grad.conv3d_weight)[dims - 1]
    padding = 0 if conv.padding == "valid" else conv.padding
    shape = (n * conv.out_channels, *conv.weight.shape[1:])
    gs = weight_grad(
        x.reshape(1, -1, *x.shape[2:]),
        shape,
        g.reshape(1, -1, *g.shape[2:]),
        stride=conv.stride,
        padding=padding,
        dilation=conv.dilation,
        groups=n * conv.groups,
    )
    return gs.view(n, *conv.weight.shape)  # (B, C_out, C_in/groups, *k)


def norm_layer_grad_sample(x: Tensor, g: Tensor, layer: nn.LayerNorm | nn.GroupNorm) -> tuple[Tensor, Tensor]:
    """Per-sample grads of a LayerNorm/GroupNorm's (weight, bias): ``sum g * x_hat`` and ``sum g``."""
    if isinstance(layer, nn.LayerNorm):
        x_hat = F.layer_norm(x, layer.normalized_shape, eps=layer.eps)
        dims = tuple(range(1, x.dim() - len(layer.normalized_shape)))
    else:
        x_hat = F.group_norm(x, layer.num_groups, eps=layer.eps)
        dims = tuple(range(2, x.dim()))
    gw = g * x_hat
    return (gw.sum(dims), g.sum(dims)) if dims else (gw, g)  # each (B, *param.shape)


def add_noise(
    grads: Sequence[Tensor],
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    generator: torch.Generator | None = None,
) -> list[Tensor]:
    """Gaussian mechanism on clipped sums: ``g + N(0, (sigma C)^2)`` elementwise (no division by B).

    Args:
        grads: Clipped gradient sums.
        noise_multiplier: sigma >= 0.
        max_grad_norm: C > 0, the clipping bound (the L2 sensitivity of the sum).
        generator: Optional torch generator on the grads' device (not a CSPRNG; see Opacus secure_mode).

    Returns:
        New tensors; the inputs are left untouched.
    """
    if noise_multiplier < 0 or max_grad_norm <= 0:
        raise ValueError(
            f"need noise_multiplier >= 0 and max_grad_norm > 0, got {noise_multiplier}, {max_grad_norm}"
        )
    std = noise_multiplier * max_grad_norm
    if std == 0:
        return [g.clone() for g in grads]
    return [
        g + torch.normal(0.0, std, g.shape, generator=generator, device=g.device, dtype=g.dtype)
        for g in grads
    ]


# ------------------------------------------------------------------------------------ layer handlers
def _live(p: nn.Parameter | None) -> nn.Parameter | None:
    return p if p is not None and p.requires_grad else None


def _sum(ts: Sequence[Tensor]) -> Tensor:
    return ts[0] if len(ts) == 1 else torch.stack(list(ts)).sum(0)


def _materialised(gs: dict[nn.Parameter, Tensor]) -> tuple[Tensor, Finisher]:
    """Norms and clipped sums from explicit per-sample gradients {p: (B, *p.shape)}."""
    flat = {p: t.reshape(t.shape[0], -1) for p, t in gs.items()}  # (B, P)
    norm_sq = _sum([torch.linalg.vector_norm(f, dim=1).square() for f in flat.values()])
    return norm_sq, lambda c: [(p, (c @ f).view(p.shape)) for p, f in flat.items()]


def _dense_2d(
    a: Tensor, g: Tensor, w: nn.Parameter | None, b: nn.Parameter | None
) -> tuple[Tensor, Finisher]:
    g_sq = torch.linalg.vecdot(g, g)  # (B,)
    if w is not None:  # ||a||^2 ||g||^2 (+ ||g||^2 for the bias)
        a_sq = torch.linalg.vecdot(a, a)
        norm_sq = torch.addcmul(g_sq, g_sq, a_sq) if b is not None else g_sq * a_sq
    else:
        norm_sq = g_sq

    def finish(c: Tensor) -> Grads:
        out = [(w, clipped_outer_sum(a, g, c).view(w.shape))] if w is not None else []
        return [*out, (b, torch.mv(g.t(), c))] if b is not None else out

    return norm_sq, finish


def _dense_3d(
    a: Tensor, g: Tensor, w: nn.Parameter | None, b: nn.Parameter | None
) -> tuple[Tensor, Finisher]:
    (n, t, d_in), d_out = a.shape, g.shape[-1]
    ghost = t * t * (d_in + d_out) < d_in * d_out  # Gram cost vs materialising (B, d_out, d_in)
    norm_sq, gs = a.new_zeros(n), None
    if w is not None and ghost:
        norm_sq = ghost_norms_sq(a, g)
    elif w is not None:
        gs = torch.bmm(g.transpose(1, 2), a)  # (B, d_out, d_in)
        norm_sq = gs.square().sum((1, 2))
    gb = g.sum(1) if b is not None else None  # (B, d_out)
    if gb is not None:
        norm_sq = norm_sq + gb.square().sum(1)

    def finish(c: Tensor) -> Grads:
        out = []
        if w is not None and gs is not None:
            out.append((w, torch.tensordot(c, gs, 1).view(w.shape)))
        elif w is not None:
            gc = (g * c[:, None, None]).reshape(-1, d_out)  # (B*T, d_out)
            out.append((w, torch.mm(gc.t(), a.reshape(-1, d_in)).view(w.shape)))
        return [*out, (b, torch.mv(gb.t(), c))] if gb is not None else out

    return norm_sq, finish


def _as_3d(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], -1, t.shape[-1])  # (B, T, d)


def _cat(ts: list[Tensor], dim: int) -> Tensor:
    return ts[0] if len(ts) == 1 else torch.cat(ts, dim)


def _linear(m: nn.Linear, pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Finisher]:
    w, b = _live(m.weight), _live(m.bias)
    if len(pairs) == 1 and pairs[0][0].dim() == 2:
        return _dense_2d(*pairs[0], w, b)
    a = _cat([_as_3d(x) for x, _ in pairs], 1)  # (B, T, d_in), calls stacked along T
    return _dense_3d(a, _cat([_as_3d(y) for _, y in pairs], 1), w, b)


def _conv(
    m: nn.Conv1d | nn.Conv2d | nn.Conv3d, pairs: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, Finisher]:
    w, b = _live(m.weight), _live(m.bias)
    gs = {w: _sum([conv_grad_sample(x, y, m) for x, y in pairs])} if w is not None else {}
    if b is not None:
        gs[b] = _sum([y.flatten(2).sum(2) for _, y in pairs])  # (B, C_out)
    return _materialised(gs)


def _norm_layer(
    m: nn.LayerNorm | nn.GroupNorm, pairs: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, Finisher]:
    gw, gb = map(_sum, zip(*(norm_layer_grad_sample(x, y, m) for x, y in pairs)))
    w, b = _live(m.weight), _live(m.bias)
    return _materialised({**({w: gw} if w is not None else {}), **({b: gb} if b is not None else {})})


def _embedding(m: nn.Embedding, pairs: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Finisher]:
    idx = _cat([x.reshape(x.shape[0], -1) for x, _ in pairs], 1)  # (B, T)
    g = _cat([_as_3d(y) for _, y in pairs], 1)  # (B, T, d)
    if m.padding_idx is not None:
        g = g * (idx != m.padding_idx).unsqueeze(-1)
    same = idx.unsqueeze(2) == idx.unsqueeze(1)  # (B, T, T): ghost norm with one-hot activations
    norm_sq = (torch.bmm(g, g.transpose(1, 2)) * same).sum((1, 2))

    def finish(c: Tensor) -> Grads:
        rows = (g * c[:, None, None]).reshape(-1, g.shape[-1])  # (B*T, d)
        return [(m.weight, torch.zeros_like(m.weight).index_add_(0, idx.reshape(-1), rows))]

    return norm_sq, finish


def _opacus(
    m: nn.Module, pairs: list[tuple[Tensor, Tensor]], *, functorch: bool = False
) -> tuple[Tensor, Finisher]:
    sampler = ft_compute_per_sample_gradient if functorch else GradSampleModule.GRAD_SAMPLERS[type(m)]
    total: dict[nn.Parameter, Tensor] = {}
    for x, y in pairs:  # calls of one group share samples: their per-sample gradients add up
        for p, gs in sampler(m, [x], y).items():
            if p.requires_grad:
                total[p] = total[p] + gs if p in total else gs
    return _materialised(total)


_HANDLERS = {
    "linear": _linear,
    "conv": _conv,
    "norm": _norm_layer,
    "embedding": _embedding,
    "opacus": _opacus,
    "functorch": partial(_opacus, functorch=True),
}


def _fast_kind(m: nn.Module) -> str | None:
    """The fast-path handler name for a module of an exactly supported type, else None."""
    if type(m) is nn.Linear:
        return "linear"
    if type(m) in (nn.Conv1d, nn.Conv2d, nn.Conv3d) and m.padding_mode == "zeros" and m.padding != "same":
        return "conv"
    if type(m) in (nn.LayerNorm, nn.GroupNorm):
        return "norm"
    if type(m) is nn.Embedding:
        return "embedding"
    return None


# ------------------------------------------------------------------------------------------ plumbing
class _Call(NamedTuple):
    """One recorded forward call of a layer."""

    x: Tensor  # the layer input, detached (shares the version counter)
    version: int  # x._version at the forward, to catch later in-place edits
    edge: GradientEdge  # the output's gradient edge: robust to in-place ops applied to the output
    in_node: Node | None  # the input's autograd node, for the graph check


class _Layer(NamedTuple):
    name: str
    module: nn.Module
    kind: str  # a key of _HANDLERS
    params: tuple[nn.Parameter, ...]


def _validate(module: nn.Module) -> None:
    """Refuse modules that mix samples (BatchNorm) or that Opacus cannot per-sample differentiate."""
    bn = [name for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if bn:
        raise ValueError(
            f"BatchNorm layers {bn} mix samples within a batch, so per-sample gradients (and DP-SGD's "
            "guarantee) do not exist. Use nn.GroupNorm or nn.LayerNorm instead, e.g. "
            "opacus.validators.ModuleValidator.fix(module) replaces BatchNorm with GroupNorm."
        )
    errors = [
        e for e in ModuleValidator.validate(module) if not isinstance(e, IllegalModuleConfigurationError)
    ]
    bad_emb = [
        n
        for n, m in module.named_modules()
        if isinstance(m, nn.Embedding) and (m.sparse or m.scale_grad_by_freq)
    ]
    if errors or bad_emb:
        raise ValueError(
            f"module is not DP-SGD compatible: {errors or ''} {bad_emb or ''}. Fix with "
            "opacus.validators.ModuleValidator.fix(module); embeddings need sparse=False and "
            "scale_grad_by_freq=False (the latter mixes samples)."
        )


def _plan(module: nn.Module, mode: str) -> list[_Layer]:
    """Assign every trainable parameter to exactly one recorded layer (pre-order walk)."""
    layers: list[_Layer] = []
    seen: set[int] = set()

    def visit(name: str, m: nn.Module) -> None:
        if id(m) in seen:
            return
        seen.add(id(m))
        own = [p for p in m.parameters(recurse=False) if p.requires_grad]
        if own:
            kind = _fast_kind(m) if mode != "opacus" else None
            if kind is None and mode == "fast":
                raise ValueError(
                    f"mode='fast' has no fast path for {name or 'root'} ({type(m).__name__}); fast types are "
                    f"{[t.__name__ for t in _FAST_TYPES]} (convs with zero padding, not 'same'). Use mode='auto'."
                )
            # Opacus' embedding sampler ignores padding_idx: use functorch for those.
            padded = isinstance(m, nn.Embedding) and m.padding_idx is not None
            if kind is None and (type(m) not in GradSampleModule.GRAD_SAMPLERS or padded):
                prepare_layer(m)  # functorch over the whole subtree
                layers.append(
                    _Layer(
                        name or "root", m, "functorch", tuple(p for p in m.parameters() if p.requires_grad)
                    )
                )
                return
            layers.append(_Layer(name or "root", m, kind or "opacus", tuple(own)))
        for child_name, child in m.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)

    visit("", module)
    owner: dict[nn.Parameter, str] = {}
    for layer in layers:
        for p in layer.params:
            if p in owner:
                raise ValueError(
                    f"parameter shared by {owner[p]} and {layer.name}: tied weights need a joint "
                    "per-sample norm, which is not supported. Untie them or freeze the shared parameter."
                )
            owner[p] = layer.name
    return layers


def _promote(x: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """One dtype of at least float32 for a float input and its output gradient (autocast, bf16).

    Norms in half precision would be off by ~0.4%, letting a clipped contribution exceed C.
    """
    dtype = torch.promote_types(g.dtype, torch.float32)
    if x.is_floating_point():
        dtype = torch.promote_types(dtype, x.dtype)
        x = x if x.dtype == dtype else x.to(dtype)
    return x, g if g.dtype == dtype else g.to(dtype)


def _groups(
    calls: list[tuple[_Call, Tensor]], n: int, name: str
) -> list[tuple[slice | None, list[tuple[Tensor, Tensor]]]]:
    """Map a layer's calls to sample slices (None: all n) by batch size.

    Calls of size n each are summed per sample (row i of every call is sample i); calls whose sizes
    sum to n are concatenated in call order.
    """
    pairs = [_promote(c.x, g) for c, g in calls]
    sizes = [g.shape[0] for _, g in pairs]
    if all(s == n for s in sizes):
        return [(None, pairs)]
    if sum(sizes) == n:
        starts = [sum(sizes[:k]) for k in range(len(sizes))]
        return [(slice(s, s + size), [pair]) for s, size, pair in zip(starts, sizes, pairs)]
    raise ValueError(
        f"{name} ran on batches of sizes {sizes} in this step; with len(per_sample_loss) = {n} they must "
        "each equal it (sample i is row i of every call) or sum to it (calls concatenated in order)."
    )


class PerSampleClipper:
    """Per-sample clipped gradient sums for one nn.Module (DP-SGD, Abadi et al. 2016, Alg. 1 lines 5-7).

    Forward hooks (registered here, removed by :meth:`detach`) record every grad-enabled call of the
    module's trainable layers; :meth:`backward` consumes the records. Records that the loss does not
    reach (e.g. a generator step through this discriminator) are ignored; :meth:`reset` frees them
    early. Calls in one step must each cover the whole batch (summed per sample, e.g. D(real_i) and
    D(fake_i)) or split it in order (``per_sample_loss = cat([loss_real, loss_fake])``).

    Example::

        clipper = PerSampleClipper(disc, max_grad_norm=1.0)
        per_sample = F.softplus(-disc(real)).squeeze(1) + F.softplus(disc(fake.detach())).squeeze(1)
        norms = clipper.backward(per_sample)  # disc's p.grad = clipped sum; add noise, divide, step

    Args:
        module: The network whose trainable parameters are clipped. Parameters with
            ``requires_grad=False`` at construction are ignored; freezing more later is fine.
        max_grad_norm: C > 0, the per-sample L2 bound over all trainable parameters together.
        mode: "auto" (fast path where supported, Opacus samplers elsewhere), "fast" (refuse other
            layers) or "opacus" (Opacus' grad samplers / functorch everywhere; a reference).
        check_graph: walk the autograd graph at every backward (~20 us) to refuse parameters that
            reach the loss outside their own module (tied weights used via ``F.linear``, gradient
            penalties through ``autograd.grad(create_graph=True)``); False checks the first only.

    Raises:
        ValueError: for a bad C or mode, BatchNorm or other Opacus-invalid layers, tied parameters.
    """

    def __init__(
        self, module: nn.Module, *, max_grad_norm: float, mode: str = "auto", check_graph: bool = True
    ) -> None:
        if not max_grad_norm > 0 or max_grad_norm == float("inf"):
            raise ValueError(f"max_grad_norm must be a finite C > 0, got {max_grad_norm}")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; valid modes: {list(MODES)}")
        _validate(module)
        self.module, self.max_grad_norm, self.mode = module, float(max_grad_norm), mode
        self._layers = _plan(module, mode)
        self.params = tuple(p for layer in self._layers for p in layer.params)
        self._frozen = tuple(p for p in module.parameters() if not p.requires_grad)
        self._names = {p: name for name, p in module.named_parameters() if p.requires_grad}
        self._calls: list[list[_Call]] = [[] for _ in self._layers]
        self._verified, self._check_graph = False, check_graph
        self._handles = [
            layer.module.register_forward_hook(partial(self._record, i))
            for i, layer in enumerate(self._layers)
        ]
        slow = [
            f"{layer.name} ({type(layer.module).__name__})"
            for layer in self._layers
            if layer.kind in ("opacus", "functorch")
        ]
        if slow and mode == "auto":
            log.info("per-sample gradients via Opacus (materialised) for: %s", ", ".join(slow))

    def _record(self, index: int, module: nn.Module, args: tuple, output: object) -> None:
        if not torch.is_grad_enabled() or module is not self._layers[index].module:  # deepcopies share hooks
            return
        if not isinstance(output, Tensor) or not args or not isinstance(args[0], Tensor):
            raise TypeError(f"{self._layers[index].name}: per-sample clipping needs tensor input and output")
        if output.grad_fn is None:
            return
        x = args[0].detach()
        check = args[0].requires_grad and (self._check_graph or not self._verified)
        in_node = get_gradient_edge(args[0]).node if check else None
        self._calls[index].append(_Call(x, x._version, get_gradient_edge(output), in_node))

    def reset(self) -> None:
        """Drop the recorded forward calls (and the graphs they keep alive)."""
        self._calls = [[] for _ in self._layers]

    def detach(self) -> None:
        """Remove the hooks and records; the clipper is unusable afterwards."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.reset()
        for layer in self._layers:
            if hasattr(layer.module, "ft_compute_sample_grad"):
                del layer.module.ft_compute_sample_grad

    def backward(self, per_sample_loss: Tensor, *, accumulate: bool = False) -> Tensor:
        """Write ``p.grad = sum_i c_i grad L_i`` for every trainable parameter of the module.

        One autograd pass, to the recorded layer outputs only: parameters outside the module
        (a GAN generator feeding it) receive nothing, and the graph is freed. Noise and the division
        by the (expected) batch size are the caller's job.

        Args:
            per_sample_loss: (B,) unreduced losses, L_i depending on sample i only. B may be 0.
            accumulate: add to existing ``p.grad`` instead of overwriting it (micro-batching).

        Returns:
            (B,) per-sample gradient norms before clipping (detached).

        Raises:
            ValueError: for a loss that is not 1-D, or calls whose batch sizes do not match B.
            RuntimeError: if no recorded forward reaches the loss, an input was modified in place,
                or (``check_graph``) a parameter reaches the loss outside its own module.
        """
        if per_sample_loss.dim() != 1:
            raise ValueError(f"per_sample_loss must have shape (B,), got {tuple(per_sample_loss.shape)}")
        n = per_sample_loss.shape[0]
        calls, self._calls = self._calls, [[] for _ in self._layers]
        newly_trainable = [p for p in self._frozen if p.requires_grad]
        if newly_trainable:
            raise RuntimeError(
                "parameters became trainable after the clipper was built; build a new PerSampleClipper"
            )
        if n == 0:
            self._write({}, accumulate)
            return per_sample_loss.detach().new_zeros(0)
        flat = [(i, call) for i, cs in enumerate(calls) for call in cs]
        if (self._check_graph or not self._verified) and per_sample_loss.grad_fn is not None:
            self._verify_graph(per_sample_loss.grad_fn, [call for _, call in flat])
        grads = torch.autograd.grad(per_sample_loss.sum(), [call.edge for _, call in flat], allow_unused=True)
        live: list[list[tuple[_Call, Tensor]]] = [[] for _ in self._layers]
        for (i, call), g in zip(flat, grads):
            if g is not None:
                if call.x._version != call.version:
                    raise RuntimeError(
                        f"the input of {self._layers[i].name} was modified in place after its forward"
                    )
                live[i].append((call, g))
        if not any(live):
            raise RuntimeError("per_sample_loss does not depend on any recorded forward of the module")

        norm_sq = per_sample_loss.new_zeros(
            n, dtype=torch.promote_types(per_sample_loss.dtype, torch.float32)
        )
        finishers: list[tuple[slice | None, Finisher, torch.dtype]] = []
        for layer, layer_calls in zip(self._layers, live):
            if layer_calls and any(p.requires_grad for p in layer.params):
                for sl, pairs in _groups(layer_calls, n, layer.name):
                    ns, finish = _HANDLERS[layer.kind](layer.module, pairs)
                    if sl is None:
                        norm_sq = norm_sq + ns
                    else:
                        norm_sq[sl] += ns
                    finishers.append((sl, finish, ns.dtype))
        norms = norm_sq.sqrt()
        c = clip_factors(norms, self.max_grad_norm)
        summed: dict[nn.Parameter, Tensor] = {}
        for sl, finish, dtype in finishers:
            c_group = c if sl is None else c[sl]
            for p, g in finish(c_group if c_group.dtype == dtype else c_group.to(dtype)):
                summed[p] = summed[p] + g if p in summed else g
        self._write(summed, accumulate)
        return norms

    def _write(self, summed: dict[nn.Parameter, Tensor], accumulate: bool) -> None:
        for p in self.params:
            if not p.requires_grad:
                continue
            g = summed.get(p)
            g = torch.zeros_like(p) if g is None else g if g.dtype == p.dtype else g.to(p.dtype)
            if accumulate and p.grad is not None:
                p.grad.add_(g)
            else:
                p.grad = g

    def _verify_graph(self, root: Node, calls: list[_Call]) -> None:
        """Walk the graph from the loss, jumping from each recorded output to its input, for stray params."""
        jumps: dict[Node, list[Node]] = {}
        for call in calls:
            jumps.setdefault(call.edge.node, []).extend([call.in_node] if call.in_node is not None else [])
        names = self._names
        stack, seen, leaked = [root], set(), []
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            if node in jumps:
                stack.extend(jumps[node])
                continue
            variable = getattr(node, "variable", None)
            if variable is not None and variable in names:
                leaked.append(names[variable])
            stack.extend(fn for fn, _ in node.next_functions)
        if leaked:
            raise RuntimeError(
                f"parameters {leaked} reach the loss outside their own module's forward (e.g. tied "
                "weights used via F.linear); their per-sample gradients would be missed."
            )
        self._verified = True
