"""lazyrt.torch.distributed: data-parallel PyTorch training steps, compiled by lazyrt.torch.

Every process runs the same step on its share of each batch; the gradients are averaged
across the processes inside the step, before the optimizer's update::

    import lazyrt.torch
    import lazyrt.torch.distributed as ldist

    ldist.init_process_group()                      # torchrun's variables (the launcher sets them)
    model = torch.nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @lazyrt.torch.compile
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        ldist.optimizer_step(opt)                   # reduce_gradients(opt), then opt.step()
        opt.zero_grad()
        return loss

    for x, y in my_share_of(data):                  # DistributedSampler
        step(x, y)

Start it with ``python3 -m lazyrt.distributed.run --nproc N train.py``. The spellings are
PyTorch/XLA's (``xm.reduce_gradients``, ``xm.optimizer_step``) and torch.distributed's
(``all_reduce`` changes its tensor in place and takes ``torch.distributed.ReduceOp``):

- ``reduce_gradients(optimizer)``: every gradient of the optimizer's parameters replaced in place
  by its mean over the ranks, gradients of one dtype travelling together in buckets of at most
  ``bucket_bytes`` (one collective each).
- ``optimizer_step(optimizer)``: ``reduce_gradients(optimizer)``, then ``optimizer.step()``.
- ``all_reduce(tensor, op=ReduceOp.SUM)``: ``tensor`` replaced in place by its reduction.
- ``all_reduce_coalesced(tensors, op)``: the reductions of several tensors, as new tensors.
- ``broadcast_parameters(model, src=0)``: rank ``src``'s parameters and buffers on every rank.

Inside a step compiled with `lazyrt.torch.compile` each call is captured as an op of the graph
(``torch.ops.lazyrt.all_reduce_coalesced``), lowered to lazyrt's collectives: the
communication runs inside the compiled executable, every rank replays one executable, and the
graph is the same on every rank (the rank is not part of it), so every rank finds it in the
cache. Outside a compiled step (in eager PyTorch, at a graph break, or where a step falls back
to eager) the same call communicates at once through the same process group.

**Rank 0's weights at the start.** A compiled step whose graph holds a collective gives every
rank rank 0's parameters and buffers of the modules it uses before its first run (as
DistributedDataParallel's constructor does), once per tensor; ``broadcast_parameters`` does it
explicitly (again after a checkpoint loaded on one rank only). Optimizer state is not
broadcast: load it on every rank.

**torch.distributed's spelling.** ``torch.distributed.init_process_group("lazyrt")`` (this
module registers the backend) makes torch.distributed's default group lazyrt's (joining it
through torch's rendezvous, or taking the one already joined): then
``torch.distributed.all_reduce(p.grad)`` inside a compiled step is captured as the op above, and
``broadcast`` and ``barrier`` run at once. torch.distributed's own backends ("gloo") run outside
the graph and cannot be captured; DistributedDataParallel, whose reducer runs inside autograd's
engine, cannot either.

Every rank must make the same calls in the same order, on tensors of the same shapes and
dtypes. Collectives are not differentiated: call them after ``backward()``.
"""

import weakref

import torch

import lazyrt
from lazyrt import _C
from lazyrt._C import _distributed as _d
from lazyrt.distributed import (  # noqa: F401  (the process group is lazyrt's, shared with lazyrt.distributed)
    DEFAULT_BUCKET_BYTES, DistributedSampler, barrier, destroy_process_group, get_local_rank, get_rank,
    get_world_size, init_process_group, is_initialized)

__all__ = [
    "init_process_group", "is_initialized", "get_rank", "get_world_size", "get_local_rank", "barrier",
    "destroy_process_group", "all_reduce", "all_reduce_coalesced", "reduce_gradients", "optimizer_step",
    "broadcast_parameters", "DistributedSampler", "DEFAULT_BUCKET_BYTES", "ProcessGroupLazyrt",
]

# ---- the op the capture records ------------------------------------------------------------

_LIB = torch.library.Library("lazyrt", "DEF")
_LIB.define("all_reduce_coalesced(Tensor[] tensors, str op, int bucket_bytes) -> Tensor[]")


def _eager_all_reduce_coalesced(tensors, op, bucket_bytes):
    """The op on real tensors: lazyrt's collectives on the tensors' memory, run now."""
    lazy = [lazyrt.from_torch(t) for t in tensors]
    out = _d.all_reduce_coalesced(lazy, op, bucket_bytes)
    lazyrt.sync(out)
    return [lazyrt.to_torch(r) for r in out]


