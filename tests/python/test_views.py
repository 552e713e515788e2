"""View semantics against PyTorch: views alias their base (writes through a view change the base
and its other views, writes to the base show through its views), with PyTorch's layout (where
reshape aliases or copies, where view refuses, strides, contiguity), autograd through writes to
views, detach()/.data, compiled steps and replays, and seeded random programs of views and
in-place ops compared with PyTorch after every action."""

import random

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn


def lazy(t):
    return lr.tensor(t.detach().numpy().copy())


def same(a, b, what=""):
    got = a.numpy().astype(np.float64)
    want = b.detach().numpy().astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=what)


def base_pair(shape=(4, 6)):
    t = torch.arange(float(np.prod(shape)), dtype=torch.float64).reshape(shape) * 0.5 - 3
    return t, lazy(t)


# Views (as the same function of torch and lazyrt tensors) of a [4, 6] base.
VIEWS = {
    "view": lambda t: t.view(-1),
    "view_3d": lambda t: t.view(2, 2, 6),
    "reshape": lambda t: t.reshape(3, 8),
    "t": lambda t: t.t(),
    "T": lambda t: t.T,
    "mT": lambda t: t.mT,
    "transpose": lambda t: t.transpose(0, 1),
    "permute": lambda t: t.permute(1, 0),
    "int": lambda t: t[1],
    "neg_int": lambda t: t[-1],
    "column": lambda t: t[:, 2],
    "rows": lambda t: t[1:3],
    "step": lambda t: t[:, ::2],
    "two_slices": lambda t: t[1:, 1::3],
    "none": lambda t: t[None],
    "ellipsis": lambda t: t[..., 0],
    "narrow": lambda t: t.narrow(1, 2, 3),
    "select": lambda t: t.select(0, 2),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "flatten": lambda t: t.flatten(),
    "split": lambda t: t.split(2)[1],
    "chunk": lambda t: t.chunk(3, dim=1)[2],
    "unbind": lambda t: t.unbind(0)[1],
    "detach": lambda t: t.detach(),
    "data": lambda t: t.data,
    "view_as": lambda t: t.view_as(torch.empty(24) if isinstance(t, torch.Tensor) else lr.empty(24)),
    "chain": lambda t: t.view(2, 2, 6)[1].transpose(0, 1)[2:],
    "chain_slices": lambda t: t.t()[1:5:2, 1:],
    "chain_detach": lambda t: t[1:].detach().t()[0],
    "squeeze": lambda t: t[1:2].squeeze(0),
}

# In-place writes (a view of any shape).
WRITES = {
    "add_": lambda v, lib: v.add_(1.5),
    "mul_": lambda v, lib: v.mul_(-2.0),
    "zero_": lambda v, lib: v.zero_(),
    "fill_": lambda v, lib: v.fill_(7.0),
    "copy_": lambda v, lib: v.copy_(lib.ones(v.shape, dtype=lib.float64) * 9),
    "setitem": lambda v, lib: v.__setitem__(..., 4.0) if v.dim() == 0 else v.__setitem__(0, 4.0),
    "iadd": lambda v, lib: v.__iadd__(2.0),
}


@pytest.mark.parametrize("view", sorted(VIEWS))
@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_write_through_a_view_changes_the_base_and_its_other_views(view, write):
    tb, lb = base_pair()
    t_other, l_other = tb[2:, 1:4], lb[2:, 1:4]  # another view, made first
    tv, lv = VIEWS[view](tb), VIEWS[view](lb)
    WRITES[write](tv, torch)
    WRITES[write](lv, lr)
    same(lv, tv, "the view")
    same(lb, tb, "the base")
    same(l_other, t_other, "another view of the base")
    lr.mark_step()
    same(lb, tb, "the base after mark_step")


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_a_write_to_the_base_shows_through_its_views(view):
    tb, lb = base_pair()
    tv, lv = VIEWS[view](tb), VIEWS[view](lb)
    tb.mul_(3).add_(1)
    lb.mul_(3).add_(1)
    same(lv, tv, "after in-place ops on the base")
    tb[1:3, ::2] = -1.0
    lb[1:3, ::2] = -1.0
    same(lv, tv, "after setitem on the base")
    tb.copy_(torch.full((4, 6), 2.0, dtype=torch.float64))
    lb.copy_(lr.full((4, 6), 2.0, dtype=lr.float64))
    same(lv, tv, "after copy_ into the base")


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_layout_is_pytorchs(view):
    tb, lb = base_pair()
    tv, lv = VIEWS[view](tb), VIEWS[view](lb)
    assert lv.stride() == tv.stride(), "strides"
    assert lv.storage_offset() == tv.storage_offset(), "storage offset"
    assert lv.is_contiguous() == tv.is_contiguous()
    # PyTorch's detach() and .data share storage without being autograd views; lazyrt's are views.
    assert lv._is_view() == (tv._is_view() or view in ("data", "detach"))


