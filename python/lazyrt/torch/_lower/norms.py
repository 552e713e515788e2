"""Layer norm and group norm: (out, mean, rstd) as torch's kernels give them, and their backward."""

import torch

from lazyrt import _C
from lazyrt.torch._lower.table import _KernelDtypes, _cast, _is_tensor, lowering

aten = torch.ops.aten


# ---- layer norm: (out, mean, rstd) as torch's kernel gives them; the backward by lazyrt's autograd
#
# Over bfloat16 or float16 values, ATen's CPU normalization kernels compute in float32 (their
# statistics, the normalization, weight and bias) and round each result once; so do these (a
# norm computed in bfloat16 op by op rounds every intermediate, and the gradients through it
# came out 2-3x further from float64 than eager's under autocast).

_HALF_FLOATS = (_C.bfloat16, _C.float16)


def _in_float32(*xs):
    """The tensors among xs of a 16-bit float dtype in float32; the others as they are."""
    return [_cast(x, _C.float32) if _is_tensor(x) and x.dtype in _HALF_FLOATS else x for x in xs]


def _stats_dtype(x, weight, bias):
    """The dtype of the saved mean and inverse deviation, as ATen's CPU kernels make them: the
    input's, but float32 for a 16-bit input with a float32 weight or bias (mixed types, as under
    autocast, where the norm's parameters stay float32). PyTorch's fake kernels say the input's
    dtype there; lazyrt gives the CPU kernel's values, so it follows the CPU kernel."""
    mixed = x.dtype in _HALF_FLOATS and any(_is_tensor(t) and t.dtype is _C.float32 for t in (weight, bias))
    return _C.float32 if mixed else x.dtype


def _norm_forward(lower, x, weight, bias):
    """[out, mean, rstd] of lower(x, weight, bias), run in float32 where they are 16-bit; each
    rounded once to the dtype ATen's CPU kernel gives it."""
    out_dtype, stats = x.dtype, _stats_dtype(x, weight, bias)
    out, mean, rstd = lower(*_in_float32(x, weight, bias))
    return _KernelDtypes([_cast(out, out_dtype), _cast(mean, stats), _cast(rstd, stats)])


def _norm_backward(lower, grad, x, mean, rstd, weight, bias_dtype):
    """[dx, dweight, dbias] of lower(grad, x, mean, rstd, weight), run in float32 where they are
    16-bit; dx in x's dtype, dweight in the weight's, dbias in bias_dtype, each rounded once."""
    dtypes = (x.dtype, weight.dtype if _is_tensor(weight) else None, bias_dtype)
    grads = lower(*_in_float32(grad, x, mean, rstd, weight))
    return _KernelDtypes(_cast(g, d) if d is not None else g for g, d in zip(grads, dtypes))


def _layer_norm_parts(x, normalized_shape, weight, bias, eps):
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    mean = _C.mean(x, dims, True)
    centered = x - mean
    rstd = _C.rsqrt(_C.mean(centered * centered, dims, True) + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


@lowering(aten.native_layer_norm.default)
def _native_layer_norm(e, x, normalized_shape, weight, bias, eps):
    return _norm_forward(lambda x, w, b: _layer_norm_parts(x, normalized_shape, w, b, eps), x, weight, bias)


@lowering(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(e, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    # From the saved statistics, as torch's kernel: with xhat = (x - mean) * rstd and g the
    # gradient times the weight, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over the
    # normalized dims; the weight's and bias's gradients sum over the others.
    def lower(grad, x, mean, rstd, weight):
        dims = list(range(x.dim() - len(normalized_shape), x.dim()))
        lead = list(range(x.dim() - len(normalized_shape)))
        xhat = (x - mean) * rstd
        g = grad * weight if weight is not None else grad
        dx = dw = db = None
        if output_mask[0]:
            dx = rstd * (g - _C.mean(g, dims, True) - xhat * _C.mean(g * xhat, dims, True))
        if output_mask[1] and weight is not None:
            dw = _C.sum(grad * xhat, lead, False) if lead else grad * xhat
        if output_mask[2] and bias is not None:
            db = _C.sum(grad, lead, False) if lead else grad
        return dx, dw, db
    return _norm_backward(lower, grad, x, mean, rstd, weight, bias.dtype if _is_tensor(bias) else None)


# ---- group norm: (out, mean, rstd) over [N, group, C / group * HxW], as torch's kernel ---------

def _per_channel(w, dim):
    """A [C] tensor shaped to broadcast over the channels of a [N, C, *] tensor of `dim` dims."""
    return _C.reshape(w, (1, -1) + (1,) * (dim - 2))


@lowering(aten.native_group_norm.default)
def _native_group_norm(e, x, weight, bias, N, C, HxW, group, eps):
    def lower(x, weight, bias):
        g = _C.reshape(x, (N, group, -1))
        mean = _C.mean(g, [2], True)
        centered = g - mean
        rstd = _C.rsqrt(_C.mean(centered * centered, [2], True) + eps)
        out = _C.reshape(centered * rstd, tuple(x.shape))
        if weight is not None:
            out = out * _per_channel(weight, x.dim())
        if bias is not None:
            out = out + _per_channel(bias, x.dim())
        return out, _C.reshape(mean, (N, group)), _C.reshape(rstd, (N, group))
    return _norm_forward(lower, x, weight, bias)


@lowering(aten.native_group_norm_backward.default)
def _native_group_norm_backward(e, grad, x, mean, rstd, weight, N, C, HxW, group, output_mask):
    # As layer norm's, per group: with xhat = (x - mean) * rstd and g the gradient times the
    # weight, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) over each group's elements; the
    # weight's and bias's gradients sum over all but the channels.
    def lower(grad, x, mean, rstd, weight):
        shape, grouped = tuple(x.shape), (N, group, -1)
        mean3, rstd3 = _C.reshape(mean, (N, group, 1)), _C.reshape(rstd, (N, group, 1))
        xhat = (_C.reshape(x, grouped) - mean3) * rstd3
        dx = dw = db = None
        if output_mask[0]:
            g = _C.reshape(grad * _per_channel(weight, x.dim()) if weight is not None else grad, grouped)
            dx = _C.reshape(rstd3 * (g - _C.mean(g, [2], True) - xhat * _C.mean(g * xhat, [2], True)), shape)
        others = [0] + list(range(2, x.dim()))
        if output_mask[1]:
            dw = _C.sum(grad * _C.reshape(xhat, shape), others, False)
        if output_mask[2]:
            db = _C.sum(grad, others, False)
        return dx, dw, db
    return _norm_backward(lower, grad, x, mean, rstd, weight, weight.dtype if _is_tensor(weight) else x.dtype)
