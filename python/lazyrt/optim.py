"""lazyrt.optim: SGD, Adam and AdamW with PyTorch's keywords and update formulas (optim.h),
parameter groups, PyTorch's state_dict layout, and learning-rate schedulers (lr_scheduler).

An optimizer step is traced like the forward and backward (it joins the pending graph); all
state, the step count included, lives in tensors updated in place, so every step has the same
graph and compile_step replays it. step(found_inf) skips the whole update where found_inf is
non-zero, without reading it on the host (PyTorch/XLA's syncfree optimizers).

Parameter groups: each group has its own C++ optimizer (its hyperparameters, its step count and
its state tensors). Hyperparameters can be changed between steps through param_groups[i] (as
LR schedulers do). The learning rate lives in a tensor that every step reads, so changing it
never recompiles and replayed steps use the new rate; any other hyperparameter is a constant of
the graph, so a change makes compiled steps retrace.

Where lazyrt differs from PyTorch: the step count is kept per group, not per parameter (a
parameter without a gradient still counts the group's steps, and a state whose parameters of
one group have different steps cannot be loaded); a parameter may not appear twice in a group
(PyTorch warns and updates it twice); amsgrad and maximize are not implemented (True raises).
"""

import weakref

from lazyrt import _C
from lazyrt._autograd import enable_grad, no_grad
from lazyrt._tensor import tensor as _tensor, _is_torch_tensor

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler"]


