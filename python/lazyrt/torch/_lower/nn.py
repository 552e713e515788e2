"""nn layers other than norms: padding and resizing, convolution and pooling, embeddings."""

import torch
import torch.fx

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import UnsupportedOperatorError, _cast, _full, _vjp, lowering, refusal

aten = torch.ops.aten


# ---- padding and resizing: forward by lazyrt.nn.functional, backward its vector-Jacobian product

@lowering(aten.constant_pad_nd.default)
def _constant_pad_nd(e, x, pad, value=0):
    return lazyrt.nn.functional.pad(x, list(pad), mode="constant", value=value)


def _pad_mode(mode):
    def forward(e, x, padding):
        return lazyrt.nn.functional.pad(x, list(padding), mode=mode)

    def backward(e, grad, x, padding):
        return _vjp(lambda t: lazyrt.nn.functional.pad(t, list(padding), mode=mode), [x], grad, [True])[0]
    return forward, backward


for _n, _mode in ((1, "reflect"), (2, "reflect"), (1, "replicate"), (2, "replicate")):
    _fw, _bw = _pad_mode(_mode)
    _name = {"reflect": "reflection", "replicate": "replication"}[_mode]
    lowering(getattr(aten, f"{_name}_pad{_n}d").default)(_fw)
    lowering(getattr(aten, f"{_name}_pad{_n}d_backward").default)(_bw)
del _n, _mode, _fw, _bw, _name


def _bilinear(size, scale_factors, align_corners):
    # With scale factors torch maps coordinates by them (not by the sizes' ratio): so does lazyrt.
    if scale_factors:
        return lambda t: lazyrt.nn.functional.interpolate(t, scale_factor=list(scale_factors), mode="bilinear",
                                                          align_corners=align_corners)
    return lambda t: lazyrt.nn.functional.interpolate(t, size=list(size), mode="bilinear", align_corners=align_corners)


@lowering(aten.upsample_bilinear2d.vec)
def _upsample_bilinear2d_vec(e, x, output_size, align_corners, scale_factors):
    return _bilinear(output_size, scale_factors, align_corners)(x)


def _scales(scales_h, scales_w):
    return None if scales_h is None or scales_w is None else [scales_h, scales_w]


@lowering(aten.upsample_bilinear2d.default)
def _upsample_bilinear2d(e, x, output_size, align_corners, scales_h=None, scales_w=None):
    return _bilinear(output_size, _scales(scales_h, scales_w), align_corners)(x)


@lowering(aten.upsample_bilinear2d_backward.default)
def _upsample_bilinear2d_backward(e, grad, output_size, input_size, align_corners, scales_h=None, scales_w=None):
    x = _C.zeros(tuple(input_size), dtype=grad.dtype)  # the map is linear: any input stands in
    return _vjp(_bilinear(output_size, _scales(scales_h, scales_w), align_corners), [x], grad, [True])[0]


def _nearest(size, scale_factors):
    if scale_factors:
        return lambda t: lazyrt.nn.functional.interpolate(t, scale_factor=list(scale_factors), mode="nearest")
    return lambda t: lazyrt.nn.functional.interpolate(t, size=list(size), mode="nearest")


@lowering(aten.upsample_nearest2d.vec)
def _upsample_nearest2d_vec(e, x, output_size, scale_factors):
    return _nearest(output_size, scale_factors)(x)


@lowering(aten.upsample_nearest2d.default)
def _upsample_nearest2d(e, x, output_size, scales_h=None, scales_w=None):
    return _nearest(output_size, _scales(scales_h, scales_w))(x)


@lowering(aten.upsample_nearest2d_backward.default)
def _upsample_nearest2d_backward(e, grad, output_size, input_size, scales_h=None, scales_w=None):
    x = _C.zeros(tuple(input_size), dtype=grad.dtype)  # the map is linear: any input stands in
    return _vjp(_nearest(output_size, _scales(scales_h, scales_w)), [x], grad, [True])[0]


