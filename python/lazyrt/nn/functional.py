"""lazyrt.nn.functional: activations and losses, as torch.nn.functional.

The losses are the C++ ones of nn.h (reduction: 'mean', 'sum' or 'none'). Padding modes, 1-D
and transposed convolutions, pixel shuffles, unfold / fold, instance norm, adaptive 1-D and max
pooling and embedding bags are compositions of lazyrt's ops (see each docstring).
"""

import math
import warnings

import numpy as np

from lazyrt import _C
from lazyrt._autograd import no_grad
from lazyrt._C import (  # noqa: F401
    avg_pool2d, conv2d, embedding, gelu, layer_norm, leaky_relu, log_softmax, max_pool2d_with_indices, one_hot,
    relu, sigmoid, silu, softmax, softplus, tanh,
)
from lazyrt._tensor import tensor


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """2-D max pooling of [N, C, H, W] or [C, H, W], as torch.nn.functional.max_pool2d; with
    return_indices, also each maximum's place in its input plane (row * W + column, int64)."""
    pool = _C.max_pool2d_with_indices if return_indices else _C.max_pool2d
    return pool(input, kernel_size, stride, padding, dilation, ceil_mode)


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


# ---- more activations, as compositions of the ops above ----------------------------------------
# inplace=True is accepted for PyTorch code: the result is the same, but the input is not
# modified (lazyrt returns a new tensor; use the returned value).

def relu6(input, inplace=False):
    """min(max(x, 0), 6)."""
    return _C.clamp(input, 0, 6)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    """x clamped to [min_val, max_val]."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) cannot be greater than max_val ({max_val})")
    return _C.clamp(input, min_val, max_val)


def elu(input, alpha=1.0, inplace=False):
    """x for x > 0, alpha * (exp(x) - 1) below."""
    # expm1 of the clamped input: a large positive x would give inf, and inf * 0 in the
    # unselected branch's gradient would be NaN.
    return _C.where(input > 0, input, alpha * _C.expm1(_C.clamp_max(input, 0)))


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def selu(input, inplace=False):
    """scale * elu(x, alpha) with PyTorch's constants (alpha 1.6732..., scale 1.0507...)."""
    return _SELU_SCALE * elu(input, _SELU_ALPHA)