class _ParamGroup(dict):
    """A parameter group: assigning a hyperparameter applies it to the group's C++ optimizer at
    once, so a replayed step (which never calls step()) sees it."""

    def __init__(self, optimizer, impl, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Weak: an optimizer that is dropped must die at once (its state with it), so that
        # compiled steps that captured that state see it gone and retrace. The optimizer owns
        # the C++ optimizer; a group kept alive by a caller must not keep its state alive.
        self._owner = weakref.ref(optimizer)
        self._impl_ref = weakref.ref(impl)

    @property
    def _optimizer(self):
        opt = self._owner()
        if opt is None:
            raise _C.Error("this parameter group's optimizer no longer exists")
        return opt

    @property
    def _impl(self):
        impl = self._impl_ref()
        if impl is None:
            raise _C.Error("this parameter group's optimizer no longer exists")
        return impl

    def __setitem__(self, key, value):
        opt = self._optimizer
        if key not in opt._hyper and key not in opt._flags:
            return super().__setitem__(key, value)
        self._apply(lambda: super(_ParamGroup, self).__setitem__(key, value))

    def update(self, *args, **kwargs):
        self._apply(lambda: super(_ParamGroup, self).update(*args, **kwargs))

    def _apply(self, change):
        # A value the optimizer refuses leaves the group, and its C++ optimizer, as they were.
        before = dict(self)
        change()
        try:
            self._optimizer._push_group(self)
        except Exception:
            dict.clear(self)
            dict.update(self, before)
            self._optimizer._push_group(self)
            raise

    def __reduce__(self):
        return (dict, (dict(self),))


def _number(value, what):
    """A step count from a saved state: a number or a one-element tensor (lazyrt, PyTorch)."""
    if isinstance(value, _C.Tensor) or _is_torch_tensor(value):
        if value.numel() != 1:
            raise ValueError(f"{what} must have one element, got shape {tuple(value.shape)}")
        value = value.item()
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number or a one-element tensor, got {type(value).__name__}") from None
    if not (value >= 0 and value == int(value)):
        raise ValueError(f"{what} must be a whole number >= 0, got {value}")
    return value


class Optimizer:
    """Base class: the parameter groups, each with its C++ optimizer.

    defaults: the hyperparameters of a group that does not give its own (as in PyTorch,
    the constructor's keywords). Keys a group adds that lazyrt does not know are kept.
    """

    _hyper = ()       # hyperparameters pushed to the C++ optimizer, in the order pushed
    _flags = {}       # PyTorch's options lazyrt accepts: name -> the one value it implements,
                      # or None where any value computes the same (performance switches)
    _slot_names = ()  # names, in PyTorch's state_dict, of the per-parameter state slots
    _impl_cls = None

    def __init__(self, params, defaults):
        self.defaults = dict(defaults)
        self._check_flags(self.defaults, f"{type(self).__name__}()")
        if isinstance(params, _C.Tensor):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of tensors or dicts, "
                            "got a single Tensor (put it in a list)")
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.param_groups = []
        self._impls = []
        for group in groups:
            self.add_param_group(group)

    # ---- groups --------------------------------------------------------------------------

    def add_param_group(self, param_group):
        """Adds a group (a dict with 'params' and, optionally, its own hyperparameters; the
        others come from defaults). Its parameters must not be in another group."""
        name = f"{type(self).__name__}.add_param_group"
        if not isinstance(param_group, dict):
            raise TypeError(f"{name}: a parameter group must be a dict, got {type(param_group).__name__}")
        if "params" not in param_group:
            raise ValueError(f"{name}: the parameter group has no 'params' entry")
        params = param_group["params"]
        if isinstance(params, _C.Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(f"{name}: parameters must be in an ordered collection (a list), not a set: "
                            "the order of a set changes between runs")
        else:
            params = list(params)
        for p in params:
            if not isinstance(p, _C.Tensor):
                raise TypeError(f"{name}: an optimizer can only optimize lazyrt Tensors, but one of "
                                f"the params is {type(p).__name__}")
        if len({id(p) for p in params}) != len(params):
            raise ValueError(f"{name}: the parameter group lists a parameter more than once")
        taken = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in taken for p in params):
            raise ValueError(f"{name}: some parameters appear in more than one parameter group")
        group = dict(param_group)
        group["params"] = params
        for key, default in self.defaults.items():
            group.setdefault(key, default)
        self._check_flags(group, name)
        # Creating the C++ optimizer validates the parameters and hyperparameters; on error
        # nothing has been added.
        impl = self._impl_cls(params, **self._impl_values(group))
        self._impls.append(impl)
        self.param_groups.append(_ParamGroup(self, impl, group))

    def _check_flags(self, group, name):
        for flag, supported in self._flags.items():
            if supported is not None and flag in group and bool(group[flag]) != supported:
                raise _C.Error(f"{name}: {flag}={group[flag]!r} is not supported by lazyrt's "
                               f"{type(self).__name__} (only {flag}={supported})")

    def _impl_values(self, group):
        """The group's hyperparameters as the C++ optimizer takes them."""
        return {k: tuple(group[k]) if k == "betas" else group[k] for k in self._hyper}

    def _push_order(self, group, impl):
        return self._hyper

    def _push_group(self, group):
        """Applies the group's hyperparameters to its C++ optimizer; only changed values are
        set, so an unchanged group never makes compiled steps retrace."""
        self._check_flags(group, f"{type(self).__name__} parameter group")
        impl = group._impl
        values = self._impl_values(group)
        for name in self._push_order(group, impl):
            if getattr(impl, name) != values[name]:
                setattr(impl, name, values[name])

    def _push_hyperparameters(self):
        for group in self.param_groups:
            self._push_group(group)

    # ---- stepping ------------------------------------------------------------------------

    def step(self, closure=None, found_inf=None):
        """One update of every parameter that has a gradient (lazy). With found_inf (a
        one-element tensor) non-zero, parameters and state keep their values."""
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self._push_hyperparameters()
        for impl in self._impls:
            impl.step(found_inf)
        return loss

    def zero_grad(self, set_to_none=True):
        for impl in self._impls:
            impl.zero_grad(set_to_none)

    @property
    def _impl(self):
        """The first group's C++ optimizer."""
        return self._impls[0]

    @property
    def step_count(self):
        """The first group's step count, a float64 scalar tensor (each group counts its own:
        group i's is param_groups[i]'s, state_tensors() holds them all)."""
        return self._impls[0].step_count

    def state_tensors(self):
        """Every state tensor as compile_step captures them: for each group in order, its step
        count, then the state slots of its parameters."""
        return [t for impl in self._impls for t in impl.state()]

    # ---- state_dict ----------------------------------------------------------------------

    def _slots(self, impl, group):
        """Per parameter of the group, its state tensors, named as in PyTorch's state_dict."""
        names = self._group_slot_names(group)
        state = impl.state()[1:]
        n = len(group["params"])
        # The C++ optimizer lays its slots out parameter by parameter (optimizers.cpp).
        assert len(state) == n * len(names), "state slots do not match the parameters"
        return [dict(zip(names, state[i * len(names):(i + 1) * len(names)])) for i in range(n)]

    def _group_slot_names(self, group):
        return self._slot_names

    def state_dict(self):
        """The state in PyTorch's layout: {'state': {index: {...}}, 'param_groups': [...]}, the
        parameters numbered across the groups in order.

        The tensors are copies made now (PyTorch's are the live state tensors, which lazyrt
        updates in place, replays included): save them whenever you like. Parameters of a group
        that has not stepped have no state, as in PyTorch before the first step. Reads the step
        counts (syncs them)."""
        state, groups, index = {}, [], 0
        for impl, group in zip(self._impls, self.param_groups):
            packed = {k: v for k, v in group.items() if k != "params"}
            n = len(group["params"])
            packed["params"] = list(range(index, index + n))
            groups.append(packed)
            steps = impl.step_count.item()
            if steps > 0:
                copies = []
                for i, slots in enumerate(self._slots(impl, group)):
                    entry = self._state_entry(steps, slots)
                    if entry is None:
                        continue
                    copies += [t for t in entry.values() if isinstance(t, _C.Tensor)]
                    state[index + i] = entry
                # Materialized: the copies must not wait on state that later steps overwrite.
                _C.sync(copies)
            index += n
        return {"state": state, "param_groups": groups}

    def _state_entry(self, steps, slots):
        """A stepped parameter's entry of state_dict()['state'], or None for no entry."""
        return {name: t.clone() for name, t in slots.items()}

    def load_state_dict(self, state_dict):
        """Loads a state made by state_dict(), lazyrt's or PyTorch's (its tensors as PyTorch
        tensors, lazyrt tensors, NumPy arrays). The hyperparameters of the groups become the
        saved ones; the state is written into the existing state tensors (compiled steps
        keep reading them). Everything is checked first: on any error nothing changes."""
        name = f"load_state_dict of {type(self).__name__}"
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError(f"{name}: expected a dict with 'state' and 'param_groups'")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{name}: loaded state dict has {len(saved_groups)} parameter groups, "
                             f"the optimizer has {len(self.param_groups)}")
        for i, (g, s) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(f"{name}: loaded state dict's parameter group {i} has {len(s['params'])} "
                                 f"parameters, the optimizer's has {len(g['params'])}")

        known = {k for g in saved_groups for k in g["params"]}
        stray = [k for k in saved_state if k not in known]
        if stray:
            # PyTorch keeps such entries as they are; lazyrt has nowhere to keep them.
            raise ValueError(f"{name}: 'state' has entries {stray} that are no parameter of 'param_groups'")
        new_groups = []
        for i, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            new = {k: v for k, v in saved.items() if k != "params"}
            missing = [k for k in self._hyper if k not in new]
            if missing:
                raise ValueError(f"{name}: parameter group {i} has no {', '.join(missing)}")
            for key, default in self.defaults.items():
                new.setdefault(key, default)
            self._check_flags(new, name)
            new["params"] = group["params"]
            new_groups.append(new)

        # Per group: the step count and, per parameter, the values of its slots.
        plans = []
        for i, (impl, group, saved, new) in enumerate(zip(self._impls, self.param_groups, saved_groups, new_groups)):
            entries = [saved_state.get(k) for k in saved["params"]]
            plans.append(self._plan_group(name, i, impl, group, new, saved["params"], entries))

        # Hyperparameters first (the C++ optimizers validate them): undone on error.
        old_groups = [dict(g) for g in self.param_groups]
        try:
            for group, new in zip(self.param_groups, new_groups):
                dict.clear(group)
                dict.update(group, new)
                self._push_group(group)
        except Exception:
            for group, old in zip(self.param_groups, old_groups):
                dict.clear(group)
                dict.update(group, old)
                self._push_group(group)
            raise
        written = []
        with no_grad():
            for impl, group, (steps, values) in zip(self._impls, self.param_groups, plans):
                impl.step_count.copy_(_tensor(steps, dtype=_C.float64))
                written.append(impl.step_count)
                for slots, vals in zip(self._slots(impl, group), values):
                    for key, dst in slots.items():
                        dst.copy_(vals[key] if vals is not None else _C.zeros_like(dst))
                        written.append(dst)
        # Materialized now: the sources may share memory with tensors the caller changes next.
        _C.sync(written)

    def _plan_group(self, name, i, impl, group, new, indices, entries):
        """Checks the saved state of group i; returns (step count, per parameter {slot: value}
        or None for zeros)."""
        slot_names = self._group_slot_names(new)
        steps = [self._entry_steps(name, k, e) for k, e in zip(indices, entries)]
        known = {s for s in steps if s is not None}
        if len(known) > 1 or (known and None in steps):
            detail = ", ".join(f"{k}: {'no state' if s is None else int(s)}" for k, s in zip(indices, steps))
            raise _C.Error(f"{name}: the parameters of group {i} have different step counts ({detail}); "
                           "lazyrt keeps one step count per parameter group")
        count = known.pop() if known else 0.0
        values = []
        for k, e, p in zip(indices, entries, group["params"]):
            if count == 0 or not slot_names:
                values.append(None)
                continue
            vals = {}
            for slot in slot_names:
                v = e.get(slot)
                if v is None:
                    raise ValueError(f"{name}: the state of parameter {k} has no '{slot}'")
                try:
                    v = _tensor(v, dtype=p.dtype)
                except (TypeError, KeyError, ValueError) as err:
                    raise TypeError(f"{name}: state '{slot}' of parameter {k} must be a tensor or an "
                                    f"array, got {type(v).__name__}") from err
                if tuple(v.shape) != tuple(p.shape):
                    raise ValueError(f"{name}: state '{slot}' of parameter {k} has shape {tuple(v.shape)}, "
                                     f"the parameter has shape {tuple(p.shape)}")
                vals[slot] = v
            values.append(vals)
        return count, values

    def _entry_steps(self, name, index, entry):
        """The step count a saved per-parameter state implies; None when it has no state."""
        raise NotImplementedError

    def __repr__(self):
        def hyper(group):
            return ", ".join(f"{k}={group[k]}" for k in self._hyper)
        if len(self.param_groups) == 1:
            return f"{type(self).__name__}({hyper(self.param_groups[0])})"
        groups = "; ".join(f"group {i}: {hyper(g)}" for i, g in enumerate(self.param_groups))
        return f"{type(self).__name__}({groups})"


