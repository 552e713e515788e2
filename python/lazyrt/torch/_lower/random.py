"""Random numbers: lazyrt's generator (its state is replayed state), not torch's stream."""

import torch

import lazyrt
from lazyrt import _C
from lazyrt.torch._lower.table import FRESH_IN_PLACE, UnsupportedOperatorError, _cast, lowering

aten = torch.ops.aten


# functionalize leaves bernoulli_ (no functional variant in 1.13) on a fresh empty tensor that
# nothing else reads; LoweredGraph checks that, so the in-place op can be lowered as a new value.
FRESH_IN_PLACE.add(aten.bernoulli_.float)


@lowering(aten.bernoulli.p, aten.bernoulli_.float)
def _bernoulli_p(e, x, p=0.5, generator=None):
    if generator is not None:
        raise UnsupportedOperatorError("lazyrt.torch: bernoulli with a torch.Generator")
    draws = lazyrt.rand(e.shape, dtype=_C.float32 if e.dtype in (_C.float16, _C.bfloat16) else e.dtype)
    return _C.cast(_C.lt(draws, float(p)), e.dtype)


@lowering(aten.rand_like.default, aten.rand.default)
def _rand(e, *args, generator=None, **kwargs):
    if generator is not None:
        raise UnsupportedOperatorError("lazyrt.torch: rand with a torch.Generator")
    return lazyrt.rand(e.shape, dtype=e.dtype)


@lowering(aten.randn_like.default, aten.randn.default)
def _randn(e, *args, generator=None, **kwargs):
    return _standard_normal(e, generator)


def _standard_normal(e, generator):
    if generator is not None:
        raise UnsupportedOperatorError("lazyrt.torch: a normal draw with a torch.Generator")
    if e.dtype in (_C.float16, _C.bfloat16):  # drawn in float32, as a half draw would lose its tails
        return _C.cast(lazyrt.randn(e.shape, dtype=_C.float32), e.dtype)
    return lazyrt.randn(e.shape, dtype=e.dtype)


def _scaled_normal(e, mean, std, generator):
    return _C.add(_C.mul(_standard_normal(e, generator), _cast(std, e.dtype)), _cast(mean, e.dtype))


@lowering(aten.normal_functional.default)  # x.normal_(mean, std), functionalized
def _normal_functional(e, x, mean=0.0, std=1.0, generator=None):
    return _scaled_normal(e, mean, std, generator)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def _normal(e, mean, std=1.0, generator=None):
    return _scaled_normal(e, mean, std, generator)


@lowering(aten.normal.float_float)
def _normal_of_size(e, mean, std, size, generator=None, **kwargs):
    return _scaled_normal(e, mean, std, generator)
