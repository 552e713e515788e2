"""Replay is never stale: every replay path against the plain traced program, for state that is
still pending when the step is traced and for what users do between calls.

The truth is the same program run with plain traced steps (call the step, mark_step), from the
same seed, in the same process; gradients through a non-leaf argument are checked against
PyTorch's autograd.
"""

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn
import lazyrt.nn.functional as F


def data(seed, *shape):
    return lr.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


class World:
    """A model, an optimizer and a step, built from one seed and never synced."""

    def __init__(self, opt="adamw", dropout=0.0, zero_grad="end", lr_=0.1):
        lr.manual_seed(0)
        layers = [nn.Linear(5, 8), nn.Tanh()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        layers.append(nn.Linear(8, 3))
        self.model = nn.Sequential(*layers)
        params = self.model.parameters()
        self.opt = {"adamw": lambda: lr.optim.AdamW(params, lr=lr_),
                    "adam": lambda: lr.optim.Adam(params, lr=lr_, weight_decay=0.01),
                    "sgd": lambda: lr.optim.SGD(params, lr=lr_, momentum=0.9)}[opt]()
        self.zero_grad = zero_grad

    def step(self, x):
        if self.zero_grad == "start":
            self.opt.zero_grad()
        loss = (self.model(x) ** 2).mean()
        loss.backward()
        self.opt.step()
        if self.zero_grad == "end":
            self.opt.zero_grad()
        return loss

    def state(self):
        """Every parameter, gradient and optimizer state tensor, as NumPy."""
        out = {k: v.numpy().copy() for k, v in self.model.state_dict().items()}
        for i, p in enumerate(self.model.parameters()):
            out[f"grad{i}"] = None if p.grad is None else p.grad.numpy().copy()
        for i, t in enumerate(self.opt.state_tensors()):
            out[f"opt{i}"] = t.numpy().copy()
        return out


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if a[k] is None or b[k] is None:
            assert a[k] is None and b[k] is None, f"{k}: one gradient is None, the other is not"
        else:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, err_msg=k)


def run_both(program, **world):
    """program(world, call) with call = the replayed step, then with call = the plain step;
    returns (replayed losses, plain losses, replayed state, plain state)."""
    results = []
    for replayed in (True, False):
        w = World(**world)
        compiled = {}

        def call(x):
            if not replayed:
                loss = w.step(x)
                lr.mark_step()
                return loss.item()
            if "step" not in compiled:
                compiled["step"] = lr.compile_step(w.step, (x,))
            return compiled["step"](x).item()

        losses = program(w, call)
        results.append((losses, w.state(), compiled.get("step")))
    (l1, s1, step), (l2, s2, _) = results
    np.testing.assert_allclose(l1, l2, rtol=1e-6, atol=1e-7)
    assert_same_state(s1, s2)
    assert len(set(np.round(l2, 5))) > 1, "the program must make the losses change"
    return step


def test_fresh_model_never_synced_replays_exactly():
    # The program: model and optimizer still pending when the step is traced.
    step = run_both(lambda w, call: [call(data(1, 10, 5)) for _ in range(4)])
    assert step.traces == 1


@pytest.mark.parametrize("opt", ["adamw", "adam", "sgd"])
def test_load_state_dict_without_sync_before_the_trace_and_between_calls(opt):
    def program(w, call):
        w.model.load_state_dict({k: data(i + 10, *v.shape) for i, (k, v) in enumerate(w.model.state_dict().items())})
        losses = [call(data(1, 10, 5)) for _ in range(2)]
        w.model.load_state_dict({k: data(i + 20, *v.shape) for i, (k, v) in enumerate(w.model.state_dict().items())})
        return losses + [call(data(2, 10, 5)) for _ in range(2)]
    run_both(program, opt=opt)


def test_in_place_edits_of_a_parameter_before_the_trace_and_between_calls():
    def program(w, call):
        with lr.no_grad():
            w.model[0].weight.mul_(0.5)
        losses = [call(data(1, 10, 5))]
        with lr.no_grad():
            w.model[0].weight.add_(data(3, 8, 5))
            w.model[2].bias.copy_(data(4, 3))
        return losses + [call(data(1, 10, 5)) for _ in range(2)]
    run_both(program)


