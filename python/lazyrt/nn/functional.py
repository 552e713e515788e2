"""lazyrt.nn.functional: activations and losses, as torch.nn.functional.

The losses are the C++ ones of nn.h (reduction: 'mean', 'sum' or 'none').
"""

import warnings

from lazyrt import _C
from lazyrt._C import (  # noqa: F401
    avg_pool2d, conv2d, embedding, gelu, layer_norm, leaky_relu, log_softmax, max_pool2d, one_hot, pad, relu,
    sigmoid, silu, softmax, softplus, tanh,
)


def linear(input, weight, bias=None):
    """y = input @ weight^T + bias, as nn.Linear computes it."""
    y = _C.matmul(input, _C.transpose(weight, 0, 1))
    return y if bias is None else y + bias


def dropout(input, p=0.5, training=True):
    """Zeroes elements with probability p while training, scaling the rest by 1 / (1 - p)."""
    return _C.dropout(input, p, training)


def mish(input):
    """x * tanh(softplus(x)), softplus with PyTorch's threshold (x itself above 20)."""
    return input * _C.tanh(_C.softplus(input))


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zeroes whole channels (dim 1) with probability p while training, scaling the rest by
    1 / (1 - p), as torch.nn.functional.dropout2d in PyTorch 1.13: a 4-D input [N, C, H, W]
    loses whole [H, W] maps; a 3-D input is read as [N, C, L] (with PyTorch's warning). The
    input is never modified (inplace is accepted for PyTorch code)."""
    if not 0 <= p <= 1:
        raise ValueError(f"dropout2d: dropout probability has to be between 0 and 1, but got {p}")
    ndim = input.dim()
    if ndim not in (3, 4):
        warnings.warn(f"dropout2d: received a {ndim}-D input; dropout2d is meant for 3-D or 4-D inputs "
                      "(PyTorch deprecates other ranks)", stacklevel=2)
    elif ndim == 3:
        warnings.warn("dropout2d: received a 3-D input, read as [N, C, L] as PyTorch 1.13 reads it: "
                      "channel-wise 1-D dropout (use dropout1d semantics explicitly to silence this)",
                      stacklevel=2)
    if ndim < 2:
        raise _C.Error(f"dropout2d: feature dropout needs an input of at least 2 dims, got shape {tuple(input.shape)}")
    if not training or p == 0:
        return input
    if p == 1:
        return input * 0
    mask_shape = tuple(input.shape[:2]) + (1,) * (ndim - 2)
    return input * _C.dropout_mask(mask_shape, p, dtype=input.dtype)


def mse_loss(input, target, reduction="mean"):
    return _C._nn.mse_loss(input, target, reduction)


def _legacy_reduction(size_average, reduce, reduction):
    # torch's deprecated size_average / reduce flags, mapped as torch maps them.
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return ("mean" if size_average else "sum") if reduce else "none"


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """Logits [C], [N, C] or [N, C, d1, ...] against class indices ([], [N], [N, d1, ...]) or
    class probabilities (the logits' shape), as torch's: targets equal to ignore_index count
    for nothing (the mean is over the others), label smoothing mixes in the uniform
    distribution. Class weights are not supported."""
    if weight is not None:
        raise _C.Error("cross_entropy: class weights (weight=) are not supported")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _C._nn.cross_entropy(input, target, label_smoothing, reduction, ignore_index)


def binary_cross_entropy_with_logits(input, target, reduction="mean"):
    return _C._nn.binary_cross_entropy_with_logits(input, target, reduction)


# ---- normalization, pooling, resizing and attention (nn.h's functional layers) ----------------

def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
               eps=1e-5):
    """Normalizes dim 1 of [N, C, *] by the batch's statistics (training, or without running
    statistics) or by the running ones; while training, running_mean and running_var are
    updated in place with the batch mean and unbiased variance, as torch does."""
    return _C._nn.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    return _C._nn.group_norm(input, num_groups, weight, bias, eps)


def _pair(v, what):
    if isinstance(v, (list, tuple)):
        if len(v) != 2:
            raise _C.Error(f"{what}: expects one value or two (height, width), got {tuple(v)}")
        return list(v)
    return [v, v]


def adaptive_avg_pool2d(input, output_size):
    """Averages [N, C, H, W] (or [C, H, W]) into output_size bins (None keeps a dim), with
    torch's bin edges."""
    return _C._nn.adaptive_avg_pool2d(input, _pair(output_size, "adaptive_avg_pool2d"))


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resizes [N, C, H, W] with mode 'nearest' or 'bilinear', as torch.nn.functional.interpolate
    (recompute_scale_factor and antialias left at their defaults)."""
    if recompute_scale_factor or antialias:
        raise _C.Error("interpolate: recompute_scale_factor and antialias are not supported")
    sizes = [] if size is None else [int(v) for v in _pair(size, "interpolate")]
    factors = [] if scale_factor is None else [float(v) for v in _pair(scale_factor, "interpolate")]
    return _C._nn.interpolate(input, sizes, factors, mode, align_corners)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """softmax(q k^T / sqrt(E) + mask) v, with a boolean mask (True keeps) or an additive one,
    or a causal mask; dropout on the attention weights when dropout_p > 0."""
    return _C._nn.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale)
