"""lazyrt.distributed: process groups and collectives across real processes (2 and 4 on this
host, started by the launcher), each result against its closed form; errors of bad calls; a
rank that dies makes the others fail with a clear error within the timeout. Every process
start has a hard timeout: a hang fails the test instead of blocking the suite."""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import lazyrt as lr
import lazyrt.distributed as dist
from conftest import REPO

WORKER = os.path.join(REPO, "tests", "python", "dist_worker.py")
HARD_TIMEOUT = 120  # seconds for a whole launch


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario, nproc, tmp_path, timeout_s=20, expect_ok=True):
    """Runs the scenario on nproc processes through the launcher; returns each rank's
    (arrays, facts)."""
    out = tmp_path / scenario
    out.mkdir()
    env = dict(os.environ, DIST_TEST_TIMEOUT=str(timeout_s))
    cmd = [sys.executable, "-m", "lazyrt.distributed.run", "--nproc", str(nproc), "--master_port", str(free_port()),
           "--grace", "30", WORKER, scenario, str(out)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HARD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{scenario} on {nproc} processes hung for {HARD_TIMEOUT} s:\n{e.stdout}\n{e.stderr}")
    if expect_ok:
        assert proc.returncode == 0, f"{scenario} failed:\n{proc.stdout}\n{proc.stderr}"
    results = {}
    for r in range(nproc):
        facts_file = out / f"rank{r}.json"
        if not facts_file.exists():
            continue
        arrays = dict(np.load(out / f"rank{r}.npz"))
        results[r] = (arrays, json.loads(facts_file.read_text()))
    return results, proc


def contribution(rank, shape, dtype=np.float32):
    n = int(np.prod(shape))
    return ((np.arange(n) % 7 - 3) * (rank + 1) + 0.25 * rank).reshape(shape).astype(dtype)


@pytest.mark.parametrize("world", [2, 4])
def test_collectives_closed_form(world, tmp_path):
    results, _ = launch("collectives", world, tmp_path)
    assert sorted(results) == list(range(world))
    xs = [contribution(r, (4 * world, 3)) for r in range(world)]
    total = np.sum(xs, axis=0, dtype=np.float64)
    expect = {
        "sum": total, "mean": total / world, "max": np.max(xs, axis=0), "min": np.min(xs, axis=0),
    }
    hashes = set()
    for r, (a, facts) in results.items():
        assert (facts["rank"], facts["world"], facts["local_rank"]) == (r, world, r)
        for op, full in expect.items():
            np.testing.assert_allclose(a[f"all_reduce_{op}"], full, rtol=1e-6, err_msg=op)
            np.testing.assert_allclose(a[f"reduce_scatter_{op}"], full[4 * r:4 * r + 4], rtol=1e-6, err_msg=op)
            assert a[f"all_reduce_{op}"].dtype == np.float32
        np.testing.assert_array_equal(a["all_gather"], np.concatenate(xs, axis=0))
        np.testing.assert_array_equal(a["broadcast"], xs[world - 1])
        ints = [contribution(q, (5,), np.int64) for q in range(world)]
        np.testing.assert_array_equal(a["all_reduce_sum_i64"], np.sum(ints, axis=0))
        assert a["all_reduce_sum_i64"].dtype == np.int64
        np.testing.assert_array_equal(a["all_reduce_sum_bf16"],
                                      np.sum([contribution(q, (6,)) for q in range(world)], axis=0))
        np.testing.assert_array_equal(a["all_reduce_max_f64"],
                                      np.max([contribution(q, (2, 2), np.float64) for q in range(world)], axis=0))
        np.testing.assert_allclose(a["all_reduce_pending"], np.sum([x * 2 + 1 for x in xs], axis=0), rtol=1e-6)
        assert facts["again_equal"]
        assert facts["token_chain_compiles"] == 1  # the second program is a graph of its own
        assert facts["rs_error"] == (f"reduce_scatter: dim 0 of f32[{4 * world + 1}, 3] must divide into the "
                                     f"group's {world} ranks")
        hashes.add(facts["graph_hash"])
    # The rank is not part of the graph: every rank traced the same one.
    assert len(hashes) == 1
    # All ranks hold bitwise-identical reductions.
    for op in expect:
        first = results[0][0][f"all_reduce_{op}"]
        for r in range(1, world):
            np.testing.assert_array_equal(results[r][0][f"all_reduce_{op}"], first)


# The ring of reduce_scatter on 4 ranks: rank 1 waits on rank 0, not on the rank that died; it
# learns of the failure at once because rank 0 closes its connections when it fails.
# die_after: the rank dies while the others already wait for it inside the collective.
@pytest.mark.parametrize("op,world,die_after", [("all_reduce", 2, 0), ("all_reduce", 4, 0), ("reduce_scatter", 4, 0),
                                                ("all_reduce", 3, 1.0)])
def test_dead_peer_is_an_error_on_every_other_rank(op, world, die_after, tmp_path, monkeypatch):
    timeout_s = 10
    monkeypatch.setenv("DIST_TEST_OP", op)
    monkeypatch.setenv("DIST_TEST_DIE_AFTER", str(die_after))
    t0 = time.perf_counter()
    results, proc = launch("dead_peer", world, tmp_path, timeout_s=timeout_s, expect_ok=False)
    assert proc.returncode == 7, proc.stderr  # the launcher reports the rank that died
    assert sorted(results) == list(range(world - 1)), proc.stderr
    for r, (_, facts) in results.items():
        assert facts["error"] is not None, f"rank {r} did not notice"
        assert f"{op} on rank {r} of {world}" in facts["error"], facts["error"]
        assert "peer process died" in facts["error"], facts["error"]
        # Not the timeout, nor a survivor's exit: the failure spreads at once.
        assert facts["seconds"] < die_after + 3, facts
        assert "failed earlier" in facts["after"], facts["after"]
    assert time.perf_counter() - t0 < HARD_TIMEOUT


# A collective that fails inside a replayed step leaves the parameters as they were, even those
# updated from an earlier collective of the same step that succeeded; the tensor the step's last
# collective reduces in place (in its own buffer, with no copy) is the one left undefined.
@pytest.mark.parametrize("world", [2, 3])
def test_replayed_step_whose_collective_fails_leaves_parameters_unchanged(world, tmp_path):
    results, proc = launch("dead_peer_replay", world, tmp_path, timeout_s=10, expect_ok=False)
    assert proc.returncode == 7, proc.stderr
    assert sorted(results) == list(range(world - 1)), proc.stderr
    w0 = [contribution(r, (1000 * world,)) for r in range(world)]
    m0 = np.mean(w0, axis=0, dtype=np.float64)
    t0 = np.sum([2 * contribution(r, (1000 * world,)) for r in range(world)], axis=0, dtype=np.float64)
    for r, (a, facts) in results.items():
        assert facts["traces"] == 1
        # Two steps: w - 0.5 m, then - 0.25 m (the mean of w halves); t summed twice.
        np.testing.assert_allclose(a["w"], w0[r] - 0.75 * m0, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(a["t"], world * t0, rtol=1e-6)
        assert facts["error"] is not None and "peer process died" in facts["error"], facts["error"]
        assert f"all_reduce on rank {r} of {world}" in facts["error"], facts["error"]
        np.testing.assert_array_equal(a["w_after"], a["w"])
        assert facts["w_same_buffer"]


# ---- one process: a group of size 1 through a file store, and the errors of bad calls --------

@pytest.fixture
def single(tmp_path):
    dist.init_process_group(init_method=f"file://{tmp_path}/store", rank=0, world_size=1, timeout=10)
    yield
    dist.destroy_process_group()


def test_group_of_one(single):
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    x = lr.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(dist.all_reduce(x, op="mean").numpy(), x.numpy())
    np.testing.assert_array_equal(dist.all_gather(x).numpy(), x.numpy())
    np.testing.assert_array_equal(dist.reduce_scatter(x).numpy(), x.numpy())
    np.testing.assert_array_equal(dist.broadcast(x).numpy(), x.numpy())
    xs = [x, lr.tensor(np.arange(3, dtype=np.int64)), x[0] * 2]
    for r, t in zip(dist.all_reduce_coalesced(xs, op="sum", bucket_bytes=16), xs):
        assert r.shape == t.shape and r.dtype == t.dtype
        np.testing.assert_array_equal(r.numpy(), t.numpy())
    dist.barrier()


def test_bad_calls_name_what_is_wrong(single, tmp_path):
    x = lr.zeros(3, 2)
    with pytest.raises(lr.Error, match=r"all_reduce: op='prod' is not a reduction"):
        dist.all_reduce(x, op="prod")
    with pytest.raises(lr.Error, match=r"all_reduce: does not take b8 tensors, got b8\[3\]"):
        dist.all_reduce(lr.zeros(3, dtype=lr.bool))
    with pytest.raises(lr.Error, match=r"all_reduce: op=\"mean\" expects a floating tensor .* got i64\[3\]"):
        dist.all_reduce(lr.zeros(3, dtype=lr.int64), op="mean")
    with pytest.raises(lr.Error, match=r"all_gather: works along dim 0 and takes a tensor of rank >= 1, got f32\[\]"):
        dist.all_gather(lr.tensor(1.0))
    with pytest.raises(lr.Error, match=r"broadcast: src 1 is not a rank of a group of size 1"):
        dist.broadcast(x, src=1)
    with pytest.raises(lr.Error, match=r"init_process_group: a process group is already initialized"):
        dist.init_process_group(init_method=f"file://{tmp_path}/other", rank=0, world_size=1)
    with pytest.raises(lr.Error, match=r"collectives cannot be traced inside a while_loop"):
        lr.fori_loop(0, 2, lambda i, c: dist.all_reduce(c), x)


def test_without_a_group():
    assert not dist.is_initialized()
    for call in (dist.get_rank, dist.get_world_size, dist.barrier, dist.destroy_process_group):
        with pytest.raises(lr.Error, match=r"no process group is initialized in this process"):
            call()
    with pytest.raises(lr.Error, match=r"all_reduce: no process group is initialized"):
        dist.all_reduce(lr.zeros(2))


def test_env_errors(monkeypatch):
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(lr.Error, match=r"init_process_group: RANK is not set"):
        dist.init_process_group()
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(lr.Error, match=r"init_process_group: rank 2 is not in \[0, 2\)"):
        dist.init_process_group()
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(lr.Error, match=r"MASTER_ADDR is not set"):
        dist.init_process_group()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    t0 = time.perf_counter()
    # Nobody serves the store: rank 1 gives up after its timeout, naming the store.
    with pytest.raises(lr.Error, match=r"cannot reach the rendezvous store at 127.0.0.1:\d+"):
        dist.init_process_group(timeout=1)
    assert time.perf_counter() - t0 < 5
    with pytest.raises(lr.Error, match=r"init_method 'tcp://127.0.0.1' is not 'tcp://host:port'"):
        dist.init_process_group(init_method="tcp://127.0.0.1")
    with pytest.raises(lr.Error, match=r"init_method 'udp://x' is not supported"):
        dist.init_process_group(init_method="udp://x")
    with pytest.raises(lr.Error, match=r"backend='nccl' is not available"):
        dist.init_process_group(backend="nccl")
    assert not dist.is_initialized()


# ---- data-parallel training ---------------------------------------------------------------

def torch_whole_batch_training(init, prefix="init."):
    """The oracle: PyTorch, one process, every step on the whole batch, from the weights
    init[prefix + name]. Returns each step's loss and the final weights."""
    import torch
    sys.path.insert(0, os.path.dirname(WORKER))
    import dist_worker  # noqa: E402  (the batches the workers trained on)
    model = dist_worker.torch_dp_model()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(init[f"{prefix}{n}"]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for k in range(dist_worker.STEPS):
        x, y = dist_worker.global_batch(k)
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("world", [2, 4])
def test_data_parallel_training_equals_one_process_on_the_whole_batch(world, tmp_path):
    results, _ = launch("dp_train", world, tmp_path)
    assert sorted(results) == list(range(world))
    arrays0 = results[0][0]
    _, expect = torch_whole_batch_training(arrays0)
    for r, (a, facts) in results.items():
        # Rank 0's weights reached every rank, and every rank ends with the same bits.
        for name in expect:
            np.testing.assert_array_equal(a[f"init.{name}"], arrays0[f"init.{name}"])
            np.testing.assert_array_equal(a[f"final.{name}"], arrays0[f"final.{name}"])
            np.testing.assert_allclose(a[f"final.{name}"], expect[name], rtol=1e-5, atol=1e-6, err_msg=name)
        # The replayed steps: traced once, compiled at most on the first call, never after, and
        # every call one replay.
        assert facts["traces"] == 1
        assert facts["compiles"][1:] == [0] * (len(facts["compiles"]) - 1), facts
        assert facts["replays"] == [1] * len(facts["replays"]), facts


def test_distributed_sampler_shares():
    for size, world, drop_last in [(10, 3, False), (10, 3, True), (8, 4, False), (5, 2, False)]:
        shares = [dist.DistributedSampler(size, num_replicas=world, rank=r, seed=3, drop_last=drop_last)
                  for r in range(world)]
        idx = [list(s) for s in shares]
        n = size // world if drop_last else -(-size // world)
        assert all(len(i) == n == len(s) for i, s in zip(idx, shares))
        flat = [j for i in idx for j in i]
        if drop_last:
            assert len(set(flat)) == len(flat) == n * world  # disjoint
        else:
            assert set(flat) == set(range(size))  # every item, the padding repeats a few
        # One permutation for all ranks, a new one per epoch.
        again = [list(dist.DistributedSampler(size, num_replicas=world, rank=r, seed=3, drop_last=drop_last))
                 for r in range(world)]
        assert again == idx
        shares[0].set_epoch(1)
        assert list(shares[0]) != idx[0] or size <= 5
    unshuffled = list(dist.DistributedSampler(10, num_replicas=3, rank=1, shuffle=False))
    assert unshuffled == [1, 4, 7, 0]  # torch's order: every 3rd of 0..9 padded with 0, 1
    import torch.utils.data
    assert unshuffled == list(torch.utils.data.DistributedSampler(range(10), num_replicas=3, rank=1, shuffle=False))
    with pytest.raises(lr.Error, match=r"DistributedSampler: rank 3 is not in \[0, 3\)"):
        dist.DistributedSampler(10, num_replicas=3, rank=3)


def accuracy_of(output):
    line = [ln for ln in output.splitlines() if ln.startswith("held-out accuracy:")]
    assert line, output
    return float(line[0].split()[2].rstrip("%"))


def check_digits_demo_on_one_and_two_processes(script, expect_in_output):
    """Runs examples/distributed/<script> for 4 epochs on 1 and 2 processes: the same held-out
    accuracy (within a point), and `expect_in_output` in what each run prints."""
    demo = os.path.join(REPO, "examples", "distributed", script)
    acc = {}
    for nproc in (1, 2):
        cmd = [sys.executable, "-m", "lazyrt.distributed.run", "--nproc", str(nproc), "--master_port",
               str(free_port()), demo, "--epochs", "4"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HARD_TIMEOUT)
        acc[nproc] = accuracy_of(proc.stdout)
        assert expect_in_output in proc.stdout, proc.stdout
    assert acc[1] > 85 and abs(acc[1] - acc[2]) <= 1.0, acc


def test_digits_demo_on_two_processes_matches_one():
    check_digits_demo_on_one_and_two_processes("digits_dp.py", "(replayed, ")


def test_launcher_sets_torchrun_variables_for_each_host(monkeypatch):
    from lazyrt.distributed import run
    a = run.parse(["--nproc", "2", "--nnodes", "3", "--node_rank", "1", "--master_addr", "h0", "--master_port", "1234",
                   "train.py", "--lr", "0.1"])
    assert (a.target, a.args, a.module) == ("train.py", ["--lr", "0.1"], False)
    env = run.worker_env(a, 1)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                "MASTER_PORT")} == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "MASTER_ADDR": "h0", "MASTER_PORT": "1234"}
    assert run.parse(["-m", "pkg.train"]).module
    for name in run.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # The host's CPUs are shared among its processes; a setting already made is kept.
    assert {run.worker_env(a, 0, cpus=8)[k] for k in run.THREAD_VARIABLES} == {"4"}
    assert {run.worker_env(run.parse(["--nproc", "4", "t.py"]), 3, cpus=2)[k] for k in run.THREAD_VARIABLES} == {"1"}
    assert run.worker_env(run.parse(["t.py"]), 0, cpus=6)["LAZYRT_NUM_THREADS"] == "6"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = run.worker_env(a, 0, cpus=8)
    assert (env["OMP_NUM_THREADS"], env["LAZYRT_NUM_THREADS"]) == ("3", "4")
    for bad in (["--nnodes", "2", "--node_rank", "2", "t.py"], ["--nproc", "0", "t.py"], ["--master_port", "70000", "t.py"]):
        with pytest.raises(SystemExit):
            run.parse(bad)


