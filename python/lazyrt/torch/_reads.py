"""PyTorch's objects for the walk over what a step reads (`lazyrt._reads`, registered when
lazyrt.torch is imported): torch tensors are read by their metadata (class, shape, dtype,
device, layout: `tensor_meta`); torch modules and optimizers are discovery's; a module's
bookkeeping attributes are not read; torch dtypes compare by value."""

import torch

from lazyrt import _reads


def tensor_meta(t):
    return (t.__class__, tuple(t.shape), t.dtype, t.device, t.layout)


_reads.register(tensors=(torch.Tensor,), tensor_meta=tensor_meta, owned=(torch.nn.Module, torch.optim.Optimizer),
                modules=(torch.nn.Module,), module_internals=torch.nn.Module().__dict__, by_value=(torch.dtype,))
