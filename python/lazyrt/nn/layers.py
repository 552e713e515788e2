"""Layers and losses as lazyrt.nn.Module subclasses, mirroring torch.nn and the C++ nn.h.

Linear draws its initial weights exactly as the C++ nn::Linear does (same seed, same values):
weight, then bias, uniform in [-1/sqrt(in_features), 1/sqrt(in_features)).
"""

import math
import operator
import warnings
from collections import OrderedDict, abc

from lazyrt import _C
from lazyrt._C import Tensor
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


class ModuleDict(Module):
    """An ordered dict of submodules, registered under their keys (as torch.nn.ModuleDict).
    A plain dict keeps its insertion order."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]
        _C.invalidate_compiled_steps()

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def clear(self):
        self._modules.clear()
        _C.invalidate_compiled_steps()

    def pop(self, key):
        module = self[key]
        del self[key]
        return module

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules):
        """Adds (or replaces) the entries of a mapping or of an iterable of (key, module)."""
        _update(self, modules, "ModuleDict", (OrderedDict, ModuleDict))


def _update(container, entries, kind, ordered, sort_plain_dicts=False):
    """container[k] = v for the pairs of `entries` (a mapping or an iterable of pairs), checked
    as torch.nn's containers check them; `ordered` are the mappings taken in their own order."""
    if not isinstance(entries, abc.Iterable) or isinstance(entries, Tensor):
        raise TypeError(f"{kind}.update should be called with an iterable of key/value pairs, "
                        f"but got {type(entries).__name__}")
    if isinstance(entries, ordered):
        pairs = list(entries.items())
    elif isinstance(entries, abc.Mapping):
        # PyTorch sorts the keys of a plain dict here (ParameterDict only).
        pairs = sorted(entries.items()) if sort_plain_dicts else list(entries.items())
    else:
        pairs = []
        for j, pair in enumerate(entries):
            if not isinstance(pair, abc.Iterable):
                raise TypeError(f"{kind} update sequence element #{j} should be Iterable; is {type(pair).__name__}")
            pair = list(pair)
            if len(pair) != 2:
                raise ValueError(f"{kind} update sequence element #{j} has length {len(pair)}; 2 is required")
            pairs.append(pair)
    for key, value in pairs:
        container[key] = value


def _describe(value):
    """A container entry as torch.nn's containers print it."""
    if isinstance(value, Tensor):
        kind = "Parameter" if isinstance(value, Parameter) else "Tensor"
        size = "x".join(str(d) for d in value.shape)
        return f"{kind} containing: [{value.dtype} of size {size}]"
    return f"Object of type: {type(value).__name__}"


class ParameterList(Module):
    """A list of parameters, registered as '0', '1', ... (as torch.nn.ParameterList). Tensors
    put in it become Parameters; other values are kept as they are."""

    def __init__(self, values=None):
        super().__init__()
        self._size = 0
        if values is not None:
            self.extend(values)

    def _index(self, idx):
        idx = operator.index(idx)
        if not -len(self) <= idx < len(self):
            raise IndexError(f"ParameterList: index {idx} is out of range for {len(self)} entries")
        return str(idx + len(self) if idx < 0 else idx)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            out = type(self)()
            for i in range(*idx.indices(len(self))):
                out.append(self[i])
            return out
        return getattr(self, self._index(idx))

    def __setitem__(self, idx, value):
        name = self._index(idx)
        if isinstance(value, Tensor) and not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, name, value)

    def __len__(self):
        return self._size

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __iadd__(self, values):
        return self.extend(values)

    def __dir__(self):
        return [k for k in super().__dir__() if not k.isdigit()]

    def append(self, value):
        self._size += 1
        self[self._size - 1] = value
        return self

    def extend(self, values):
        # A tensor is iterable, but never unpacked here.
        if not isinstance(values, abc.Iterable) or isinstance(values, Tensor):
            raise TypeError(f"ParameterList.extend should be called with an iterable, but got {type(values).__name__}")
        for v in values:
            self.append(v)
        return self

    def extra_repr(self):
        return "\n".join(f"({i}): {_describe(v)}" for i, v in enumerate(self))

    def __call__(self, *args, **kwargs):
        raise _C.Error("ParameterList should not be called.")