def _meta_all_reduce_coalesced(tensors, op, bucket_bytes):
    return [torch.empty_like(t) for t in tensors]


_LIB.impl("all_reduce_coalesced", _eager_all_reduce_coalesced, "CPU")
_LIB.impl("all_reduce_coalesced", _meta_all_reduce_coalesced, "Meta")
_OP = torch.ops.lazyrt.all_reduce_coalesced.default

#: The ops of lazyrt.torch's graphs that communicate (a capture holding one broadcasts the
#: modules' tensors first, see `_before_first_run`).
COLLECTIVE_OPS = frozenset([_OP])


def _lower_all_reduce_coalesced(e, tensors, op, bucket_bytes):
    return _d.all_reduce_coalesced(list(tensors), op, int(bucket_bytes))


def _register_lowering():
    from lazyrt.torch._lower import lowering
    lowering(_OP)(_lower_all_reduce_coalesced)


_register_lowering()

# ---- the user's calls ----------------------------------------------------------------------

_OPS = {"sum": "sum", "mean": "mean", "avg": "mean", "max": "max", "min": "min"}


def _op_name(op):
    """A reduction as lazyrt names it, from a name or a torch.distributed.ReduceOp."""
    if isinstance(op, str):
        name = _OPS.get(op.lower())
    else:
        import torch.distributed as tdist
        # A ReduceOp object (as the process group hands it on) names its kind in .op; the class
        # attributes (ReduceOp.SUM) are the kinds themselves.
        kind = getattr(op, "op", op)
        name = {tdist.ReduceOp.SUM: "sum", tdist.ReduceOp.AVG: "mean", tdist.ReduceOp.MAX: "max",
                tdist.ReduceOp.MIN: "min"}.get(kind) if tdist.is_available() else None
    if name is None:
        raise _C.Error(f"all_reduce: op={op!r} is not a reduction lazyrt has (sum, mean/AVG, max, min)")
    return name


def _torch_tensors(tensors, call):
    tensors = list(tensors)
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{call}: expects torch tensors, got {type(t).__name__}")
    return tensors


def all_reduce_coalesced(tensors, op="sum", bucket_bytes=DEFAULT_BUCKET_BYTES):
    """The reduction of each of ``tensors`` over the ranks, as new tensors (the tensors of one
    dtype travel in buckets of at most ``bucket_bytes``)."""
    tensors = _torch_tensors(tensors, "all_reduce_coalesced")
    if not tensors:
        return []
    with torch.no_grad():
        return list(_OP(tensors, _op_name(op), int(bucket_bytes)))


def all_reduce(tensor, op="sum", group=None, async_op=False):
    """``tensor`` replaced in place by its reduction over the ranks (``op``: a
    torch.distributed.ReduceOp or 'sum', 'mean', 'max', 'min'), as torch.distributed.all_reduce.
    ``group`` must be None (the default group); ``async_op`` is refused."""
    if group is not None or async_op:
        raise _C.Error("all_reduce: lazyrt runs its collectives in the default group, in order (group=None, "
                       "async_op=False)")
    (reduced,) = all_reduce_coalesced([tensor], op, DEFAULT_BUCKET_BYTES)
    with torch.no_grad():
        tensor.copy_(reduced)


def _optimizer_grads(optimizer):
    seen, grads = set(), []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in seen and p.grad is not None:
                seen.add(id(p))
                grads.append(p.grad)
    return grads


