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
