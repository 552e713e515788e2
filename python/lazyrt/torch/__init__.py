"""lazyrt.torch: unmodified PyTorch training steps, captured once and replayed by lazyrt.

    import lazyrt.torch

    model = torch.nn.Linear(5, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    @lazyrt.torch.compile
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for x, y in data:
        loss = step(x, y)      # first call: capture + compile; later calls: replay

**What a step touches**: the torch modules and optimizers the step reaches, plus any given as
``compile(fn, model=..., optimizer=...)``: found in its arguments (positional or keyword, inside
tuples, lists and dicts), its bound self, its closure and the globals its code names, and in
what those hold up to three steps deep — a module's own attributes (an optimizer kept as
``self.opt``), lists, tuples, dicts, dataclasses, namespaces and objects of the program's own
classes (``state.model``, ``nets["G"]``, ``opts[0]``), and the program's own helper functions
the step calls (their closures and the globals they name). They are found again whenever what
that search read has changed (``self.opt`` rebound, another model passed, a helper rebound). An optimizer whose
``step()`` or ``zero_grad()`` runs in the step but that was neither found nor given (held only
by a default argument, or deeper) is refused with ``CaptureError`` naming it. Their
parameters, buffers, the parameters' ``.grad``,
the optimizers' state and learning rates, and the tensors among the arguments are the inputs
of the captured graph. Other tensors the step reads (a class-weight tensor in a closure) are
read anew on every call too. A leaf tensor that requires grad and belongs to no module, met on
that search (weights trained by hand: ``w -= lr * w.grad`` under ``torch.no_grad()``), is a
parameter of its own; one out of its reach (a module in a default argument) is refused (pass
its module as ``model=``). A sparse tensor runs the call in eager.

**Capture** (`_capture`): the first call with a given signature traces the step with
``make_fx`` over fake tensors — with the modules' parameters and buffers, the gradients, the
optimizers' state and learning rates swapped for graph inputs — and traces that graph again
under ``functionalize``: a pure aten graph whose ``aten.copy_(input, value)`` nodes say what
the step changed in place. Nothing runs while capturing and no torch tensor changes (a capture
that fails leaves everything as it was). SGD (momentum, nesterov, dampening, weight decay,
maximize), Adam and AdamW (amsgrad, maximize, weight decay), Adagrad, Adamax, NAdam, RAdam,
RMSprop (centered, momentum, weight decay, maximize), Adadelta (weight decay, maximize) and ASGD run
their own ``step()`` with the update arithmetic replaced by an equivalent that reads the learning
rate and the step count as tensors (`_optim`): the learning rate is a graph input and no
``.item()`` is needed.
``foreach=True`` groups are captured with the same per-tensor arithmetic (and ``zero_grad``'s
``torch._foreach_zero_`` as one ``zero_`` per gradient). Other optimizers run their own code:
their learning rate is a constant of the capture, and a Python number in their state makes
every step a new capture; a ``.item()`` in their step cannot be captured. LBFGS's step, which
reads the loss with ``float()`` and decides by values how many evaluations to run, cannot be
captured: such a step runs in PyTorch eager, warned once (``torch.compile(step,
backend="lazyrt")`` compiles it, breaking the graph at those reads).
A replay runs no Python. Tensors the step sets on its modules (a cached mask) are results of
the capture, set again after every run. Other Python state a step changes — a value or the
contents of a list, dict or set it reaches directly (its closure's variables, the globals its
code names, its bound self's attributes, its modules' other attributes) — is put back after
the capture and that call runs in PyTorch eager (setting up what a first call sets up); a
step whose next capture changes such state again is refused with `CaptureError`, as is one
that changes the optimizers' param groups (a learning-rate scheduler stepped inside it).

A fresh model (``.grad`` None) and a fresh optimizer (no state) are captured as if they had
zero gradients and the optimizer's initial state, so the first step and the later ones share
one graph; the stand-in is checked on the captured graph and dropped where it would change
what eager computes (see `_capture`).

**Lowering** (`_lower`): an interpreter maps each aten op of the graph to lazyrt ops
(``lazyrt.torch.supported_ops()`` lists them; batch norm is captured through PyTorch's own
decomposition, and the backward of convolutions and average pooling is the vector-Jacobian
product of the lowered forward by lazyrt's autograd; 1-d convolutions are 2-d ones over a unit
height, and a transposed convolution is the direct one's vector-Jacobian product with respect
to its input; dropout and other random ops draw from lazyrt's generator, whose state every
replay advances, not from torch's stream); it runs inside ``lazyrt.compile_step``, which
records it once and replays the compiled lazyrt graph on later calls. An op without a lowering
(or with attributes its lowering does not take: a 3-d convolution)
is a graph break: it runs in PyTorch eager on the values the compiled piece before it gave, and
the graph's other ops run as compiled pieces around it (each its own ``compile_step``); every
such op run counts in ``lazyrt.metrics.counter("GraphBreak")`` and the first capture that
meets it warns once naming it (`GraphBreakWarning`). Loop bodies cannot break: there it raises
`UnsupportedOperatorError`. A step that reads a value (``.item()``, ``if loss > 0``) or makes a
shape that depends on values (``x[x > 0]``) cannot be replayed: its calls run in PyTorch eager,
warned once (counted as ``EagerStep``).

**A call**: the torch tensors are handed to lazyrt without a copy (``lazyrt.from_torch``; a
tensor still at the same address and contiguous reuses the view handed over on the last call),
and the compiled step runs. The memory of every tensor the step changes in place (parameters,
buffers, gradients, optimizer state) is lent to lazyrt for writing: the replay writes the new
values into the user's tensors themselves (same tensors, same ``data_ptr()``, no copy), and
each written tensor's version counter is bumped as eager's in-place update bumps it. A value
that cannot land in place (a tensor that is not contiguous, a gradient that was None, a step
with graph breaks) is copied in after the run (``copy_``). Gradients and state entries the step
replaced or created become new tensors, as in eager; gradients it set to None are None. The
capture treats its inputs as separate values: a call whose inputs share memory, one of them
written by the step (parameters that are overlapping views of one storage), runs the step in
PyTorch eager instead, counted in ``lazyrt.metrics.counter("EagerStep")`` and warned about once; so
does a call given an argument that requires grad (its ``.grad`` is made as eager makes it). Results are new torch tensors, not
attached to autograd (``loss.item()`` after the call, not inside the step). The compiled
function keeps the views of the last call's tensors, hence their memory, until its next call.

**Guards**: a call captures again when any of these differ from every capture so far: the
arguments' structure, shapes, dtypes, ``requires_grad`` and non-tensor values; which tensors are
the modules' parameters and buffers (identity, shapes, dtypes, ``requires_grad``); any module's
``training`` flag; which gradients exist and their shapes; the optimizers' state layout and
non-tensor state values, and every hyperparameter except the learning rate (a scheduler
changing ``lr`` does not recapture); the grad mode, the default dtype and the CPU autocast mode
and dtype the step is called under (``torch.autocast`` inside the step is captured as any other
code: its casts are ops of the graph); and the **Python values the step reads** (`_reads`),
which a replay cannot read again: plain numbers, strings, bools, None and tuples of them (also
torch dtypes and NumPy scalars) in the
globals its code names and its closure's cells (a global learning rate of a hand-written SGD
update, a loss weight rebound with ``nonlocal``), in the same places of the user functions it
calls, and in the attributes its code (and the ``forward`` and methods of the modules' and
objects' classes) reads of its bound self, of objects with a ``__dict__`` found in those places
(``args.clip``) and of every submodule (``self.scale``, ``nn.ELU``'s ``alpha``),
the instance's own value or its class's, and the items of tuples, lists and dicts found there
(``cfg["clip"]``); the objects followed to them, and the functions (``act = torch.relu``, a
function of the program), classes and other objects found there, are guarded by identity.
Each distinct value is a capture of its own, kept with the others: a value that changes every
call (a schedule computed in Python) recaptures every call; pass it as a tensor argument, or use
an optimizer's learning rate, which is a graph input. **Tensors** the step reads from those
places (a mask in a global, ``cfg["mask"]``, a module's state kept in a plain attribute and set
by its forward) are inputs read from their place on every call, as Dynamo reads a global
tensor: another tensor of the same shape, dtype and device there is what the next call reads,
without a capture; another shape is another capture. Attributes are found by name, so an
attribute of a reached object that changes every call and shares its name with one the code
reads recaptures too. Not guarded: values read through a computed name (``getattr``), the
contents of lists and dicts of more than 256 items and of other containers (guarded by
identity), ``__slots__``, the globals of library code (torch, NumPy, the standard library),
and any Python side effect of the step beyond those refused at capture (it runs only when
captured: changes to other objects' attributes, printing). A call with
positional arguments on the same modules and optimizers as its recent calls (the last 16 that
differed) is checked first against theirs, most recent first, by a cheaper key over the same
facts (identities of the modules' parameters, buffers and submodules, shapes, dtypes, flags,
plain hyperparameter and state values, modes, the values read), checked in C++ (with what a
plain function reaches: its code, closure cells and the globals it names, by identity); a call
that matches none, or a value that is not a plain number, string or tuple of them, takes the
full signature. A compiled function holds no model the program dropped: captures of a world
whose modules are gone are let go at the next capture.

**Data-parallel training** (`lazyrt.torch.distributed`): a step that calls
``lazyrt.torch.distributed.reduce_gradients(optimizer)`` (or ``optimizer_step(optimizer)``, or
``all_reduce(p.grad)``) between ``backward()`` and ``optimizer.step()`` averages the gradients
over the processes of lazyrt's process group inside the compiled graph; such a step gives
every rank rank 0's parameters and buffers before its first run.

**torch.compile** (`_dynamo`): importing lazyrt.torch registers the Dynamo backend
``"lazyrt"``: ``torch.compile(fn_or_module, backend="lazyrt")`` leaves capture, guards,
recompiles and graph breaks to Dynamo, and runs each graph AOTAutograd makes of what Dynamo
captured (forward, backward, or inference: an optimizer step, whose updates of parameters and
state land in the user's tensors) through the same lowering and ``lazyrt.compile_step``, compiled
once and replayed on every call. ``lazyrt.metrics.counter("DynamoGraph")`` counts the lazyrt
graphs compiled, ``counter("DynamoCall")`` their calls.

**The lazyrt device** (`_device`): ``torch.device("lazyrt")`` (``lazyrt.torch.device()``), as
PyTorch/XLA's device: ``model.to(device)``, ``torch.randn(..., device=device)``, and every op on
such tensors records lazyrt ops (views, in-place ops, autograd and torch.optim as in eager);
``lazyrt.torch.sync()`` (``mark_step``) computes every pending device tensor as one compiled,
cached graph, and ``.cpu()``, ``.item()`` and printing compute what they read. An op without
a lowering runs on the CPU and comes back (``GraphBreak``, warned once).
``torch._higher_order_ops.while_loop`` on device tensors is one lazyrt loop, and
``torch.autocast("lazyrt")`` follows PyTorch's device autocast policy. PyTorch/XLA's
cached-graph calls take device tensors: ``_get_graph_hash``, ``_xla_warm_up_cache``,
``_get_tensors_xla_device_data_node``, ``_xla_get_tensor_id`` and ``_run_cached_graph`` with a
``GraphInputMatcher`` replay the step traced since the last ``sync()``, writing every tensor it
updated in place (parameters, optimizer state) back on every replay; a step whose optimizer
keeps state on the CPU (``capturable=False``), made its state from the step's values (SGD's
first step), or changed a hyperparameter since the trace raises rather than replay stale, as
does one that drew random values on the host (``torch.randn(..., device=)``), ran an op on the
CPU (a graph break) or read a value (``.item()``).
"""

from lazyrt.torch._capture import CaptureError
from lazyrt.torch._loops import fori_loop, scan, while_loop
from lazyrt.torch._lower import LOWERINGS as _LOWERINGS, GraphBreakWarning, UnsupportedOperatorError
from lazyrt.torch._step import CompiledFunction, compile, discover
from lazyrt.torch import distributed  # noqa: F401  (lazyrt.torch.distributed)
from lazyrt.torch import _dynamo  # noqa: F401  (registers torch.compile's backend="lazyrt")
from lazyrt.torch._device import device, sync, mark_step, from_device, to_device
from lazyrt.torch._device import (_get_graph_hash, _xla_warm_up_cache, _get_tensors_xla_device_data_node,  # noqa: F401
                                  _run_cached_graph, _xla_get_tensor_id)
from lazyrt._replay import GraphInputMatcher
from lazyrt.torch import _device as _device_module


def supported_ops():
    """The names of the aten ops lazyrt.torch lowers (sorted)."""
    from lazyrt.torch._lower import op_name
    return sorted({op_name(op) for op in _LOWERINGS})


__all__ = ["compile", "CompiledFunction", "CaptureError", "UnsupportedOperatorError", "GraphBreakWarning",
           "supported_ops", "discover", "while_loop", "fori_loop", "scan", "distributed",
           "device", "sync", "mark_step", "from_device", "to_device", "GraphInputMatcher"]

try:  # torch.device("lazyrt") from the import on, where PyTorch's PrivateUse1 device type is free
    _device_module._ensure()
except RuntimeError:
    pass  # lazyrt.torch.device() raises saying why
