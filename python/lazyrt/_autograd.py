"""Gradient mode: no_grad, enable_grad, set_grad_enabled, as in PyTorch (per thread)."""

import functools

from lazyrt import _C


class _GradMode:
    """A context manager that sets the gradient mode, restoring it on exit; also a decorator."""

    _mode = True

    def __enter__(self):
        self._previous = _C.is_grad_enabled()
        _C._set_grad_enabled(self._mode)
        return None

    def __exit__(self, *exc):
        _C._set_grad_enabled(self._previous)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapped


class no_grad(_GradMode):
    """Ops inside record no gradient (optimizer updates, evaluation)."""
    _mode = False


class enable_grad(_GradMode):
    """Ops inside record gradients, even within no_grad."""
    _mode = True


class set_grad_enabled(_GradMode):
    """Sets the gradient mode: at once, and for a with block (restored on exit)."""

    def __init__(self, mode):
        self._previous = _C.is_grad_enabled()
        self._mode = bool(mode)
        _C._set_grad_enabled(self._mode)

    def __enter__(self):
        return None

    def __call__(self, fn):
        _C._set_grad_enabled(self._previous)
        mode = self._mode

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapped
