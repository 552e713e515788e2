"""lazyrt.distributed: data-parallel training across processes (and hosts) over Gloo.

Every process runs the same program on its share of the data; the processes form a group::

    import lazyrt.distributed as dist
    dist.init_process_group()              # torchrun's variables: MASTER_ADDR, MASTER_PORT,
                                           # RANK, WORLD_SIZE (and LOCAL_RANK)
    dist.broadcast_parameters(model)       # every rank starts from rank 0's weights
    for x, y in batches:                   # this rank's share (DistributedSampler)
        loss = loss_fn(model(x), y)
        loss.backward()
        dist.reduce_gradients(optimizer)   # the mean gradient over the ranks
        optimizer.step()
        optimizer.zero_grad()
        lazyrt.mark_step()

Start it with ``python3 -m lazyrt.distributed.run --nproc N script.py`` (one such launcher per
host, with the same ``--master_addr``, for several hosts), or under any launcher that sets the
variables above. ``init_method="file:///a/directory"`` (with ``rank`` and ``world_size``)
meets in a directory every process can see instead.

The collectives (all_reduce, all_gather, reduce_scatter, broadcast) return new lazy tensors:
they are ops of the graph and communicate inside the compiled executable when the graph runs,
so a compiled step (lazyrt.compile_step) with reduce_gradients replays on every rank as one
executable. Every rank must issue the same collectives in the same order (the graph orders its
collectives by a token); the graphs hash alike on every rank (the rank is not part of them), so
the cache holds one entry for all. A peer that dies or stops answering makes every collective
and barrier of the others raise lazyrt.Error within the group's timeout instead of hanging.
Collectives are not differentiated, and cannot run inside loop bodies.

For PyTorch steps compiled by lazyrt.torch, ``lazyrt.torch.distributed`` has the same calls for
torch tensors (``reduce_gradients(optimizer)``, ``optimizer_step(optimizer)``, an in-place
``all_reduce``), captured into the compiled graph, over this same process group.
"""

import datetime as _datetime

from lazyrt import _C
from lazyrt._C import _distributed as _d
from lazyrt.distributed.sampler import DistributedSampler  # noqa: F401

__all__ = [
    "init_process_group", "is_initialized", "get_rank", "get_world_size", "get_local_rank", "barrier",
    "destroy_process_group", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_reduce_coalesced",
    "all_reduce_gradients",
    "reduce_gradients", "broadcast_parameters", "DistributedSampler", "DEFAULT_BUCKET_BYTES",
]

DEFAULT_BUCKET_BYTES = _d.DEFAULT_BUCKET_BYTES

is_initialized = _d.is_initialized
get_rank = _d.get_rank
get_world_size = _d.get_world_size
get_local_rank = _d.get_local_rank
barrier = _d.barrier
destroy_process_group = _d.destroy_process_group
all_reduce = _d.all_reduce
all_gather = _d.all_gather
reduce_scatter = _d.reduce_scatter
broadcast = _d.broadcast


def init_process_group(backend="gloo", init_method=None, rank=None, world_size=None,
                       timeout=_datetime.timedelta(minutes=5)):
    """Joins the process group. ``init_method``: ``"env://"`` (the default: MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK as torchrun sets them; rank 0 serves the
    rendezvous), ``"tcp://host:port"`` (rank 0 serves it there) or ``"file:///a/directory"``. ``rank`` and ``world_size`` override RANK and
    WORLD_SIZE. ``timeout`` (a timedelta or seconds) bounds joining, every barrier and every
    collective."""
    if backend not in (None, "gloo"):
        raise _C.Error(f"init_process_group: backend={backend!r} is not available (lazyrt runs its collectives "
                       "through Gloo: backend='gloo')")
    if isinstance(timeout, _datetime.timedelta):
        timeout = timeout.total_seconds()
    _d.init_process_group(init_method or "env://", -1 if rank is None else int(rank),
                          -1 if world_size is None else int(world_size), float(timeout))


def _tensors(params, call):
    if hasattr(params, "parameters") and callable(params.parameters):
        out = list(params.parameters())
        if hasattr(params, "buffers"):
            out += list(params.buffers())
        return out
    out = list(params)
    for t in out:
        if not isinstance(t, _C.Tensor):
            raise _C.Error(f"{call}: expects lazyrt tensors (or a module), got {type(t).__name__}")
    return out


def all_reduce_coalesced(tensors, op="sum", bucket_bytes=DEFAULT_BUCKET_BYTES):
    """The reduction of each of ``tensors`` over the ranks, as new tensors: the tensors of one
    dtype travel together in flat buffers of at most ``bucket_bytes`` (one all_reduce each) and
    come back in their own shapes. Lazy, as all_reduce."""
    return _d.all_reduce_coalesced(_tensors(tensors, "all_reduce_coalesced"), op, int(bucket_bytes))


def all_reduce_gradients(params, op="mean", bucket_bytes=DEFAULT_BUCKET_BYTES):
    """Replaces the gradient of each parameter in ``params`` (tensors, or a module's parameters)
    in place by its reduction over the ranks (the mean by default). Gradients of one dtype travel
    together in flat buffers of at most ``bucket_bytes``; parameters without a gradient are
    skipped. Lazy: call it between backward() and the optimizer's step()."""
    if hasattr(params, "parameters") and callable(params.parameters):
        params = list(params.parameters())
    _d.all_reduce_gradients(_tensors(params, "all_reduce_gradients"), op, int(bucket_bytes))


def reduce_gradients(optimizer, bucket_bytes=DEFAULT_BUCKET_BYTES):
    """PyTorch/XLA's ``xm.reduce_gradients``: the gradients of every parameter the optimizer
    updates, averaged over the ranks, before ``optimizer.step()``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    _d.all_reduce_gradients(params, "mean", int(bucket_bytes))


def broadcast_parameters(params, src=0):
    """Sets every tensor of ``params`` (tensors, or a module's parameters and buffers) in place to
    rank ``src``'s value, and computes them: the ranks start from the same weights."""
    _d.broadcast_parameters(_tensors(params, "broadcast_parameters"), int(src))
