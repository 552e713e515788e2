"""lazyrt.nn's recurrent modules (RNNCell, LSTMCell, GRUCell, RNN, LSTM, GRU) and the
Transformer decoder (TransformerDecoderLayer, TransformerDecoder, Transformer) against PyTorch
1.13's: the same parameters (names, shapes, order) so that a torch state_dict loads, the
initial distribution, outputs and final states over a grid of configurations, gradients of
every parameter, the input and the initial state, one loop node whatever the sequence length,
dropout between layers, errors, and training replayed by compile_step.

Every PyTorch module is built under a seed and the lazyrt module loads its state_dict, so both
compute with the same numbers. Transformer modules get random values in every parameter
(PyTorch starts biases at zero, which would leave their paths untested) and dropout 0.
"""

import math
import re
import warnings

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn
from conftest import assert_same, pair, randomize

F32 = dict(rtol=1e-5, atol=1e-6)
F64 = dict(rtol=1e-11, atol=1e-12)
TORCH_DTYPE = {lr.float32: torch.float32, lr.float64: torch.float64}
MODES = {  # name -> (module name, extra keyword arguments)
    "rnn_tanh": ("RNN", {}),
    "rnn_relu": ("RNN", {"nonlinearity": "relu"}),
    "lstm": ("LSTM", {}),
    "gru": ("GRU", {}),
}