def celu(input, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    if alpha == 0:
        raise _C.Error("celu: ZeroDivisionError: alpha cannot be 0")
    return _C.where(input > 0, input, alpha * _C.expm1(_C.clamp_max(input, 0) / alpha))


def hardsigmoid(input, inplace=False):
    """relu6(x + 3) / 6."""
    return _C.clamp(input + 3, 0, 6) / 6


def hardswish(input, inplace=False):
    """x * relu6(x + 3) / 6."""
    return input * _C.clamp(input + 3, 0, 6) / 6


def logsigmoid(input):
    """log(sigmoid(x)), as min(x, 0) - log1p(exp(-|x|)), which neither overflows nor loses the
    small term for large |x| (softplus's threshold would)."""
    return _C.clamp_max(input, 0) - _C.log1p(_C.exp(-_C.abs(input)))


def softsign(input):
    """x / (1 + |x|)."""
    return input / (_C.abs(input) + 1)


def _implicit_softmax_dim(ndim, call):
    warnings.warn(f"Implicit dimension choice for {call} has been deprecated. "
                  "Change the call to include dim=X as an argument.", stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmin(input, dim=None, _stacklevel=3, dtype=None):
    """softmax(-x) along dim (PyTorch's implicit dim, with its warning, when dim is None);
    dtype casts the input first."""
    if dim is None:
        dim = _implicit_softmax_dim(input.dim(), "softmin")
    if dtype is not None:
        input = _C.cast(input, dtype)
    return _C.softmax(-input, dim)


def prelu(input, weight):
    """x for x >= 0, weight * x below; a weight of C > 1 values applies per channel (dim 1)."""
    n = weight.numel()
    if n != 1:
        if input.dim() < 2 or input.shape[1] != n:
            raise _C.Error(f"prelu: the weight has {n} values, but the input of shape {tuple(input.shape)} has "
                           f"{input.shape[1] if input.dim() >= 2 else 1} channels (dim 1)")
        weight = _C.reshape(weight, (n,) + (1,) * (input.dim() - 2))
    return _C.where(input >= 0, input, weight * input)


# ---- distances and normalization ------------------------------------------------------------

def _vector_norm(x, p, dim, keepdim):
    # The C++ norm takes p = 1, 2 and inf; other orders as (sum |x|^p)^(1/p), and p = 0
    # (the count of nonzeros) and -inf (the smallest |x|) as torch reads them.
    p = float(p)
    if p in (1.0, 2.0, float("inf")):
        return _C.norm(x, p, dim, keepdim)
    if p == 0:
        return _C.sum(_C.cast(_C.ne(x, 0), x.dtype), dim, keepdim)
    if p == float("-inf"):
        return _C.amin(_C.abs(x), dim, keepdim)
    return _C.pow(_C.sum(_C.pow(_C.abs(x), p), dim, keepdim), 1.0 / p)


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """x / max(||x||_p, eps) along dim."""
    if out is not None:
        raise _C.Error("normalize: out= is not supported (use the returned tensor)")
    return input / _C.clamp_min(_vector_norm(input, p, dim, True), eps)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 / max(||x1||, eps) * x2 / max(||x2||, eps)) along dim, x1 and x2 broadcast
    together (PyTorch 1.13's formula)."""
    n1 = _C.clamp_min(_C.norm(x1, 2.0, dim, True), eps)
    n2 = _C.clamp_min(_C.norm(x2, 2.0, dim, True), eps)
    return _C.sum((x1 / n1) * (x2 / n2), dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """||x1 - x2 + eps||_p along the last dim, x1 and x2 broadcast together."""
    diff = x1 - x2 + eps
    if diff.dim() == 0:
        raise _C.Error("pairwise_distance: the inputs need at least one dim")
    return _vector_norm(diff, p, diff.dim() - 1, keepdim)


# ---- more losses ---------------------------------------------------------------------------

def _reduce(loss, reduction, call):
    if reduction == "mean":
        return _C.mean(loss)
    if reduction == "sum":
        return _C.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{call}: {reduction} is not a valid value for reduction (expected 'mean', 'sum' or 'none')")


def _check_same_size(input, target, call):
    if tuple(input.shape) != tuple(target.shape):
        warnings.warn(f"{call}: using a target size ({tuple(target.shape)}) that is different to the input size "
                      f"({tuple(input.shape)}). This will likely lead to incorrect results due to broadcasting. "
                      "Please ensure they have the same size.", stacklevel=3)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """|input - target|, reduced."""
    _check_same_size(input, target, "l1_loss")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    return _reduce(_C.abs(input - target), reduction, "l1_loss")


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """0.5 d^2 / beta where d = |input - target| < beta, d - 0.5 beta elsewhere (the L1 loss
    for beta = 0), reduced."""
    if beta < 0:
        raise _C.Error(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    _check_same_size(input, target, "smooth_l1_loss")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    d = _C.abs(input - target)
    if beta == 0:
        return _reduce(d, reduction, "smooth_l1_loss")
    return _reduce(_C.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), reduction, "smooth_l1_loss")


def huber_loss(input, target, reduction="mean", delta=1.0):
    """0.5 d^2 where d = |input - target| < delta, delta (d - 0.5 delta) elsewhere, reduced."""
    if delta <= 0:
        raise _C.Error(f"huber_loss: delta must be positive, got {delta}")
    _check_same_size(input, target, "huber_loss")
    d = _C.abs(input - target)
    return _reduce(_C.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction, "huber_loss")


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """-input[n, target[n], ...] for log-probabilities input [C], [N, C] or [N, C, d1, ...] and
    int64 class indices target ([], [N] or [N, d1, ...]), as torch's: targets equal to
    ignore_index count for nothing ('mean' averages over the others, NaN when there are none).
    Class weights are not supported. Indices outside [0, C) are not checked."""
    if weight is not None:
        raise _C.Error("nll_loss: class weights (weight=) are not supported")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"nll_loss: {reduction} is not a valid value for reduction")
    if target.dtype is not _C.int64:
        raise _C.Error(f"nll_loss: expected the target to hold int64 class indices, got {target.dtype}")
    if input.dim() == 1:
        if target.dim() != 0:
            raise _C.Error(f"nll_loss: a 1-D input needs a 0-D target, got shape {tuple(target.shape)}")
        input, target = _C.unsqueeze(input, 0), _C.unsqueeze(target, 0)
        squeeze = True
    else:
        squeeze = False
    if input.dim() < 1:
        raise _C.Error("nll_loss: the input needs at least one dim (the classes)")
    expected = tuple(input.shape[:1]) + tuple(input.shape[2:])
    if target.dim() >= 1 and input.shape[0] != target.shape[0]:
        raise ValueError(f"nll_loss: expected input batch_size ({input.shape[0]}) to match target batch_size "
                         f"({target.shape[0]})")
    if tuple(target.shape) != expected:
        raise _C.Error(f"nll_loss: expected a target of shape {expected} for the input of shape "
                       f"{tuple(input.shape)}, got {tuple(target.shape)}")
    keep = target != ignore_index
    # Ignored targets index class 0 (any valid index) and are then zeroed.
    safe = _C.where(keep, target, 0)
    picked = _C.squeeze(_C.gather(input, 1, _C.unsqueeze(safe, 1)), 1)
    loss = _C.where(keep, -picked, 0)
    if squeeze and reduction == "none":
        loss = _C.squeeze(loss, 0)
    if reduction == "none":
        return loss
    total = _C.sum(loss)
    if reduction == "sum":
        return total
    return total / _C.sum(keep).to(input.dtype)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """-(t log(x) + (1 - t) log(1 - x)) for probabilities x, each log clamped at -100 as torch
    clamps it, times weight (broadcast) when given, reduced. Inputs outside [0, 1] are not
    checked (torch raises): they give NaN."""
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(f"binary_cross_entropy: using a target size ({tuple(target.shape)}) that is different to "
                         f"the input size ({tuple(input.shape)}) is deprecated. Please ensure they have the same size.")
    reduction = _legacy_reduction(size_average, reduce, reduction)
    loss = -(target * _C.clamp_min(_C.log(input), -100) + (1 - target) * _C.clamp_min(_C.log(1 - input), -100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction, "binary_cross_entropy")


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """Pointwise KL divergence of log-probabilities input from target: target * (log(target) -
    input), 0 where target is 0 (with log_target, exp(target) * (target - input)), reduced;
    'batchmean' divides the sum by the batch size (dim 0), 'mean' by the element count (with
    PyTorch's warning that this is not the KL divergence's mean)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if log_target:
        loss = _C.exp(target) * (target - input)
    else:
        positive = target > 0
        # log of 1 where the target is 0: those terms are 0 and their gradient must not be NaN.
        loss = _C.where(positive, target * _C.log(_C.where(positive, target, 1)), 0) - target * input
    if reduction == "batchmean":
        total = _C.sum(loss)
        return total / input.shape[0] if input.dim() > 0 else total
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                      "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                      "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                      stacklevel=2)
    return _reduce(loss, reduction, "kl_div")


# ---- padding with modes ----------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _pad_source(n, lo, hi, mode):
    """For each position of a dim of size n padded by (lo, hi): where its value comes from."""
    if mode == "circular":
        # As PyTorch: negative pads crop first, then the rest wraps around what is left.
        start, end = max(-lo, 0), n - max(-hi, 0)
        i = start + np.mod(np.arange(-max(lo, 0), end - start + max(hi, 0)), end - start)
        return i.astype(np.int64)
    i = np.arange(-lo, n + hi)
    if mode == "reflect":
        i = np.abs(i)
        i = np.where(i >= n, 2 * (n - 1) - i, i)
    else:  # replicate
        i = np.clip(i, 0, n - 1)
    return i.astype(np.int64)


def pad(input, pad, mode="constant", value=None):
    """Pads the last len(pad) // 2 dims, pad = (last_low, last_high, second_low, ...), as
    torch.nn.functional.pad: 'constant' (value, default 0; negative pads crop), and 'reflect'
    (mirrored without the edge), 'replicate' (the edge repeated), 'circular' (wrapped; negative
    pads crop first) for 1 to 3 dims of a batched or (reflect, replicate) unbatched input, with
    PyTorch 1.13's limits: reflect pads below the dim's size, circular at most its size. The
    modes gather with a static index (index_select), so gradients sum onto the sources; unlike
    PyTorch they take integer tensors too."""
    pad = [int(v) for v in pad]
    if len(pad) % 2:
        raise _C.Error("Padding length must be divisible by 2")
    if len(pad) // 2 > input.dim():
        raise _C.Error(f"Padding length too large: {len(pad)} values for an input of {input.dim()} dims")
    if mode == "constant":
        return _C.pad(input, pad, 0 if value is None else value)
    if mode not in _PAD_MODES:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if value is not None and value != 0:
        raise _C.Error(f'Padding mode "{mode}" doesn\'t take in value argument')
    k = len(pad) // 2
    if k not in (1, 2, 3) or input.dim() not in (k + 1, k + 2):
        raise NotImplementedError("Only 2D, 3D, 4D, 5D padding with non-constant padding are supported for now")
    if mode == "circular" and input.dim() != k + 2:
        raise _C.Error(f"pad: circular padding of {k} dims expects a {k + 2}-D input (batch and channel dims first), "
                       f"got shape {tuple(input.shape)}")
    x = input
    for j in range(k):
        lo, hi = pad[2 * j], pad[2 * j + 1]
        d = input.dim() - 1 - j
        n = x.shape[d]
        if mode == "reflect" and (lo >= n or hi >= n):
            raise _C.Error(f"Argument #4: Padding size should be less than the corresponding input dimension, but "
                           f"got: padding ({lo}, {hi}) at dimension {d} of input {list(input.shape)}")
        if mode == "circular" and (lo > n or hi > n):
            raise _C.Error("Padding value causes wrapping around more than once.")
        if n == 0 or n + lo + hi <= 0 or n + min(lo, 0) + min(hi, 0) <= 0:
            raise _C.Error(f"pad: {mode} padding ({lo}, {hi}) of dim {d} (size {n}) of input {list(input.shape)} "
                           "leaves no values")
        if lo or hi:
            x = _C.index_select(x, d, tensor(_pad_source(n, lo, hi, mode)))
    return x


# ---- convolutions ----------------------------------------------------------------------------

def _ntuple(v, n, call, what):
    if isinstance(v, (list, tuple)):
        if len(v) != n:
            raise _C.Error(f"{call}: {what} expects one value or {n}, got {tuple(v)}")
        return tuple(int(e) for e in v)
    return (int(v),) * n


def _batched(input, spatial, call):
    """(input with a batch dim, whether one was added): [N, C, *spatial] or [C, *spatial]."""
    if input.dim() == spatial + 2:
        return input, False
    if input.dim() == spatial + 1:
        return _C.unsqueeze(input, 0), True
    raise _C.Error(f"{call}: expected a {spatial + 1}-D (unbatched) or {spatial + 2}-D (batched) input, got shape "
                   f"{tuple(input.shape)}")


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution of [N, C, L] (or [C, L]) by weight [O, C / groups, K], as conv2d over a
    height of 1. padding: an int, 'valid' (none) or 'same' (stride 1; an odd total pads one
    more on the right, as PyTorch)."""
    if weight.dim() != 3:
        raise _C.Error(f"conv1d: expected a 3-D weight [out_channels, in_channels / groups, kernel], got shape "
                       f"{tuple(weight.shape)}")
    x, unbatched = _batched(input, 1, "conv1d")
    (s,), (d,) = _ntuple(stride, 1, "conv1d", "stride"), _ntuple(dilation, 1, "conv1d", "dilation")
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise ValueError(f"conv1d: invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
        if padding == "same" and s != 1:
            raise ValueError("conv1d: padding='same' is not supported for strided convolutions")
        p = padding  # conv2d's: the inserted dim of size 1 takes none
    else:
        p = [0, _ntuple(padding, 1, "conv1d", "padding")[0]]
    y = _C.conv2d(_C.unsqueeze(x, 2), _C.unsqueeze(weight, 2), bias, [1, s], p, [1, d], groups)
    y = _C.squeeze(y, 2)
    return _C.squeeze(y, 0) if unbatched else y


def _spread(x, d, s):
    """x with s - 1 zeros between neighbours along dim d (size (n - 1) * s + 1)."""
    n = x.shape[d]
    if s == 1 or n == 0:
        return x
    y = _C.unsqueeze(x, d + 1)
    widths = [0] * (2 * (y.dim() - d - 1))
    widths[-1] = s - 1  # the high side of dim d + 1
    y = _C.pad(y, widths)
    shape = tuple(x.shape)
    y = _C.reshape(y, shape[:d] + (n * s,) + shape[d + 1:])
    return _C.narrow(y, d, 0, (n - 1) * s + 1)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The transposed 2-D convolution (the gradient of conv2d with respect to its input) of
    [N, C_in, H, W] (or [C_in, H, W]) by weight [C_in, C_out / groups, kH, kW]: output size
    (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1. lazyrt's
    conv2d_backward_input op is not bound in Python, so this is a composition: stride - 1
    zeros between the input's values, padded by dilation * (k - 1) - padding (cropped where
    negative), convolved (stride 1) with the flipped, channel-transposed weight. That does
    stride^2 times the multiply-adds of the direct form."""
    call = "conv_transpose2d"
    if weight.dim() != 4:
        raise _C.Error(f"{call}: expected a 4-D weight [in_channels, out_channels / groups, kH, kW], got shape "
                       f"{tuple(weight.shape)}")
    x, unbatched = _batched(input, 2, call)
    cin = x.shape[1]
    if weight.shape[0] != cin:
        raise _C.Error(f"{call}: the weight of shape {tuple(weight.shape)} expects {weight.shape[0]} input channels, "
                       f"got input of shape {tuple(input.shape)}")
    if groups <= 0 or cin % groups:
        raise _C.Error(f"{call}: {cin} input channels are not divisible by groups={groups}")
    s, p = _ntuple(stride, 2, call, "stride"), _ntuple(padding, 2, call, "padding")
    op, dl = _ntuple(output_padding, 2, call, "output_padding"), _ntuple(dilation, 2, call, "dilation")
    if any(v <= 0 for v in s + dl) or any(v < 0 for v in p + op):
        raise _C.Error(f"{call}: stride and dilation must be positive, padding and output_padding non-negative, "
                       f"got stride={s}, padding={p}, output_padding={op}, dilation={dl}")
    for i in range(2):
        if op[i] >= s[i] and op[i] >= dl[i]:
            raise _C.Error(f"{call}: output padding must be smaller than either stride or dilation, but got "
                           f"output_padding={op}, stride={s}, dilation={dl}")
    kh, kw = weight.shape[2], weight.shape[3]
    x = _spread(_spread(x, 2, s[0]), 3, s[1])
    lo_h, lo_w = dl[0] * (kh - 1) - p[0], dl[1] * (kw - 1) - p[1]
    x = _C.pad(x, [lo_w, lo_w + op[1], lo_h, lo_h + op[0]])
    cout_g = weight.shape[1]
    w = _C.reshape(weight, (groups, cin // groups, cout_g, kh, kw))
    w = _C.reshape(_C.transpose(w, 1, 2), (groups * cout_g, cin // groups, kh, kw))
    y = _C.conv2d(x, _C.flip(w, [2, 3]), bias, 1, 0, list(dl), groups)
    return _C.squeeze(y, 0) if unbatched else y


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """The transposed 1-D convolution of [N, C_in, L] (or [C_in, L]) by weight
    [C_in, C_out / groups, K]: conv_transpose2d over a height of 1."""
    call = "conv_transpose1d"
    if weight.dim() != 3:
        raise _C.Error(f"{call}: expected a 3-D weight [in_channels, out_channels / groups, kernel], got shape "
                       f"{tuple(weight.shape)}")
    x, unbatched = _batched(input, 1, call)
    (s,), (p,) = _ntuple(stride, 1, call, "stride"), _ntuple(padding, 1, call, "padding")
    (op,), (d,) = _ntuple(output_padding, 1, call, "output_padding"), _ntuple(dilation, 1, call, "dilation")
    y = conv_transpose2d(_C.unsqueeze(x, 2), _C.unsqueeze(weight, 2), bias, (1, s), (0, p), (0, op), groups, (1, d))
    y = _C.squeeze(y, 2)
    return _C.squeeze(y, 0) if unbatched else y


# ---- rearranging pixels and sliding blocks ---------------------------------------------------

def pixel_shuffle(input, upscale_factor):
    """[*, C * r^2, H, W] -> [*, C, H * r, W * r] (r = upscale_factor)."""
    r = int(upscale_factor)
    if input.dim() < 3:
        raise _C.Error(f"pixel_shuffle expects input to have at least 3 dimensions, but got input with {input.dim()} "
                       "dimension(s)")
    if r <= 0:
        raise _C.Error(f"pixel_shuffle expects a positive upscale_factor, but got {r}")
    *batch, c, h, w = input.shape
    if c % (r * r):
        raise _C.Error(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of "
                       f"upscale_factor, but input.size(-3)={c} is not divisible by {r * r}")
    b = len(batch)
    x = _C.reshape(input, tuple(batch) + (c // (r * r), r, r, h, w))
    x = _C.permute(x, list(range(b)) + [b, b + 3, b + 1, b + 4, b + 2])
    return _C.reshape(x, tuple(batch) + (c // (r * r), h * r, w * r))


def pixel_unshuffle(input, downscale_factor):
    """[*, C, H * r, W * r] -> [*, C * r^2, H, W] (r = downscale_factor): pixel_shuffle undone."""
    r = int(downscale_factor)
    if input.dim() < 3:
        raise _C.Error(f"pixel_unshuffle expects input to have at least 3 dimensions, but got input with "
                       f"{input.dim()} dimension(s)")
    if r <= 0:
        raise _C.Error(f"pixel_unshuffle expects a positive downscale_factor, but got {r}")
    *batch, c, h, w = input.shape
    for name, size, at in (("height", h, -2), ("width", w, -1)):
        if size % r:
            raise _C.Error(f"pixel_unshuffle expects {name} to be divisible by downscale_factor, but "
                           f"input.size({at})={size} is not divisible by {r}")
    b = len(batch)
    x = _C.reshape(input, tuple(batch) + (c, h // r, r, w // r, r))
    x = _C.permute(x, list(range(b)) + [b, b + 2, b + 4, b + 1, b + 3])
    return _C.reshape(x, tuple(batch) + (c * r * r, h // r, w // r))


def _blocks(size, kernel, dilation, padding, stride, call):
    """The sliding blocks over a plane of `size` padded by `padding`: (positions, blocks, padded)
    with positions[k, l] the flat position in the padded plane of kernel element k of block l."""
    k, d = _ntuple(kernel, 2, call, "kernel_size"), _ntuple(dilation, 2, call, "dilation")
    p, s = _ntuple(padding, 2, call, "padding"), _ntuple(stride, 2, call, "stride")
    if any(v <= 0 for v in k + d + s) or any(v < 0 for v in p):
        raise _C.Error(f"{call}: kernel_size, dilation and stride must be positive and padding non-negative, got "
                       f"kernel_size={k}, dilation={d}, padding={p}, stride={s}")
    padded = tuple(size[i] + 2 * p[i] for i in range(2))
    blocks = tuple((padded[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    if any(b <= 0 for b in blocks):
        raise _C.Error(f"{call}: the {size[0]}x{size[1]} input padded by {p} holds no {k} block with dilation {d}: "
                       f"the calculated shape of the array of sliding blocks is {blocks[0]}x{blocks[1]}")
    ki = (np.arange(k[0]) * d[0])[:, None, None, None] + (np.arange(blocks[0]) * s[0])[None, None, :, None]
    kj = (np.arange(k[1]) * d[1])[None, :, None, None] + (np.arange(blocks[1]) * s[1])[None, None, None, :]
    positions = (ki * padded[1] + kj).reshape(k[0] * k[1], blocks[0] * blocks[1])
    return positions.astype(np.int64), blocks, padded, k, p


def unfold(input, kernel_size, dilation=1, padding=0, stride=1):
    """im2col: the sliding kernel_size blocks of [N, C, H, W] (or [C, H, W]) as columns,
    [N, C * kH * kW, L] (L blocks, row-major; rows channel-major then kernel row, column). One
    index_select with a static index over the zero-padded plane; gradients sum over overlaps."""
    x, unbatched = _batched(input, 2, "unfold")
    n, c, h, w = x.shape
    positions, blocks, padded, k, p = _blocks((h, w), kernel_size, dilation, padding, stride, "unfold")
    x = _C.reshape(_C.pad(x, [p[1], p[1], p[0], p[0]]), (n, c, padded[0] * padded[1]))
    cols = _C.index_select(x, 2, tensor(positions.reshape(-1)))
    out = _C.reshape(cols, (n, c * k[0] * k[1], blocks[0] * blocks[1]))
    return _C.squeeze(out, 0) if unbatched else out


def fold(input, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """col2im, unfold's adjoint: columns [N, C * kH * kW, L] (or [C * kH * kW, L]) summed into
    [N, C, *output_size] where their blocks lie (index_add over the padded plane, then the
    padding cropped)."""
    if input.dim() not in (2, 3):
        raise _C.Error(f"fold: expected a 2-D (unbatched) or 3-D (batched) input, got shape {tuple(input.shape)}")
    x, unbatched = (_C.unsqueeze(input, 0), True) if input.dim() == 2 else (input, False)
    size = _ntuple(output_size, 2, "fold", "output_size")
    positions, blocks, padded, k, p = _blocks(size, kernel_size, dilation, padding, stride, "fold")
    n, rows, length = x.shape
    if rows % (k[0] * k[1]):
        raise _C.Error(f"Expected size of input's dimension 1 to be divisible by the product of kernel_size, but got "
                       f"input.size(1)={rows} and kernel_size={k}")
    if length != blocks[0] * blocks[1]:
        raise _C.Error(f"Given output_size={size}, kernel_size={k}, padding={p}: expected size of input's dimension 2 "
                       f"to match the calculated number of sliding blocks {blocks[0]} * {blocks[1]} = "
                       f"{blocks[0] * blocks[1]}, but got input.size(2)={length}.")
    c = rows // (k[0] * k[1])
    plane = _C.zeros((n, c, padded[0] * padded[1]), dtype=x.dtype)
    plane = _C.index_add(plane, 2, tensor(positions.reshape(-1)), _C.reshape(x, (n, c, rows // c * length)))
    out = _C.reshape(plane, (n, c) + padded)
    out = _C.narrow(_C.narrow(out, 2, p[0], size[0]), 3, p[1], size[1])
    return _C.squeeze(out, 0) if unbatched else out


# ---- instance normalization and more pooling ---------------------------------------------------

def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """Normalizes each channel of each sample of [N, C, *] over its own values (biased variance),
    then weight * x + bias per channel. With use_input_stats=False the running statistics
    normalize instead; with it and running statistics, they are updated in place with the
    mean over the batch of the instances' means and unbiased variances (momentum), as torch."""
    if input.dim() < 2:
        raise _C.Error(f"instance_norm: expected an input of at least 2 dims [N, C, *], got shape {tuple(input.shape)}")
    spatial = 1
    for v in input.shape[2:]:
        spatial *= v
    if use_input_stats and spatial <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size {list(input.shape)}")
    c = input.shape[1]
    per_channel = (c,) + (1,) * (input.dim() - 2)
    dims = list(range(2, input.dim()))
    if use_input_stats:
        mean = _C.mean(input, dims, True)
        var = _C.var(input, dims, correction=0, keepdim=True)
        if running_mean is not None or running_var is not None:
            with no_grad():
                m, v = mean.detach(), var.detach()
                if running_mean is not None:
                    batch = _C.cast(_C.mean(_C.reshape(m, tuple(m.shape[:2])), 0), running_mean.dtype)
                    running_mean.copy_(running_mean * (1 - momentum) + batch * momentum)
                if running_var is not None:
                    unbiased = _C.reshape(v, tuple(v.shape[:2])) * (spatial / (spatial - 1))
                    batch = _C.cast(_C.mean(unbiased, 0), running_var.dtype)
                    running_var.copy_(running_var * (1 - momentum) + batch * momentum)
    else:
        if running_mean is None or running_var is None:
            raise _C.Error("instance_norm: use_input_stats=False needs running_mean and running_var")
        mean = _C.reshape(running_mean, per_channel)
        var = _C.reshape(running_var, per_channel)
    y = (input - mean) * _C.rsqrt(var + eps)
    if weight is not None:
        y = y * _C.reshape(weight, per_channel)
    if bias is not None:
        y = y + _C.reshape(bias, per_channel)
    return y


def _single(v, call):
    if isinstance(v, (list, tuple)):
        if len(v) != 1:
            raise _C.Error(f"{call}: output_size must be one value, got {tuple(v)}")
        v = v[0]
    return v


def _check_pool_input(input, dims, call):
    if input.dim() not in dims:
        raise _C.Error(f"{call}(): Expected {dims[0]}D or {dims[1]}D tensor, but got: {list(input.shape)}")


def adaptive_avg_pool1d(input, output_size):
    """Averages [N, C, L] (or [C, L]) into output_size bins, with torch's bin edges."""
    _check_pool_input(input, (2, 3), "adaptive_avg_pool1d")
    out = _single(output_size, "adaptive_avg_pool1d")
    return _C.squeeze(_C._nn.adaptive_avg_pool2d(_C.unsqueeze(input, -2), [1, out]), -2)


def _bin_sources(n, out):
    """The positions read by each of `out` adaptive bins over n values, [out, widest], each bin
    padded by repeating its last position; PyTorch's bins: floor(i n / out) to
    ceil((i + 1) n / out)."""
    starts = [(i * n) // out for i in range(out)]
    ends = [-((-(i + 1) * n) // out) for i in range(out)]
    width = max(e - s for s, e in zip(starts, ends))
    return np.array([[min(s + j, e - 1) for j in range(width)] for s, e in zip(starts, ends)], dtype=np.int64)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """The maximum of each of output_size adaptive bins (PyTorch's edges) of [N, C, H, W] (or
    [C, H, W]); output_size an int or a pair (None keeps a dim). With return_indices, also
    where each maximum is, as h * W + w (int64): the first maximum of the bin in row-major
    order, or its last NaN, as PyTorch. The gradient reaches that element."""
    _check_pool_input(input, (3, 4), "adaptive_max_pool2d")
    x, unbatched = _batched(input, 2, "adaptive_max_pool2d")
    n, c, h, w = x.shape
    oh, ow = _pair(output_size, "adaptive_max_pool2d")
    oh, ow = h if oh is None else int(oh), w if ow is None else int(ow)
    if oh <= 0 or ow <= 0 or h == 0 or w == 0:
        raise _C.Error(f"adaptive_max_pool2d: cannot pool an input of shape {tuple(input.shape)} to ({oh}, {ow})")
    rows, cols = _bin_sources(h, oh), _bin_sources(w, ow)
    kh, kw = rows.shape[1], cols.shape[1]
    # Flat positions of every bin's cells: [oh, ow, kh * kw].
    flat = (rows[:, None, :, None] * w + cols[None, :, None, :]).reshape(oh, ow, kh * kw)
    where = tensor(flat)
    cells = _C.index_select(_C.reshape(x, (n, c, h * w)), 2, tensor(flat.reshape(-1)))
    cells = _C.reshape(cells, (n, c, oh, ow, kh * kw)).detach()
    first = _C.argmax(_C.where(_C.isnan(cells), -math.inf, cells) if cells.is_floating_point() else cells, -1, True)
    if cells.is_floating_point():
        nan = _C.isnan(cells)
        last_nan = (kh * kw - 1) - _C.argmax(_C.cast(_C.flip(nan, [-1]), _C.int32), -1, True)
        first = _C.where(_C.any(nan, -1, True), last_nan, first)
    index = _C.squeeze(_C.gather(_C.broadcast_to(where, (n, c, oh, ow, kh * kw)), -1, first), -1)
    values = _C.reshape(_C.gather(_C.reshape(x, (n, c, h * w)), 2, _C.reshape(index, (n, c, oh * ow))),
                        (n, c, oh, ow))
    if unbatched:
        values, index = _C.squeeze(values, 0), _C.squeeze(index, 0)
    return (values, index) if return_indices else values


def adaptive_max_pool1d(input, output_size, return_indices=False):
    """adaptive_max_pool2d over [N, C, L] (or [C, L]): indices are positions along L."""
    _check_pool_input(input, (2, 3), "adaptive_max_pool1d")
    out = adaptive_max_pool2d(_C.unsqueeze(input, -2), (1, _single(output_size, "adaptive_max_pool1d")), True)
    values, index = _C.squeeze(out[0], -2), _C.squeeze(out[1], -2)
    return (values, index) if return_indices else values


# ---- bags of embeddings --------------------------------------------------------------------------

def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False, mode="mean",
                  sparse=False, per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """Sums, means or maxima of bags of rows of weight: input [B, L] (B bags of L indices) or
    1-D with offsets (bag i from offsets[i] to offsets[i + 1], the last to the end, or with
    include_last_offset offsets holds B + 1 bounds). per_sample_weights scale the rows (mode
    'sum' only); indices equal to padding_idx count for nothing; an empty bag gives zeros.
    Bags are found from the offsets lazily (no host read): offsets must be sorted from 0, which
    is not checked. 'max' compares every bag with every index: O(B * len(input) * D) memory.
    max_norm and scale_grad_by_freq are not supported; sparse is ignored."""
    call = "embedding_bag"
    if max_norm is not None or scale_grad_by_freq:
        raise _C.Error(f"{call}: max_norm and scale_grad_by_freq are not supported")
    if mode not in ("sum", "mean", "max"):
        raise ValueError(f"{call}: mode has to be one of sum, mean or max, got {mode!r}")
    if weight.dim() != 2:
        raise _C.Error(f"{call}: weight has to be a 2D Tensor, but got Tensor of dimension {weight.dim()}")
    if input.dtype not in (_C.int32, _C.int64):
        raise _C.Error(f"{call}: expected indices of int32 or int64, got {input.dtype}")
    if per_sample_weights is not None:
        if mode != "sum":
            raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. per_sample_weights is only "
                                      f"supported for mode='sum' (got mode='{mode}'). Please open a feature request "
                                      "on GitHub.")
        if tuple(per_sample_weights.shape) != tuple(input.shape):
            raise ValueError(f"{call}: embedding_bag: If per_sample_weights ({tuple(per_sample_weights.shape)}) is "
                             f"not None, then it must have the same shape as the input ({tuple(input.shape)})")
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError(f"{call}: if input is 2D, then offsets has to be None, as input is treated is a "
                             "mini-batch of fixed length sequences.")
        bags, length = input.shape
        flat = _C.reshape(input, (-1,))
        bag_of = _C.reshape(_C.expand(_C.unsqueeze(_C._arange(bags, _C.int64), 1), (bags, length)), (-1,))
        if per_sample_weights is not None:
            per_sample_weights = _C.reshape(per_sample_weights, (-1,))
    elif input.dim() == 1:
        if offsets is None:
            raise ValueError(f"{call}: offsets has to be a 1D Tensor but got None")
        if offsets.dim() != 1:
            raise ValueError(f"{call}: offsets has to be a 1D Tensor, got shape {tuple(offsets.shape)}")
        bags = offsets.shape[0] - (1 if include_last_offset else 0)
        if bags < 0:
            raise ValueError(f"{call}: include_last_offset needs at least one offset")
        flat = input
        j = _C.unsqueeze(_C._arange(input.shape[0], _C.int64), 1)
        bag_of = _C.sum(_C.unsqueeze(_C.cast(offsets, _C.int64), 0) <= j, 1) - 1  # past the last bound: `bags`
    else:
        raise ValueError(f"{call}: input has to be 1D or 2D Tensor, but got Tensor of dimension {input.dim()}")
    total, dim = flat.shape[0], weight.shape[1]
    counted = _C.ones((total,), dtype=_C.bool)
    if padding_idx is not None:
        counted = _C.ne(flat, padding_idx % weight.shape[0] if padding_idx < 0 else padding_idx)
    rows = _C.embedding(flat, weight)                                     # [total, D]
    if mode == "max":
        member = (_C.unsqueeze(bag_of, 0) == _C.unsqueeze(_C._arange(bags, _C.int64), 1)) & _C.unsqueeze(counted, 0)
        cand = _C.where(_C.unsqueeze(member, 2), _C.unsqueeze(rows.detach(), 0), -math.inf)   # [B, total, D]
        best = _C.argmax(cand, 1)                                                           # [B, D] first max
        values = _C.gather(rows, 0, best)
        return _C.where(_C.any(member, 1, True), values, 0.0)
    if per_sample_weights is not None:
        rows = rows * _C.unsqueeze(per_sample_weights, 1)
    rows = _C.where(_C.unsqueeze(counted, 1), rows, 0.0)
    # Entries past the last bound (include_last_offset) land in an extra bag, dropped.
    sums = _C.narrow(_C.index_add(_C.zeros((bags + 1, dim), dtype=rows.dtype), 0, bag_of, rows), 0, 0, bags)
    if mode == "sum":
        return sums
    counts = _C.narrow(_C.index_add(_C.zeros((bags + 1,), dtype=rows.dtype), 0, bag_of,
                                    _C.cast(counted, rows.dtype)), 0, 0, bags)
    return sums / _C.unsqueeze(_C.clamp_min(counts, 1), 1)