class ParameterDict(Module):
    """An ordered dict of parameters, registered under their (string) keys (as
    torch.nn.ParameterDict). Tensors put in it become Parameters; other values are kept as
    they are. As in PyTorch, a plain dict given to the constructor or update() is taken in
    sorted key order; an OrderedDict, a ParameterDict or a list of pairs keeps its order."""

    def __init__(self, parameters=None):
        super().__init__()
        self._keys = {}
        if parameters is not None:
            self.update(parameters)

    @staticmethod
    def _attr(key):
        if not isinstance(key, str):
            raise TypeError("Index given to ParameterDict cannot be used as a key as it is not a string "
                            f"(type is '{type(key).__name__}')")
        return key

    def __getitem__(self, key):
        return getattr(self, self._attr(key))

    def __setitem__(self, key, value):
        attr = self._attr(key)
        if key not in self._keys and hasattr(type(self), attr):
            raise KeyError(f"ParameterDict: attribute '{attr}' already exists")
        self._keys[key] = None
        if isinstance(value, Tensor) and not isinstance(value, Parameter):
            value = Parameter(value)
        setattr(self, attr, value)

    def __delitem__(self, key):
        del self._keys[key]
        delattr(self, self._attr(key))

    def __len__(self):
        return len(self._keys)

    def __iter__(self):
        return iter(self._keys)

    def __reversed__(self):
        return reversed(list(self._keys))

    def __contains__(self, key):
        return key in self._keys

    def copy(self):
        """A new ParameterDict holding the same entries (the same Parameter objects)."""
        return ParameterDict(OrderedDict((k, self[k]) for k in self._keys))

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def clear(self):
        for k in list(self._keys):
            del self[k]

    def pop(self, key):
        value = self[key]
        del self[key]
        return value

    def popitem(self):
        if not self._keys:
            raise KeyError("popitem(): ParameterDict is empty")
        key = next(reversed(self._keys))
        return key, self.pop(key)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def fromkeys(self, keys, default=None):
        return ParameterDict((k, default) for k in keys)

    def keys(self):
        return self._keys.keys()

    def items(self):
        return ((k, self[k]) for k in self._keys)

    def values(self):
        return (self[k] for k in self._keys)

    def update(self, parameters):
        """Adds (or replaces) the entries of a mapping or of an iterable of (key, value)."""
        _update(self, parameters, "ParameterDict", (OrderedDict, ParameterDict), sort_plain_dicts=True)

    def extra_repr(self):
        return "\n".join(f"({k}): {_describe(v)}" for k, v in self.items())

    def __call__(self, *args, **kwargs):
        raise _C.Error("ParameterDict should not be called.")

    def __or__(self, other):
        out = self.copy()
        out.update(other)
        return out

    def __ror__(self, other):
        out = other.copy()
        out.update(self)
        return out

    def __ior__(self, other):
        self.update(other)
        return self


class Identity(Module):
    def forward(self, input):
        return input