def load_from_torch(module, tmodule):
    # Clones: load_state_dict may share memory with the torch tensors, which torch's
    # optimizers update in place.
    result = module.load_state_dict({k: v.detach().clone() for k, v in tmodule.state_dict().items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    return module


def module_pair(name, *args, dtype=lr.float32, seed=0, **kwargs):
    """(lazyrt module, torch module) of torch.nn.<name>(*args, **kwargs), with torch's values."""
    torch.manual_seed(seed)
    tm = getattr(torch.nn, name)(*args, dtype=TORCH_DTYPE[dtype], **kwargs)
    m = getattr(nn, name)(*args, dtype=dtype, **kwargs)
    return load_from_torch(m, tm), tm


def flat(result):
    """A recurrent module's result as a flat list: [output, h_n] or [output, h_n, c_n]."""
    out, state = result
    return [out] + (list(state) if isinstance(state, tuple) else [state])


def weighted_loss(results, weights):
    return sum((r * w).sum() for r, w in zip(results, weights))


def check_grads(module, tmodule, inputs, tinputs, tol):
    for (n, p), (tn, tp) in zip(module.named_parameters(), tmodule.named_parameters()):
        assert n == tn
        assert p.grad is not None, n
        assert_same(p.grad, tp.grad, what=f"grad of {n}", **tol)
    for i, (x, t) in enumerate(zip(inputs, tinputs)):
        assert_same(x.grad, t.grad, what=f"grad of input {i}", **tol)


def initial_state(rng, mode, shape_h, shape_c, dtype, requires_grad=False):
    """(lazyrt hx, torch hx): h_0, or (h_0, c_0) for an LSTM."""
    h, th = pair(rng, shape_h, dtype, -1, 1, requires_grad)
    if mode != "lstm":
        return h, th, [h], [th]
    c, tc = pair(rng, shape_c, dtype, -1, 1, requires_grad)
    return (h, c), (th, tc), [h, c], [th, tc]


def compare(rng, mode, dtype, num_layers=1, bidirectional=False, batch_first=False, with_h0=False, bias=True,
            unbatched=False, proj_size=0, grads=False, T=5, N=3, I=4, Hd=6):
    """Runs the lazyrt and the torch module on the same input (and h0) and compares the
    output, the final states and, with grads, every gradient."""
    name, extra = MODES[mode]
    if proj_size:
        extra = dict(extra, proj_size=proj_size)
    m, tm = module_pair(name, I, Hd, num_layers=num_layers, bias=bias, batch_first=batch_first,
                        bidirectional=bidirectional, dtype=dtype, seed=int(rng.integers(1 << 30)), **extra)
    D = 2 if bidirectional else 1
    if unbatched:
        x_shape, hs = (T, I), (num_layers * D, proj_size or Hd)
        cs = (num_layers * D, Hd)
    else:
        x_shape = (N, T, I) if batch_first else (T, N, I)
        hs, cs = (num_layers * D, N, proj_size or Hd), (num_layers * D, N, Hd)
    x, tx = pair(rng, x_shape, dtype, -1, 1, grads)
    inputs, tinputs = [x], [tx]
    args, targs = (x,), (tx,)
    if with_h0:
        hx, thx, hs_list, ths_list = initial_state(rng, mode, hs, cs, dtype, grads)
        args, targs = (x, hx), (tx, thx)
        inputs += hs_list
        tinputs += ths_list
    got, want = flat(m(*args)), flat(tm(*targs))
    tol = F64 if dtype is lr.float64 else F32
    what = f"{mode} layers={num_layers} bi={bidirectional} bf={batch_first} h0={with_h0} bias={bias}"
    for k, (a, b) in enumerate(zip(got, want)):
        assert_same(a, b, what=f"{what}: result {k}", **tol)
    if grads:
        ws = [rng.uniform(-1, 1, tuple(r.shape)) for r in want]
        weighted_loss(got, [lr.tensor(w, dtype=dtype) for w in ws]).backward()
        weighted_loss(want, [torch.tensor(w, dtype=TORCH_DTYPE[dtype]) for w in ws]).backward()
        check_grads(m, tm, inputs, tinputs, tol)
    return m, tm


# ---- parameters and initialization ---------------------------------------------------------------

CONSTRUCTIONS = [
    ("RNN", (4, 6), {}), ("RNN", (4, 6, 2), {"nonlinearity": "relu", "bidirectional": True}),
    ("LSTM", (4, 6, 2), {"bias": False}), ("LSTM", (4, 6, 3), {"bidirectional": True, "proj_size": 2}),
    ("LSTM", (4, 6, 2), {"proj_size": 3, "bias": False}), ("GRU", (4, 6, 2), {"bidirectional": True}),
    ("RNNCell", (4, 6), {"nonlinearity": "relu"}), ("LSTMCell", (4, 6), {}), ("GRUCell", (4, 6), {"bias": False}),
]


@pytest.mark.parametrize("name,args,kwargs", CONSTRUCTIONS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CONSTRUCTIONS)])
def test_parameters_have_torch_names_shapes_order_and_a_torch_state_dict_loads(name, args, kwargs):
    m = getattr(nn, name)(*args, **kwargs)
    tm = getattr(torch.nn, name)(*args, **kwargs)
    assert [(n, tuple(p.shape)) for n, p in m.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tm.named_parameters()]
    assert list(m.state_dict()) == list(tm.state_dict())
    assert repr(m) == repr(tm)
    for attr in ["input_size", "hidden_size", "bias", "num_layers", "batch_first", "dropout", "bidirectional",
                 "proj_size", "mode", "nonlinearity"]:
        assert getattr(m, attr, None) == getattr(tm, attr, None), attr
    if hasattr(tm, "_flat_weights_names"):
        assert m._flat_weights_names == tm._flat_weights_names
        assert [[tuple(p.shape) for p in ps] for ps in m.all_weights] == \
            [[tuple(p.shape) for p in ps] for ps in tm.all_weights]
    # The torch tensors load as they are (load_state_dict converts them) and keep the
    # parameters' identity.
    before = list(m.parameters())
    result = m.load_state_dict(tm.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert all(a is b for a, b in zip(before, m.parameters()))
    for (n, p), (_, tp) in zip(m.named_parameters(), tm.named_parameters()):
        assert_same(p, tp.detach(), rtol=0, atol=0, what=n)


@pytest.mark.parametrize("name", ["LSTM", "GRU", "RNN", "LSTMCell"])
def test_initialization_is_uniform_in_plus_minus_one_over_sqrt_hidden(name):
    hidden = 64
    bound = 1 / math.sqrt(hidden)
    lr.manual_seed(5)
    m = getattr(nn, name)(32, hidden, **({} if name.endswith("Cell") else {"num_layers": 2}))
    values = np.concatenate([p.numpy().ravel() for p in m.parameters()])
    assert np.abs(values).max() <= bound
    assert values.max() > 0.99 * bound and values.min() < -0.99 * bound
    np.testing.assert_allclose(values.std(), bound / math.sqrt(3), rtol=0.02)  # uniform's std
    assert abs(values.mean()) < 0.02 * bound
    # Every parameter draws its own numbers, from lazyrt's generator.
    firsts = [p.numpy().ravel()[:8].tolist() for p in m.parameters()]
    assert len({tuple(f) for f in firsts}) == len(firsts)
    lr.manual_seed(5)
    again = getattr(nn, name)(32, hidden, **({} if name.endswith("Cell") else {"num_layers": 2}))
    assert [p.numpy().tolist() for p in again.parameters()] == [p.numpy().tolist() for p in m.parameters()]
    assert all(p.dtype is lr.float32 and p.requires_grad for p in m.parameters())
    double = getattr(nn, name)(3, 4, dtype=lr.float64)
    assert all(p.dtype is lr.float64 and np.abs(p.numpy()).max() <= 0.5 for p in double.parameters())


# ---- forward against torch ---------------------------------------------------------------------

@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (1, True), (2, False), (2, True)])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_forward_matches_torch_float32(mode, num_layers, bidirectional, batch_first, with_h0, rng):
    compare(rng, mode, lr.float32, num_layers, bidirectional, batch_first, with_h0)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("num_layers,bidirectional,batch_first,with_h0", [
    (1, False, False, False), (1, True, True, True), (2, False, True, True), (2, True, False, True),
])
def test_forward_and_gradients_match_torch_float64(mode, num_layers, bidirectional, batch_first, with_h0, rng):
    compare(rng, mode, lr.float64, num_layers, bidirectional, batch_first, with_h0, grads=True)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", ["no_bias", "unbatched", "unbatched_h0_batch_first", "batch_of_one_long"])