class SGD(Optimizer):
    """SGD with momentum, dampening, weight decay and Nesterov momentum, as in PyTorch. A
    group's momentum cannot be switched between zero and non-zero after construction (its
    buffers are made with it)."""

    _hyper = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
    _flags = {"maximize": False, "foreach": None, "differentiable": None, "fused": None}
    _impl_cls = _C._optim.SGD

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                                      foreach=foreach, differentiable=differentiable, fused=fused))

    def _push_order(self, group, impl):
        # Nesterov needs momentum and no dampening: switched off first, on last, so that
        # every intermediate setting is valid.
        if impl.nesterov and not group["nesterov"]:
            return ("nesterov",) + tuple(k for k in self._hyper if k != "nesterov")
        return self._hyper

    def _group_slot_names(self, group):
        # The C++ SGD makes a momentum buffer only with momentum.
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _state_entry(self, steps, slots):
        # Without momentum PyTorch (2.x) keeps no state for a parameter, stepped or not.
        return {"momentum_buffer": slots["momentum_buffer"].clone()} if slots else None

    def _entry_steps(self, name, index, entry):
        # PyTorch's SGD keeps no step count: a buffer means at least one step (the C++ SGD
        # starts the buffer at step 1 and only needs to know that it has passed).
        if entry is None:
            return None
        if not isinstance(entry, dict):
            raise TypeError(f"{name}: the state of parameter {index} must be a dict, got {type(entry).__name__}")
        return 1.0

    def _plan_group(self, name, i, impl, group, new, indices, entries):
        for k, e in zip(indices, entries):
            if e is not None and new["momentum"] != 0 and e.get("momentum_buffer") is None:
                # A None buffer with momentum: PyTorch starts it at the next step, as at step 1.
                raise _C.Error(f"{name}: parameter {k} has no momentum buffer but group {i} has "
                               "momentum; lazyrt cannot start one buffer of a group afresh")
        return super()._plan_group(name, i, impl, group, new, indices, entries)


