"""lazyrt.nn.Module and Parameter, as torch.nn.Module and torch.nn.Parameter.

A module registers what is assigned to its attributes: a Parameter (or any leaf tensor that
requires grad) as a parameter, a Module as a submodule; register_buffer adds buffers.
Parameters keep their identity for the module's life (optimizers, compile_step and
load_state_dict rely on that); their values change in place. The one exception is
Module.to(dtype) (and half(), double(), ...), which replaces each cast parameter. Replacing
or deleting an attribute of a module, and switching it between train() and eval(), changes
what a traced step computes: it makes every compiled step retrace on its next call.
copy.deepcopy and pickle give a module with its own parameters and buffers (equal values).
"""

from collections import OrderedDict, namedtuple

from lazyrt import _C
from lazyrt._autograd import no_grad
from lazyrt._C import Tensor


class Parameter(Tensor):
    """A tensor that is a module parameter: a leaf that requires grad (by default)."""

    def __init__(self, data=None, requires_grad=True):
        if data is None:
            data = _C.zeros(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: expected a lazyrt.Tensor, got {type(data).__name__}")
        super().__init__(data.detach())
        if requires_grad:
            self.requires_grad_()

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


_IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _as_lazyrt(value, name):
    """A state dict value as a lazyrt tensor: tensors as they are, ndarrays and PyTorch
    tensors copied now (as PyTorch's load_state_dict copies): shared memory would be read only
    when the copy into the module is computed, after the owner may have changed it."""
    if isinstance(value, Tensor):
        return value
    from lazyrt._tensor import tensor
    try:
        return tensor(value)
    except TypeError:
        raise TypeError(f"load_state_dict: '{name}' is a {type(value).__name__}, expected a tensor") from None


class Module:
    """Base class of all modules. Subclasses set their parameters and submodules as attributes
    in __init__ (after super().__init__()) and define forward()."""

    def __init__(self):
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ---- registration ----------------------------------------------------------------------

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign attributes before Module.__init__() is called")
        params, buffers, modules = self._parameters, self._buffers, self._modules
        self._replacing(name, value)
        # A leaf that requires grad is a parameter too (results of ops that require grad are not).
        is_param = isinstance(value, Parameter) or (
            isinstance(value, Tensor) and value.requires_grad and value.is_leaf)
        if is_param:
            self._remove(name, keep=params)
            params[name] = value
        elif isinstance(value, Module):
            self._remove(name, keep=modules)
            modules[name] = value
        elif name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(lazyrt.nn.Parameter, a tensor that requires grad, or None expected)")
            params[name] = None
        elif name in modules:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                "(lazyrt.nn.Module or None expected)")
            modules[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                "(lazyrt.Tensor or None expected)")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def _replacing(self, name, value):
        """A compiled step may have read the attribute being replaced: it retraces."""
        d = self.__dict__
        for store in (d, self._parameters, self._buffers, self._modules):
            if name in store:
                if store[name] is not value:
                    _C.invalidate_compiled_steps()
                return

    def _remove(self, name, keep=None):
        """Drops `name` from the plain attributes and from every store but `keep`: an entry
        replaced in its own store keeps its place, as in PyTorch (state_dict order)."""
        self.__dict__.pop(name, None)
        for d in (self._parameters, self._buffers, self._modules):
            if d is not keep:
                d.pop(name, None)
        if keep is not self._buffers:
            self._non_persistent_buffers.discard(name)

    def __getattr__(self, name):
        # Only called when normal lookup fails: parameters, buffers and submodules.
        d = self.__dict__
        for store in ("_parameters", "_buffers", "_modules"):
            if store in d and name in d[store]:
                return d[store][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        _C.invalidate_compiled_steps()
        for store in (self._parameters, self._buffers, self._modules):
            if name in store:
                del store[name]
                self._non_persistent_buffers.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._buffers) | set(self._modules))

    def _check_name(self, name, own, kind, call):
        """PyTorch's rules for a name being registered: a non-empty string without '.', and not
        an attribute of another kind already (`own` is the store it may already be in)."""
        if not isinstance(name, str):
            raise TypeError(f"{call}: the {kind} name should be a string, got {type(name).__name__}")
        if "." in name:
            raise KeyError(f"{call}: the {kind} name can't contain \".\", got '{name}'")
        if name == "":
            raise KeyError(f"{call}: the {kind} name can't be empty string \"\"")
        if name not in own and hasattr(self, name):
            raise KeyError(f"{call}: attribute '{name}' already exists")

    def register_parameter(self, name, param):
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        self._check_name(name, self._parameters, "parameter", "register_parameter")
        if param is not None and not isinstance(param, Tensor):
            raise TypeError(f"register_parameter: '{name}' must be a lazyrt tensor or None")
        if param is not None and not isinstance(param, Parameter) and not param.requires_grad:
            param = Parameter(param)
        self._replacing(name, param)
        self._remove(name, keep=self._parameters)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """Adds a buffer: a tensor of the module's state that is not a parameter. Persistent
        buffers are in state_dict(); non-persistent ones only in buffers() / named_buffers().
        As in PyTorch, the name must be new to the module or name a buffer already."""
        if "_buffers" not in self.__dict__:
            raise AttributeError("cannot assign buffer before Module.__init__() call")
        self._check_name(name, self._buffers, "buffer", "register_buffer")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"register_buffer: '{name}' must be a lazyrt tensor or None")
        self._replacing(name, tensor)
        self._remove(name, keep=self._buffers)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers.discard(name)
        else:
            self._non_persistent_buffers.add(name)

    def add_module(self, name, module):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module: '{name}' must be a lazyrt.nn.Module or None")
        self._check_name(name, self._modules, "module", "add_module")
        self._replacing(name, module)
        self._remove(name, keep=self._modules)
        self._modules[name] = module

    register_module = add_module

    # ---- traversal -------------------------------------------------------------------------

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """(dotted name, module) for this module and every submodule, depth first; a module
        reachable by several paths is listed once unless remove_duplicate is False."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def get_submodule(self, target):
        """The submodule at a dotted path ('' is the module itself), as in PyTorch."""
        m = self
        for item in target.split(".") if target else []:
            child = m._modules.get(item) if isinstance(m, Module) else None
            if child is None:
                raise AttributeError(f"{type(m).__name__} has no attribute `{item}` (looking up '{target}')")
            m = child
        return m

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, store, prefix, recurse):
        seen = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for module_prefix, m in modules:
            for name, t in getattr(m, store).items():
                # A tensor shared by several modules is listed once, as in PyTorch.
                if t is None or _C.tensor_id(t) in seen:
                    continue
                seen.add(_C.tensor_id(t))
                yield module_prefix + ("." if module_prefix else "") + name, t

    def named_parameters(self, prefix="", recurse=True):
        yield from self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True):
        yield from self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # ---- state -----------------------------------------------------------------------------

    def state_dict(self, destination=None, prefix="", keep_vars=False):
        """Parameters and persistent buffers by dotted name, in registration order. Values are
        detached handles on the same (immutable) data: no copy."""
        if destination is None:
            destination = OrderedDict()
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers:
                destination[prefix + name] = b if keep_vars else b.detach()
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination, prefix + name + ".", keep_vars)
        return destination

    def load_state_dict(self, state_dict, strict=True):
        """Copies every value in place (the tensors keep their identity). Every entry is checked
        first (names with strict, shapes); on any mismatch it raises and changes nothing.
        Values may be lazyrt tensors, NumPy arrays or PyTorch tensors; dtypes are converted."""
        own = self.state_dict(keep_vars=True)
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        if strict:
            errors += [f"missing key '{k}'" for k in missing]
            errors += [f"unexpected key '{k}'" for k in unexpected]
        copies = []
        for name, dst in own.items():
            if name not in state_dict:
                continue
            src = _as_lazyrt(state_dict[name], name)
            if tuple(src.shape) != tuple(dst.shape):
                errors.append(f"'{name}' has shape {tuple(src.shape)}, the module expects {tuple(dst.shape)}")
                continue
            copies.append((dst, src))
        if errors:
            raise _C.Error(f"load_state_dict of {type(self).__name__}: " + "; ".join(errors))
        with no_grad():
            for dst, src in copies:
                dst.copy_(src.detach())
        return _IncompatibleKeys(missing, unexpected)

    # ---- modes and gradients ---------------------------------------------------------------

    def train(self, mode=True):
        if self.training != bool(mode):
            _C.invalidate_compiled_steps()  # dropout and the like compute otherwise
        object.__setattr__(self, "training", bool(mode))
        for m in self.children():
            m.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def apply(self, fn):
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def to(self, *args, **kwargs):
        """As torch.nn.Module.to: to(device), to(dtype), to(device, dtype), to(tensor). Devices
        must be lazyrt's ('lazy' or 'cpu'; see lazyrt.device) and change nothing. A floating
        dtype casts every floating parameter, gradient and buffer. lazyrt cannot change a
        tensor's dtype in place, so a cast parameter is a new Parameter in the module (tied
        parameters stay tied): optimizers and compiled steps built before must be built again.
        Returns the module."""
        from lazyrt._tensor import _parse_to
        _, dtype, _, _ = _parse_to(args, kwargs, "Module.to")
        if dtype is not None:
            if not dtype.is_floating_point:
                raise TypeError(f"Module.to only accepts floating point dtypes, got {dtype}")
            self._cast_floating(dtype)
        return self

    def _cast_floating(self, dtype):
        cast = {}  # tensor_id -> the cast tensor, so a tensor shared by modules stays shared

        def convert(t, make):
            key = _C.tensor_id(t)
            if key not in cast:
                cast[key] = make(t)
            return cast[key]

        def new_parameter(p):
            new = Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
            if p.grad is not None:
                new.grad = p.grad.to(dtype)
            return new

        changed = False
        for m in self.modules():
            for store, make in ((m._parameters, new_parameter), (m._buffers, lambda b: b.detach().to(dtype))):
                for name, t in store.items():
                    if t is not None and t.is_floating_point() and t.dtype is not dtype:
                        store[name] = convert(t, make)
                        changed = True
        if changed:
            _C.invalidate_compiled_steps()

    def float(self):
        return self.to(_C.float32)

    def double(self):
        return self.to(_C.float64)

    def half(self):
        return self.to(_C.float16)

    def bfloat16(self):
        return self.to(_C.bfloat16)

    def cpu(self):
        return self

    # ---- printing --------------------------------------------------------------------------

    def extra_repr(self):
        return ""

    def __repr__(self):
        lines = []
        extra = self.extra_repr()
        if extra:
            lines += extra.split("\n")
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {child}")
        if not lines:
            return f"{type(self).__name__}()"
        if len(lines) == 1 and not self._modules:
            return f"{type(self).__name__}({lines[0]})"
        return f"{type(self).__name__}(\n  " + "\n  ".join(lines) + "\n)"