@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_a_learning_rate_change_between_calls_is_used_without_recompiling(opt):
    def program(w, call):
        losses = [call(data(1, 10, 5)) for _ in range(2)]
        lr.mark_step()
        before = lr.metrics.counter("UncachedCompile")
        for rate in (0.5, 0.0, 0.02):
            w.opt.param_groups[0]["lr"] = rate
            losses.append(call(data(1, 10, 5)))
            if rate == 0.0:
                losses.append(call(data(1, 10, 5)))
                assert losses[-1] == pytest.approx(losses[-2], rel=1e-6), "rate 0: the weights stay"
        program.compiles = lr.metrics.counter("UncachedCompile") - before
        return losses
    step = run_both(program, opt=opt)
    assert step.traces == 1, "a new rate is a tensor value, not a new trace"


def test_other_hyperparameters_retrace():
    def program(w, call):
        losses = [call(data(1, 10, 5)) for _ in range(2)]
        w.opt.param_groups[0]["weight_decay"] = 0.5
        return losses + [call(data(1, 10, 5)) for _ in range(2)]
    step = run_both(program)
    assert step.traces == 2


def test_eval_after_training_turns_dropout_off_and_train_turns_it_on():
    def program(w, call):
        losses = [call(data(1, 10, 5)) for _ in range(2)]
        w.model.eval()
        losses += [call(data(1, 10, 5)) for _ in range(2)]
        w.model.train()
        return losses + [call(data(1, 10, 5))]
    step = run_both(program, dropout=0.5)
    assert step.traces == 3


def test_replacing_a_parameter_between_calls_is_read_by_the_next_call():
    def program(w, call):
        losses = [call(data(1, 10, 5))]
        w.model[2].bias = nn.Parameter(data(5, 3))  # the optimizer keeps updating the old one
        return losses + [call(data(1, 10, 5)) for _ in range(2)]
    run_both(program)


@pytest.mark.parametrize("set_to_none", [True, False])
def test_gradients_accumulated_over_calls_with_zero_grad_outside(set_to_none):
    def program(w, call):
        losses = []
        for i in range(6):
            losses.append(call(data(i, 10, 5)))
            if i % 3 == 2:
                w.opt.zero_grad(set_to_none=set_to_none)
        return losses
    run_both(program, zero_grad="never")


def test_zero_grad_at_the_start_of_the_step():
    run_both(lambda w, call: [call(data(i, 10, 5)) for i in range(3)], zero_grad="start")


def test_a_step_that_clears_gradients_clears_them_on_every_call():
    # The step ends with zero_grad(set_to_none); a gradient set between calls must go.
    def program(w, call):
        losses = [call(data(1, 10, 5))]
        for p in w.model.parameters():
            p.grad = data(9, *p.shape)
        return losses + [call(data(1, 10, 5))]
    run_both(program, zero_grad="end")


def test_deleting_the_optimizer_retraces_with_the_new_one():
    def program(w, call):
        losses = [call(data(1, 10, 5)) for _ in range(2)]
        w.opt = lr.optim.SGD(w.model.parameters(), lr=0.05)
        return losses + [call(data(1, 10, 5)) for _ in range(2)]
    step = run_both(program)
    assert step.traces == 2