def test_bias_off_and_unbatched_inputs_match_torch(mode, case, rng):
    kwargs = {
        "no_bias": dict(num_layers=2, bidirectional=True, with_h0=True, bias=False),
        "unbatched": dict(num_layers=2),
        "unbatched_h0_batch_first": dict(bidirectional=True, batch_first=True, with_h0=True),  # batch_first ignored
        "batch_of_one_long": dict(N=1, T=40, bidirectional=True),
    }[case]
    unbatched = case.startswith("unbatched")
    m, _ = compare(rng, mode, lr.float64, unbatched=unbatched, grads=True, **kwargs)
    if unbatched:
        x = lr.zeros(5, 4, dtype=lr.float64)
        out = flat(m(x))
        assert out[0].dim() == 2 and all(s.dim() == 2 for s in out[1:])


@pytest.mark.parametrize("num_layers,bidirectional,batch_first,unbatched", [
    (1, False, False, False), (2, True, True, False), (3, False, False, False), (2, True, False, True),
])
def test_lstm_projection_matches_torch(num_layers, bidirectional, batch_first, unbatched, rng):
    m, tm = compare(rng, "lstm", lr.float64, num_layers, bidirectional, batch_first, with_h0=True,
                    unbatched=unbatched, proj_size=2, grads=True)
    assert tuple(m.weight_hr_l0.shape) == (2, 6)


def test_eval_and_train_mode_without_dropout_compute_the_same(rng):
    # Dropout 0.0 with several layers: train mode is eval mode.
    m, tm = module_pair("GRU", 4, 5, num_layers=3)
    x, tx = pair(rng, (6, 2, 4), lr.float32, -1, 1)
    assert_same(m(x)[0], tm(tx)[0], **F32)
    m.eval()
    tm.eval()
    assert_same(m(x)[0], tm(tx)[0], **F32)


# ---- cells -------------------------------------------------------------------------------------------

CELLS = [("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu"}), ("LSTMCell", {}), ("GRUCell", {}),
         ("LSTMCell", {"bias": False}), ("GRUCell", {"bias": False})]


