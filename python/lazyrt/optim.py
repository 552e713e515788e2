"""lazyrt.optim: SGD, Adam and AdamW with PyTorch's keywords and update formulas (optim.h).

An optimizer step is traced like the forward and backward (it joins the pending graph); all
state, the step count included, lives in tensors updated in place, so every step has the same
graph and compile_step replays it. step(found_inf) skips the whole update where found_inf is
non-zero, without reading it on the host (PyTorch/XLA's syncfree optimizers).

Hyperparameters can be changed between steps through param_groups[0] (as LR schedulers do).
The learning rate lives in a tensor that every step reads, so changing it never recompiles and
replayed steps use the new rate; any other hyperparameter is a constant of the graph, so a
change makes compiled steps retrace.
"""

import weakref

from lazyrt import _C
from lazyrt._autograd import enable_grad

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]


class _ParamGroup(dict):
    """A parameter group: assigning a hyperparameter applies it to the optimizer at once, so a
    replayed step (which never calls step()) sees it."""

    def __init__(self, optimizer, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Weak: an optimizer that is dropped must die at once (its state with it), so that
        # compiled steps that captured that state see it gone and retrace.
        self._owner = weakref.ref(optimizer)

    @property
    def _optimizer(self):
        opt = self._owner()
        if opt is None:
            raise _C.Error("this parameter group's optimizer no longer exists")
        return opt

    def __setitem__(self, key, value):
        if key not in self._optimizer._hyper:
            return super().__setitem__(key, value)
        self._apply(lambda: super(_ParamGroup, self).__setitem__(key, value))

    def update(self, *args, **kwargs):
        self._apply(lambda: super(_ParamGroup, self).update(*args, **kwargs))

    def _apply(self, change):
        # A value the optimizer refuses leaves the group as it was.
        before = dict(self)
        change()
        try:
            self._optimizer._push_hyperparameters()
        except Exception:
            dict.clear(self)
            dict.update(self, before)
            raise

    def __reduce__(self):
        return (dict, (dict(self),))


class Optimizer:
    """Base class: holds the C++ optimizer and one parameter group."""

    _hyper = ()

    def __init__(self, params, impl_cls, **hyper):
        params = list(params)
        if params and isinstance(params[0], dict):
            if len(params) != 1:
                raise _C.Error(f"{type(self).__name__}: lazyrt optimizers take one parameter group")
            group = dict(params[0])
            params = list(group.pop("params"))
            hyper.update({k: v for k, v in group.items() if k in hyper})
        if not params:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        self._impl = impl_cls(params, **hyper)
        self.param_groups = [_ParamGroup(self, params=params, **hyper)]
        self.defaults = dict(hyper)

    def _push_hyperparameters(self):
        group = self.param_groups[0]
        for name in self._hyper:
            value = tuple(group[name]) if name == "betas" else group[name]
            if getattr(self._impl, name) != value:
                setattr(self._impl, name, value)

    def step(self, closure=None, found_inf=None):
        """One update of every parameter that has a gradient (lazy). With found_inf (a
        one-element tensor) non-zero, parameters and state keep their values."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self._push_hyperparameters()
        self._impl.step(found_inf)
        return loss

    def zero_grad(self, set_to_none=True):
        self._impl.zero_grad(set_to_none)

    @property
    def step_count(self):
        """The step count, a float64 scalar tensor."""
        return self._impl.step_count

    def state_tensors(self):
        """Every state tensor (step count first), as compile_step captures them."""
        return self._impl.state()

    def __repr__(self):
        hyper = ", ".join(f"{k}={self.param_groups[0][k]}" for k in self._hyper)
        return f"{type(self).__name__}({hyper})"


class SGD(Optimizer):
    _hyper = ("lr", "momentum", "dampening", "weight_decay", "nesterov")

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False):
        super().__init__(params, _C._optim.SGD, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov)


class Adam(Optimizer):
    """Adam; weight_decay adds L2 to the gradient, as in PyTorch."""
    _hyper = ("lr", "betas", "eps", "weight_decay")
    _impl_cls = _C._optim.Adam

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0):
        super().__init__(params, self._impl_cls, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)


class AdamW(Adam):
    """AdamW: decoupled weight decay (default 1e-2), as in PyTorch."""
    _impl_cls = _C._optim.AdamW

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
