"""Patches of PyTorch's Python code while a step is captured, for the capturing thread only.

Capturing a step swaps some of PyTorch's functions for lazyrt's (the optimizers' update
functions, batch norm's forward with a cumulative average, the transformer's causal-mask
check, LBFGS's step, ``Optimizer.__init__``). Each swap (`patch`) installs a function that runs
lazyrt's version in the thread that captures and PyTorch's own in every other thread, and is
undone when the capture ends; captures take `LOCK`, one thread at a time, so that one capture's
undo never removes another's swap. PyTorch's process-wide switches the capture also sets
(oneDNN off, the math attention kernel) are not per thread: another thread's eager ops may pick
other kernels meanwhile (same values up to rounding).
"""

import contextlib
import threading

LOCK = threading.RLock()
_capturing = threading.local()


@contextlib.contextmanager
def capturing():
    """Marks this thread as the one capturing (under LOCK) while within."""
    with LOCK:
        depth = getattr(_capturing, "depth", 0)
        _capturing.depth = depth + 1
        try:
            yield
        finally:
            _capturing.depth = depth


def in_capture():
    """Whether this thread is capturing a step."""
    return getattr(_capturing, "depth", 0) > 0


@contextlib.contextmanager
def patch(owner, name, replacement):
    """owner.name is `replacement` for the capturing thread while within; PyTorch's own for
    every other thread. Returns (yields) the original."""
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)

    def chosen(*args, **kwargs):
        return (replacement if in_capture() else original)(*args, **kwargs)
    chosen.__wrapped__ = original
    setattr(owner, name, chosen)
    try:
        yield original
    finally:
        # Put back unless another library replaced it meanwhile, wrapping `chosen` (Dynamo's
        # first compile, which a loop op traced inside a capture starts, disables its tracing of
        # LBFGS's step so): its wrapper stays, and `chosen` calls the original outside captures.
        now = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
        if now is chosen:
            setattr(owner, name, original)
