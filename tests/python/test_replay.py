"""Cached-graph replay from Python: the low-level calls with GraphInputMatcher (as PyTorch/XLA's
dynamo bridge uses them) and compile_step, checked against plain traced steps."""

import gc
import threading

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn


class Seed:
    """The seed scenario: Linear(5, 3) on a 10x5 batch, sum, backward, AdamW, zero_grad."""

    def __init__(self, init=None):
        lr.manual_seed(1)
        self.model = nn.Linear(5, 3)
        if init is not None:
            self.model.load_state_dict(init)
        self.opt = lr.optim.AdamW(self.model.parameters())
        lr.mark_step()

    def step(self, x, found_inf=None):
        loss = self.model(x).sum()
        loss.backward()
        self.opt.step(found_inf=found_inf)
        self.opt.zero_grad()
        return loss

    def weights(self):
        return self.model.weight.tolist()


def batch(i):
    k = np.arange(50)
    return lr.tensor(((k * 7 + i * 13) % 11 / 5.0 - 1.0).reshape(10, 5), dtype=lr.float32)


def snapshot(model):
    return {n: lr.tensor(t.numpy()) for n, t in model.state_dict().items()}


def plain(init, n, vary):
    s = Seed(init)
    losses = []
    for i in range(n):
        loss = s.step(batch(i if vary else 0))
        lr.mark_step()
        losses.append(loss.item())
    return losses, s.weights()


def test_graph_hash_object():
    h = lr.GraphHash(1, 2)
    assert (h.hi, h.lo) == (1, 2) and h == lr.GraphHash(1, 2) and h != lr.GraphHash(2, 1)
    assert str(h) == h.hex() == "0000000000000001" + "0000000000000002"
    assert repr(h) == "GraphHash('00000000000000010000000000000002')"
    assert {h: 1}[lr.GraphHash(1, 2)] == 1
    assert not lr.graph_hash([lr.tensor([1.0])]), "nothing pending: the zero hash"


def test_low_level_scenario_updates_state_on_every_replay():
    s = Seed()
    init = snapshot(s.model)
    x = batch(0)
    loss = s.step(x, found_inf=lr.zeros(1))
    h = lr.graph_hash([loss])
    assert h == lr.graph_hash([loss]), "deterministic"
    lr.warm_up_cache([loss])
    assert loss.is_pending(), "warm-up executes nothing"
    ids, values = lr.graph_inputs([loss])
    assert len(ids) == len(values)
    assert lr.tensor_id(s.model.weight) in ids, "the weight is an input, as the same tensor"
    assert s.weights() == init["weight"].tolist(), "back to its value before the trace"
    lr.metrics.reset()
    outs = [lr.run_cached_graph(h, values) for _ in range(3)]
    losses = [o[0].item() for o in outs]
    assert lr.metrics.counter("ReplayGraph") == 3 and lr.metrics.counter("UncachedCompile") == 0
    # An output that is an input updated in place is the caller's own tensor object.
    weight = next(v for i, v in zip(ids, values) if i == lr.tensor_id(s.model.weight))
    assert any(o is weight for o in outs[-1]) and s.model.weight.tolist() == weight.tolist()
    assert losses[0] != losses[1] != losses[2]
    expect_losses, expect_weights = plain(init, 3, False)
    assert losses == expect_losses
    assert s.weights() == expect_weights


def test_graph_input_matcher_feeds_new_arguments():
    s = Seed()
    init = snapshot(s.model)
    x = batch(0)
    loss = s.step(x)
    h = lr.graph_hash([loss])
    lr.warm_up_cache([loss])
    ids, values = lr.graph_inputs([loss])
    matcher = lr.GraphInputMatcher({lr.tensor_id(x): 0}, ids, values)
    assert "1 from arguments" in repr(matcher)
    losses = [lr.run_cached_graph(h, matcher([batch(i)]))[0].item() for i in range(4)]
    expect_losses, expect_weights = plain(init, 4, True)
    assert losses == expect_losses
    assert s.weights() == expect_weights