def reduce_gradients(optimizer, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """PyTorch/XLA's ``xm.reduce_gradients``: the gradient of every parameter ``optimizer``
    updates replaced in place by its mean over the ranks (parameters without a gradient are
    skipped: every rank must have the same ones). Call it after ``backward()``, before
    ``optimizer.step()``."""
    grads = _optimizer_grads(optimizer)
    reduced = all_reduce_coalesced(grads, "mean", bucket_bytes)
    with torch.no_grad():
        for g, r in zip(grads, reduced):
            g.copy_(r)


def optimizer_step(optimizer, optimizer_args=None, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """PyTorch/XLA's ``xm.optimizer_step``: ``reduce_gradients(optimizer)``, then
    ``optimizer.step(**optimizer_args)``; returns what step() returns."""
    reduce_gradients(optimizer, bucket_bytes)
    return optimizer.step(**(optimizer_args or {}))


# Tensors whose values came from rank 0 (by broadcast_parameters or a compiled step's first
# run), by id while they live: a later capture does not broadcast them again. (A WeakSet would
# compare tensors with ==, which is elementwise.)
_BROADCAST = {}


def _mark_broadcast(t):
    key = id(t)
    _BROADCAST[key] = weakref.ref(t, lambda _: _BROADCAST.pop(key, None))


def _was_broadcast(t):
    ref = _BROADCAST.get(id(t))
    return ref is not None and ref() is t


def _module_tensors(params):
    if isinstance(params, torch.nn.Module):
        return list(params.parameters()) + list(params.buffers())
    if isinstance(params, torch.Tensor):
        return [params]
    out = []
    for p in params:
        out += _module_tensors(p) if isinstance(p, torch.nn.Module) else _torch_tensors([p], "broadcast_parameters")
    return out


def broadcast_parameters(params, src=0):
    """Sets every tensor of ``params`` (a module's parameters and buffers, modules, or tensors)
    in place to rank ``src``'s value: the ranks start from the same weights. Runs now (one
    graph of broadcasts)."""
    tensors, seen = [], set()
    for t in _module_tensors(params):
        if id(t) not in seen:
            seen.add(id(t))
            tensors.append(t)
    if not tensors:
        return
    lazy = [_d.broadcast(lazyrt.from_torch(t), int(src)) for t in tensors]
    lazyrt.sync(lazy)
    with torch.no_grad():
        for t, v in zip(tensors, lazy):
            t.copy_(lazyrt.to_torch(v))
            _mark_broadcast(t)


def _before_first_run(world):
    """Called by lazyrt.torch.compile before the first run of a capture that communicates:
    every parameter and buffer of the step's modules not yet broadcast gets rank 0's value."""
    if not is_initialized():
        return
    tensors = [t for t in list(world.params) + list(world.buffers) if not _was_broadcast(t)]
    if tensors:
        broadcast_parameters(tensors, 0)


# ---- torch.distributed's backend "lazyrt" --------------------------------------------------

def _completed(result=None):
    fut = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)


def _register_backend():
    """``torch.distributed.init_process_group("lazyrt")``: torch.distributed's calls over lazyrt's
    process group, so ``torch.distributed.all_reduce(p.grad)`` in a step compiled by
    lazyrt.torch is captured as the all_reduce above (as PyTorch/XLA's "xla" backend does)."""
    import torch.distributed as tdist
    if not tdist.is_available():
        return None
    from torch._C._distributed_c10d import ProcessGroup

    class ProcessGroupLazyrt(ProcessGroup):
        """torch.distributed's process group over lazyrt's: allreduce (captured inside a step
        compiled by lazyrt.torch; at once outside), broadcast and barrier (at once). Operations
        run in order, so every Work is complete when returned."""

        def __init__(self, rank, size):
            super().__init__(rank, size)

        def getBackendName(self):
            return "lazyrt"

        def allreduce(self, tensors, opts=None):
            op = opts.reduceOp if opts is not None else tdist.ReduceOp.SUM
            reduced = all_reduce_coalesced(tensors, op)
            with torch.no_grad():
                for t, r in zip(tensors, reduced):
                    t.copy_(r)
            return _completed(tensors)

        def allreduce_coalesced(self, tensors, opts=None):
            return self.allreduce(tensors, opts)

        def broadcast(self, tensors, opts=None):
            broadcast_parameters(list(tensors), opts.rootRank if opts is not None else 0)
            return _completed(tensors)

        def barrier(self, opts=None):
            barrier()
            return _completed()

    def create(store, rank, size, timeout):
        if is_initialized():
            if (get_rank(), get_world_size()) != (rank, size):
                raise _C.Error(f"init_process_group('lazyrt'): lazyrt's process group is rank {get_rank()} of "
                               f"{get_world_size()}, torch.distributed asks for rank {rank} of {size}")
        else:
            # Rank 0 serves lazyrt's rendezvous on a port of its own, published in torch's store.
            import os
            import socket
            if rank == 0:
                with socket.socket() as s:
                    s.bind(("", 0))
                    port = s.getsockname()[1]
                store.set("lazyrt/rendezvous", f"{os.environ.get('MASTER_ADDR') or socket.gethostname()}:{port}")
            where = store.get("lazyrt/rendezvous").decode()
            init_process_group(init_method=f"tcp://{where}", rank=rank, world_size=size, timeout=timeout)
        return ProcessGroupLazyrt(rank, size)

    tdist.Backend.register_backend("lazyrt", create, devices=["cpu"])
    return ProcessGroupLazyrt


ProcessGroupLazyrt = _register_backend()