class ReLU(Module):
    """max(x, 0). inplace=True is accepted for PyTorch code and gives the same result, but the
    input is not modified: the result is a new tensor (use the returned value)."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return _C.relu(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class LeakyReLU(Module):
    """x for x >= 0, negative_slope * x below. inplace as for ReLU (the input is not modified)."""

    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input):
        return _C.leaky_relu(input, self.negative_slope)

    def extra_repr(self):
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class SiLU(Module):
    """x * sigmoid(x). inplace as for ReLU (the input is not modified)."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return _C.silu(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Mish(Module):
    """x * tanh(softplus(x)). inplace as for ReLU (the input is not modified)."""

    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.mish(input)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Softplus(Module):
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold."""

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input):
        return _C.softplus(input, self.beta, self.threshold)

    def extra_repr(self):
        return f"beta={self.beta}, threshold={self.threshold}"


class Softmax(Module):
    """Softmax along dim. Without a dim, PyTorch's deprecated implicit choice (with its
    warning): dim 0 for 0-, 1- and 3-dim inputs, else dim 1."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim
        if dim is None:
            warnings.warn("Implicit dimension choice for softmax has been deprecated. "
                          "Change the call to include dim=X as an argument.", stacklevel=2)
            dim = 0 if input.dim() in (0, 1, 3) else 1
        return _C.softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"


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


class Dropout2d(Module):
    """Zeroes whole channels with probability p while training, scaling the rest by
    1 / (1 - p); identity in eval mode. As PyTorch 1.13: the channels are dim 1 of an input
    of 2 or more dims, so a 4-D input [N, C, H, W] loses whole [H, W] maps, and a 3-D input is
    read as [N, C, L] (PyTorch warns, and so does lazyrt)."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if not 0 <= p <= 1:
            raise ValueError(f"Dropout2d: dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, input):
        return F.dropout2d(input, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


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
    """F.cross_entropy as a module, with torch's arguments (class weights unsupported)."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        super().__init__()
        if weight is not None:
            raise _C.Error("CrossEntropyLoss: class weights (weight=) are not supported")
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return F.cross_entropy(input, target, ignore_index=self.ignore_index, reduction=self.reduction,
                               label_smoothing=self.label_smoothing)


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

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class LayerNorm(Module):
    """Normalizes over the trailing normalized_shape dims; weight ones, bias zeros at first."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_C.ones(self.normalized_shape))
        else:
            self.register_parameter("weight", None)
        if elementwise_affine and bias:  # bias=False (PyTorch 2.x): a weight and no bias
            self.bias = Parameter(_C.zeros(self.normalized_shape))
        else:
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


def _conv_parameters(module, weight_shape, fan_in, out_channels, bias, dtype=None):
    """A convolution's weight and bias (or none), uniform in +-1/sqrt(fan_in) as PyTorch draws them."""
    bound = 1.0 / math.sqrt(fan_in)
    module.weight = Parameter(_uniform(weight_shape, bound))
    if bias:
        module.bias = Parameter(_uniform((out_channels,), bound))
    else:
        module.register_parameter("bias", None)
    if dtype is not None:
        module.to(dtype)