def test_a_non_leaf_argument_gets_pytorchs_gradient():
    # Traced on a leaf that requires grad, called on x * 2: the gradient flows back through
    # the multiplication into x.grad, as in PyTorch.
    lr.manual_seed(0)
    lin = nn.Linear(4, 2)
    w0, b0 = lin.weight.numpy().copy(), lin.bias.numpy().copy()
    x_np = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)

    def step(x):
        loss = lin(x).tanh().sum()
        loss.backward()
        return loss

    x = lr.tensor(x_np, requires_grad=True)
    s = lr.compile_step(step, (x,))
    s(x)
    x.grad = None
    s(x * 2)
    s(x * 3)

    tx = torch.tensor(x_np, requires_grad=True)
    tl = torch.nn.Linear(4, 2)
    with torch.no_grad():
        tl.weight.copy_(torch.from_numpy(w0))
        tl.bias.copy_(torch.from_numpy(b0))
    tl(tx * 2).tanh().sum().backward()
    tl(tx * 3).tanh().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    # Gradients of the weights accumulated over all three calls.
    tl(tx).tanh().sum().backward()
    np.testing.assert_allclose(lin.weight.grad.numpy(), tl.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    # The second call retraced once: the weights' gradients existed by then, so backward
    # accumulates into them. A non-leaf argument itself needs no new trace.
    assert s.traces == 2


def test_a_second_leaf_argument_gets_its_own_gradient():
    lr.manual_seed(0)
    lin = nn.Linear(4, 2)

    def step(x):
        lin(x).sum().backward()
        return lin.weight.sum()

    x1 = data(1, 3, 4).requires_grad_()
    x2 = data(2, 3, 4).requires_grad_()
    s = lr.compile_step(step, (x1,))
    s(x2)
    assert x1.grad is None, "the traced argument is not the one called with"
    np.testing.assert_allclose(x2.grad.numpy(), np.tile(lin.weight.numpy().sum(0), (3, 1)), rtol=1e-6)


def test_an_argument_that_is_also_captured_state_is_not_confused_with_it():
    lr.manual_seed(0)
    lin = nn.Linear(3, 3)

    def step(x):
        with lr.no_grad():
            x.mul_(2)  # when x is the weight itself, the forward sees the doubled weight
        return lin(lr.ones(1, 3)).sum()

    def plain(arg_is_weight):
        lr.manual_seed(0)
        l2 = nn.Linear(3, 3)
        return l2, (l2.weight if arg_is_weight else data(7, 3, 3))

    for first, then in [(False, True), (True, False)]:
        lr.manual_seed(0)
        lin = nn.Linear(3, 3)
        other = data(7, 3, 3)
        s = lr.compile_step(step, (lin.weight if first else other,))
        got = [s(lin.weight if a else other).item() for a in (first, then, then)]
        lr.manual_seed(0)
        lin = nn.Linear(3, 3)
        other = data(7, 3, 3)
        want = [step(lin.weight if a else other).item() for a in (first, then, then)]
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_grad_mode_at_the_call_is_a_guard():
    lr.manual_seed(0)
    lin = nn.Linear(3, 1)

    def step(x):
        y = lin(x).sum()
        if y.requires_grad:
            y.backward()
        return y

    s = lr.compile_step(step, (data(1, 2, 3),))
    s(data(1, 2, 3))
    g = lin.weight.grad.numpy().copy()
    with lr.no_grad():
        s(data(1, 2, 3))
    np.testing.assert_array_equal(lin.weight.grad.numpy(), g)
    assert s.traces == 2


@pytest.mark.parametrize("opt,zero_grad", [("adamw", "end"), ("sgd", "end"), ("adam", "end")])
def test_low_level_calls_compute_state_made_before_the_step_once(opt, zero_grad):
    # A model and optimizer built without a mark_step() and a step traced on them: the
    # low-level calls compute the model's making once (the weights' initialisation, the
    # optimizer state the step creates) instead of refusing, so each replay starts from the
    # state the last one wrote back, and three replays equal three plain steps, state and all.
    # (They used to be refused, and before that every replay recomputed the initial weights.)
    x = data(1, 10, 5)
    plain = World(opt, zero_grad=zero_grad)
    losses, states = [], []
    for _ in range(3):
        loss = plain.step(x)
        lr.mark_step()
        losses.append(loss.item())
        states.append(plain.state())
    assert len(set(losses)) == 3
    w = World(opt, zero_grad=zero_grad)
    loss = w.step(x)
    outputs = [loss] + list(w.model.parameters())
    h = lr.graph_hash(outputs)
    lr.warm_up_cache(outputs)
    ids, values = lr.graph_inputs(outputs)
    for k in range(3):
        out = lr.run_cached_graph(h, values)
        assert out[0].item() == pytest.approx(losses[k], rel=1e-6), f"replay {k}"
        assert_same_state(w.state(), states[k])


@pytest.mark.parametrize("making", ["built", "initialised", "loaded"])
@pytest.mark.parametrize("zero_grad", ["none", "zeros_after_a_first_step"])
def test_low_level_calls_replay_the_seed_program_as_written(making, zero_grad):
    # The seed's user: a model built (then re-initialised in place, or loaded) and an input
    # drawn with no mark_step(), one step traced, [loss] + params + grads handed to the
    # low-level calls (not the optimizer's moments or step count). Three replays equal three
    # plain steps: losses, weights, gradients and optimizer state.
    def run(replayed):
        lr.manual_seed(0)
        model = nn.Linear(5, 3)
        if making == "initialised":
            nn.init.xavier_uniform_(model.weight)
        elif making == "loaded":
            model.load_state_dict({"weight": lr.ones(3, 5) * 0.1, "bias": lr.zeros(3)})
        opt = lr.optim.AdamW(model.parameters(), lr=1e-2)
        x = lr.randn(10, 5)
        if zero_grad != "none":  # gradients (zeros) from a first step: the traced one accumulates into them
            (model(x) ** 2).mean().backward()
            opt.zero_grad(set_to_none=False)
            lr.mark_step()

        def step():
            loss = (model(x) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=zero_grad == "none")
            return loss

        if not replayed:
            losses = []
            for _ in range(3):
                loss = step()
                lr.mark_step()
                losses.append(loss.item())
        else:
            loss = step()
            params = list(model.parameters())
            outputs = [loss] + params + [p.grad for p in params if p.grad is not None]
            h = lr.graph_hash(outputs)
            lr.warm_up_cache(outputs)
            ids, values = lr.graph_inputs(outputs)
            losses = [lr.run_cached_graph(h, values)[0].item() for _ in range(3)]
        state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
        state["grads"] = [None if p.grad is None else p.grad.numpy().copy() for p in model.parameters()]
        state["opt"] = [t.numpy().copy() for t in opt.state_tensors()]
        return losses, state

    (got, got_state), (want, want_state) = run(True), run(False)
    assert len(set(want)) == 3
    assert got == want
    for k in ("weight", "bias"):
        np.testing.assert_array_equal(got_state[k], want_state[k])
    for a, b in zip(got_state["grads"] + got_state["opt"], want_state["grads"] + want_state["opt"]):
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_array_equal(a, b)


def test_low_level_calls_take_an_input_drawn_before_the_step_as_an_input():
    # x drawn (pending) right before the step, no mark_step() anywhere: it is computed once
    # and is a graph input the matcher can replace, not a draw each replay makes anew.
    w = World("sgd")
    x = lr.randn(10, 5)
    loss = w.step(x)
    outputs = [loss] + list(w.model.parameters())
    h = lr.graph_hash(outputs)
    lr.warm_up_cache(outputs)
    ids, values = lr.graph_inputs(outputs)
    assert not x.is_pending() and lr.tensor_id(x) in ids
    matcher = lr.GraphInputMatcher({lr.tensor_id(x): 0}, ids, values)
    got = [lr.run_cached_graph(h, matcher([x]))[0].item() for _ in range(2)]
    plain = World("sgd")
    want = []
    for _ in range(2):
        want.append(plain.step(x).item())
        lr.mark_step()
    assert got == pytest.approx(want, rel=1e-6)


def test_low_level_calls_after_mark_step_match_plain_steps_across_lr_changes():
    losses = []
    for replayed in (True, False):
        w = World()
        lr.mark_step()
        x = data(1, 10, 5)
        if replayed:
            loss = w.step(x)
            h = lr.graph_hash([loss])
            lr.warm_up_cache([loss])
            _, values = lr.graph_inputs([loss])
            out = []
            for rate in (0.1, 0.1, 0.3):
                w.opt.param_groups[0]["lr"] = rate
                out.append(lr.run_cached_graph(h, values)[0].item())
        else:
            out = []
            for rate in (0.1, 0.1, 0.3):
                w.opt.param_groups[0]["lr"] = rate
                out.append(w.step(x).item())
                lr.mark_step()
        losses.append((out, w.state()))
    np.testing.assert_allclose(losses[0][0], losses[1][0], rtol=1e-6)
    assert_same_state(losses[0][1], losses[1][1])


def test_loops_accept_tensors_that_require_grad_under_no_grad():
    # As PyTorch/XLA's test_while_loop runs a Linear inside the loop: under no_grad nothing is
    # differentiated.
    lr.manual_seed(0)
    lin = nn.Linear(4, 4)
    t = torch.nn.Linear(4, 4)
    with torch.no_grad():
        t.weight.copy_(torch.tensor(lin.weight.numpy()))
        t.bias.copy_(torch.tensor(lin.bias.numpy()))
    x0 = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    with lr.no_grad():
        (i, x) = lr.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, lin(x).tanh()),
                               (lr.tensor(0), lr.tensor(x0)))
    want = torch.from_numpy(x0)
    with torch.no_grad():
        for _ in range(3):
            want = t(want).tanh()
    np.testing.assert_allclose(x.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert not x.requires_grad
    # Without no_grad the loop is differentiated: the Linear's weight gets torch's gradient.
    (i, x) = lr.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, lin(x).tanh()), (lr.tensor(0), lr.tensor(x0)))
    x.sum().backward()
    want = torch.from_numpy(x0)
    for _ in range(3):
        want = t(want).tanh()
    want.sum().backward()
    np.testing.assert_allclose(lin.weight.grad.numpy(), t.weight.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_reading_the_loss_every_step_without_mark_step_keeps_one_graph():
    # The beginner's loop: item() every step, never mark_step(). Reading the loss also computes
    # the updates that share its graph, so each step starts from device data.
    x, y = data(1, 32, 8), data(2, 32, 1)

    def train(mark_steps):
        lr.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = lr.optim.AdamW(model.parameters(), lr=1e-2)
        lr.mark_step()
        before = lr.metrics.counter("UncachedCompile")
        losses = []
        for _ in range(30):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if mark_steps:
                lr.mark_step()
            losses.append(loss.item())
            assert not model[0].weight.is_pending() and not opt.step_count.is_pending()
        return losses, lr.metrics.counter("UncachedCompile") - before

    losses, compiles = train(mark_steps=False)
    assert compiles <= 2
    np.testing.assert_allclose(losses, train(mark_steps=True)[0], rtol=1e-6)


def test_reading_the_loss_every_step_without_mark_step_keeps_compiles_and_memory_flat():
    # Over many steps: the number of compiled graphs stops growing after the first steps, and
    # so does the memory lazyrt holds (no pending history kept alive from step to step).
    x, y = data(3, 32, 8), data(4, 32, 1)
    lr.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = lr.optim.Adam(model.parameters(), lr=1e-2)
    lr.mark_step()
    before = lr.metrics.counter("UncachedCompile") + lr.metrics.counter("CachedCompile")
    compiles, live, losses = [], [], []
    for _ in range(60):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        compiles.append(lr.metrics.counter("UncachedCompile"))
        live.append(lr.debug.live_memory_bytes())
    assert lr.metrics.counter("UncachedCompile") + lr.metrics.counter("CachedCompile") - before == 60, \
        "one graph per step"
    assert compiles[-1] - compiles[0] <= 1 and compiles[5:] == [compiles[5]] * 55, compiles
    assert live[5:] == [live[5]] * 55, live
    assert losses[-1] < losses[0]


# ---- regressions found by the randomized test (tests/python/replay_fuzz.py) ----------------


def test_a_gradient_zeroed_between_calls_is_read_through_its_detached_copy():
    # The optimizer reads p.grad().detach(): a temporary on the gradient's buffer. The replay
    # must read the gradient tensor itself on each call, not the buffer the trace saw.
    results = []
    for replayed in (True, False):
        lr.manual_seed(0)
        m = nn.Linear(5, 3)
        extra = nn.Parameter(lr.zeros(3))  # updated by the optimizer, never differentiated
        extra.grad = lr.ones(3)
        opt = lr.optim.Adam(list(m.parameters()) + [extra], lr=0.1)
        x = data(0, 10, 5)

        def step(x):
            loss = (m(x) ** 2).mean()
            loss.backward()
            opt.step()
            return loss

        s = lr.compile_step(step, (x,)) if replayed else step
        extra.grad.zero_()
        s(x)
        lr.mark_step()
        results.append(extra.numpy().copy())
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[1], np.zeros(3, np.float32))


