"""Every public free function of the C++ API (include/lazyrt/*.h) is bound in Python. An op
added to a header without its line in python/src/ops.cpp fails here."""

import os
import re

import pytest

import lazyrt as lr
from conftest import REPO

# Where each header's functions live in Python.
NAMESPACES = {
    "tensor.h": lr, "random.h": lr, "backend.h": lr, "loops.h": lr, "replay.h": lr, "types.h": lr,
    "nn.h": lr.nn.functional, "metrics.h": lr.metrics, "cache.h": lr.cache, "debug.h": lr.debug,
    "distributed.h": lr.distributed,
}
# Functions whose Python form has another shape, and why.
PYTHON_FORM = {
    "from_blob": "from_numpy",    # raw memory comes from NumPy (or DLPack) in Python
    "dtype_size": None,           # lazyrt.float32.itemsize
    "dtype_name": None,           # repr(lazyrt.float32)
    "is_floating": None,          # lazyrt.float32.is_floating_point, Tensor.is_floating_point()
    "is_integral": None,          # not lazyrt.int64.is_floating_point and not bool
    "shape_str": None,            # Tensor.shape is a tuple
    "shape_numel": None,          # Tensor.numel()
    "shape_bytes": None,          # Tensor.numel() * Tensor.element_size()
    "grad_enabled": "is_grad_enabled",        # torch.is_grad_enabled's name
    "set_grad_enabled": "set_grad_enabled",   # also a context manager, as torch's
    "increment": None,            # the package's own layers count through lazyrt._C._metrics._increment
    "wait_for_generated_code": None,  # lazyrt._C._jit.wait_idle (tests and benchmarks)
    "stop_generating_code": None,     # lazyrt._C._jit.shutdown, which the package calls at exit
}
DECLARATION = re.compile(r"^[A-Za-z][A-Za-z0-9_:<>, ]*[ &*]([a-z_0-9]+)\(", re.MULTILINE)


def declared():
    out = []
    for header, namespace in NAMESPACES.items():
        with open(os.path.join(REPO, "include", "lazyrt", header)) as f:
            for name in sorted(set(DECLARATION.findall(f.read()))):
                out.append((header, name, namespace))
    return out


@pytest.mark.parametrize("header,name,namespace", declared(), ids=lambda v: v if isinstance(v, str) else "")
def test_bound(header, name, namespace):
    if name in PYTHON_FORM:
        if PYTHON_FORM[name]:
            assert hasattr(lr, PYTHON_FORM[name])
        return
    assert callable(getattr(namespace, name, None)), f"{header}: {name} has no binding in {namespace.__name__}"


def test_the_scan_finds_the_api():
    names = {n for _, n, _ in declared()}
    assert {"add", "matmul", "while_loop", "compile_step", "mse_loss", "counter", "graph_node_count",
            "set_memory_capacity", "tensor_id", "manual_seed", "promote_types"} <= names


def test_promote_types():
    assert lr.promote_types(lr.int32, lr.float16) is lr.float16
    assert lr.promote_types(lr.bfloat16, lr.float16) is lr.float32
    assert lr.promote_types(lr.bool, lr.int64) is lr.int64