def test_reshape_aliases_where_pytorch_does_and_copies_elsewhere():
    tb, lb = base_pair()
    # A transpose cannot be viewed flat: reshape copies (writes do not reach the base), view refuses.
    tr, lrr = tb.t().reshape(-1), lb.t().reshape(-1)
    assert not lrr._is_view() and lrr.is_contiguous()
    tr.add_(100)
    lrr.add_(100)
    same(lb, tb)
    same(lrr, tr)
    with pytest.raises(RuntimeError):
        tb.t().view(-1)
    with pytest.raises(RuntimeError, match="view"):
        lb.t().view(-1)
    # Splitting a dim of a transpose is a view in both.
    tv, lv = tb.t().reshape(2, 3, 4), lb.t().reshape(2, 3, 4)
    assert lv._is_view() and lv.stride() == tv.stride()
    tv[1, 2].fill_(0)
    lv[1, 2].fill_(0)
    same(lb, tb)


def test_contiguous_copies_only_what_is_not_contiguous():
    tb, lb = base_pair()
    lc = lb.contiguous()
    assert lc is lb
    tc, lc = tb.t().contiguous(), lb.t().contiguous()
    assert lc.is_contiguous() and not lc._is_view()
    tc.zero_()
    lc.zero_()
    same(lb, tb)
    same(lc, tc)


def test_writing_through_an_expanded_view_is_refused_as_in_pytorch():
    tb, lb = base_pair()
    te, le = tb[0:1].expand(4, 6), lb[0:1].expand(4, 6)
    with pytest.raises(RuntimeError):
        te.add_(1)
    with pytest.raises(RuntimeError, match="more than one element"):
        le.add_(1)
    same(lb, tb, "the refused write changed nothing")
    same(le, te)


def test_views_of_views_of_a_dead_base_still_alias():
    tb, lb = base_pair()
    t1, l1 = tb[0:3], lb[0:3]
    t2, l2 = tb[2:4], lb[2:4]
    del tb, lb
    t1[2].fill_(5.0)
    l1[2].fill_(5.0)
    same(l2, t2, "row 2 is in both views")
    t2.mul_(2)
    l2.mul_(2)
    same(l1, t1)


def test_one_view_of_a_dead_base_is_a_tensor_of_its_own():
    _, lb = base_pair()
    lv = lb.t()
    del lb
    lv.add_(1)
    np.testing.assert_allclose(lv.tolist(), (torch.arange(24.0, dtype=torch.float64).reshape(4, 6) * 0.5 - 2).t())


# ---- autograd ------------------------------------------------------------------------------


def grad_case(lib, x0, w0, z0):
    x = x0.clone().requires_grad_(True)
    z = z0.clone().requires_grad_(True)
    w = w0
    y = x * 2
    y[:, 1].mul_(3)  # a write through a column view of a non-leaf
    y.view(-1)[2:5].add_(z)  # a write through a view of a view
    r = y.t()[1:3]  # a view taken before the next write to the base
    y.add_(1)
    loss = (y * w).sum() + (r * r).sum()
    loss.backward()
    return loss, x.grad, z.grad