# ---- data-parallel PyTorch steps compiled by lazyrt.torch ------------------------------------

@pytest.mark.parametrize("spelling,bucket", [("optimizer_step", None), ("optimizer_step", 100), ("all_reduce", None),
                                             ("torch.distributed", None)])
def test_torch_data_parallel_step_equals_one_process_on_the_whole_batch(spelling, bucket, tmp_path, monkeypatch):
    """lazyrt.torch.compile of a plain PyTorch step whose gradients are averaged over 2 ranks
    (lazyrt.torch.distributed): rank 0's weights reach every rank at the first call, every rank
    ends with the same bits as the others and with eager PyTorch's weights for the whole batch,
    and every call after the first is one fast call of one executable, compiled once, whose
    graph (its cache key) is the same on both ranks."""
    world = 2
    monkeypatch.setenv("DIST_TEST_SPELLING", spelling)
    if bucket is not None:
        monkeypatch.setenv("DIST_TEST_BUCKET", str(bucket))  # one bucket per gradient or two
    results, _ = launch("torch_dp_train", world, tmp_path)
    assert sorted(results) == list(range(world))
    arrays0, facts0 = results[0]
    # The ranks started from different weights.
    assert not np.array_equal(arrays0["local_init.0.weight"], results[1][0]["local_init.0.weight"])
    losses, expect = torch_whole_batch_training(arrays0, prefix="local_init.")
    for r, (a, facts) in results.items():
        for name in expect:
            np.testing.assert_array_equal(a[f"final.{name}"], arrays0[f"final.{name}"], err_msg=f"rank {r} {name}")
            np.testing.assert_allclose(a[f"final.{name}"], expect[name], rtol=1e-5, atol=1e-6, err_msg=name)
        if spelling == "torch.distributed":
            assert facts["broadcast"] == [world - 1.0] * 3, facts
        if spelling != "optimizer_step":  # the step returns the loss averaged over the ranks
            np.testing.assert_allclose(facts["losses"], losses, rtol=1e-5)
        assert facts["captures"] == 1 and facts["traces"] == 1, facts
        calls = facts["calls"]
        assert calls[0]["UncachedCompile"] >= 1, calls
        for c in calls:
            assert c["GraphBreak"] == 0 and c["EagerStep"] == 0, calls
        for c in calls[1:]:
            assert c["UncachedCompile"] == 0 and c["ReplayGraph"] == 1, calls
        for c in calls[2:]:
            assert c["TorchFastCall"] == 1, calls
        # One graph for every rank: the same cache keys.
        assert facts["cache_entries"] and facts["cache_entries"] == facts0["cache_entries"], (facts, facts0)


