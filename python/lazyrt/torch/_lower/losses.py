"""Loss functions and their backward ops: nll_loss (1-d and 2-d), mse, binary cross-entropy,
smooth L1 and Huber, as ATen's CPU kernels compute them."""

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import _cast, lowering

aten = torch.ops.aten


_REDUCTION_NONE, _REDUCTION_MEAN, _REDUCTION_SUM = 0, 1, 2


def _nll_parts(x, target, weight, ignore_index):
    """(log-probability picked per sample, per-sample weight, one-hot of the targets) for [N, C]
    input and [N] targets; ignored samples weigh 0."""
    classes = x.shape[1]
    valid = _C.ne(target, ignore_index)
    safe = _C.where(valid, target, 0)
    hot = _C.eq(_C.unsqueeze(safe, 1), _C.unsqueeze(lazyrt.arange(classes), 0))  # [N, C] bool
    picked = _C.sum(_C.where(hot, x, 0.0), [1])
    if weight is None:
        w = _C.cast(valid, x.dtype)
    else:
        w = _C.where(valid, _C.index_select(_cast(weight, x.dtype), 0, safe), 0.0)
    return picked, w, hot


@lowering(aten.nll_loss_forward.default)
def _nll_loss_forward(e, x, target, weight, reduction, ignore_index):
    batched = x.dim() == 2
    if not batched:  # one sample, no batch dim
        x, target = _C.unsqueeze(x, 0), _C.reshape(target, (1,))
    picked, w, _ = _nll_parts(x, target, weight, ignore_index)
    losses = _C.neg(_C.mul(picked, w))
    total = _C.sum(w)
    if reduction == _REDUCTION_NONE:
        return (losses if batched else _C.reshape(losses, ())), _C.zeros((), dtype=x.dtype)
    out = _C.sum(losses)
    if reduction == _REDUCTION_MEAN:
        out = _C.div(out, total)
    return out, total


@lowering(aten.nll_loss_backward.default)
def _nll_loss_backward(e, grad_out, x, target, weight, reduction, ignore_index, total_weight):
    batched = x.dim() == 2
    if not batched:
        x, target = _C.unsqueeze(x, 0), _C.reshape(target, (1,))
        if reduction == _REDUCTION_NONE:
            grad_out = _C.reshape(grad_out, (1,))
    _, w, hot = _nll_parts(x, target, weight, ignore_index)
    if reduction == _REDUCTION_NONE:
        scale = _C.mul(w, grad_out)
    elif reduction == _REDUCTION_MEAN:
        scale = _C.mul(w, _C.div(grad_out, total_weight))
    else:
        scale = _C.mul(w, grad_out)
    g = _C.where(hot, _C.unsqueeze(_C.neg(scale), 1), 0.0)
    return g if batched else _C.reshape(g, e.shape)


def _classes_last(x):
    """[N, C, *] -> [N * prod(*), C]: the rows nll_loss takes."""
    perm = [0] + list(range(2, x.dim())) + [1]
    return _C.reshape(_C.permute(x, perm), (-1, x.shape[1]))


@lowering(aten.nll_loss2d_forward.default)
def _nll_loss2d_forward(e, x, target, weight, reduction, ignore_index):
    # nll_loss over every position: class scores [N, C, H, W], targets [N, H, W]
    out, total = _nll_loss_forward(None, _classes_last(x), _C.reshape(target, (-1,)), weight, reduction,
                                   ignore_index)
    return [_C.reshape(out, tuple(target.shape)) if reduction == _REDUCTION_NONE else out, total]


@lowering(aten.nll_loss2d_backward.default)
def _nll_loss2d_backward(e, grad_out, x, target, weight, reduction, ignore_index, total_weight):
    if reduction == _REDUCTION_NONE:
        grad_out = _C.reshape(grad_out, (-1,))
    g = _nll_loss_backward(None, grad_out, _classes_last(x), _C.reshape(target, (-1,)), weight, reduction,
                           ignore_index, total_weight)
    n, c = x.shape[0], x.shape[1]
    g = _C.reshape(g, (n,) + tuple(x.shape[2:]) + (c,))
    return _C.permute(g, [0, x.dim() - 1] + list(range(1, x.dim() - 1)))


def _reduce(x, reduction):
    if reduction == _REDUCTION_MEAN:
        return _C.mean(x)
    if reduction == _REDUCTION_SUM:
        return _C.sum(x)
    return x


@lowering(aten.mse_loss.default)
def _mse_loss(e, x, target, reduction=_REDUCTION_MEAN):
    d = _C.sub(_cast(x, e.dtype), _cast(target, e.dtype))
    return _reduce(_C.mul(d, d), reduction)


@lowering(aten.binary_cross_entropy.default)
def _binary_cross_entropy(e, x, target, weight=None, reduction=_REDUCTION_MEAN):
    # (target - 1) * max(log1p(-x), -100) - target * max(log(x), -100), as ATen's kernel
    x, t = _cast(x, e.dtype), _cast(target, e.dtype)
    log_1mx = _C.clamp(_C.log1p(_C.neg(x)), min=-100.0)
    log_x = _C.clamp(_C.log(x), min=-100.0)
    loss = _C.sub(_C.mul(_C.sub(t, 1.0), log_1mx), _C.mul(t, log_x))
    if weight is not None:
        loss = _C.mul(loss, _cast(weight, e.dtype))
    return _reduce(loss, reduction)


@lowering(aten.binary_cross_entropy_backward.default)
def _binary_cross_entropy_backward(e, grad, x, target, weight=None, reduction=_REDUCTION_MEAN):
    # grad * (x - target) / max((1 - x) * x, 1e-12), times the weight, over the count for a mean
    x, t = _cast(x, e.dtype), _cast(target, e.dtype)
    denom = _C.clamp(_C.mul(_C.add(_C.neg(x), 1.0), x), min=1e-12)
    g = _C.div(_C.mul(_cast(grad, e.dtype), _C.sub(x, t)), denom)
    if weight is not None:
        g = _C.mul(g, _cast(weight, e.dtype))
    return _C.div(g, float(max(x.numel(), 1))) if reduction == _REDUCTION_MEAN else g


@lowering(aten.smooth_l1_loss.default)
def _smooth_l1_loss(e, x, target, reduction=_REDUCTION_MEAN, beta=1.0):
    # |d| < beta: d^2 / 2 / beta; else |d| - beta / 2, as ATen's kernel (beta 0: the L1 loss; its
    # backward is PyTorch's decomposition, captured as plain ops)
    z = _C.abs(_C.sub(_cast(x, e.dtype), _cast(target, e.dtype)))
    if beta == 0:
        return _reduce(z, reduction)
    quadratic = _C.div(_C.mul(_C.mul(z, 0.5), z), beta)
    return _reduce(_C.where(_C.lt(z, beta), quadratic, _C.sub(z, 0.5 * beta)), reduction)


@lowering(aten.huber_loss.default)
def _huber_loss(e, x, target, reduction=_REDUCTION_MEAN, delta=1.0):
    # |d| < delta: d^2 / 2; else delta * (|d| - delta / 2), as ATen's kernel (its backward is
    # PyTorch's decomposition, captured as plain ops)
    z = _C.abs(_C.sub(_cast(x, e.dtype), _cast(target, e.dtype)))
    quadratic = _C.mul(_C.mul(z, 0.5), z)
    return _reduce(_C.where(_C.lt(z, delta), quadratic, _C.mul(_C.sub(z, 0.5 * delta), delta)), reduction)


@lowering(aten.mse_loss_backward.default)
def _mse_loss_backward(e, grad_out, x, target, reduction):
    d = _C.sub(_cast(x, e.dtype), _cast(target, e.dtype))
    scale = 2.0 / max(x.numel(), 1) if reduction == _REDUCTION_MEAN else 2.0
    return _C.mul(_C.mul(d, scale), grad_out)
