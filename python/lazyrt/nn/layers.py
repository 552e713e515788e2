"""Layers and losses as lazyrt.nn.Module subclasses, mirroring torch.nn and the C++ nn.h.

Linear draws its initial weights exactly as the C++ nn::Linear does (same seed, same values):
weight, then bias, uniform in [-1/sqrt(in_features), 1/sqrt(in_features)).
"""

import math
from collections import OrderedDict

from lazyrt import _C
from lazyrt.nn import functional as F
from lazyrt.nn.module import Module, Parameter


def _uniform(shape, bound):
    # The C++ layers' expression, op for op: the same graph gives the same numbers.
    return _C.rand(*shape) * (2 * bound) - bound


class Linear(Module):
    """y = x W^T + b."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise _C.Error(f"Linear: features must be positive, got {in_features} and {out_features}")
        self.in_features = in_features
        self.out_features = out_features
        bound = 1.0 / math.sqrt(in_features)
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        if bias:
            self.bias = Parameter(_uniform((out_features,), bound))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Sequential(Module):
    """Its children applied in order; built from modules or an OrderedDict of them."""

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            for i, m in enumerate(modules):
                self.add_module(str(i), m)

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def __getitem__(self, idx):
        mods = list(self._modules.values())
        if isinstance(idx, slice):
            return Sequential(*mods[idx])
        return mods[idx]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class ModuleList(Module):
    """A list of submodules, registered."""

    def __init__(self, modules=None):
        super().__init__()
        for m in modules or []:
            self.append(m)

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, idx):
        return list(self._modules.values())[idx]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())


class Identity(Module):
    def forward(self, input):
        return input


class ReLU(Module):
    def forward(self, input):
        return _C.relu(input)


class Tanh(Module):
    def forward(self, input):
        return _C.tanh(input)


class Sigmoid(Module):
    def forward(self, input):
        return _C.sigmoid(input)


class Dropout(Module):
    """Zeroes elements with probability p while training (scaling the rest by 1/(1-p))."""

    def __init__(self, p=0.5):
        super().__init__()
        if not 0 <= p <= 1:
            raise _C.Error(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, input):
        return _C.dropout(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}"


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, input):
        return _C.flatten(input, self.start_dim, self.end_dim)


class LogSoftmax(Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return _C.log_softmax(input, self.dim)


# ---- losses ----------------------------------------------------------------------------------

class MSELoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return F.mse_loss(input, target, reduction=self.reduction)


class CrossEntropyLoss(Module):
    def __init__(self, reduction="mean", label_smoothing=0.0):
        super().__init__()
        self.reduction, self.label_smoothing = reduction, label_smoothing

    def forward(self, input, target):
        return F.cross_entropy(input, target, reduction=self.reduction, label_smoothing=self.label_smoothing)


class BCEWithLogitsLoss(Module):
    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, input, target):
        return F.binary_cross_entropy_with_logits(input, target, reduction=self.reduction)


# ---- layers built on the convolution, pooling and normalization ops ---------------------------
# Initialization draws as the C++ layers do (nn.h), in the same order: the same seed gives the
# same weights in both.

def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, input):
        return _C.gelu(input, approximate=self.approximate)


class LayerNorm(Module):
    """Normalizes over the trailing normalized_shape dims; weight ones, bias zeros at first."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        if elementwise_affine:
            self.weight = Parameter(_C.ones(self.normalized_shape))
            self.bias = Parameter(_C.zeros(self.normalized_shape))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return _C.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class Embedding(Module):
    """num_embeddings vectors of embedding_dim from N(0, 1); the padding_idx row starts at zero."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None):
        super().__init__()
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.padding_idx = padding_idx
        w = _C.randn(num_embeddings, embedding_dim)
        if padding_idx is not None:
            rows = _C.reshape(_C._arange(num_embeddings, _C.int64), (num_embeddings, 1)) == padding_idx
            w = _C.masked_fill(w, rows, 0)
        self.weight = Parameter(w)

    def forward(self, input):
        return _C.embedding(input, self.weight, self.padding_idx)


class Conv2d(Module):
    """2-D convolution; weight and bias uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in))."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise _C.Error(f"Conv2d: channels {in_channels} -> {out_channels} must be divisible by groups {groups}")
        kh, kw = _pair(kernel_size)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        bound = 1.0 / math.sqrt(in_channels // groups * kh * kw)
        self.weight = Parameter(_uniform((out_channels, in_channels // groups, kh, kw), bound))
        if bias:
            self.bias = Parameter(_uniform((out_channels,), bound))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return _C.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def forward(self, input):
        return _C.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, input):
        return _C.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                             self.count_include_pad, self.divisor_override)
