"""lazyrt.nn.functional: activations and losses, as torch.nn.functional.

The losses are the C++ ones of nn.h (reduction: 'mean', 'sum' or 'none').
"""

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


def mse_loss(input, target, reduction="mean"):
    return _C._nn.mse_loss(input, target, reduction)


def cross_entropy(input, target, reduction="mean", label_smoothing=0.0):
    """logits [N, C] and integer class targets [N]; label smoothing as in PyTorch."""
    return _C._nn.cross_entropy(input, target, label_smoothing, reduction)


def binary_cross_entropy_with_logits(input, target, reduction="mean"):
    return _C._nn.binary_cross_entropy_with_logits(input, target, reduction)