def low_level_trace(w, x):
    lr.mark_step()
    loss = w.step(x)
    h = lr.graph_hash([loss])
    lr.warm_up_cache([loss])
    return h, lr.graph_inputs([loss])[1]


def test_low_level_calls_refuse_a_step_that_changes_gradients():
    w = World(zero_grad="start")  # gradients are None before the step and set after it
    lr.mark_step()
    with pytest.raises(lr.Error, match="gradient"):
        low_level_trace(w, data(1, 10, 5))


@pytest.mark.parametrize("update", ["add_", "fill_", "copy_"])
def test_low_level_calls_replay_an_update_the_outputs_do_not_reach(update):
    # A counter the step changes in place, which neither the loss nor the updates read: it is
    # part of the step all the same (everything updated in place since the last mark_step()),
    # and each replay changes it as a plain step does, whether or not the new value reads the
    # old one. (It used to be refused.)
    def run(replayed):
        w = World()
        counter = lr.zeros([])
        step = w.step
        change = {"add_": lambda: counter.add_(1), "fill_": lambda: counter.fill_(7.0),
                  "copy_": lambda: counter.copy_(lr.ones([]) * 3)}[update]
        w.step = lambda x: (change(), step(x))[1]
        x = data(1, 10, 5)
        if replayed:
            h, values = low_level_trace(w, x)
            out = []
            for _ in range(3):
                out.append((lr.run_cached_graph(h, values)[0].item(), counter.item()))
            return out
        lr.mark_step()
        out = []
        for _ in range(3):
            loss = w.step(x)
            lr.mark_step()
            out.append((loss.item(), counter.item()))
        return out

    assert run(True) == run(False)


