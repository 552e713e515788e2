"""Cached-graph replay from Python: the low-level calls with GraphInputMatcher (as PyTorch/XLA's
dynamo bridge uses them) and compile_step, checked against plain traced steps."""

import threading

import numpy as np
import pytest

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
    losses = [lr.run_cached_graph(h, values)[0].item() for _ in range(3)]
    assert lr.metrics.counter("ReplayGraph") == 3 and lr.metrics.counter("UncachedCompile") == 0
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
    with pytest.raises(TypeError):
        lr.run_cached_graph(h, [1.0] * len(values))


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


def test_invalidate_compiled_steps_retraces_a_step_that_read_a_python_value():
    # A Python number the step reads is a constant of its trace; after changing it, the user
    # says so and the next call retraces instead of replaying the old constant.
    scale = {"v": 2.0}
    x = lr.tensor([1.0, 2.0])
    step = lr.compile_step(lambda x: x * scale["v"], (x,))
    assert step(x).tolist() == [2.0, 4.0]
    scale["v"] = 3.0
    assert step(x).tolist() == [2.0, 4.0], "the trace's constant, as documented"
    lr.invalidate_compiled_steps()
    assert step(x).tolist() == [3.0, 6.0]
    assert step.traces == 2
