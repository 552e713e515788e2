"""lazyrt.nn: modules, layers and losses with torch.nn's interface."""

from lazyrt.nn import functional, init, utils  # noqa: F401
from lazyrt.nn.module import Module, Parameter  # noqa: F401
from lazyrt.nn.layers import (  # noqa: F401
    AvgPool2d, BCEWithLogitsLoss, Conv2d, CrossEntropyLoss, Dropout, Dropout2d, Embedding, Flatten, GELU,
    Identity, LayerNorm, LeakyReLU, Linear, LogSoftmax, MaxPool2d, Mish, ModuleDict, ModuleList, MSELoss,
    ParameterDict, ParameterList, ReLU, Sequential, Sigmoid, SiLU, Softmax, Softplus, Tanh,
    BCELoss, CELU, ConstantPad2d, CosineSimilarity, ELU, Hardsigmoid, Hardswish, Hardtanh, HuberLoss, KLDivLoss,
    L1Loss, LogSigmoid, NLLLoss, PairwiseDistance, PReLU, ReLU6, SELU, SmoothL1Loss, Softmin, Softsign, Unflatten,
    ZeroPad2d,
)
from lazyrt.nn.layers import Conv1d, ConvTranspose1d, ConvTranspose2d, EmbeddingBag  # noqa: F401
from lazyrt.nn.normalization import BatchNorm1d, BatchNorm2d, GroupNorm, InstanceNorm1d, InstanceNorm2d  # noqa: F401
from lazyrt.nn.spatial import AdaptiveAvgPool2d, Upsample  # noqa: F401
from lazyrt.nn.spatial import (  # noqa: F401
    AdaptiveAvgPool1d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, Fold, PixelShuffle, PixelUnshuffle, ReflectionPad1d,
    ReflectionPad2d, ReplicationPad1d, ReplicationPad2d, Unfold,
)
from lazyrt.nn.transformer import (  # noqa: F401
    MultiheadAttention, Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
    TransformerEncoderLayer,
)
from lazyrt.nn.recurrent import GRU, GRUCell, LSTM, LSTMCell, RNN, RNNBase, RNNCell, RNNCellBase  # noqa: F401
