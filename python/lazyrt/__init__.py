"""lazyrt: a lazy-tensor runtime with PyTorch's look and feel.

Ops do not run when called: each records a node in a graph. Reading a value (``item()``,
``numpy()``, ``print``) or ``mark_step()`` compiles the pending graph once per graph hash and
runs it. Structured loops (``while_loop``, ``fori_loop``, ``scan``) trace their body once, and
``compile_step`` / the replay calls run a traced training step again without tracing.

    import lazyrt as lr
    x = lr.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    loss = (x * x).sum()
    loss.backward()
    print(loss.item(), x.grad)

Errors from lazyrt raise ``lazyrt.Error``, a ``RuntimeError``.
"""

import atexit as _atexit

from lazyrt import _C

# Generated kernels compile on a thread of their own: it must be done before the interpreter
# finalizes and the C++ statics it uses are destroyed.
_atexit.register(_C._jit.shutdown)
# Every public name of the extension is public here: Tensor, Error, the dtypes (float32, ...,
# with PyTorch's aliases float, long, ...), and every op bound in python/src/ops.cpp, so an op
# added there needs nothing here.
from lazyrt._C import *  # noqa: F401,F403
from lazyrt._tensor import tensor, as_tensor, arange, device, from_torch, to_torch  # noqa: F401
from lazyrt._tensor import FACTORIES as _FACTORIES
from lazyrt import _methods  # noqa: F401  (attaches the Tensor methods written in Python)
globals().update(_FACTORIES)  # zeros, ones, ... taking PyTorch's device= as well
from lazyrt._autograd import no_grad, enable_grad, set_grad_enabled  # noqa: F401
from lazyrt._replay import GraphInputMatcher  # noqa: F401
from lazyrt._loops import while_loop, fori_loop, scan, scan_layers  # noqa: F401  (pytrees over _C's loops)
from lazyrt import nn, optim, metrics, cache, debug, distributed  # noqa: F401
from lazyrt import _reads, lr_scheduler as _lr_scheduler
# A compiled step's guard on the Python values it reads (compile_step) leaves modules, optimizers
# and schedulers to their own guards (the compiled-step epoch, a learning rate read as a tensor).
_reads.register(owned=(nn.Module, optim.Optimizer, _lr_scheduler.LRScheduler))

__version__ = "0.1.0"
# torch functions written in Python, as compositions of lazyrt's ops
from lazyrt._math import *  # noqa: F401,F403,E402
from lazyrt._linalg import *  # noqa: F401,F403,E402
from lazyrt._factories import *  # noqa: F401,F403,E402
from lazyrt._shapes import *  # noqa: F401,F403,E402
from lazyrt._sorting import *  # noqa: F401,F403,E402
from lazyrt._data_dependent import *  # noqa: F401,F403,E402
from lazyrt._serialization import *  # noqa: F401,F403,E402

# `from lazyrt import *` gives the names above and never the subpackage lazyrt.torch (which,
# once imported, is an attribute here and would shadow PyTorch in the importer's namespace).
__all__ = [name for name in globals() if not name.startswith("_") and name != "torch"]