def test_torch_collectives_in_eager(tmp_path):
    """lazyrt.torch.distributed outside a compiled step, against closed forms."""
    world = 2
    results, _ = launch("torch_eager_collectives", world, tmp_path)
    assert sorted(results) == list(range(world))
    xs = [contribution(r, (4, 3)) for r in range(world)]
    expect = {"sum": np.sum(xs, axis=0), "avg": np.mean(xs, axis=0), "max": np.max(xs, axis=0),
              "min": np.min(xs, axis=0)}
    coalesced = [np.sum([contribution(r, shape, dtype) for r in range(world)], axis=0)
                 for shape, dtype in (((3,), np.float32), ((2, 2), np.int64), ((2,), np.float64), ((5,), np.float32))]
    for r, (a, _) in results.items():
        for name, value in expect.items():
            np.testing.assert_allclose(a[f"all_reduce_{name}"], value, rtol=1e-6, err_msg=name)
        for k, value in enumerate(coalesced):
            np.testing.assert_array_equal(a[f"coalesced_{k}"], value)
            assert a[f"coalesced_{k}"].dtype == value.dtype
        for n in ("0.weight", "0.bias", "1.weight", "1.running_mean"):
            np.testing.assert_array_equal(a[f"bcast.{n}"], results[world - 1][0][f"bcast.{n}"], err_msg=n)
        np.testing.assert_array_equal(a["bcast.1.running_mean"], np.full(2, float(world), np.float32))
        np.testing.assert_array_equal(a["grad_mean"], np.full((2, 3), (world + 1) / 2, np.float32))


def test_torch_distributed_collective_in_a_compiled_step_names_the_lazyrt_spelling():
    """torch.distributed's all_reduce without a process group of the "lazyrt" backend cannot be
    captured: the capture is refused, naming the backend and lazyrt.torch.distributed's calls."""
    import torch
    import torch.distributed as tdist
    import lazyrt.torch
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @lazyrt.torch.compile
    def step(x):
        model(x).sum().backward()
        for p in model.parameters():
            tdist.all_reduce(p.grad)
        opt.step()

    with pytest.raises(lazyrt.torch.CaptureError, match=r"backend 'lazyrt' .*lazyrt.torch.distributed.all_reduce"):
        step(torch.ones(4, 3))


def test_torch_digits_demo_on_two_processes_matches_one():
    """examples/distributed/digits_torch_dp.py: a plain PyTorch step with optimizer_step, compiled
    by lazyrt.torch: the same held-out accuracy on 1 and 2 processes, every call after the first
    a fast call."""
    check_digits_demo_on_one_and_two_processes("digits_torch_dp.py", "(1 capture, 86 fast calls)")