def test_gradients_through_writes_to_views_equal_pytorchs():
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(4, 3, dtype=torch.float64, generator=g)
    w0 = torch.randn(4, 3, dtype=torch.float64, generator=g)
    z0 = torch.randn(3, dtype=torch.float64, generator=g)
    tl, tx, tz = grad_case(torch, x0, w0, z0)
    ll, lx, lz = grad_case(lr, lazy(x0), lazy(w0), lazy(z0))
    assert ll.item() == pytest.approx(tl.item(), rel=1e-12)
    same(lx, tx, "x.grad")
    same(lz, tz, "z.grad")


def test_a_view_of_a_leaf_that_requires_grad_cannot_be_written_while_recording():
    tp = torch.ones(3, dtype=torch.float64, requires_grad=True)
    lp = lr.ones(3, dtype=lr.float64).requires_grad_()
    with pytest.raises(RuntimeError):
        tp[0:2].mul_(2)
    with pytest.raises(RuntimeError, match="leaf"):
        lp[0:2].mul_(2)
    assert lp.tolist() == [1.0, 1.0, 1.0] and lp.is_leaf
    with torch.no_grad():
        tp[0:2].mul_(2)
    with lr.no_grad():
        lp[0:2].mul_(2)
    same(lp, tp)
    assert lp.is_leaf and lp.requires_grad


def test_writes_through_detach_and_data_keep_the_autograd_history():
    for lib, make in ((torch, lambda a: torch.tensor(a, dtype=torch.float64)), (lr, lambda a: lr.tensor(a, dtype=lr.float64))):
        p = make([1.0, 2.0, 3.0]).requires_grad_()
        p.data.mul_(0.5)
        p.detach()[2] = 10.0
        assert p.is_leaf and p.requires_grad
        (p * p).sum().backward()
        assert p.grad.tolist() == [1.0, 2.0, 20.0], lib.__name__
        assert p.tolist() == [0.5, 1.0, 10.0]


def test_assigning_data_replaces_the_value_and_updates_views():
    tp, lp = torch.zeros(2, 3, dtype=torch.float64), lr.zeros(2, 3, dtype=lr.float64)
    tp.requires_grad_()
    lp.requires_grad_()
    tv, lv = tp.detach()[1], lp.detach()[1]
    new = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
    tp.data = new.clone()
    lp.data = lazy(new)
    same(lp, tp)
    assert lp.is_leaf and lp.requires_grad
    with pytest.raises(RuntimeError, match="set_data"):
        lp.data = lr.zeros(3, dtype=lr.float64)
    # PyTorch's views keep the old storage after .data is replaced; lazyrt's see the new value.
    assert lv.tolist() == [3.0, 4.0, 5.0] and tv.tolist() == [0.0, 0.0, 0.0]


# ---- compiled steps and replays --------------------------------------------------------------


def test_a_compiled_step_that_writes_through_views_replays_exactly():
    def run(lib, xs, compiled):
        w = lib.zeros(6, dtype=lib.float64)
        row = w.view(2, 3)[1]  # a view held across every call
        col = w.view(2, 3)[:, 0]

        def step(x):
            w.view(2, 3)[0].add_(x)  # a write through a view inside the step
            w[3:].mul_(0.5)
            w.view(2, 3)[1, 1:].add_(x[1:])
            return w.sum()

        if compiled:
            step = lr.compile_step(step, (xs[0],))
        out = []
        for x in xs:
            loss = step(x)
            out.append((loss.item(), w.tolist(), row.tolist(), col.tolist()))
        return out, getattr(step, "traces", None)

    xs_t = [torch.tensor([1.0 + i, -2.0 * i, 0.25 * i], dtype=torch.float64) for i in range(5)]
    want, _ = run(torch, xs_t, False)
    got, traces = run(lr, [lazy(x) for x in xs_t], True)
    assert traces == 1
    for (gl, gw, gr, gc), (wl, ww, wr, wc) in zip(got, want):
        assert gl == pytest.approx(wl, rel=1e-12)
        np.testing.assert_allclose(gw, ww, rtol=1e-12)
        np.testing.assert_allclose(gr, wr, rtol=1e-12)
        np.testing.assert_allclose(gc, wc, rtol=1e-12)