def test_low_level_calls_replay_plain_sgd_and_its_step_count_as_plain_steps():
    # Plain SGD's update does not read its step count. Each parameter's update is one call
    # node that takes the count among its operands, so the graph reaches the count's update and
    # a replay advances it, as plain steps do.
    results = []
    for replayed in (True, False):
        w = World(opt="sgd")
        w.opt = lr.optim.SGD(w.model.parameters(), lr=0.1)
        x = data(1, 10, 5)
        if replayed:
            h, values = low_level_trace(w, x)
            losses = [lr.run_cached_graph(h, values)[0].item() for _ in range(3)]
        else:
            lr.mark_step()
            losses = []
            for _ in range(3):
                losses.append(w.step(x).item())
                lr.mark_step()
        results.append((losses, w.state(), w.opt.step_count.item()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
    assert_same_state(results[0][1], results[1][1])
    assert results[0][2] == results[1][2] == 3.0


@pytest.mark.parametrize("change", ["eval", "replace", "new_optimizer", "weight_decay", "set_grad", "zero_grad"])
def test_run_cached_graph_refuses_after_changes_it_cannot_see(change):
    w = World(dropout=0.5, zero_grad="never")
    lr.mark_step()
    x = data(1, 10, 5)
    w.step(x)  # gradients exist before the traced step: it accumulates into them
    h, values = low_level_trace(w, x)
    lr.run_cached_graph(h, values)
    if change == "eval":
        w.model.eval()
    elif change == "replace":
        w.model[3].bias = nn.Parameter(data(5, 3))
    elif change == "new_optimizer":
        w.opt = lr.optim.SGD(w.model.parameters(), lr=0.1)
    elif change == "weight_decay":
        w.opt.param_groups[0]["weight_decay"] = 0.5
    elif change == "set_grad":
        w.model[0].weight.grad = data(6, 8, 5)
    else:
        w.opt.zero_grad(set_to_none=True)
    before = w.state()
    with pytest.raises(lr.Error, match="run_cached_graph"):
        lr.run_cached_graph(h, values)
    assert_same_state(w.state(), before)


def test_gradients_zeroed_together_stay_distinct_tensors_for_the_low_level_calls():
    # zero_grad(set_to_none=False) then a read: every zeroed gradient used to get the one
    # buffer of the executable's zero constant, so graph_inputs rewound only one of them.
    lr.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))  # biases and more of one shape
    opt = lr.optim.Adam(model.parameters(), lr=0.1)
    x = data(3, 6, 4)

    def step(x):
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    step(x)
    opt.zero_grad(set_to_none=False)
    grads = [p.grad.numpy().copy() for p in model.parameters()]
    lr.mark_step()
    loss = step(x)
    h = lr.graph_hash([loss])
    lr.warm_up_cache([loss])
    _, values = lr.graph_inputs([loss])
    for g, p in zip(grads, model.parameters()):
        np.testing.assert_array_equal(p.grad.numpy(), g)  # rewound: the traced step undone
    first = lr.run_cached_graph(h, values)[0].item()
    assert first == pytest.approx(loss_after_plain_steps(), rel=1e-6)