@pytest.mark.parametrize("name,kwargs", CELLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CELLS)])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_hx", [True, False])
def test_cells_match_torch(name, kwargs, batched, with_hx, rng):
    m, tm = module_pair(name, 4, 5, dtype=lr.float64, **kwargs)
    x, tx = pair(rng, (3, 4) if batched else (4,), lr.float64, -1, 1, True)
    hs = (3, 5) if batched else (5,)
    inputs, tinputs = [x], [tx]
    args, targs = (x,), (tx,)
    if with_hx:
        hx, thx, hl, thl = initial_state(rng, "lstm" if name == "LSTMCell" else "rnn", hs, hs, lr.float64, True)
        args, targs = (x, hx), (tx, thx)
        inputs += hl
        tinputs += thl
    got, want = m(*args), tm(*targs)
    got, want = (list(got), list(want)) if name == "LSTMCell" else ([got], [want])
    for a, b in zip(got, want):
        assert_same(a, b, **F64)
    ws = [rng.uniform(-1, 1, tuple(r.shape)) for r in want]
    weighted_loss(got, [lr.tensor(w) for w in ws]).backward()
    weighted_loss(want, [torch.tensor(w) for w in ws]).backward()
    check_grads(m, tm, inputs, tinputs, F64)


def test_cells_step_by_step_equal_the_layers(rng):
    # A cell applied in a Python loop computes what the one-layer module computes with scan.
    for cell_name, layer_name in [("LSTMCell", "LSTM"), ("GRUCell", "GRU"), ("RNNCell", "RNN")]:
        layer = getattr(nn, layer_name)(4, 5, dtype=lr.float64)
        cell = getattr(nn, cell_name)(4, 5, dtype=lr.float64)
        cell.load_state_dict({k[:-3]: v for k, v in layer.state_dict().items()})  # weight_ih_l0 -> weight_ih
        x = lr.tensor(rng.uniform(-1, 1, (7, 2, 4)))
        out, state = layer(x)
        hx, steps = None, []
        for t in range(7):
            hx = cell(x[t], hx)
            steps.append(hx[0] if cell_name == "LSTMCell" else hx)
        np.testing.assert_allclose(out.numpy(), lr.stack(steps).numpy(), rtol=1e-12, atol=1e-14)
        last = state[1][0] if cell_name == "LSTMCell" else state[0]
        np.testing.assert_allclose(last.numpy(), (hx[1] if cell_name == "LSTMCell" else hx).numpy(),
                                   rtol=1e-12, atol=1e-14)


# ---- one loop node ---------------------------------------------------------------------------------

def top_level_scans(tensors):
    return len(re.findall(r"^%\d+ = scan\(", lr.debug.graph_text(tensors), re.M))


def test_a_long_sequence_is_one_loop_node_per_layer_and_direction():
    lr.manual_seed(3)
    m = nn.LSTM(4, 8, num_layers=2, bidirectional=True)
    for p in m.parameters():
        p.numpy()  # the initialization is computed: the graphs below hold only the forward
    g = np.random.default_rng(3)
    lr.cache.clear_memory()
    counts = {}
    for T in [10, 200, 200]:
        x = lr.tensor(g.standard_normal((T, 3, 4)).astype(np.float32), requires_grad=True)
        lr.metrics.reset()
        o, (h, c) = m(x)
        fwd = lr.debug.graph_node_count([o, h, c])
        assert top_level_scans([o, h, c]) == 4  # 2 layers x 2 directions
        ((o * o).sum() + h.sum()).backward()
        grads = [p.grad for p in m.parameters()] + [x.grad]
        bwd = lr.debug.graph_node_count(grads)
        assert top_level_scans(grads) == 8  # each scan's forward, and its gradient's
        for t in grads:
            t.numpy()
        m.zero_grad()
        compiles = lr.metrics.counter("UncachedCompile"), lr.metrics.counter("CachedCompile")
        counts.setdefault(T, []).append((fwd, bwd, compiles))
    (fwd10, bwd10, c10), = counts[10]
    (fwd200, bwd200, first), (_, _, second) = counts[200]
    assert (fwd200, bwd200) == (fwd10, bwd10)  # the graph does not grow with the length
    assert c10 == first == (1, 0)  # one graph, compiled once...
    assert second == (0, 1)        # ...and found in the cache for the next batch of that length


# ---- dropout between layers ------------------------------------------------------------------