def test_views_of_parameters_see_every_replayed_optimizer_step():
    torch.manual_seed(0)
    tm = torch.nn.Linear(4, 3).double()
    lm = nn.Linear(4, 3).to(lr.float64)
    lm.load_state_dict(tm.state_dict())
    topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    lopt = lr.optim.SGD(lm.parameters(), lr=0.1, momentum=0.9)
    t_wt, l_wt = tm.weight.detach().t(), lm.weight.detach().t()  # held views of a parameter
    t_b0, l_b0 = tm.bias.data[0:2], lm.bias.data[0:2]

    def make_step(model, opt):
        def step(x):
            loss = (model(x) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, 4, dtype=torch.float64, generator=g) for _ in range(4)]
    lstep = lr.compile_step(make_step(lm, lopt), (lazy(xs[0]),))
    tstep = make_step(tm, topt)
    for x in xs:
        tl = tstep(x)
        ll = lstep(lazy(x))
        assert ll.item() == pytest.approx(tl.item(), rel=1e-10)
        same(l_wt, t_wt, "a held transpose of the weight")
        same(l_b0, t_b0, "a held slice of the bias")
    assert lstep.traces == 1
    # A view made after the step was compiled sees the next replays too.
    t_row, l_row = tm.weight.detach()[1], lm.weight.detach()[1]
    tstep(xs[0])
    lstep(lazy(xs[0]))
    same(l_row, t_row)
    same(lm.weight, tm.weight)


def test_results_that_are_views_of_state_stay_views_after_replays():
    def run(lib, xs, compiled):
        w = lib.zeros(4, dtype=lib.float64)
        a = lib.ones(2, 3, dtype=lib.float64)

        def step(x):
            w.add_(x)
            return w.sum(), w.detach(), w.view(2, 2)[1], a[1:]

        if compiled:
            step = lr.compile_step(step, (xs[0],))
        outs = [step(x) for x in xs]
        # Writes through a returned view reach the state, as in PyTorch.
        outs[1][3].mul_(2.0)
        outs[0][2].add_(10.0)
        return [[o.tolist() for o in out] for out in outs], w.tolist(), a.tolist()

    xs_t = [torch.tensor([1.0, -2.0, 0.5 * i, i], dtype=torch.float64) for i in range(4)]
    want = run(torch, xs_t, False)
    got = run(lr, [lazy(x) for x in xs_t], True)
    assert got == want


def test_a_write_through_data_inside_a_compiled_step():
    def run(lib, xs, compiled):
        p = lib.ones(3, dtype=lib.float64).requires_grad_()

        def step(x):
            loss = (p * x).sum()
            loss.backward()
            p.data.sub_(0.1 * p.grad)  # a hand-written SGD step through .data
            p.grad.zero_()
            return loss

        if compiled:
            step = lr.compile_step(step, (xs[0],))
        return [(step(x).item(), p.tolist()) for x in xs]

    xs_t = [torch.tensor([1.0, 2.0 * i, -i], dtype=torch.float64) for i in range(4)]
    want = run(torch, xs_t, False)
    got = run(lr, [lazy(x) for x in xs_t], True)
    for (gl, gp), (wl, wp) in zip(got, want):
        assert gl == pytest.approx(wl, rel=1e-12)
        np.testing.assert_allclose(gp, wp, rtol=1e-12)


def test_a_loop_body_cannot_write_through_a_view_of_an_outside_tensor():
    outside = lr.zeros(4)
    with pytest.raises(RuntimeError, match="outside the loop"):
        lr.fori_loop(0, 3, lambda i, x: (outside[0:2].add_(1.0), x)[1], lr.zeros(2))
    assert outside.tolist() == [0.0, 0.0, 0.0, 0.0], "nothing changed"


def test_views_of_a_carry_inside_a_loop_body():
    def body(i, x):
        x = x.clone()
        x[1:3].mul_(2.0)
        x.view(2, 2)[:, 0].add_(1.0)
        return x

    got = lr.fori_loop(0, 3, body, lr.tensor([1.0, 2.0, 3.0, 4.0]))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for _ in range(3):
        x = x.clone()
        x[1:3].mul_(2.0)
        x.view(2, 2)[:, 0].add_(1.0)
    assert got.tolist() == x.tolist()


# ---- select by a tensor index ------------------------------------------------------------------


def test_select_by_a_tensor_index_is_a_view_as_select_by_an_int_is():
    # PyTorch's select(dim, int) is the oracle; lazyrt's takes the position as a tensor too.
    t, l = base_pair((4, 6))
    tv, lv = t.select(0, 2), l.select(0, lr.tensor(2))
    same(lv, tv, "select")
    tv.add_(1.5)
    lv.add_(1.5)  # through the view: the base changes
    same(l, t, "base after a write through the view")
    t.mul_(2)
    l.mul_(2)  # to the base: the view follows
    same(lv, tv, "view after a write to the base")
    same(l.select(1, lr.tensor(-1, dtype=lr.int32)), t.select(1, -1), "negative position, i32")
    i = lr.tensor(3)
    lw = l.select(0, i)
    i.add_(-3)  # the position is the index's value when the view was made
    l.add_(1)
    same(lw, t.add(1).select(0, 3), "a later change of the index moves no view")
    lr.mark_step()
    same(lw, t.add(1).select(0, 3), "after a sync")


def test_select_by_a_tensor_index_has_pytorchs_gradient():
    t = torch.arange(12.0, dtype=torch.float64).reshape(3, 4).requires_grad_()
    l = lr.tensor(t.detach().numpy(), requires_grad=True)
    w = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)
    for ti, li in ((t, l), (t * 1.0, l * 1.0)):
        (ti.select(0, 1).sin() * w).sum().backward()
        (li.select(0, lr.tensor(1)).sin() * lazy(w)).sum().backward()
    same(l.grad, t.grad, "gradient through select by a tensor, of a leaf and of a computed tensor")


def test_select_by_a_tensor_index_out_of_range_fails_when_the_graph_runs():
    l = lr.zeros([3, 2])
    v = l.select(0, lr.tensor(3))
    with pytest.raises(lr.Error, match="index_select"):
        v.numpy()
    with pytest.raises(lr.Error, match="one integer"):
        l.select(0, lr.tensor([0, 1]))
    with pytest.raises(lr.Error, match="one integer"):
        l.select(0, lr.tensor(1.0))


def test_narrow_at_a_tensor_start_is_a_view_as_narrow_at_an_int_is():
    t, l = base_pair((5, 4))
    tv, lv = t.narrow(0, 1, 3), l.narrow(0, lr.tensor(1), 3)
    same(lv, tv, "narrow")
    tv.mul_(-1)
    lv.mul_(-1)
    same(l, t, "base after a write through the narrowed view")
    same(l.narrow(1, lr.tensor(-2), 2), t.narrow(1, -2, 2), "negative start")
    with pytest.raises(lr.Error, match="index_select"):
        l.narrow(0, lr.tensor(3), 3).numpy()  # 3 + 3 > 5
    w = torch.arange(20.0, dtype=torch.float64).reshape(5, 4).requires_grad_()
    lw = lr.tensor(w.detach().numpy(), requires_grad=True)
    (w.narrow(0, 2, 2).exp() * 0.5).sum().backward()
    (lw.narrow(0, lr.tensor(2), 2).exp() * 0.5).sum().backward()
    same(lw.grad, w.grad, "gradient through narrow at a tensor start")


def test_a_loop_writes_the_window_its_counter_starts():
    # scan-free sliding window: iteration i adds i to rows i and i + 1 of the carried buffer.
    x = np.random.default_rng(4).standard_normal((6, 2))

    def body(i, buf):
        window = buf.narrow(0, i, 2)
        window.add_(i.to(lr.float64))
        return buf

    got = lr.fori_loop(0, 5, body, lr.tensor(x))
    want = torch.tensor(x)
    for i in range(5):
        want.narrow(0, i, 2).add_(i)
    same(got, want, "fori_loop writing rows i, i + 1")


def test_a_loop_writes_the_row_its_counter_selects():
    # The commonest loop: row i of a buffer written in iteration i, by the counter as index.
    x = np.random.default_rng(3).standard_normal((5, 3))

    def body(i, buf):
        row = buf.select(0, i)
        row.copy_(row * 2 + i.to(lr.float64))
        return buf

    got = lr.fori_loop(0, 5, body, lr.tensor(x))
    want = torch.tensor(x)
    for i in range(5):
        want.select(0, i).copy_(want.select(0, i) * 2 + i)
    same(got, want, "fori_loop writing row i")
    it, got = lr.while_loop(lambda it, b: it < 5, lambda it, b: (it + 1, body(it, b.clone())), (lr.tensor(0), lr.tensor(x)))
    assert it.item() == 5
    same(got, want, "while_loop writing row it")


# ---- random programs -------------------------------------------------------------------------


def random_view(rng, t_view, l_view):
    """A random view op valid for this shape: (torch view, lazyrt view) or None."""
    shape = tuple(t_view.shape)
    nd = len(shape)
    choices = []
    if nd >= 1:
        d = rng.randrange(nd)
        n = shape[d]
        if n >= 1:
            i = rng.randrange(-n, n)
            choices.append(lambda t: t.select(d, i))
            # by a tensor index (read when the graph runs): lazyrt's side only
            choices.append(lambda t: t.select(d, lr.tensor(i) if isinstance(t, lr.Tensor) else i))
            a = rng.randrange(0, n + 1)
            b = rng.randrange(a, n + 1)
            s = rng.choice([1, 1, 2, 3])
            idx = (slice(None),) * d + (slice(a, b, s),)
            choices.append(lambda t: t[idx])
            choices.append(lambda t: t.narrow(d, a, b - a))
            if a < n:  # by a tensor start: lazyrt's side only
                choices.append(lambda t: t.narrow(d, lr.tensor(a - n) if isinstance(t, lr.Tensor) else a, b - a))
    if nd >= 2:
        d0, d1 = rng.sample(range(nd), 2)
        choices.append(lambda t: t.transpose(d0, d1))
        perm = list(range(nd))
        rng.shuffle(perm)
        choices.append(lambda t: t.permute(*perm))
    u = rng.randrange(nd + 1)
    choices.append(lambda t: t.unsqueeze(u))
    choices.append(lambda t: t.detach())
    if t_view.is_contiguous() or nd <= 1:
        choices.append(lambda t: t.reshape(-1))
    if 1 in shape:
        choices.append(lambda t: t.squeeze(shape.index(1)))
    f = rng.choice(choices)
    return f(t_view), f(l_view)


def random_write(rng, lib, v, value):
    k = rng.randrange(5)
    if k == 0:
        return v.add_(value)
    if k == 1:
        return v.mul_(value)
    if k == 2:
        return v.fill_(value)
    if k == 3:
        return v.zero_()
    return v.copy_(lib.full(tuple(v.shape), value, dtype=lib.float64))


@pytest.mark.parametrize("seed", range(120))
def test_random_programs_of_views_and_writes_match_pytorch(seed):
    rng = random.Random(seed)
    shape = tuple(rng.choice([1, 2, 3, 4]) for _ in range(rng.randrange(1, 4)))
    tb = torch.tensor(np.random.default_rng(seed).standard_normal(shape))
    handles = [(tb, lazy(tb))]
    log = [f"base {shape}"]
    for step in range(14):
        action = rng.random()
        ti, li = handles[rng.randrange(len(handles))]
        if action < 0.45:
            tv, lv = random_view(rng, ti, li)
            handles.append((tv, lv))
            log.append(f"view -> {tuple(tv.shape)}")
        elif action < 0.9:
            value = round(rng.uniform(-2, 2), 2)
            try:
                random_write(random.Random(step), torch, ti, value)
            except RuntimeError:
                with pytest.raises(RuntimeError):
                    random_write(random.Random(step), lr, li, value)
                log.append("refused write")
                continue
            random_write(random.Random(step), lr, li, value)
            log.append(f"write {value}")
        elif action < 0.95:
            lr.mark_step()
            log.append("mark_step")
        else:
            del handles[rng.randrange(len(handles))]
            log.append("drop a handle")
            if not handles:
                break
        for k, (t, l) in enumerate(handles):
            same(l, t, f"seed {seed}, handle {k}, after: {'; '.join(log)}")