# ---- convolution and pooling -------------------------------------------------------------------
# Forward ops map to lazyrt's; most backward ops are the vector-Jacobian product of that
# forward by lazyrt's own autograd (`_vjp`: the recomputed forward is the same graph, which
# CSE merges with the forward's), so the gradients are lazyrt's gradient rules. 1-d
# convolutions are 2-d ones over a unit height; a transposed convolution, forward and
# backward, is made of the direct one's (see `_Conv`). max_pool2d's backward scatters through
# the indices, as torch's does.

def _autograd_records():
    """Whether lazyrt's autograd records here: not while a loop body is traced (a loop's
    gradient is taken of its whole body)."""
    with lazyrt.enable_grad():
        return _C.neg(_C.zeros((), dtype=_C.float32).requires_grad_()).requires_grad


def _pair(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _single(v):
    return v[0] if isinstance(v, (list, tuple)) else v


@refusal(aten.convolution.default, aten.convolution_backward.default)
def _conv_refusal(node):
    """Why a convolution node is not lowered (None when it is): its input has neither 1 nor 2
    spatial dims."""
    x = node.args[0] if node.target is aten.convolution.default else node.args[1]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dim() not in (3, 4):
        return f"a {val.dim() - 2}-d convolution; lazyrt lowers 1-d and 2-d ones"
    return None


class _Conv:
    """aten.convolution's attributes, for computing a 1-d or 2-d convolution as a 2-d one: a
    1-d convolution's tensors ([N, C, L] input, [O, C / groups, K] weight, their gradients)
    gain a unit height dim (`lift`) and lose it again (`drop`).

    `direct(a, w)` is lazyrt's conv2d. A transposed convolution is the vector-Jacobian product
    of the direct one with respect to its input (`transposed`): lazyrt's input-gradient kernel
    of conv2d. Its backward is made of the direct one's too: the input's gradient is the direct
    convolution of the output gradient, the weight's is the direct one's weight gradient at
    input = output gradient and output gradient = the transposed one's input."""

    def __init__(self, x, stride, padding, dilation, output_padding, groups):
        if x.dim() not in (3, 4):
            raise UnsupportedOperatorError(f"lazyrt.torch: convolution of a {x.dim()}-d input: lazyrt lowers 1-d "
                                           "and 2-d convolutions")
        self.one_d = x.dim() == 3
        if self.one_d:
            self.stride, self.padding = (1, _single(stride)), (0, _single(padding))
            self.dilation, self.output_padding = (1, _single(dilation)), (0, _single(output_padding))
        else:
            self.stride, self.padding = _pair(stride), _pair(padding)
            self.dilation, self.output_padding = _pair(dilation), _pair(output_padding)
        self.groups = groups

    def lift(self, t):
        return _C.unsqueeze(t, 2) if self.one_d else t

    def drop(self, t):
        return _C.squeeze(t, 2) if self.one_d and t is not None else t

    def lift_shape(self, shape):
        return tuple(shape[:2]) + (1,) + tuple(shape[2:]) if self.one_d else tuple(shape)

    def direct(self, a, w, bias=None):
        return lazyrt.nn.functional.conv2d(a, w, bias, self.stride, self.padding, self.dilation, self.groups)

    def cotangent(self, x, w, shape):
        """x (a transposed convolution's input) zero-padded at the bottom and right to the size
        of the direct convolution's output for an input of `shape`: larger than x where
        output_padding >= stride (allowed when the dilation is larger still), and those last rows
        and columns reach no output."""
        extra = []
        for d in (1, 0):  # pad's order: the last dim first
            n, k = shape[2 + d], w.shape[2 + d]
            s, p, dl = self.stride[d], self.padding[d], self.dilation[d]
            extra += [0, (n + 2 * p - dl * (k - 1) - 1) // s + 1 - x.shape[2 + d]]
        return _C.pad(x, extra) if any(extra) else x

    def transposed(self, x, w, shape):
        """The transposed convolution of x (lifted) to an output of `shape` (lifted)."""
        if not _autograd_records():
            # A loop body: the same map as lazyrt.nn.functional's composition (stride - 1 zeros
            # between the input's values, a stride-1 convolution with the flipped weight: stride^2
            # times the multiply-adds of the input-gradient kernel).
            return lazyrt.nn.functional.conv_transpose2d(x, w, None, self.stride, self.padding, self.output_padding,
                                                         self.groups, self.dilation)
        primal = _full(shape, 0, x.dtype)
        return _vjp(lambda a: self.direct(a, w), [primal], self.cotangent(x, w, shape), [True])[0]


@lowering(aten.convolution.default)
def _convolution(e, x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    c = _Conv(x, stride, padding, dilation, output_padding, groups)
    x, w = c.lift(x), c.lift(w)
    if not transposed:
        return c.drop(c.direct(x, w, bias))
    y = c.transposed(x, w, c.lift_shape(e.shape))
    if bias is not None:
        y = _C.add(y, _C.reshape(bias, (1, -1, 1, 1)))
    return c.drop(y)


@lowering(aten.convolution_backward.default)
def _convolution_backward(e, grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):
    c = _Conv(x, stride, padding, dilation, output_padding, groups)
    grad, x, w = c.lift(grad), c.lift(x), c.lift(w)
    gx = gw = None
    if transposed:
        if output_mask[0]:  # the direct output's last rows and columns (cotangent's padding) dropped
            gx = c.direct(grad, w)[:, :, :x.shape[2], :x.shape[3]]
        if output_mask[1]:
            gw = _vjp(c.direct, [grad, w], c.cotangent(x, w, tuple(grad.shape)), [False, True])[1]
    elif output_mask[0] or output_mask[1]:
        gx, gw = _vjp(c.direct, [x, w], grad, list(output_mask[:2]))
    gb = _C.sum(grad, [0, 2, 3]) if output_mask[2] else None
    return [c.drop(gx), c.drop(gw), gb]


def _pool_window(kernel_size, stride, padding, dilation):
    k = _pair(kernel_size)
    return k, (_pair(stride) if stride else k), _pair(padding), _pair(dilation)


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(e, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    k, s, p, d = _pool_window(kernel_size, stride, padding, dilation)
    return list(lazyrt.nn.functional.max_pool2d(x, k, s, p, d, ceil_mode, return_indices=True))


@lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(e, grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    h, w = x.shape[-2:]
    planes = 1
    for d in x.shape[:-2]:
        planes *= d
    g = _C.reshape(_cast(grad, e.dtype), (planes, -1))
    i = _C.reshape(indices, (planes, -1))
    return _C.reshape(lazyrt.scatter_add(_full((planes, h * w), 0, e.dtype), 1, i, g), e.shape)


@lowering(aten.avg_pool2d.default)
def _avg_pool2d(e, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    k, s, p, _ = _pool_window(kernel_size, stride, padding, 1)
    return lazyrt.nn.functional.avg_pool2d(x, k, s, p, ceil_mode, count_include_pad, divisor_override)


@lowering(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(e, grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _ = _pool_window(kernel_size, stride, padding, 1)
    pool = lambda a: lazyrt.nn.functional.avg_pool2d(a, k, s, p, ceil_mode, count_include_pad, divisor_override)
    return _vjp(pool, [x], grad, [True])[0]


@lowering(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(e, x, output_size):
    return lazyrt.nn.functional.adaptive_avg_pool2d(x, tuple(output_size))


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(e, grad, x):
    size = tuple(grad.shape[-2:])
    return _vjp(lambda a: lazyrt.nn.functional.adaptive_avg_pool2d(a, size), [x], grad, [True])[0]


# ---- embeddings ------------------------------------------------------------------------------

@lowering(aten.embedding.default)
def _embedding(e, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    flat = _C.reshape(indices, (-1,))
    return _C.reshape(_C.index_select(weight, 0, flat), e.shape)


@lowering(aten.embedding_dense_backward.default)
def _embedding_backward(e, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    if scale_grad_by_freq:
        raise UnsupportedOperatorError("lazyrt.torch: embedding_dense_backward with scale_grad_by_freq=True")
    flat = _C.reshape(indices, (-1,))
    rows = _C.reshape(_cast(grad, e.dtype), (-1, e.shape[1]))
    if padding_idx >= 0:
        rows = _C.where(_C.unsqueeze(_C.eq(flat, padding_idx), 1), 0.0, rows)
    return _C.index_add(_full(e.shape, 0, e.dtype), 0, flat, rows)