class Conv2d(Module):
    """2-D convolution; weight and bias uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in))."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise _C.Error(f"Conv2d: channels {in_channels} -> {out_channels} must be divisible by groups {groups}")
        kh, kw = _pair(kernel_size)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        _conv_parameters(self, (out_channels, in_channels // groups, kh, kw), in_channels // groups * kh * kw,
                         out_channels, bias)

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


# ---- more activations (nn.functional's compositions as modules) -------------------------------
# inplace=True is accepted where torch.nn takes it, for PyTorch code: the result is the same,
# but the input is not modified (the module returns a new tensor; use the returned value).

class _Inplace(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class ReLU6(_Inplace):
    """min(max(x, 0), 6)."""

    def forward(self, input):
        return F.relu6(input)


class Hardtanh(Module):
    """x clamped to [min_val, max_val] (min_value / max_value: torch's deprecated names)."""

    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False, min_value=None, max_value=None):
        super().__init__()
        if min_value is not None:
            warnings.warn("keyword argument min_value is deprecated and rename to min_val", stacklevel=2)
            min_val = min_value
        if max_value is not None:
            warnings.warn("keyword argument max_value is deprecated and rename to max_val", stacklevel=2)
            max_val = max_value
        if max_val <= min_val:
            raise _C.Error(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input):
        return F.hardtanh(input, self.min_val, self.max_val)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class ELU(Module):
    """x for x > 0, alpha * (exp(x) - 1) below."""

    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input):
        return F.elu(input, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""

    def forward(self, input):
        return F.celu(input, self.alpha)


class SELU(_Inplace):
    """scale * elu(x, alpha) with PyTorch's constants."""

    def forward(self, input):
        return F.selu(input)


class Hardswish(_Inplace):
    """x * relu6(x + 3) / 6."""

    def forward(self, input):
        return F.hardswish(input)


class Hardsigmoid(_Inplace):
    """relu6(x + 3) / 6."""

    def forward(self, input):
        return F.hardsigmoid(input)


class LogSigmoid(Module):
    def forward(self, input):
        return F.logsigmoid(input)


class Softsign(Module):
    def forward(self, input):
        return F.softsign(input)


class Softmin(Module):
    """softmax(-x) along dim (PyTorch's implicit dim, with its warning, when dim is None)."""

    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        return F.softmin(input, self.dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class PReLU(Module):
    """x for x >= 0, a * x below, with a learnable slope `weight` (num_parameters values, one
    for all channels or one per channel of dim 1), each starting at `init`."""

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        self.num_parameters = num_parameters
        self.weight = Parameter(_C.full((num_parameters,), float(init)))

    def forward(self, input):
        return F.prelu(input, self.weight)

    def extra_repr(self):
        return f"num_parameters={self.num_parameters}"


# ---- reshaping and padding -----------------------------------------------------------------

class Unflatten(Module):
    """Splits dim into unflattened_size (a tuple of ints; one may be -1)."""

    def __init__(self, dim, unflattened_size):
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"Unflatten: invalid type of dim: {type(dim).__name__} (expected int)")
        if not isinstance(unflattened_size, (tuple, list)) or not all(
                isinstance(s, int) and not isinstance(s, bool) for s in unflattened_size):
            raise TypeError(f"Unflatten: unflattened_size must be a tuple of ints, got {unflattened_size!r}")
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, input):
        shape = tuple(input.shape)
        dim = self.dim + len(shape) if self.dim < 0 else self.dim
        if not 0 <= dim < len(shape):
            raise IndexError(f"Unflatten: dim {self.dim} is out of range for an input of {len(shape)} dims")
        sizes = list(self.unflattened_size)
        known = 1
        for s in sizes:
            known *= s if s != -1 else 1
        if sizes.count(-1) > 1 or (sizes.count(-1) == 0 and known != shape[dim]) or \
                (sizes.count(-1) == 1 and (known == 0 or shape[dim] % known)):
            raise _C.Error(f"Unflatten: sizes {self.unflattened_size} do not multiply to dim {self.dim}'s size "
                           f"{shape[dim]}")
        return _C.reshape(input, shape[:dim] + self.unflattened_size + shape[dim + 1:])

    def extra_repr(self):
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"


class ConstantPad2d(Module):
    """Pads the last two dims with `value`: padding is one int or (left, right, top, bottom)."""

    def __init__(self, padding, value):
        super().__init__()
        self.padding = (padding,) * 4 if isinstance(padding, int) else tuple(padding)
        if len(self.padding) != 4:
            raise _C.Error(f"{type(self).__name__}: padding must be an int or 4 values, got {padding!r}")
        self.value = value

    def forward(self, input):
        if input.dim() not in (3, 4):
            raise _C.Error(f"{type(self).__name__}: expects a 3-D or 4-D input, got shape {tuple(input.shape)}")
        return _C.pad(input, self.padding, self.value)

    def extra_repr(self):
        return f"padding={self.padding}, value={self.value}"


