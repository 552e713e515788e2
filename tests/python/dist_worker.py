"""One process of a test of lazyrt.distributed (tests/python/test_distributed.py starts several).

    dist_worker.py SCENARIO OUT_DIR

reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as the launcher sets them, runs the scenario
and writes what it saw to OUT_DIR/rank<r>.npz (arrays) and OUT_DIR/rank<r>.json (facts); the
test compares them with closed-form results.
"""

import json
import os
import sys
import time

import numpy as np

import lazyrt as lr
import lazyrt.distributed as dist

SCENARIO, OUT = sys.argv[1], sys.argv[2]
TIMEOUT = float(os.environ.get("DIST_TEST_TIMEOUT", "20"))


def contribution(rank, shape, dtype=np.float32):
    """Rank r's tensor: known values, distinct per rank and element."""
    n = int(np.prod(shape))
    return ((np.arange(n) % 7 - 3) * (rank + 1) + 0.25 * rank).reshape(shape).astype(dtype)


def save(rank, arrays, facts):
    np.savez(os.path.join(OUT, f"rank{rank}.npz"), **arrays)
    with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
        json.dump(facts, f)


def collectives():
    t0 = time.perf_counter()
    dist.init_process_group(timeout=TIMEOUT)
    join_ms = (time.perf_counter() - t0) * 1e3
    rank, world = dist.get_rank(), dist.get_world_size()
    out, facts = {}, {"rank": rank, "world": world, "local_rank": dist.get_local_rank(), "join_ms": join_ms}
    x = lr.tensor(contribution(rank, (4 * world, 3)))
    for op in ("sum", "mean", "max", "min"):
        out[f"all_reduce_{op}"] = dist.all_reduce(x, op=op)
        out[f"reduce_scatter_{op}"] = dist.reduce_scatter(x, op=op)
    out["all_gather"] = dist.all_gather(x)
    out["broadcast"] = dist.broadcast(x, src=world - 1)
    xi = lr.tensor(contribution(rank, (5,), np.int64))
    out["all_reduce_sum_i64"] = dist.all_reduce(xi)
    # 16-bit floats reduce in f32 and round once per addition; these sums are exact in bf16.
    out["all_reduce_sum_bf16"] = dist.all_reduce(lr.tensor(contribution(rank, (6,))).to(lr.bfloat16)).float()
    out["all_reduce_max_f64"] = dist.all_reduce(lr.tensor(contribution(rank, (2, 2), np.float64)), op="max")
    # A pending input: the collective joins the graph that computes it.
    out["all_reduce_pending"] = dist.all_reduce(x * 2 + 1)
    facts["graph_hash"] = str(lr.graph_hash(list(out.values())))
    lr.mark_step()
    before = lr.metrics.counter("UncachedCompile")
    # The same program again: one graph, found in the cache.
    again = dist.all_reduce(x * 2 + 1)
    facts["again_equal"] = bool(np.array_equal(again.numpy(), out["all_reduce_pending"].numpy()))
    facts["token_chain_compiles"] = lr.metrics.counter("UncachedCompile") - before
    try:
        dist.reduce_scatter(lr.zeros(4 * world + 1, 3))
        facts["rs_error"] = None
    except lr.Error as e:
        facts["rs_error"] = str(e)
    dist.barrier()
    arrays = {k: v.numpy() for k, v in out.items()}
    dist.destroy_process_group()
    save(rank, arrays, facts)