def test_dropout_applies_between_layers_in_train_mode_only(rng):
    m, tm = module_pair("LSTM", 4, 5, num_layers=2, dropout=0.5)
    x, tx = pair(rng, (6, 2, 4), lr.float32, -1, 1)
    m.eval()
    tm.eval()
    assert_same(m(x)[0], tm(tx)[0], **F32)  # eval: no dropout
    # Train mode: the first layer's output goes through lazyrt's dropout, then the second layer.
    m.train()
    lr.manual_seed(11)
    out, (h, c) = m(x)
    first, second = nn.LSTM(4, 5), nn.LSTM(5, 5)
    first.load_state_dict({k: v for k, v in tm.state_dict().items() if k.endswith("l0")})
    second.load_state_dict({k.replace("l1", "l0"): v for k, v in tm.state_dict().items() if k.endswith("l1")})
    lr.manual_seed(11)
    y, (h0, c0) = first(x)
    y = lr.dropout(y, 0.5, True)
    want, (h1, c1) = second(y)
    np.testing.assert_array_equal(out.numpy(), want.numpy())
    np.testing.assert_array_equal(h.numpy(), lr.cat([h0, h1]).numpy())
    eval_out = m.eval()(x)[0].numpy()
    assert not np.allclose(out.numpy(), eval_out)
    # dropout=1 zeroes the second layer's input entirely: deterministic, so torch agrees.
    m, tm = module_pair("GRU", 4, 5, num_layers=2, dropout=1.0, bidirectional=True)
    assert_same(m(x)[0], tm(tx)[0], **F32)
    assert_same(m(x)[1], tm(tx)[1], **F32)


# ---- errors ----------------------------------------------------------------------------------------

def raises_like(tcall, call, ltype=None):
    """torch's call raises an exception; lazyrt's raises one of the same type (or ltype)."""
    with pytest.raises(Exception) as texc:
        tcall()
    with pytest.raises(ltype or texc.type) as exc:
        call()
    return str(exc.value)