def test_run_cached_graph_errors():
    with pytest.raises(lr.Error, match="warm_up_cache"):
        lr.run_cached_graph(lr.GraphHash(1, 2), [])
    s = Seed()
    loss = s.step(batch(0))
    h = lr.graph_hash([loss])
    lr.warm_up_cache([loss])
    ids, values = lr.graph_inputs([loss])
    with pytest.raises(lr.Error, match="inputs given"):
        lr.run_cached_graph(h, values[:-1])
    with pytest.raises(TypeError, match=r"run_cached_graph: element 0 is not a lazyrt tensor but float"):
        lr.run_cached_graph(h, [1.0] * len(values))
    with pytest.raises(TypeError, match=r"run_cached_graph: element 2 is not a lazyrt tensor but ndarray"):
        lr.run_cached_graph(h, tuple(values[:2]) + (np.ones(3),))
    with pytest.raises(TypeError, match=r"run_cached_graph: expected a tuple or list of lazyrt tensors, got int"):
        lr.run_cached_graph(h, 3)
    assert lr.graph_hash(loss) == lr.graph_hash([loss]), "one tensor stands for a list of it"
    assert loss.is_pending(), "the failed calls ran nothing"


def test_compile_step_replays_match_plain_steps():
    s = Seed()
    init = snapshot(s.model)
    lr.metrics.reset()
    step = lr.compile_step(s.step, (batch(0),))
    assert s.weights() == init["weight"].tolist(), "tracing runs nothing"
    assert not s.model.weight.is_pending() and s.opt.step_count.item() == 0
    traced = lr.metrics.timing_count("TraceTime")
    losses = [step(batch(i)).item() for i in range(4)]
    assert lr.metrics.counter("ReplayGraph") == 4
    assert lr.metrics.timing_count("TraceTime") == traced, "replays trace nothing"
    assert step.traces == 1
    expect_losses, expect_weights = plain(init, 4, True)
    assert losses == expect_losses
    assert s.weights() == expect_weights
    assert s.opt.step_count.item() == 4


def test_compile_step_returns_what_the_function_returns():
    w = lr.tensor([1.0, 2.0])
    w.tolist()

    def two(x):
        w.copy_(w + x)
        return w.sum(), w * 2

    step = lr.compile_step(two, [lr.ones(2)])
    total, doubled = step(lr.ones(2))
    assert total.item() == 5.0 and doubled.tolist() == [4.0, 6.0]
    one = lr.compile_step(lambda x: (x * 3).sum(), (lr.ones(2),))
    assert isinstance(one(lr.ones(2)), lr.Tensor)


def test_a_batch_shape_change_retraces_instead_of_running_stale():
    s = Seed()
    init = snapshot(s.model)
    step = lr.compile_step(s.step, (batch(0),))
    l0 = step(batch(0)).item()
    wide = lr.full((20, 5), 0.5)
    l1 = step(wide).item()
    assert step.traces == 2
    ref = Seed(init)
    r0 = ref.step(batch(0))
    lr.mark_step()
    r1 = ref.step(wide)
    lr.mark_step()
    assert (l0, l1) == (r0.item(), r1.item())
    assert s.weights() == ref.weights()


def test_guard_failure_raises_by_policy_and_changes_nothing():
    s = Seed()
    step = lr.compile_step(s.step, (batch(0),), retrace=False)
    step(batch(0))
    before = s.weights()
    with pytest.raises(lr.Error, match="f32\\[3, 5\\]"):
        step(lr.ones(3, 5))
    with pytest.raises(lr.Error):
        step(batch(0), batch(1))
    with pytest.raises(lr.Error):
        step(batch(0).double())
    with pytest.raises(TypeError):
        step(np.ones((10, 5)))
    assert s.weights() == before and s.opt.step_count.item() == 1


def test_a_step_that_fails_while_tracing_leaves_everything_as_it_was():
    s = Seed()
    before = s.weights()

    def reads_a_value(x):
        loss = s.step(x)
        loss.item()
        return loss

    with pytest.raises(lr.Error, match="compile_step"):
        lr.compile_step(reads_a_value, (batch(0),))

    def raises(x):
        s.step(x)
        raise KeyError("from the step")

    with pytest.raises(KeyError):
        lr.compile_step(raises, (batch(0),))
    with pytest.raises(lr.Error, match="must return a lazyrt tensor"):
        lr.compile_step(lambda x: 3, (batch(0),))
    assert not s.model.weight.is_pending()
    assert s.weights() == before and s.opt.step_count.item() == 0