def dead_peer():
    dist.init_process_group(timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    # Every rank has joined before one dies: a rank's init_process_group can return while a
    # peer's connections to it are still being made, and a death then fails that peer's join.
    dist.barrier()
    if rank == world - 1:
        time.sleep(float(os.environ.get("DIST_TEST_DIE_AFTER", "0")))
        os._exit(7)  # dies without a word
    x = lr.tensor(contribution(rank, (1000 * world,)))
    op = getattr(dist, os.environ.get("DIST_TEST_OP", "all_reduce"))
    t0 = time.perf_counter()
    facts = {"rank": rank}
    try:
        op(x).numpy()
        facts["error"] = None
    except lr.Error as e:
        facts["error"] = str(e)
    facts["seconds"] = time.perf_counter() - t0
    # This rank lives on a while: the others must learn of the failure from it now, not when
    # its connections close at its exit.
    time.sleep(4)
    try:
        dist.barrier()
        facts["after"] = None
    except lr.Error as e:
        facts["after"] = str(e)
    dist.destroy_process_group()
    save(rank, {}, facts)


def dead_peer_replay():
    """A replayed step with two collectives: w is updated from the first one's result, t is
    reduced in place by the second (the last). Two calls on every rank; then the last rank
    takes part in the third call's first collective only and dies, so the others fail in the
    second collective, after w's new value was computed."""
    dist.init_process_group(timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    n = 1000 * world
    w = lr.tensor(contribution(rank, (n,)))
    t = lr.tensor(contribution(rank, (n,)) * 2)
    lr.mark_step()

    def step():
        r = dist.all_reduce(w * 1.0, "mean")
        w.sub_(r * 0.5)
        t.copy_(dist.all_reduce(t))
        return w[:1] * 2.0

    compiled = lr.compile_step(step, ())
    for _ in range(2):
        compiled()
    arrays = {"w": w.numpy().copy(), "t": t.numpy().copy()}
    facts = {"rank": rank, "traces": compiled.traces}
    dist.barrier()
    if rank == world - 1:
        dist.all_reduce(w * 1.0, "mean").numpy()  # the survivors' first collective of the call
        os._exit(7)
    w_ptr = w.data_ptr()
    try:
        compiled()
        facts["error"] = None
    except lr.Error as e:
        facts["error"] = str(e)
    facts["w_same_buffer"] = w.data_ptr() == w_ptr
    arrays["w_after"] = w.numpy().copy()
    dist.destroy_process_group()
    save(rank, arrays, facts)


def dp_model():
    return lr.nn.Sequential(lr.nn.Linear(6, 8), lr.nn.Tanh(), lr.nn.Linear(8, 3))


GLOBAL_BATCH, STEPS = 8, 6


def global_batch(k):
    """Step k's whole batch, the same on every rank (each takes its rows)."""
    rng = np.random.default_rng(100 + k)
    return (rng.standard_normal((GLOBAL_BATCH, 6)).astype(np.float32),
            rng.standard_normal((GLOBAL_BATCH, 3)).astype(np.float32))


def dp_train():
    """Data-parallel SGD with momentum: rank 0's initial weights broadcast, each rank's rows of
    each step's batch, gradients averaged by reduce_gradients; the first half traced (mark_step),
    the second half replayed by compile_step."""
    dist.init_process_group(timeout=TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    lr.manual_seed(1234 + rank)  # a different start on every rank, until the broadcast
    model = dp_model()
    dist.broadcast_parameters(model)
    arrays = {f"init.{n}": p.numpy().copy() for n, p in model.named_parameters()}
    opt = lr.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    share = GLOBAL_BATCH // world
    bucket = int(os.environ.get("DIST_TEST_BUCKET", "100"))

    def step(x, y):
        loss = lr.nn.functional.mse_loss(model(x), y)
        loss.backward()
        dist.reduce_gradients(opt, bucket_bytes=bucket)
        opt.step()
        opt.zero_grad()
        return loss

    def local(k):
        x, y = global_batch(k)
        return lr.tensor(x[rank * share:(rank + 1) * share]), lr.tensor(y[rank * share:(rank + 1) * share])

    facts = {"rank": rank}
    half = STEPS // 2
    for k in range(half):
        step(*local(k))
        lr.mark_step()
    compiled = lr.compile_step(step, local(half))
    compiles, replays, times = [], [], []
    for k in range(half, STEPS):
        before = (lr.metrics.counter("UncachedCompile"), lr.metrics.counter("ReplayGraph"))
        t0 = time.perf_counter()
        compiled(*local(k))
        times.append(time.perf_counter() - t0)
        compiles.append(lr.metrics.counter("UncachedCompile") - before[0])
        replays.append(lr.metrics.counter("ReplayGraph") - before[1])
    facts.update(traces=compiled.traces, compiles=compiles, replays=replays, step_seconds=times)
    for n, p in model.named_parameters():
        arrays[f"final.{n}"] = p.numpy().copy()
    dist.destroy_process_group()
    save(rank, arrays, facts)


def torch_dp_model():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def torch_dp_train():
    """A plain PyTorch step compiled by lazyrt.torch, data-parallel: each rank trains on its rows
    of each step's batch from its own random weights, which the compiled step replaces by rank
    0's before its first run; the gradients are averaged inside the step. DIST_TEST_SPELLING:
    'optimizer_step' (PyTorch/XLA's xm.optimizer_step), 'all_reduce' (lazyrt.torch.distributed's
    in-place all_reduce of each gradient, summed, then divided; the loss averaged too) or
    'torch.distributed' (the same with torch.distributed.all_reduce over the "lazyrt" backend)."""
    import torch
    import lazyrt.torch
    import lazyrt.torch.distributed as ldist
    from torch.distributed import ReduceOp

    spelling = os.environ.get("DIST_TEST_SPELLING", "optimizer_step")
    if spelling == "torch.distributed":  # torch.distributed's calls, over lazyrt's backend
        import datetime
        import torch.distributed as tdist
        tdist.init_process_group("lazyrt", timeout=datetime.timedelta(seconds=TIMEOUT))
        assert tdist.get_backend() == "lazyrt"
    else:
        ldist.init_process_group(timeout=TIMEOUT)
    rank, world = ldist.get_rank(), ldist.get_world_size()
    # Each rank's own persistent cache: its entries' names are the graphs' keys.
    lr.cache.set_persistent_dir(os.path.join(OUT, f"cache{rank}"))
    torch.manual_seed(1234 + rank)  # a different start on every rank
    model = torch_dp_model()
    arrays = {f"local_init.{n}": p.detach().numpy().copy() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    bucket = int(os.environ.get("DIST_TEST_BUCKET", str(ldist.DEFAULT_BUCKET_BYTES)))

    if spelling == "optimizer_step":
        @lazyrt.torch.compile
        def step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            ldist.optimizer_step(opt, bucket_bytes=bucket)
            opt.zero_grad()
            return loss
    else:
        all_reduce = tdist.all_reduce if spelling == "torch.distributed" else ldist.all_reduce

        @lazyrt.torch.compile
        def step(x, y):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            for p in model.parameters():
                all_reduce(p.grad, op=ReduceOp.SUM)
                p.grad /= world
            opt.step()
            opt.zero_grad()
            mean_loss = loss.detach().clone()
            all_reduce(mean_loss, op=ReduceOp.AVG)
            return mean_loss

    share = GLOBAL_BATCH // world
    counters = ("UncachedCompile", "TorchFastCall", "ReplayGraph", "GraphBreak", "EagerStep")
    facts = {"rank": rank, "calls": []}
    if spelling == "torch.distributed":  # the backend's other calls, at once
        t = torch.full((3,), float(rank))
        tdist.broadcast(t, src=world - 1)
        tdist.barrier()
        facts["broadcast"] = t.tolist()
    losses = []
    for k in range(STEPS):
        x, y = global_batch(k)
        x, y = torch.from_numpy(x[rank * share:(rank + 1) * share]), torch.from_numpy(y[rank * share:(rank + 1) * share])
        before = {c: lr.metrics.counter(c) for c in counters}
        loss = step(x, y)
        facts["calls"].append({c: lr.metrics.counter(c) - before[c] for c in counters})
        losses.append(float(loss))
    facts.update(captures=step.captures, traces=step.traces, losses=losses,
                 cache_entries=sorted(os.listdir(os.path.join(OUT, f"cache{rank}"))))
    for n, p in model.named_parameters():
        arrays[f"final.{n}"] = p.detach().numpy().copy()
    ldist.destroy_process_group()
    save(rank, arrays, facts)


def torch_eager_collectives():
    """lazyrt.torch.distributed's calls on torch tensors outside a compiled step: they
    communicate at once, in place as torch.distributed's do."""
    import torch
    import lazyrt.torch.distributed as ldist
    from torch.distributed import ReduceOp

    ldist.init_process_group(timeout=TIMEOUT)
    rank, world = ldist.get_rank(), ldist.get_world_size()
    out = {}
    for name, op in (("sum", ReduceOp.SUM), ("avg", ReduceOp.AVG), ("max", "max"), ("min", ReduceOp.MIN)):
        t = torch.from_numpy(contribution(rank, (4, 3)))
        ptr = t.data_ptr()
        ldist.all_reduce(t, op=op)
        assert t.data_ptr() == ptr  # in place
        out[f"all_reduce_{name}"] = t.numpy().copy()
    # Mixed dtypes in buckets of 16 bytes: every tensor its own shape and dtype back.
    xs = [torch.from_numpy(contribution(rank, (3,))), torch.from_numpy(contribution(rank, (2, 2), np.int64)),
          torch.from_numpy(contribution(rank, (2,), np.float64)), torch.from_numpy(contribution(rank, (5,)))]
    for k, r in enumerate(ldist.all_reduce_coalesced(xs, op="sum", bucket_bytes=16)):
        assert r.shape == xs[k].shape and r.dtype == xs[k].dtype
        out[f"coalesced_{k}"] = r.numpy().copy()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    with torch.no_grad():
        model[1].running_mean.fill_(rank + 1.0)
    ldist.broadcast_parameters(model, src=world - 1)
    for n, v in model.state_dict().items():
        out[f"bcast.{n}"] = v.numpy().copy()
    # reduce_gradients in eager: the mean of every rank's gradient, in place.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.full_like(p, float(rank + 1))
    ldist.reduce_gradients(opt)
    out["grad_mean"] = model[0].weight.grad.numpy().copy()
    ldist.destroy_process_group()
    save(rank, out, {"rank": rank})


SCENARIOS = {"collectives": collectives, "dead_peer": dead_peer, "dead_peer_replay": dead_peer_replay, "dp_train": dp_train, "torch_dp_train": torch_dp_train,
             "torch_eager_collectives": torch_eager_collectives}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()