def loss_after_plain_steps():
    lr.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    opt = lr.optim.Adam(model.parameters(), lr=0.1)
    x = data(3, 6, 4)
    for i in range(2):
        loss = (model(x) ** 2).mean()
        loss.backward()
        opt.step()
        if i == 0:
            opt.zero_grad(set_to_none=False)
    lr.mark_step()
    return loss.item()


@pytest.mark.parametrize("identity", ["mul1", "add0", "sub0", "div1"])
def test_a_result_equal_to_the_old_value_of_an_updated_tensor_keeps_the_old_value(identity):
    # The result is a value the compiler reduces to the tensor's old value itself, which the
    # step then updates in place: the update must not be written over the memory the result is
    # read from. PyTorch runs the same program.
    make = {"mul1": lambda s: s * 1, "add0": lambda s: s + 0, "sub0": lambda s: s - 0, "div1": lambda s: s / 1}[identity]
    start = np.array([1.0, -2.0, 3.5], dtype=np.float32)
    s = lr.tensor(start.copy())
    ts = torch.tensor(start.copy())
    lr.mark_step()

    def step(x):
        r = make(s)
        s.add_(x)
        return r

    compiled = lr.compile_step(step, (lr.tensor(start),))
    for i in range(4):
        x = np.full(3, 10.0 * (i + 1), dtype=np.float32)
        got = compiled(lr.tensor(x)).numpy().copy()
        want = make(ts)
        ts.add_(torch.from_numpy(x))
        np.testing.assert_array_equal(got, want.numpy(), err_msg=f"call {i}")
        np.testing.assert_array_equal(s.numpy(), ts.numpy(), err_msg=f"call {i}")
    assert compiled.traces == 1


