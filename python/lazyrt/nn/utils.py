"""lazyrt.nn.utils: helpers over modules."""

from lazyrt import _C


def functional_call(module, parameters_and_buffers, args, kwargs=None):
    """Calls ``module(*args, **kwargs)`` with some of its parameters and buffers replaced by the
    tensors of ``parameters_and_buffers`` (dotted names, as named_parameters() gives them), as
    torch.func.functional_call does. Tensors shared under several names (tied weights) are
    replaced everywhere they appear. The module is restored afterwards, even if the call
    raises; it is not changed in between as far as compiled steps are concerned.
    """
    if not isinstance(args, tuple):
        args = (args,)
    current = dict(module.named_parameters()) | dict(module.named_buffers())
    unknown = [n for n in parameters_and_buffers if n not in current]
    if unknown:
        raise _C.Error(f"functional_call: {type(module).__name__} has no parameter or buffer named "
                       f"{', '.join(unknown)}")
    new_of = {_C.tensor_id(current[n]): v for n, v in parameters_and_buffers.items()}
    swapped = []
    try:
        for m in module.modules():
            for store in (m._parameters, m._buffers):
                for name, t in store.items():
                    if t is not None and _C.tensor_id(t) in new_of:
                        swapped.append((store, name, t))
        for store, name, t in swapped:
            store[name] = new_of[_C.tensor_id(t)]
        return module(*args, **(kwargs or {}))
    finally:
        for store, name, t in swapped:
            store[name] = t