def test_load_state_dict_between_replays_takes_effect():
    s = Seed()
    init = snapshot(s.model)
    step = lr.compile_step(s.step, (batch(0),))
    step(batch(0))
    step(batch(1))
    s.model.load_state_dict(init)
    after_load = step(batch(0)).item()
    assert after_load == Seed(init).step(batch(0)).item()


def test_dropout_masks_differ_per_call_and_follow_the_seed():
    def make(w):
        def fn(x):
            with lr.no_grad():
                y = lr.dropout(x, 0.5) + w
                w.copy_(w + 1)
            return y
        return fn

    x = lr.ones(64)
    w = lr.zeros(64)
    w.tolist()
    lr.manual_seed(77)
    step = lr.compile_step(make(w), (x,))
    replayed = [step(x).tolist() for _ in range(3)]
    assert replayed[0] != replayed[1]
    lr.manual_seed(77)
    w2 = lr.zeros(64)
    w2.tolist()
    fn = make(w2)
    for i in range(3):
        y = fn(x)
        lr.mark_step()
        assert y.tolist() == replayed[i]


def test_steps_called_from_several_threads_do_not_deadlock():
    s = Seed()
    step = lr.compile_step(s.step, (batch(0),))
    errors = []

    def work(shape_change):
        try:
            for i in range(20):
                x = lr.full((20, 5), 0.1) if shape_change and i == 10 else batch(i)
                step(x).item()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k == 0,), daemon=True) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    assert s.opt.step_count.item() == 60
    assert step.traces == 2, "the shape change retraced once, while other threads waited"


def test_a_python_number_the_step_reads_is_guarded_and_invalidate_still_retraces():
    # A Python number the step reads (an item of a dict in its closure) is a constant of its
    # trace, guarded (lazyrt._reads): a change retraces, the old value's variant comes back.
    scale = {"v": 2.0}
    x = lr.tensor([1.0, 2.0])
    step = lr.compile_step(lambda x: x * scale["v"], (x,))
    assert step(x).tolist() == [2.0, 4.0]
    scale["v"] = 3.0
    assert step(x).tolist() == [3.0, 6.0]
    assert step.traces == 2
    scale["v"] = 2.0
    assert step(x).tolist() == [2.0, 4.0]
    assert step.traces == 2, "the first value's variant"
    lr.invalidate_compiled_steps()  # (for what no guard sees: a value a C++ step reads)
    assert step(x).tolist() == [2.0, 4.0]
    assert step.traces == 3


# ---- bounded variants: one per argument signature, the least recently used evicted ---------


