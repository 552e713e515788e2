"""save / load, as torch's.

Pickle, with lazyrt tensors pickled as their values (a NumPy array), dtype, requires_grad and
class: not PyTorch's zip format (lazyrt cannot read files torch.save wrote, nor torch those
of lazyrt.save).
"""

import os
import pickle

from lazyrt import _C
from lazyrt._tensor import _check_device

__all__ = ["save", "load"]


def save(obj, f, pickle_module=pickle, pickle_protocol=2, _use_new_zipfile_serialization=True):
    """Writes obj (tensors, a state_dict, nested containers of them) to f, a path or a binary
    file, with pickle. Reads the tensors' values (a sync when pending). Tensors that are the
    same object stay one object when loaded, as in PyTorch."""
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as fh:
            pickle_module.dump(obj, fh, protocol=pickle_protocol)
    else:
        pickle_module.dump(obj, f, protocol=pickle_protocol)


class _WeightsUnpickler(pickle.Unpickler):
    """Loads tensors, NumPy arrays and Python's containers and numbers only."""

    _ALLOWED = {
        ("collections", "OrderedDict"), ("lazyrt._tensor", "_rebuild_tensor"), ("lazyrt._tensor", "_dtype_named"),
        ("lazyrt._C", "Tensor"), ("lazyrt.nn.module", "Parameter"), ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
        ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    }

    def find_class(self, module, name):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"load(weights_only=True): {module}.{name} is not allowed; only tensors, "
                                         "NumPy arrays and Python's containers and numbers load this way")
        return super().find_class(module, name)


def load(f, map_location=None, pickle_module=None, *, weights_only=False, **pickle_load_args):
    """Reads what save wrote, from a path or a binary file. map_location may be None, 'cpu',
    'lazy' or such a device (lazyrt has one device); weights_only=True refuses anything but
    tensors, arrays and plain containers (pickle.UnpicklingError)."""
    if map_location is not None:
        if callable(map_location) or isinstance(map_location, dict):
            raise _C.Error("load: map_location must be None or a device ('cpu', 'lazy'): lazyrt has one device")
        _check_device(map_location, "load")
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return load(fh, weights_only=weights_only, pickle_module=pickle_module, **pickle_load_args)
    if weights_only:
        return _WeightsUnpickler(f, **pickle_load_args).load()
    return (pickle_module or pickle).load(f, **pickle_load_args)
