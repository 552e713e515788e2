"""lazyrt.nn: modules, layers and losses with torch.nn's interface."""

from lazyrt.nn import functional, utils  # noqa: F401
from lazyrt.nn.module import Module, Parameter  # noqa: F401
from lazyrt.nn.layers import (  # noqa: F401
    AvgPool2d, BCEWithLogitsLoss, Conv2d, CrossEntropyLoss, Dropout, Embedding, Flatten, GELU, Identity,
    LayerNorm, Linear, LogSoftmax, MaxPool2d, ModuleList, MSELoss, ReLU, Sequential, Sigmoid, Tanh,
)