def shapes_of(numel):
    """Every 3-d shape of numel elements: many distinct signatures of one byte size."""
    return [(a, b, numel // (a * b)) for a in range(1, numel + 1) for b in range(1, numel // a + 1)
            if numel % (a * b) == 0]


def values(shape, i):
    """Small integers as float32, so that sums are exact and a wrong or stale value shows."""
    n = int(np.prod(shape))
    return ((np.arange(n) + i * 5) % 7 - 3).astype(np.float32).reshape(shape)


def accumulator():
    """A step with state, acc += x.sum(), returning x * 2 + acc; and its PyTorch twin."""
    acc = lr.zeros(())
    lr.mark_step()
    tacc = torch.zeros(())

    def step(x):
        acc.add_(x.sum())
        return x * 2 + acc

    def eager(a):
        nonlocal tacc
        tx = torch.from_numpy(a)
        tacc = tacc + tx.sum()
        return (tx * 2 + tacc).numpy()

    return step, eager, acc, lambda: tacc


@pytest.fixture
def small_memory_cache():
    old = lr.cache.memory_capacity(), lr.cache.memory_max_bytes()
    yield
    lr.cache.set_memory_capacity(old[0])
    lr.cache.set_memory_max_bytes(old[1])


def test_many_argument_shapes_stay_within_the_variant_cap_exact_and_with_flat_memory(small_memory_cache):
    lr.cache.set_memory_capacity(8)  # the executables themselves are the in-memory cache's to bound
    shapes = shapes_of(720)[:200]
    fn, eager, acc, tacc = accumulator()
    step = lr.compile_step(fn, (lr.tensor(values(shapes[0], 0)),), max_variants=8)
    lr.metrics.reset()
    gc.collect()  # (earlier tests' garbage in cycles, freed by a collection during the loop, is not the step's)
    live = []
    for i, shape in enumerate(shapes):
        a = values(shape, i)
        out = step(lr.tensor(a))
        np.testing.assert_array_equal(out.numpy(), eager(a), err_msg=str(shape))
        assert step.variants <= 8
        live.append(lr.debug.live_memory_bytes())
    assert step.variants == 8 and step.traces == len(shapes)
    assert lr.metrics.counter("CompiledStepVariantEvictions") == len(shapes) - 8
    assert live[16:] == [live[16]] * (len(live) - 16), "live bytes grew after warm-up"
    # An evicted shape is traced again; its replays stay exact.
    for k in range(3):
        a = values(shapes[0], 1000 + k)
        np.testing.assert_array_equal(step(lr.tensor(a)).numpy(), eager(a))
    assert step.traces == len(shapes) + 1
    assert acc.item() == tacc().item()


def test_the_most_recently_used_variants_stay_and_the_byte_cap_evicts():
    fn, eager, _, _ = accumulator()
    a, b, c = (2, 3), (3, 2), (6,)
    step = lr.compile_step(fn, (lr.tensor(values(a, 0)),), max_variants=2)

    def call(shape, i):
        x = values(shape, i)
        np.testing.assert_array_equal(step(lr.tensor(x)).numpy(), eager(x))

    lr.metrics.reset()
    for i, shape in enumerate([a, b, a, c]):  # c evicts b, the least recently used
        call(shape, i)
    assert step.traces == 3
    call(a, 4)
    assert step.traces == 3, "a was kept"
    call(b, 5)
    assert step.traces == 4, "b was evicted: it is traced again"
    assert lr.metrics.counter("CompiledStepVariantEvictions") == 2 and step.variants == 2
    # A byte cap below two variants keeps one: the one in use.
    step.max_variant_bytes = step.variant_bytes // 2 + 1
    assert step.variants == 1 and lr.metrics.counter("CompiledStepVariantEvictions") == 3
    for i in range(4):
        call((a, b)[i % 2], 10 + i)
        assert step.variants == 1
    assert lr.metrics.counter("CompiledStepVariantEvictions") == 7, "each change of shape evicted the other"


def test_variant_settings_and_bad_values():
    fn, _, _, _ = accumulator()
    step = lr.compile_step(fn, (lr.ones(3),))
    assert step.max_variants == 64 and step.max_variant_bytes == 8 << 30
    assert step.variants == 1 and step.variant_bytes >= 3 * 4
    for n in range(1, 6):
        step(lr.ones(n))
    assert step.variants == 5
    for bad in (0, -1):
        with pytest.raises(lr.Error, match="max_variants"):
            step.max_variants = bad
    assert step.max_variants == 64 and step.variants == 5, "a refused setting changes nothing"
    with pytest.raises(lr.Error, match="max_variant_bytes"):
        step.max_variant_bytes = -1
    step.max_variants = 2
    assert step.max_variants == 2 and step.variants == 2
    step.max_variant_bytes = 0
    assert step.max_variant_bytes == 0
    with pytest.raises(lr.Error, match="max_variants"):
        lr.compile_step(fn, (lr.ones(3),), max_variants=0)
    with pytest.raises(lr.Error, match="max_variant_bytes"):
        lr.compile_step(fn, (lr.ones(3),), max_variant_bytes=-2)


def test_a_failed_retrace_leaves_the_step_as_it_was():
    acc = lr.zeros(())
    lr.mark_step()

    def fn(x):
        if x.shape[0] == 3:
            raise ValueError("the step refuses three rows")
        acc.add_(x.sum())
        return x + acc

    step = lr.compile_step(fn, (lr.ones(2),))
    assert step(lr.ones(2)).tolist() == [3.0, 3.0]
    with pytest.raises(ValueError, match="three rows"):
        step(lr.ones(3))
    assert step.traces == 1 and step.variants == 1
    assert step(lr.ones(2)).tolist() == [5.0, 5.0] and step.traces == 1
    # Every variant stale and the retrace fails: nothing is lost, and the next call retraces.
    lr.invalidate_compiled_steps()
    with pytest.raises(ValueError):
        step(lr.ones(3))
    assert step.traces == 1 and step.variants == 1 and acc.item() == 4
    assert step(lr.ones(2)).tolist() == [7.0, 7.0]
    assert step.traces == 2 and step.variants == 1