# ---- the Python values a step reads --------------------------------------------------------------
# A replay runs no Python: the numbers, functions and tensors a step function reads from its
# globals, its closure, attributes and containers are guarded (lazyrt._reads), and a change
# retraces; a variant traced for a value is replayed again when the value comes back.

scale = 2.0
cfg = {"shift": 1.0}
act = lr.tanh
w_a, w_b = lr.ones(3), lr.full((3,), 3.0)
w = w_a


def _reads_globals(x):
    return act(x * w * scale + cfg["shift"])


def test_numbers_functions_and_tensors_a_step_reads_are_guarded():
    global scale, act, w
    x = lr.tensor([0.5, -1.0, 2.0])
    step = lr.compile_step(_reads_globals, (x,))

    def check(what, traces):
        np.testing.assert_allclose(step(x).numpy(), _reads_globals(x).numpy(), rtol=1e-6, err_msg=what)
        assert step.traces == traces, f"{what}: {step.traces} traces, expected {traces}"
    try:
        check("first call", 1)
        check("nothing changed", 1)
        scale = 3.0
        check("a global number", 2)
        cfg["shift"] = -1.0
        check("an item of a global dict", 3)
        act = lr.sigmoid
        check("a global function", 4)
        w = w_b  # the tensor read before is alive still (w_a): the trace read that one
        check("a global tensor rebound", 5)
        scale, cfg["shift"], act, w = 2.0, 1.0, lr.tanh, w_a
        check("back to the first values: its variant", 5)
    finally:
        scale, cfg["shift"], act, w = 2.0, 1.0, lr.tanh, w_a


def test_a_loss_weight_in_a_closure_changed_between_training_calls():
    def program(world, call):
        weight = [1.0]

        def step(x):
            loss = (world.model(x) ** 2).mean() * weight[0]
            loss.backward()
            world.opt.step()
            world.opt.zero_grad()
            return loss
        world.step = step
        losses = []
        for k in range(6):
            if k == 3:
                weight[0] = 0.25  # a list item of the closure: read by the step
            losses.append(call(data(k, 4, 5)))
        return losses
    step = run_both(program)
    assert step.traces == 2