def test_errors_as_torch():
    m, tm = nn.LSTM(4, 5, num_layers=2), torch.nn.LSTM(4, 5, num_layers=2)
    g, tg = nn.GRU(4, 5, batch_first=True), torch.nn.GRU(4, 5, batch_first=True)
    x, tx = lr.zeros(3, 2, 4), torch.zeros(3, 2, 4)
    msg = raises_like(lambda: tm(torch.zeros(3, 2, 3)), lambda: m(lr.zeros(3, 2, 3)))
    assert "[3, 2, 3]" in msg and "input_size 4" in msg
    msg = raises_like(lambda: tm(torch.zeros(3, 2, 4, 1)), lambda: m(lr.zeros(3, 2, 4, 1)))
    assert "2-D unbatched" in msg
    msg = raises_like(lambda: tm(tx, (torch.zeros(2, 3, 5), torch.zeros(2, 2, 5))),
                      lambda: m(x, (lr.zeros(2, 3, 5), lr.zeros(2, 2, 5))))
    assert "h_0 has shape [2, 3, 5], expected [2, 2, 5]" in msg
    msg = raises_like(lambda: tm(tx, (torch.zeros(2, 2, 5), torch.zeros(1, 2, 5))),
                      lambda: m(x, (lr.zeros(2, 2, 5), lr.zeros(1, 2, 5))))
    assert "c_0 has shape [1, 2, 5]" in msg
    msg = raises_like(lambda: tm(tx, (torch.zeros(2, 5), torch.zeros(2, 5))),
                      lambda: m(x, (lr.zeros(2, 5), lr.zeros(2, 5))))
    assert "must be 3-D too" in msg
    msg = raises_like(lambda: tg(torch.zeros(3, 4), torch.zeros(1, 1, 5)), lambda: g(lr.zeros(3, 4), lr.zeros(1, 1, 5)))
    assert "must be 2-D too" in msg
    raises_like(lambda: tg(torch.zeros(2, 3, 4), torch.zeros(1, 3, 5)), lambda: g(lr.zeros(2, 3, 4), lr.zeros(1, 3, 5)))
    msg = raises_like(lambda: tm(torch.zeros(0, 2, 4)), lambda: m(lr.zeros(0, 2, 4)))
    assert "sequence length" in msg
    msg = raises_like(lambda: tm(tx.double()), lambda: m(x.to(lr.float64)))
    assert "float64" in msg and "float32" in msg
    raises_like(lambda: tm(tx, torch.zeros(2, 2, 5)), lambda: m(x, lr.zeros(2, 2, 5)), TypeError)
    with pytest.raises(TypeError, match="PackedSequence is not supported"):
        m(torch.nn.utils.rnn.pack_sequence([tx[:, 0]]))
    # Constructor arguments.
    raises_like(lambda: torch.nn.GRU(4, 5, proj_size=2), lambda: nn.GRU(4, 5, proj_size=2))
    raises_like(lambda: torch.nn.RNN(4, 5, proj_size=2), lambda: nn.RNN(4, 5, proj_size=2))
    raises_like(lambda: torch.nn.LSTM(4, 5, proj_size=5), lambda: nn.LSTM(4, 5, proj_size=5))
    raises_like(lambda: torch.nn.LSTM(4, 5, proj_size=-1), lambda: nn.LSTM(4, 5, proj_size=-1))
    raises_like(lambda: torch.nn.RNN(4, 5, nonlinearity="gelu"), lambda: nn.RNN(4, 5, nonlinearity="gelu"))
    raises_like(lambda: torch.nn.LSTM(4, 5, dropout=1.5), lambda: nn.LSTM(4, 5, dropout=1.5))
    raises_like(lambda: torch.nn.LSTM(4, 5, dropout=True), lambda: nn.LSTM(4, 5, dropout=True))
    for module in (torch.nn, nn):
        with pytest.warns(UserWarning, match="num_layers"):
            module.GRU(4, 5, dropout=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.GRU(4, 5, num_layers=2, dropout=0.2)
    # Cells.
    c, tc = nn.LSTMCell(4, 5), torch.nn.LSTMCell(4, 5)
    msg = raises_like(lambda: tc(torch.zeros(3, 3)), lambda: c(lr.zeros(3, 3)))
    assert "input_size 4" in msg
    msg = raises_like(lambda: tc(torch.zeros(3, 4), (torch.zeros(2, 5), torch.zeros(2, 5))),
                      lambda: c(lr.zeros(3, 4), (lr.zeros(2, 5), lr.zeros(2, 5))))
    assert "hx[0] has shape [2, 5], expected [3, 5]" in msg
    raises_like(lambda: tc(torch.zeros(3, 4), (torch.zeros(3, 5), torch.zeros(3, 6))),
                lambda: c(lr.zeros(3, 4), (lr.zeros(3, 5), lr.zeros(3, 6))))
    raises_like(lambda: tc(torch.zeros(3, 4).double()), lambda: c(lr.zeros(3, 4, dtype=lr.float64)))
    # A 3-D input: a ValueError.
    msg = raises_like(lambda: tc(torch.zeros(2, 3, 4)), lambda: c(lr.zeros(2, 3, 4)))
    assert "[2, 3, 4]" in msg
    raises_like(lambda: torch.nn.GRUCell(4, 5)(torch.zeros(4), torch.zeros(3, 5)),
                lambda: nn.GRUCell(4, 5)(lr.zeros(4), lr.zeros(3, 5)))
    # An unknown nonlinearity: PyTorch's RNNCell fails on its first call, lazyrt's when built (as nn.RNN).
    raises_like(lambda: torch.nn.RNNCell(4, 5, nonlinearity="sigmoid")(torch.zeros(4)),
                lambda: nn.RNNCell(4, 5, nonlinearity="sigmoid"), ValueError)


# ---- training ------------------------------------------------------------------------------------------

class Regressor(nn.Module):
    """An LSTM reading [N, T, 3] sequences, a Linear reading the last step."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


class TorchRegressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(3, 8, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def test_training_an_lstm_with_compile_step_matches_torch():
    torch.manual_seed(7)
    tmodel = TorchRegressor()
    model = load_from_torch(Regressor(), tmodel)
    opt = lr.optim.Adam(model.parameters(), lr=0.02)
    topt = torch.optim.Adam(tmodel.parameters(), lr=0.02)
    g = np.random.default_rng(7)
    batches = [(g.standard_normal((4, 12, 3)).astype(np.float32), g.standard_normal((4, 1)).astype(np.float32))
               for _ in range(5)]

    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = lr.compile_step(step, (lr.tensor(batches[0][0]), lr.tensor(batches[0][1])))
    losses, tlosses = [], []
    for x, y in batches:
        losses.append(compiled(lr.tensor(x), lr.tensor(y)).item())
        topt.zero_grad()
        tloss = torch.nn.functional.mse_loss(tmodel(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        tlosses.append(tloss.item())
    np.testing.assert_allclose(losses, tlosses, rtol=1e-4)
    assert losses[-1] < losses[0]
    for (n, p), (_, tp) in zip(model.named_parameters(), tmodel.named_parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=n)


# ---- Transformer decoder ---------------------------------------------------------------------------

E, NH = 8, 2           # d_model, heads
N, T, S = 3, 4, 5      # batch, target length, source (memory) length


def layout(seq, batch_first):
    return (N, seq, E) if batch_first else (seq, N, E)


def decoder_masks(rng, kind):
    """(lazyrt, torch) masks: tgt_mask, memory_mask, tgt_key_padding_mask,
    memory_key_padding_mask, for a kind such as 'causal_float+kpm'."""
    masks = [None] * 4
    parts = kind.split("+")
    if "causal_float" in parts:
        masks[0] = torch.nn.Transformer.generate_square_subsequent_mask(T).numpy()
    if "causal_bool" in parts:
        masks[0] = np.triu(np.ones((T, T), dtype=bool), 1)
    if "memory_mask" in parts:
        m = rng.random((T, S)) < 0.4
        m[:, 0] = False
        masks[1] = m
    if "kpm" in parts:
        for i, length in [(2, T), (3, S)]:
            m = rng.random((N, length)) < 0.4
            m[:, 0] = False  # no row is masked out entirely
            masks[i] = m
    return [None if a is None else lr.tensor(a) for a in masks], [None if a is None else torch.from_numpy(a)
                                                                   for a in masks]


DECODER_CASES = [
    (False, False, "relu", "causal_float+kpm"),
    (True, False, "gelu", "causal_bool+memory_mask"),
    (False, True, "relu", "causal_bool+kpm+memory_mask"),
    (True, True, "gelu", "causal_float+kpm"),
    (True, False, "relu", "none"),
]


@pytest.mark.parametrize("batch_first,norm_first,activation,kind", DECODER_CASES)
def test_decoder_layer_forward_and_gradients_match_torch(batch_first, norm_first, activation, kind, rng):
    kwargs = dict(dim_feedforward=16, dropout=0.0, activation=activation, batch_first=batch_first,
                  norm_first=norm_first)
    tlayer = randomize(torch.nn.TransformerDecoderLayer(E, NH, **kwargs), rng)
    layer = load_from_torch(nn.TransformerDecoderLayer(E, NH, **kwargs), tlayer)
    tgt, ttgt = pair(rng, layout(T, batch_first), lr.float32, -1, 1, True)
    mem, tmem = pair(rng, layout(S, batch_first), lr.float32, -1, 1, True)
    masks, tmasks = decoder_masks(rng, kind)
    out = layer(tgt, mem, *masks)
    tout = tlayer(ttgt, tmem, *tmasks)
    assert_same(out, tout, rtol=1e-5, atol=1e-5)
    w, tw = pair(rng, tuple(out.shape), lr.float32, -1, 1)
    (out * w).sum().backward()
    (tout * tw).sum().backward()
    check_grads(layer, tlayer, [tgt, mem], [ttgt, tmem], dict(rtol=1e-4, atol=1e-5))


def test_decoder_stack_matches_torch_and_its_layers_are_independent(rng):
    kwargs = dict(dim_feedforward=16, dropout=0.0, batch_first=True)
    tdec = randomize(torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(E, NH, **kwargs), 2,
                                                 norm=torch.nn.LayerNorm(E)), rng)
    layer = nn.TransformerDecoderLayer(E, NH, **kwargs)
    dec = nn.TransformerDecoder(layer, 2, norm=nn.LayerNorm(E))
    assert [(n, tuple(p.shape)) for n, p in dec.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tdec.named_parameters()]
    assert [n for n, _ in layer.named_children()] == [n for n, _ in tdec.layers[0].named_children()]
    assert dec.layers[0].linear1.weight.tolist() == dec.layers[1].linear1.weight.tolist()
    assert len({lr.tensor_id(p) for p in dec.parameters()}) == len(list(tdec.parameters()))
    load_from_torch(dec, tdec)
    tgt, ttgt = pair(rng, layout(T, True), lr.float32, -1, 1, True)
    mem, tmem = pair(rng, layout(S, True), lr.float32, -1, 1, True)
    masks, tmasks = decoder_masks(rng, "causal_float+kpm")
    out, tout = dec(tgt, mem, *masks), tdec(ttgt, tmem, *tmasks)
    assert_same(out, tout, rtol=1e-5, atol=1e-5)
    (out * out).sum().backward()
    (tout * tout).sum().backward()
    check_grads(dec, tdec, [tgt, mem], [ttgt, tmem], dict(rtol=1e-4, atol=1e-5))
    # Unbatched: [T, E] and [S, E] with 1-D padding masks.
    out = dec(tgt[0], mem[0], masks[0], tgt_key_padding_mask=masks[2][0])
    tout = tdec(ttgt[0], tmem[0], tmasks[0], tgt_key_padding_mask=tmasks[2][0])
    assert_same(out, tout, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_first,norm_first", [(False, False), (True, True)])
def test_transformer_matches_torch(batch_first, norm_first, rng):
    kwargs = dict(d_model=E, nhead=NH, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=16, dropout=0.0,
                  batch_first=batch_first, norm_first=norm_first)
    tmodel = randomize(torch.nn.Transformer(**kwargs), rng)
    model = nn.Transformer(**kwargs)
    assert list(model.state_dict()) == list(tmodel.state_dict())
    load_from_torch(model, tmodel)
    src, tsrc = pair(rng, layout(S, batch_first), lr.float32, -1, 1, True)
    tgt, ttgt = pair(rng, layout(T, batch_first), lr.float32, -1, 1, True)
    masks, tmasks = decoder_masks(rng, "causal_float+kpm")
    src_kpm = rng.random((N, S)) < 0.3
    src_kpm[:, 0] = False
    args = dict(tgt_mask=masks[0], src_key_padding_mask=lr.tensor(src_kpm), tgt_key_padding_mask=masks[2],
                memory_key_padding_mask=masks[3])
    targs = dict(tgt_mask=tmasks[0], src_key_padding_mask=torch.from_numpy(src_kpm), tgt_key_padding_mask=tmasks[2],
                 memory_key_padding_mask=tmasks[3])
    out, tout = model(src, tgt, **args), tmodel(tsrc, ttgt, **targs)
    assert_same(out, tout, rtol=1e-5, atol=1e-5)
    w, tw = pair(rng, tuple(out.shape), lr.float32, -1, 1)
    (out * w).sum().backward()
    (tout * tw).sum().backward()
    check_grads(model, tmodel, [src, tgt], [tsrc, ttgt], dict(rtol=1e-4, atol=1e-5))
    # Errors: batch sizes and d_model.
    bad_tgt = lr.zeros(*layout(T, batch_first)[:-1], E + 1)
    raises_like(lambda: tmodel(tsrc, torch.zeros(*layout(T, batch_first)[:-1], E + 1)), lambda: model(src, bad_tgt))
    other = (2, T, E) if batch_first else (T, 2, E)
    msg = raises_like(lambda: tmodel(tsrc, torch.zeros(other)), lambda: model(src, lr.zeros(*other)))
    assert "same batch size" in msg


def test_transformer_initialization_and_causal_mask():
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    assert_same(mask, torch.nn.Transformer.generate_square_subsequent_mask(5), rtol=0, atol=0)
    lr.manual_seed(2)
    model = nn.Transformer(d_model=32, nhead=4, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=64)
    tmodel = torch.nn.Transformer(d_model=32, nhead=4, num_encoder_layers=1, num_decoder_layers=1,
                                  dim_feedforward=64)
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tmodel.named_parameters()]
    for (n, p), (_, tp) in zip(model.named_parameters(), tmodel.named_parameters()):
        if p.dim() > 1:  # xavier-uniform, redrawn by Transformer
            bound = math.sqrt(6 / (p.shape[0] + p.shape[1]))
            v = p.numpy()
            assert np.abs(v).max() <= bound and np.abs(v).max() > 0.9 * bound, n
            np.testing.assert_allclose(v.std(), tp.detach().numpy().std(), rtol=0.15, err_msg=n)
        elif n.endswith("in_proj_bias") or "norm" in n:
            assert_same(p, tp.detach(), rtol=0, atol=0, what=n)  # zeros, ones: as the layers start
    assert (model.d_model, model.nhead, model.batch_first) == (32, 4, False)