class ZeroPad2d(ConstantPad2d):
    """Pads the last two dims with zeros: padding is one int or (left, right, top, bottom)."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)

    def extra_repr(self):
        return f"{self.padding}"


# ---- more losses and distances -------------------------------------------------------------

class L1Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean", beta=1.0):
        super().__init__()
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input, target):
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(Module):
    def __init__(self, reduction="mean", delta=1.0):
        super().__init__()
        self.reduction, self.delta = reduction, delta

    def forward(self, input, target):
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class NLLLoss(Module):
    """F.nll_loss as a module, with torch's arguments (class weights unsupported)."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
        super().__init__()
        if weight is not None:
            raise _C.Error("NLLLoss: class weights (weight=) are not supported")
        self.ignore_index = ignore_index
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return F.nll_loss(input, target, ignore_index=self.ignore_index, reduction=self.reduction)


class BCELoss(Module):
    """F.binary_cross_entropy as a module; weight (a tensor broadcast against the loss) is kept
    as a buffer, as torch keeps it."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction="mean"):
        super().__init__()
        self.register_buffer("weight", weight)
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)

    def forward(self, input, target):
        return F.binary_cross_entropy(input, target, weight=self.weight, reduction=self.reduction)


class KLDivLoss(Module):
    def __init__(self, size_average=None, reduce=None, reduction="mean", log_target=False):
        super().__init__()
        self.reduction = F._legacy_reduction(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input, target):
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)


class CosineSimilarity(Module):
    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1, x2):
        return F.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1, x2):
        return F.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)


# ---- 1-D and transposed convolutions, bags of embeddings ----------------------------------------
# Initialization as Conv2d's (and PyTorch's): weight and bias uniform in
# [-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in from the weight's dim 1 times the kernel's size.

def _single(v, what):
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise _C.Error(f"{what}: expects one value, got {tuple(v)}")
        return int(v[0])
    return v if isinstance(v, str) else int(v)


_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class Conv1d(Module):
    """1-D convolution of [N, C, L] (or [C, L]); padding an int, 'valid' or 'same';
    padding_mode 'zeros', 'reflect', 'replicate' or 'circular' as PyTorch's."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv1d: channels {in_channels} -> {out_channels} must be divisible by groups {groups}")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {list(_PADDING_MODES)}, but got "
                             f"padding_mode='{padding_mode}'")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = (_single(kernel_size, "Conv1d"),), (_single(stride, "Conv1d"),)
        padding = _single(padding, "Conv1d")
        self.padding = padding if isinstance(padding, str) else (padding,)
        self.dilation, self.groups, self.padding_mode = (_single(dilation, "Conv1d"),), groups, padding_mode
        if isinstance(padding, str) and padding not in ("valid", "same"):
            raise ValueError(f"Invalid padding string '{padding}', should be one of {{'valid', 'same'}}")
        if padding == "same" and self.stride[0] != 1:
            raise ValueError("padding='same' is not supported for strided convolutions")
        _conv_parameters(self, (out_channels, in_channels // groups, self.kernel_size[0]),
                         in_channels // groups * self.kernel_size[0], out_channels, bias, dtype)

    def forward(self, input):
        if self.padding_mode == "zeros":
            return F.conv1d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        if self.padding == "same":
            total = self.dilation[0] * (self.kernel_size[0] - 1)
            widths = [total // 2, total - total // 2]
        elif self.padding == "valid":
            widths = [0, 0]
        else:
            widths = [self.padding[0]] * 2
        x = F.pad(input, widths, mode=self.padding_mode)
        return F.conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}")


class _ConvTransposeNd(Module):
    _dims = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", device=None, dtype=None):
        super().__init__()
        name, n = type(self).__name__, self._dims
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {name}')
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: channels {in_channels} -> {out_channels} must be divisible by groups {groups}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = F._ntuple(kernel_size, n, name, "kernel_size")
        self.stride, self.padding = F._ntuple(stride, n, name, "stride"), F._ntuple(padding, n, name, "padding")
        self.output_padding = F._ntuple(output_padding, n, name, "output_padding")
        self.dilation, self.padding_mode = F._ntuple(dilation, n, name, "dilation"), padding_mode
        # PyTorch's fan_in of a transposed convolution: the weight's dim 1 (out_channels / groups).
        _conv_parameters(self, (in_channels, out_channels // groups) + self.kernel_size,
                         out_channels // groups * math.prod(self.kernel_size), out_channels, bias, dtype)

    def _output_padding(self, input, output_size):
        """output_padding, or the one that gives output_size (its last dims)."""
        if output_size is None:
            return self.output_padding
        n = self._dims
        output_size = list(output_size)
        if len(output_size) not in (n, n + 2):
            raise ValueError(f"ConvTranspose{n}D: for {n}D convolution, output_size must have {n} or {n + 2} elements "
                             f"(got {len(output_size)})")
        output_size = output_size[-n:]
        out = []
        for i in range(n):
            size = input.shape[input.dim() - n + i]
            smallest = ((size - 1) * self.stride[i] - 2 * self.padding[i] + self.dilation[i] * (self.kernel_size[i] - 1)
                        + 1)
            largest = smallest + self.stride[i] - 1
            if not smallest <= output_size[i] <= largest:
                raise ValueError(f"requested an output size of {output_size}, but valid sizes range from "
                                 f"{smallest} to {largest} (for an input of {tuple(input.shape)[-n:]})")
            out.append(output_size[i] - smallest)
        return tuple(out)

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, output_padding={self.output_padding}")


class ConvTranspose1d(_ConvTransposeNd):
    """The transposed 1-D convolution (F.conv_transpose1d) of [N, C, L] (or [C, L]); weight
    [in_channels, out_channels / groups, kernel]; forward(input, output_size=None)."""
    _dims = 1

    def forward(self, input, output_size=None):
        return F.conv_transpose1d(input, self.weight, self.bias, self.stride, self.padding,
                                  self._output_padding(input, output_size), self.groups, self.dilation)


class ConvTranspose2d(_ConvTransposeNd):
    """The transposed 2-D convolution (F.conv_transpose2d) of [N, C, H, W] (or [C, H, W]); weight
    [in_channels, out_channels / groups, kH, kW]; forward(input, output_size=None)."""
    _dims = 2

    def forward(self, input, output_size=None):
        return F.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                  self._output_padding(input, output_size), self.groups, self.dilation)


class EmbeddingBag(Module):
    """Sums, means or maxima of bags of embeddings (F.embedding_bag); weight from N(0, 1) as
    Embedding's, the padding_idx row zero. forward(input, offsets=None, per_sample_weights=None)."""

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 mode="mean", sparse=False, _weight=None, include_last_offset=False, padding_idx=None,
                 device=None, dtype=None):
        super().__init__()
        if max_norm is not None or scale_grad_by_freq:
            raise _C.Error("EmbeddingBag: max_norm and scale_grad_by_freq are not supported")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("padding_idx must be within num_embeddings")
            padding_idx %= num_embeddings
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.max_norm, self.norm_type, self.scale_grad_by_freq = max_norm, norm_type, scale_grad_by_freq
        self.mode, self.sparse, self.padding_idx = mode, sparse, padding_idx
        self.include_last_offset = include_last_offset
        if _weight is None:
            w = _C.randn(num_embeddings, embedding_dim)
            if padding_idx is not None:
                rows = _C.reshape(_C._arange(num_embeddings, _C.int64), (num_embeddings, 1)) == padding_idx
                w = _C.masked_fill(w, rows, 0)
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise AssertionError("Shape of weight does not match num_embeddings and embedding_dim")
            w = _weight.detach()
        self.weight = Parameter(w)
        if dtype is not None:
            self.to(dtype)

    def forward(self, input, offsets=None, per_sample_weights=None):
        return F.embedding_bag(input, self.weight, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=self.padding_idx)

    def extra_repr(self):
        out = f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
        return out + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else "")