class Adam(Optimizer):
    """Adam; weight_decay adds L2 to the gradient, as in PyTorch, or with
    decoupled_weight_decay=True decays the weights directly, as AdamW (chosen at construction:
    a group cannot switch it afterwards)."""

    _hyper = ("lr", "betas", "eps", "weight_decay")
    _flags = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": None,
              "differentiable": None, "fused": None, "decoupled_weight_decay": False}
    _slot_names = ("exp_avg", "exp_avg_sq")
    _impl_cls = _C._optim.Adam

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False):
        if decoupled_weight_decay and type(self) is Adam:
            # PyTorch's Adam(decoupled_weight_decay=True) is AdamW: its update, on every group.
            self._impl_cls = AdamW._impl_cls
            self._flags = dict(self._flags, decoupled_weight_decay=True)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                                      capturable=capturable, differentiable=differentiable, fused=fused,
                                      decoupled_weight_decay=bool(decoupled_weight_decay)))

    def _state_entry(self, steps, slots):
        # PyTorch's step is a float32 scalar tensor per parameter.
        entry = {"step": _tensor(steps, dtype=_C.float32)}
        entry.update((name, t.clone()) for name, t in slots.items())
        return entry

    def _entry_steps(self, name, index, entry):
        if entry is None:
            return None
        if not isinstance(entry, dict):
            raise TypeError(f"{name}: the state of parameter {index} must be a dict, got {type(entry).__name__}")
        if not entry:
            return None
        if "step" not in entry:
            raise ValueError(f"{name}: the state of parameter {index} has no 'step'")
        return _number(entry["step"], f"{name}: 'step' of parameter {index}")


class AdamW(Adam):
    """AdamW: decoupled weight decay (default 1e-2), as in PyTorch."""

    _flags = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": None,
              "differentiable": None, "fused": None, "decoupled_weight_decay": True}
    _impl_cls = _C._optim.AdamW

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None):
        # As PyTorch's AdamW: Adam's options, its groups marked decoupled_weight_decay=True.
        Optimizer.__init__(self, params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                              amsgrad=amsgrad, maximize=maximize, foreach=foreach,
                                              capturable=capturable, differentiable=differentiable, fused=fused,
                                              decoupled_weight_decay=True))


# lazyrt.optim.lr_scheduler, as in torch.optim (optim is a module here, so the scheduler module
# lives beside it and is registered under this name for `import lazyrt.optim.lr_scheduler`).
import sys as _sys  # noqa: E402

from lazyrt import lr_scheduler  # noqa: E402

_sys.modules[__name__ + ".lr_scheduler"] = lr_scheduler
