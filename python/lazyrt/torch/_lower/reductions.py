"""Reductions, scans, sorting and matrix products."""

import math

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import UnsupportedOperatorError, _cast, _reduce_dims, lowering

aten = torch.ops.aten


# ---- scans, reductions and sorting -------------------------------------------------------------

@lowering(aten.cumsum.default)
def _cumsum(e, x, dim, dtype=None):
    return _C.cumsum(_cast(x, e.dtype), dim)


@lowering(aten.cumprod.default)
def _cumprod(e, x, dim, dtype=None):
    return _C.cumprod(_cast(x, e.dtype), dim)


@lowering(aten.prod.default)
def _prod(e, x, dtype=None):
    return _C.prod(_cast(x, e.dtype))


@lowering(aten.prod.dim_int)
def _prod_dim(e, x, dim, keepdim=False, dtype=None):
    return _C.prod(_cast(x, e.dtype), dim, keepdim)


@lowering(aten.logsumexp.default)
def _logsumexp(e, x, dim, keepdim=False):
    return _C.logsumexp(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.std.correction)
def _std(e, x, dim=None, correction=None, keepdim=False):
    return _C.std(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim=keepdim,
                  correction=1 if correction is None else correction)


@lowering(aten.sort.default, aten.sort.stable)
def _sort(e, x, *args, **kwargs):
    # sort.default(x, dim=-1, descending=False); sort.stable(x, *, stable, dim=-1, descending=False).
    # lazyrt's order is stable, as PyTorch's CPU sort gives it.
    dim = kwargs.get("dim", args[0] if args else -1)
    descending = kwargs.get("descending", args[1] if len(args) > 1 else False)
    values, indices = lazyrt.sort(x, dim, descending, stable=True)
    return [values, indices]


@lowering(aten.topk.default)
def _topk(e, x, k, dim=-1, largest=True, sorted=True):
    # Ties may come in another order than PyTorch's, which leaves theirs unspecified.
    values, indices = lazyrt.topk(x, k, dim, largest, sorted)
    return [values, indices]


# ---- linear algebra, reductions ---------------------------------------------------------------

@lowering(aten.mm.default)
def _mm(e, a, b):
    return _C.mm(_cast(a, e.dtype), _cast(b, e.dtype))


@lowering(aten.bmm.default)
def _bmm(e, a, b):
    return _C.bmm(_cast(a, e.dtype), _cast(b, e.dtype))


@lowering(aten.addmm.default)
def _addmm(e, bias, a, b, beta=1, alpha=1):
    return _C.addmm(_cast(bias, e.dtype), _cast(a, e.dtype), _cast(b, e.dtype), beta=beta, alpha=alpha)


@lowering(aten.baddbmm.default)
def _baddbmm(e, bias, a, b, beta=1, alpha=1):
    # Attention scores with an additive mask (multi_head_attention_forward's attn_mask).
    return _C.baddbmm(_cast(bias, e.dtype), _cast(a, e.dtype), _cast(b, e.dtype), beta=beta, alpha=alpha)


@lowering(aten.sum.default, aten.sum.dim_IntList)
def _sum(e, x, dim=None, keepdim=False, dtype=None):
    return _C.sum(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.mean.default, aten.mean.dim)
def _mean(e, x, dim=None, keepdim=False, dtype=None):
    return _C.mean(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.amax.default)
def _amax(e, x, dim=(), keepdim=False):
    return _C.amax(x, _reduce_dims(dim, x.dim()), keepdim)


@lowering(aten.amin.default)
def _amin(e, x, dim=(), keepdim=False):
    return _C.amin(x, _reduce_dims(dim, x.dim()), keepdim)


def _norm(x, p, dim, keepdim):
    dims = _reduce_dims(dim, x.dim())
    if p is None or p == 2:
        return _C.sqrt(_C.sum(_C.mul(x, x), dims, keepdim))
    if p == math.inf:
        return _C.amax(_C.abs(x), dims, keepdim)
    if p == 1:
        return _C.sum(_C.abs(x), dims, keepdim)
    if p == 0 or p == -math.inf:
        raise UnsupportedOperatorError(f"lazyrt.torch: norm with p={p}")
    return _C.pow(_C.sum(_C.pow(_C.abs(x), float(p)), dims, keepdim), 1.0 / p)


@lowering(aten.norm.ScalarOpt_dim, aten.norm.Scalar, aten.norm.ScalarOpt_dim_dtype)
def _norm_op(e, x, p=2, dim=None, keepdim=False, dtype=None):
    return _norm(_cast(x, e.dtype), p, dim, keepdim)


@lowering(aten.linalg_vector_norm.default)
def _vector_norm(e, x, ord=2, dim=None, keepdim=False, dtype=None):
    return _norm(_cast(x, e.dtype), ord, dim, keepdim)


@lowering(aten.max.default)
def _max_all(e, x):
    return _C.amax(x, list(range(x.dim())), False)


@lowering(aten.min.default)
def _min_all(e, x):
    return _C.amin(x, list(range(x.dim())), False)


@lowering(aten.argmax.default)
def _argmax(e, x, dim=None, keepdim=False):
    return _C.argmax(x, dim, keepdim)


@lowering(aten.argmin.default)
def _argmin(e, x, dim=None, keepdim=False):
    return _C.argmin(x, dim, keepdim)


@lowering(aten.var.correction)
def _var(e, x, dim=None, correction=None, keepdim=False):
    return lazyrt.var(_cast(x, e.dtype), _reduce_dims(dim, x.dim()), correction=1 if correction is None else correction,
                      keepdim=keepdim)


@lowering(aten.var_mean.correction)
def _var_mean(e, x, dim=None, correction=None, keepdim=False):
    x, dims = _cast(x, e.dtype), _reduce_dims(dim, x.dim())
    return [lazyrt.var(x, dims, correction=1 if correction is None else correction, keepdim=keepdim),
            _C.mean(x, dims, keepdim)]
