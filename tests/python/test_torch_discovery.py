"""lazyrt.torch discovery: the modules and optimizers a step uses, wherever the program keeps
them — arguments (positional, keyword, nested), an optimizer held by a module, dataclasses,
namespaces, lists and dicts — and a refusal, naming it, of an optimizer the capture cannot own.

PyTorch eager is the oracle: each test runs the same program eagerly and through
lazyrt.torch.compile from the same initial state, on the same batches, comparing losses,
parameters, gradients and optimizer.state_dict() after every step (float32, rtol 1e-5).
"""

import copy
import dataclasses
import types

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lazyrt
import lazyrt.torch
from conftest import same_tree

RTOL, ATOL = 1e-5, 1e-6
STEPS = 4


def close(a, b, what):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL, err_msg=what)


def same_state(pairs, what):
    """pairs: [(lazy module, eager module)] and [(lazy optimizer, eager optimizer)] mixed."""
    for a, b in pairs:
        if isinstance(a, nn.Module):
            for (name, p1), (_, p2) in zip(a.named_parameters(), b.named_parameters()):
                close(p1.detach().numpy(), p2.detach().numpy(), f"{what} parameter {name}")
                assert (p1.grad is None) == (p2.grad is None), f"{what} {name}.grad"
                if p1.grad is not None:
                    close(p1.grad.numpy(), p2.grad.numpy(), f"{what} {name}.grad")
        else:
            same_tree(a.state_dict(), b.state_dict(), f"{what} optimizer.state_dict()")
            assert len(a.state) == len(b.state), f"{what}: optimizer state entries"


def net(seed=0, n_in=6, n_out=4):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n_in, 12), nn.Tanh(), nn.Linear(12, n_out))


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def batches(n=STEPS, seed=1, n_in=6, n_out=4):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, n_in, generator=g), torch.randn(8, n_out, generator=g)) for _ in range(n)]


def train(model, opt, x, y):
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def run_both(call_lazy, call_eager, pairs, data=None, what=""):
    """Calls both on every batch, comparing the losses and the state after each step."""
    for k, (x, y) in enumerate(data or batches()):
        got, want = call_lazy(x, y), call_eager(x, y)
        close(got.detach().numpy(), want.detach().numpy(), f"{what} loss at step {k}")
        same_state(pairs, f"{what} after step {k}:")


def test_model_and_optimizer_as_positional_arguments():
    m_eager = net()
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = sgd(m_eager.parameters()), sgd(m_lazy.parameters())
    step = lazyrt.torch.compile(train)
    run_both(lambda x, y: step(m_lazy, o_lazy, x, y), lambda x, y: train(m_eager, o_eager, x, y),
             [(m_lazy, m_eager), (o_lazy, o_eager)])
    assert step.captures == 1
    # Another model and optimizer passed: found anew, a capture of their own.
    m2_eager = net(seed=5)
    m2_lazy = copy.deepcopy(m2_eager)
    o2_eager, o2_lazy = sgd(m2_eager.parameters()), sgd(m2_lazy.parameters())
    run_both(lambda x, y: step(m2_lazy, o2_lazy, x, y), lambda x, y: train(m2_eager, o2_eager, x, y),
             [(m2_lazy, m2_eager), (o2_lazy, o2_eager), (m_lazy, m_eager)], what="second model:")
    assert step.captures == 2


def test_module_optimizer_and_number_arguments_take_the_guarded_fast_path():
    # train(model, opt, x, y, scale) used to build its world and signature on every call (the
    # quick key and the C++ guard took tensor arguments only): ~20x the time of a step that
    # reaches its model by closure. Modules, optimizers and plain values are now in both, by
    # identity and by value; alternating two models, and changing the number, stay exact.
    def scaled(model, opt, x, y, scale):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y) * scale
        loss.backward()
        opt.step()
        return loss

    pairs, steps = [], lazyrt.torch.compile(scaled)
    for seed in (0, 5):
        m_eager = net(seed=seed)
        m_lazy = copy.deepcopy(m_eager)
        pairs.append((m_lazy, m_eager, sgd(m_lazy.parameters()), sgd(m_eager.parameters())))
    for k, (x, y) in enumerate(batches(n=6)):
        m_lazy, m_eager, o_lazy, o_eager = pairs[k % 2]
        scale = 1.0 if k < 4 else 2.0
        got, want = steps(m_lazy, o_lazy, x, y, scale), scaled(m_eager, o_eager, x, y, scale)
        close(got.detach().numpy(), want.detach().numpy(), f"loss at step {k}")
        same_state([(a, b) for a, b, _, _ in pairs] + [(c, d) for _, _, c, d in pairs], f"after step {k}:")
        assert steps._recent and steps._recent[0][2] is not None, "a guarded call"
    assert steps.captures == 4  # two models, two scales
    fast = steps._recent[0][3]
    m_lazy, _, o_lazy, _ = pairs[1]
    x, y = batches(n=1)[0]
    steps(m_lazy, o_lazy, x, y, 2.0)
    assert steps._recent[0][3] is fast and fast is not None, "the same call again: the fast call"


def test_calls_that_alternate_between_captures_take_the_guarded_fast_path():
    # Two batch sizes in turn (a last short batch, an evaluation batch), gradients accumulated
    # over two calls (none on the first, present on the second): each call's facts are those of
    # one of the step's last calls, whose guard it passes, so it runs without discovery or a
    # signature (before: only the very last call's guard was tried, and every switch was
    # discovered and signed anew, ~20x the time of a step). The results stay eager's.
    m_lazy, m_eager = net(), net()
    o_lazy, o_eager = sgd(m_lazy.parameters()), sgd(m_eager.parameters())

    def accumulate(model, opt, x, y, update):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if update:
            opt.step()
            opt.zero_grad()
        return loss

    compiled = lazyrt.torch.compile(accumulate)
    found = []
    discovery = compiled._discovery
    compiled._discovery = lambda *a: found.append(1) or discovery(*a)
    g = torch.Generator().manual_seed(4)
    sizes = [8, 5, 8, 3]
    for k in range(36):
        n = sizes[k % len(sizes)]
        x, y = torch.randn(n, 6, generator=g), torch.randn(n, 4, generator=g)
        update = k % 3 == 2
        got = compiled(m_lazy, o_lazy, x, y, update)
        want = accumulate(m_eager, o_eager, x, y, update)
        close(got.detach().numpy(), want.detach().numpy(), f"loss at call {k}")
        same_state([(m_lazy, m_eager), (o_lazy, o_eager)], f"after call {k}:")
        if k == 23:  # every (size, update, gradients present, momentum present) met
            settled = len(found)
    assert len(found) == settled, f"{len(found) - settled} calls of the last round were discovered again"
    # The calls kept for their guards are those on the objects of the last call: a call on
    # another model drops the others (each holds its model, optimizer and tensors alive).
    m_new = net(seed=2)
    compiled(m_new, sgd(m_new.parameters()), x, y, True)
    assert all(world.modules == [m_new] for world, _, _, _ in compiled._recent)


def test_a_model_the_program_drops_is_not_kept_by_the_compiled_step():
    # A sweep, or k-fold training: one compiled step, a new model and optimizer per trial. The
    # signatures of the earlier trials' captures held their models (argument objects) alive,
    # and kept their captures (compiled code, views of the parameters' memory) forever. Objects
    # are in a signature by identity without being held; a capture of a world whose objects are
    # all gone is dropped when the next capture is made. The same for a model reached by a
    # global that the program rebinds.
    import gc
    import weakref

    global SWEEP_MODEL, SWEEP_OPT

    def closure_trial(x, y):
        return train(SWEEP_MODEL, SWEEP_OPT, x, y)

    for compiled, by_argument in ((lazyrt.torch.compile(train), True), (lazyrt.torch.compile(closure_trial), False)):
        dropped = []
        for seed in range(6):
            gc.collect()  # (a model and its optimizer may hold each other: freed by the collector)
            m_lazy, m_eager = net(seed=seed), net(seed=seed)
            o_lazy, o_eager = sgd(m_lazy.parameters()), sgd(m_eager.parameters())
            SWEEP_MODEL, SWEEP_OPT = m_lazy, o_lazy
            for x, y in batches(n=3, seed=seed):
                got = compiled(m_lazy, o_lazy, x, y) if by_argument else compiled(x, y)
                close(got.detach().numpy(), train(m_eager, o_eager, x, y).detach().numpy(), f"trial {seed}")
            same_state([(m_lazy, m_eager), (o_lazy, o_eager)], f"trial {seed}:")
            dropped.append(weakref.ref(m_lazy))
            del m_lazy, o_lazy, got
        SWEEP_MODEL = SWEEP_OPT = None
        gc.collect()
        # (the last trial's model: its calls' guards hold it until a call on another model)
        alive = sum(r() is not None for r in dropped[:-1])
        assert alive == 0, f"{alive} of the first 5 dropped models alive (by argument: {by_argument})"
        # Each trial captures twice (no momentum yet, then momentum): those of the last two
        # trials at most are kept (the one before the last is dropped once the collector ran).
        assert sum(map(len, compiled._entries.values())) <= 4, f"{len(compiled._entries)} captures kept"


def test_tuple_and_list_arguments_take_the_fast_path_and_stay_exact():
    # A recurrent model's hidden state passed as a tuple of tensors (a new tuple every call), a
    # batch as a list: the call's leaves enter the quick key and the guard, so it takes the fast
    # call (before: discovered and signed again on every call, ~6x the time); a tuple that now
    # holds a model, or another structure, is discovered again.
    def step(model, opt, batch, hidden):
        x, y = batch
        opt.zero_grad()
        loss = F.mse_loss(model(x + hidden[0] - hidden[1]), y)
        loss.backward()
        opt.step()
        return loss

    m_lazy, m_eager = net(), net()
    o_lazy, o_eager = sgd(m_lazy.parameters()), sgd(m_eager.parameters())
    compiled = lazyrt.torch.compile(step)
    found = []
    discovery = compiled._discovery
    compiled._discovery = lambda *a: found.append(1) or discovery(*a)
    for k, (x, y) in enumerate(batches(n=5)):
        hidden = (torch.full((8, 6), 0.1 * k), torch.full((8, 6), 0.05))
        got = compiled(m_lazy, o_lazy, [x, y], hidden)
        want = step(m_eager, o_eager, [x, y], hidden)
        close(got.detach().numpy(), want.detach().numpy(), f"loss at step {k}")
        same_state([(m_lazy, m_eager), (o_lazy, o_eager)], f"after step {k}:")
        if k == 1:
            settled = len(found)  # the first call has no gradients yet: the second is signed anew
    assert len(found) == settled <= 2 and compiled._recent[0][3] is not None, "then the fast call, every call"
    # The model and optimizer inside a tuple argument, alternating between two pairs: each call
    # trains the pair it is given, as eager.
    pairs = []
    for seed in (1, 4):
        a, b = net(seed=seed), net(seed=seed)
        pairs.append(((a, sgd(a.parameters())), (b, sgd(b.parameters()))))
    wrapped = lazyrt.torch.compile(lambda pair, x, y: train(pair[0], pair[1], x, y))
    for k, (x, y) in enumerate(batches(n=6)):
        lazy, eager = pairs[k % 2]
        got, want = wrapped(lazy, x, y), train(eager[0], eager[1], x, y)
        close(got.detach().numpy(), want.detach().numpy(), f"pair {k % 2} loss at step {k}")
        same_state([(lazy[0], eager[0]), (lazy[1], eager[1])], f"pair {k % 2} after step {k}:")


def test_model_and_optimizer_as_keyword_and_nested_arguments():
    def step_fn(x, y, *, parts, extra=()):
        model, opt = parts["model"], parts["opt"]
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        for m in extra:  # modules nested in a tuple argument
            loss = loss + m(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    m_eager, h_eager = net(), net(seed=3)
    m_lazy, h_lazy = copy.deepcopy(m_eager), copy.deepcopy(h_eager)
    o_eager = sgd(list(m_eager.parameters()) + list(h_eager.parameters()))
    o_lazy = sgd(list(m_lazy.parameters()) + list(h_lazy.parameters()))
    step = lazyrt.torch.compile(step_fn)
    run_both(lambda x, y: step(x, y, parts={"model": m_lazy, "opt": o_lazy}, extra=(h_lazy,)),
             lambda x, y: step_fn(x, y, parts={"model": m_eager, "opt": o_eager}, extra=(h_eager,)),
             [(m_lazy, m_eager), (h_lazy, h_eager), (o_lazy, o_eager)])
    assert step.captures == 1


class SelfTraining(nn.Module):
    """A module that holds its own optimizer and trains itself in a method."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 4))
        self.opt = sgd(self.parameters())

    def forward(self, x):
        return self.body(x)

    def train_step(self, x, y):
        self.opt.zero_grad()
        loss = F.mse_loss(self(x), y)
        loss.backward()
        self.opt.step()
        return loss


def _self_training_twins():
    eager = SelfTraining()
    lazy = SelfTraining()
    lazy.load_state_dict(eager.state_dict())
    return eager, lazy


def test_optimizer_held_by_the_module_trains_in_its_own_method():
    eager, lazy = _self_training_twins()
    step = lazyrt.torch.compile(lazy.train_step)
    run_both(step, eager.train_step, [(lazy, eager), (lazy.opt, eager.opt)])
    assert step.captures == 1
    # Rebinding the attribute to another optimizer: the next call steps with that one.
    eager.opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    lazy.opt = torch.optim.SGD(lazy.parameters(), lr=0.1)
    run_both(step, eager.train_step, [(lazy, eager), (lazy.opt, eager.opt)], what="rebound opt:")
    assert step.captures == 2


def test_optimizer_held_by_a_module_the_step_names():
    eager, lazy = _self_training_twins()

    def make(model):
        def step(x, y):
            model.opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            model.opt.step()
            return loss
        return step

    step = lazyrt.torch.compile(make(lazy))
    run_both(step, make(eager), [(lazy, eager), (lazy.opt, eager.opt)])
    assert step.captures == 1


@dataclasses.dataclass
class TrainState:
    model: nn.Module
    opt: torch.optim.Optimizer
    epoch: int = 0


class Trainer:
    def __init__(self, state):
        self.state = state

    def step(self, x, y):
        return train(self.state.model, self.state.opt, x, y)


@pytest.mark.parametrize("where", ["dataclass in a closure", "namespace argument", "trainer object"])
def test_model_and_optimizer_held_by_an_object(where):
    m_eager = net()
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = sgd(m_eager.parameters()), sgd(m_lazy.parameters())
    if where == "dataclass in a closure":
        def make(state):
            def step(x, y):
                return train(state.model, state.opt, x, y)
            return step, state
        lazy_step, lazy_state = make(TrainState(m_lazy, o_lazy))
        eager_step, eager_state = make(TrainState(m_eager, o_eager))
        step = lazyrt.torch.compile(lazy_step)
    elif where == "namespace argument":
        def step_fn(x, y, ns):
            return train(ns.model, ns.opt, x, y)
        lazy_state = types.SimpleNamespace(model=m_lazy, opt=o_lazy)
        eager_state = types.SimpleNamespace(model=m_eager, opt=o_eager)
        compiled = lazyrt.torch.compile(step_fn)
        step = lambda x, y: compiled(x, y, lazy_state)  # noqa: E731
        step.compiled = compiled
        eager_step = lambda x, y: step_fn(x, y, eager_state)  # noqa: E731
    else:
        lazy_state, eager_state = TrainState(m_lazy, o_lazy), TrainState(m_eager, o_eager)
        step = lazyrt.torch.compile(Trainer(lazy_state).step)
        eager_step = Trainer(eager_state).step
    run_both(step, eager_step, [(m_lazy, m_eager), (o_lazy, o_eager)])
    compiled = getattr(step, "compiled", step)
    assert compiled.captures == 1
    # Another optimizer in the object: seen on the next call.
    lazy_state.opt = torch.optim.SGD(m_lazy.parameters(), lr=0.2)
    eager_state.opt = torch.optim.SGD(m_eager.parameters(), lr=0.2)
    run_both(step, eager_step, [(m_lazy, m_eager), (lazy_state.opt, eager_state.opt)], what="rebound opt:")
    assert compiled.captures == 2


def _gan_world(seed):
    torch.manual_seed(seed)
    nets = {"G": nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 6)),
            "D": nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))}
    opts = [torch.optim.Adam(nets["G"].parameters(), lr=1e-2, betas=(0.5, 0.9)),
            torch.optim.SGD(nets["D"].parameters(), lr=0.05, momentum=0.9)]
    return nets, opts


def _gan_step(nets, opts):
    def step(z, real):
        G, D = nets["G"], nets["D"]
        opt_g, opt_d = opts
        # Discriminator: real against generated (detached).
        opt_d.zero_grad()
        fake = G(z)
        d_loss = (D(real) - 1).pow(2).mean() + D(fake.detach()).pow(2).mean()
        d_loss.backward()
        opt_d.step()
        # Generator: fool the updated discriminator.
        opt_g.zero_grad()
        g_loss = (D(fake) - 1).pow(2).mean()
        g_loss.backward()
        opt_g.step()
        return d_loss + g_loss
    return step


def test_two_models_in_a_dict_each_with_its_optimizer_in_a_list():
    nets_e, opts_e = _gan_world(0)
    nets_l, opts_l = _gan_world(0)
    step = lazyrt.torch.compile(_gan_step(nets_l, opts_l))
    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(8, 3, generator=g), torch.randn(8, 6, generator=g)) for _ in range(STEPS)]
    pairs = [(nets_l["G"], nets_e["G"]), (nets_l["D"], nets_e["D"]), (opts_l[0], opts_e[0]), (opts_l[1], opts_e[1])]
    for k, (z, real) in enumerate(data):
        got, want = step(z, real), _gan_step(nets_e, opts_e)(z, real)
        close(got.detach().numpy(), want.detach().numpy(), f"loss at step {k}")
        for (a, b) in pairs[:2]:  # Adam: parameters within Adam's tolerance for near-zero gradients
            for (name, p1), (_, p2) in zip(a.named_parameters(), b.named_parameters()):
                np.testing.assert_allclose(p1.detach().numpy(), p2.detach().numpy(), rtol=1e-4, atol=1e-5,
                                           err_msg=f"step {k}: {name}")
        same_tree(opts_l[1].state_dict(), opts_e[1].state_dict(), f"step {k}: D's optimizer")
        same_tree(opts_l[0].state_dict(), opts_e[0].state_dict(), f"step {k}: G's optimizer", rtol=1e-4, atol=1e-5)
    assert step.captures == 1


class _Deep:
    def __init__(self, inner):
        self.inner = inner


def test_an_optimizer_out_of_reach_is_refused_by_name():
    # Only through a default argument: the capture cannot own it, so its step would not be
    # part of the replay.
    model = net()
    hidden = torch.optim.RMSprop(model.parameters(), lr=0.01)

    def step_fn(x, y, opt=hidden):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    before = [p.detach().clone() for p in model.parameters()]
    x, y = batches(1)[0]
    with pytest.raises(lazyrt.torch.CaptureError, match=r"step\(\) of a RMSprop .* does not own"):
        lazyrt.torch.compile(step_fn)(x, y)
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.detach(), b)
    assert not hidden.state
    # zero_grad() of one counts too.
    other = net(seed=2)
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1)

    def zeroes_other(x, y, opt=other_opt):
        opt.zero_grad()
        return F.mse_loss(model(x), y)

    with pytest.raises(lazyrt.torch.CaptureError, match=r"zero_grad\(\) of a SGD"):
        lazyrt.torch.compile(zeroes_other)(x, y)
    # Eager use of the same optimizers outside a capture is untouched.
    step_fn(x, y)
    assert hidden.state


def test_an_optimizer_deeper_than_the_walk_is_refused_by_name():
    model = net()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    box = _Deep(_Deep(_Deep(_Deep({"opt": opt}))))

    def step_fn(x, y):
        return train(model, box.inner.inner.inner.inner["opt"], x, y)

    x, y = batches(1)[0]
    with pytest.raises(lazyrt.torch.CaptureError, match=r"zero_grad\(\) of a Adagrad .* does not own"):
        lazyrt.torch.compile(step_fn)(x, y)
    # Given explicitly, it trains as eager.
    m_eager = copy.deepcopy(model)
    o_eager = torch.optim.Adagrad(m_eager.parameters(), lr=0.05)
    step = lazyrt.torch.compile(step_fn, optimizer=opt)
    run_both(step, lambda x, y: train(m_eager, o_eager, x, y), [(model, m_eager), (opt, o_eager)])
    assert step.captures == 1


def test_a_model_added_to_a_list_is_used_from_the_next_call_and_cycles_end():
    def make(seed):
        first = net(seed)
        holder = types.SimpleNamespace(nets=[first], opt=sgd(first.parameters()))
        holder.me = holder  # a cycle: walked once
        holder.nets.append(holder.nets)  # and a list that holds itself

        def step(x, y):
            holder.opt.zero_grad()
            loss = sum(F.mse_loss(m(x), y) for m in holder.nets if isinstance(m, nn.Module))
            loss.backward()
            holder.opt.step()
            return loss
        return step, holder

    eager_step, eager = make(0)
    lazy_fn, lazy = make(0)
    step = lazyrt.torch.compile(lazy_fn)
    data = batches(2 * STEPS)
    run_both(step, eager_step, [(lazy.nets[0], eager.nets[0]), (lazy.opt, eager.opt)], data[:STEPS])
    assert step.captures == 1
    # A second model, trained by a new optimizer over both: found from the next call.
    for h in (eager, lazy):
        h.nets.append(copy.deepcopy(eager.nets[0]) if h is lazy else net(7))
    lazy.nets[2].load_state_dict(eager.nets[2].state_dict())
    for h in (eager, lazy):
        h.opt = sgd(list(h.nets[0].parameters()) + list(h.nets[2].parameters()))
    run_both(step, eager_step, [(lazy.nets[0], eager.nets[0]), (lazy.nets[2], eager.nets[2]), (lazy.opt, eager.opt)],
             data[STEPS:], what="two models:")
    assert step.captures == 2


_HELPER_NET = None
_HELPER_OPT = None


def _global_helper_step(x, y):  # reaches the model and optimizer through a global helper
    return _helper_train(x, y)


def _helper_train(x, y):
    return train(_HELPER_NET, _HELPER_OPT, x, y)


def test_model_and_optimizer_reached_through_helper_functions():
    # The step calls a helper kept in its closure, which reaches the model through its own
    # closure; and a step calls a global helper that names global model and optimizer. Both are
    # found, train as eager, and a helper rebound to another model is followed on the next call.
    global _HELPER_NET, _HELPER_OPT

    def make(seed):
        model = net(seed)
        opt = sgd(model.parameters())

        def forward_loss(x, y):
            return F.mse_loss(model(x), y)

        def step(x, y):
            opt.zero_grad()
            loss = helpers["loss"](x, y)
            loss.backward()
            opt.step()
            return loss
        helpers = {"loss": forward_loss}
        return step, model, opt, helpers

    eager_step, m_eager, o_eager, _ = make(0)
    lazy_fn, m_lazy, o_lazy, helpers = make(0)
    step = lazyrt.torch.compile(lazy_fn)
    run_both(step, eager_step, [(m_lazy, m_eager), (o_lazy, o_eager)])
    assert step.captures == 1
    # Rebound to a helper over another model (whose parameters the optimizer does not hold):
    # the next call captures again and trains only through the new model's gradients.
    other, other_eager = net(5), net(5)
    helpers["loss"] = lambda x, y: F.mse_loss(other(x), y) + 0 * sum(p.sum() for p in m_lazy.parameters())
    x, y = batches(1, seed=9)[0]
    got = step(x, y)
    want = F.mse_loss(other_eager(x), y)
    close(got.detach().numpy(), want.detach().numpy(), "loss through the rebound helper")
    assert step.captures == 2
    assert all(p.grad is not None for p in other.parameters()), "the new model was found"

    _HELPER_NET, _HELPER_OPT = net(3), None
    _HELPER_OPT = sgd(_HELPER_NET.parameters())
    m_eager2 = copy.deepcopy(_HELPER_NET)
    o_eager2 = sgd(m_eager2.parameters())
    step2 = lazyrt.torch.compile(_global_helper_step)
    run_both(step2, lambda x, y: train(m_eager2, o_eager2, x, y), [(_HELPER_NET, m_eager2), (_HELPER_OPT, o_eager2)])
    assert step2.captures == 1


_W1, _W2, _LEARNING_RATE = None, None, 1e-3


def _global_weights_step(x, y):  # the classic tensors-and-autograd example's loop body
    global _W1, _W2
    loss = ((x @ _W1).clamp(min=0) @ _W2 - y).pow(2).sum()
    loss.backward()
    with torch.no_grad():
        _W1 -= _LEARNING_RATE * _W1.grad
        _W2 -= _LEARNING_RATE * _W2.grad
        _W1.grad = None
        _W2.grad = None
    return loss.detach()


def test_weights_trained_by_hand_without_module_or_optimizer():
    # Leaf tensors that require grad, kept in globals (w -= lr * w.grad under no_grad, as the
    # tensors-and-autograd example writes it) or in a list in a closure, are parameters of their
    # own: trained as eager, one capture (a changed learning rate, a Python value the step
    # reads, is another); a tensor replaced in the list is followed. Before, the capture refused
    # them as parameters of no module.
    global _W1, _W2, _LEARNING_RATE
    g = torch.Generator().manual_seed(1)
    init = [torch.randn(3, 5, generator=g), torch.randn(5, 2, generator=g)]
    x, y = torch.randn(16, 3, generator=g), torch.randn(16, 2, generator=g)
    _W1, _W2 = (t.clone().requires_grad_() for t in init)
    _LEARNING_RATE = 1e-3
    e1, e2 = (t.clone().requires_grad_() for t in init)

    def eager(lr):
        loss = ((x @ e1).clamp(min=0) @ e2 - y).pow(2).sum()
        loss.backward()
        with torch.no_grad():
            e1.sub_(lr * e1.grad)
            e2.sub_(lr * e2.grad)
            e1.grad = e2.grad = None
        return loss.detach()

    step = lazyrt.torch.compile(_global_weights_step)
    for k in range(5):
        if k == 3:
            _LEARNING_RATE = 1e-4
        close(step(x, y).numpy(), eager(_LEARNING_RATE).numpy(), f"loss at step {k}")
        close(_W1.detach().numpy(), e1.detach().numpy(), f"w1 after step {k}")
        close(_W2.detach().numpy(), e2.detach().numpy(), f"w2 after step {k}")
        assert _W1.grad is None and _W2.grad is None
    assert step.captures == 2

    weights = [t.clone().requires_grad_() for t in init]
    ref = [t.clone().requires_grad_() for t in init]

    def train(ws):
        def step(x, y):
            loss = ((x @ ws[0]).tanh() @ ws[1] - y).pow(2).mean()
            loss.backward()
            with torch.no_grad():
                for w in ws:
                    w.sub_(0.1 * w.grad)
                    w.grad.zero_()
            return loss.detach()
        return step
    compiled, eager_list = lazyrt.torch.compile(train(weights)), train(ref)
    for k in range(4):
        if k == 2:  # a new tensor in the list: the step trains it from the next call on
            weights[1] = init[1].clone().requires_grad_()
            ref[1] = init[1].clone().requires_grad_()
        close(compiled(x, y).numpy(), eager_list(x, y).numpy(), f"list: loss at step {k}")
        for a, b in zip(weights, ref):
            close(a.detach().numpy(), b.detach().numpy(), f"list: weight after step {k}")
