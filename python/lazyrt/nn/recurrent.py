"""Recurrent layers and cells, as torch.nn (PyTorch 1.13) defines them: RNNCell, LSTMCell,
GRUCell, and the multi-layer RNN (tanh or relu), LSTM (with proj_size) and GRU.

The modules take PyTorch 1.13's arguments and register the same parameters under the same
names, shapes and order (weight_ih_l{k}[_reverse], weight_hh_l{k}..., bias_ih_l{k}...,
bias_hh_l{k}..., weight_hr_l{k}... for a projected LSTM), so a PyTorch state_dict loads as it
is. The gates are PyTorch's, in its order: LSTM i, f, g, o; GRU r, z, n, where the hidden
part of n is b_hn + W_hn h, multiplied by r as a whole. Every parameter starts uniform in
[-1/sqrt(hidden_size), 1/sqrt(hidden_size)), drawn from lazyrt's generator (PyTorch's
distribution, not its numbers).

The layers are compositions of lazyrt ops. The input projections of a whole sequence are one
matmul; the time loop is one lazyrt.scan per layer and direction (the reverse direction
scans with reverse=True), so a sequence of any length is one loop node in the graph, traced
and compiled once, and differentiable like the rest (gradients of the parameters, the input
and the initial state). Dropout between layers (in train mode, dropout > 0) is applied to a
layer's whole output, outside the loop, as PyTorch does; lazyrt's dropout draws its own
random numbers. No configuration falls back to a Python loop over time steps. The cells are
one step, for the caller's own loops (inside lazyrt.scan too).

Where lazyrt differs from PyTorch:
- PackedSequence inputs are not supported (lazyrt has no PackedSequence): pass padded
  tensors. flatten_parameters() is accepted and does nothing (there is no cuDNN weight
  buffer to compact).
- `device` is accepted for PyTorch's signature and ignored; `dtype` sets the parameters'
  floating dtype.
"""

import math
import numbers
import warnings

from lazyrt import _C
from lazyrt._C import Tensor
from lazyrt._loops import scan
from lazyrt.nn import functional as F
from lazyrt.nn import init
from lazyrt.nn.module import Module, Parameter

__all__ = ["RNNCellBase", "RNNCell", "LSTMCell", "GRUCell", "RNNBase", "RNN", "LSTM", "GRU"]


# ---- one step of each recurrence ---------------------------------------------------------------
# xg is the input's projection x W_ih^T + b_ih (computed once for a whole sequence in the
# layers), h and c the state; the functions return the next state.

def _rnn_step(act, xg, h, w_hh, b_hh):
    return act(xg + F.linear(h, w_hh, b_hh))


def _lstm_step(xg, h, c, w_hh, b_hh, w_hr):
    i, f, g, o = (xg + F.linear(h, w_hh, b_hh)).chunk(4, -1)
    c = _C.sigmoid(f) * c + _C.sigmoid(i) * _C.tanh(g)
    h = _C.sigmoid(o) * _C.tanh(c)
    if w_hr is not None:
        h = F.linear(h, w_hr)
    return h, c


def _gru_step(xg, h, w_hh, b_hh):
    x_r, x_z, x_n = xg.chunk(3, -1)
    h_r, h_z, h_n = F.linear(h, w_hh, b_hh).chunk(3, -1)
    r = _C.sigmoid(x_r + h_r)
    z = _C.sigmoid(x_z + h_z)
    n = _C.tanh(x_n + r * h_n)
    return n + z * (h - n)  # (1 - z) * n + z * h


_ACTIVATIONS = {"tanh": _C.tanh, "relu": _C.relu}


# ---- checks ------------------------------------------------------------------------------------

def _shape(t):
    return list(t.shape)


def _check_size_arg(call, name, value, least):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < least:
        raise ValueError(f"{call}: {name} must be an integer >= {least}, got {value!r}")


def _check_dtype(call, what, t, weight, error=_C.Error):
    if not isinstance(t, Tensor):
        raise TypeError(f"{call}: {what} must be a lazyrt.Tensor, got {type(t).__name__}")
    if t.dtype is not weight.dtype:
        raise error(f"{call}: {what} is {t.dtype} {_shape(t)} but the parameters are {weight.dtype}; "
                       f"convert one (module.to({t.dtype}) or {what}.to({weight.dtype}))")


def _new_parameter(shape, dtype):
    """An uninitialized (zero) parameter; reset_parameters fills it."""
    return Parameter(_C.zeros(*shape, dtype=dtype if dtype is not None else _C.float32))


def _uniform_reset(module):
    """Every parameter uniform in [-1/sqrt(hidden_size), 1/sqrt(hidden_size)), in registration
    order, as PyTorch's recurrent modules start."""
    bound = 1.0 / math.sqrt(module.hidden_size) if module.hidden_size > 0 else 0.0
    for p in module.parameters():
        init.uniform_(p, -bound, bound)


# ---- cells -------------------------------------------------------------------------------------

class RNNCellBase(Module):
    """The parameters shared by the cells: weight_ih [chunks * hidden, input], weight_hh
    [chunks * hidden, hidden], bias_ih and bias_hh [chunks * hidden] (None without bias)."""

    def __init__(self, input_size, hidden_size, bias, num_chunks, device=None, dtype=None):
        super().__init__()
        call = type(self).__name__
        _check_size_arg(call, "input_size", input_size, 0)
        _check_size_arg(call, "hidden_size", hidden_size, 0)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = _new_parameter((num_chunks * hidden_size, input_size), dtype)
        self.weight_hh = _new_parameter((num_chunks * hidden_size, hidden_size), dtype)
        if bias:
            self.bias_ih = _new_parameter((num_chunks * hidden_size,), dtype)
            self.bias_hh = _new_parameter((num_chunks * hidden_size,), dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_reset(self)

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s

    def _prepare(self, input, states):
        """Checks a cell's input and states; returns (batched, input [N, input], states as
        [N, hidden] tensors, None for zeros)."""
        call = type(self).__name__
        _check_dtype(call, "input", input, self.weight_ih)
        if input.dim() not in (1, 2):
            raise ValueError(f"{call}: expected input to be 1-D [input_size] or 2-D [batch, input_size], got "
                             f"shape {_shape(input)}")
        if input.shape[-1] != self.input_size:
            raise _C.Error(f"{call}: input has shape {_shape(input)}, its last dim should be input_size "
                           f"{self.input_size}")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        n = x.shape[0]
        want = (n, self.hidden_size) if batched else (self.hidden_size,)
        out = []
        for name, s in states:
            if s is None:
                out.append(_C.zeros(n, self.hidden_size, dtype=x.dtype))
                continue
            _check_dtype(call, name, s, self.weight_ih)
            if tuple(s.shape) != want:
                raise _C.Error(f"{call}: {name} has shape {_shape(s)}, expected {list(want)} for input "
                               f"{_shape(input)} and hidden_size {self.hidden_size}")
            out.append(s if batched else s.unsqueeze(0))
        return batched, x, out


class RNNCell(RNNCellBase):
    """h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act tanh or relu.

    forward(input, hx=None) -> h'. input is [N, input_size] or [input_size]; hx [N,
    hidden_size] or [hidden_size], zeros if None. An unknown nonlinearity is a ValueError when
    the cell is built (as for nn.RNN); PyTorch's cell fails on its first call.
    """

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", device=None, dtype=None):
        if nonlinearity not in _ACTIVATIONS:
            raise ValueError(f"RNNCell: unknown nonlinearity '{nonlinearity}' (expected 'tanh' or 'relu')")
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input, hx=None):
        if self.nonlinearity not in _ACTIVATIONS:
            raise _C.Error(f"RNNCell: unknown nonlinearity '{self.nonlinearity}'")
        batched, x, (h,) = self._prepare(input, [("hx", hx)])
        h = _rnn_step(_ACTIVATIONS[self.nonlinearity], F.linear(x, self.weight_ih, self.bias_ih), h,
                      self.weight_hh, self.bias_hh)
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    """A long short-term memory cell: gates i, f, g, o (in that order in the weights' rows);
    c' = f * c + i * g, h' = o * tanh(c').

    forward(input, hx=None) -> (h', c'). input is [N, input_size] or [input_size]; hx a pair
    (h, c), each [N, hidden_size] or [hidden_size], zeros if None.
    """

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input, hx=None):
        if hx is None:
            hx = (None, None)
        elif not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LSTMCell: hx must be a pair (h_0, c_0), got a {type(hx).__name__}")
        batched, x, (h, c) = self._prepare(input, [("hx[0]", hx[0]), ("hx[1]", hx[1])])
        h, c = _lstm_step(F.linear(x, self.weight_ih, self.bias_ih), h, c, self.weight_hh, self.bias_hh, None)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    """A gated recurrent unit: gates r, z, n (in that order in the weights' rows);
    n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) * n + z * h.

    forward(input, hx=None) -> h'. Shapes as RNNCell's.
    """

    def __init__(self, input_size, hidden_size, bias=True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input, hx=None):
        batched, x, (h,) = self._prepare(input, [("hx", hx)])
        h = _gru_step(F.linear(x, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh)
        return h if batched else h.squeeze(0)


# ---- multi-layer recurrent modules ---------------------------------------------------------

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


class RNNBase(Module):
    """The multi-layer recurrent module of a `mode`: 'LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU'
    (RNN, LSTM and GRU are the forms to use).

    forward(input, hx=None) -> (output, h_n), (output, (h_n, c_n)) for an LSTM. input is [L,
    N, input_size] ([N, L, input_size] with batch_first) or unbatched [L, input_size]
    (batch_first does not apply). output is [L, N, D * H_out] in input's layout, D = 2 if
    bidirectional else 1, H_out = proj_size or hidden_size, the last layer's states of both
    directions side by side. hx (h_0, or (h_0, c_0) for an LSTM) and the final states are
    [num_layers * D, N, H_out] (c: hidden_size), [num_layers * D, H_out] unbatched, layer by
    layer, forward direction first; zeros when hx is None.
    """

    def __init__(self, mode, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__()
        if mode not in _GATES:
            raise ValueError(f"RNNBase: unrecognized mode '{mode}' (expected one of {list(_GATES)})")
        call = {"RNN_TANH": "RNN", "RNN_RELU": "RNN"}.get(mode, mode)
        _check_size_arg(call, "input_size", input_size, 0)
        _check_size_arg(call, "hidden_size", hidden_size, 1)
        _check_size_arg(call, "num_layers", num_layers, 1)
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1:
            raise ValueError(f"{call}: dropout should be a number in [0, 1] (the probability of zeroing an "
                             f"element), got {dropout!r}")
        if dropout > 0 and num_layers == 1:
            warnings.warn(f"{call}: dropout applies between recurrent layers, after all but the last, so "
                          f"dropout={dropout} with num_layers=1 does nothing", stacklevel=2)
        if not isinstance(proj_size, numbers.Integral) or proj_size < 0:
            raise ValueError(f"{call}: proj_size should be a positive integer, or zero for no projection, "
                             f"got {proj_size!r}")
        if proj_size >= hidden_size:
            raise ValueError(f"{call}: proj_size ({proj_size}) has to be smaller than hidden_size ({hidden_size})")
        if proj_size and mode != "LSTM":
            raise ValueError(f"{call}: proj_size is only supported by LSTM")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        gates = _GATES[mode] * hidden_size
        out_size = proj_size or hidden_size
        directions = 2 if bidirectional else 1
        self._flat_weights_names = []
        self._all_weights = []
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else out_size * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                shapes = [("weight_ih", (gates, layer_input)), ("weight_hh", (gates, out_size))]
                if bias:
                    shapes += [("bias_ih", (gates,)), ("bias_hh", (gates,))]
                if proj_size:
                    shapes.append(("weight_hr", (proj_size, hidden_size)))
                names = []
                for kind, shape in shapes:
                    setattr(self, kind + suffix, _new_parameter(shape, dtype))
                    names.append(kind + suffix)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self):
        _uniform_reset(self)

    def flatten_parameters(self):
        """Does nothing: PyTorch compacts the weights for cuDNN here; lazyrt has nothing to compact."""

    @property
    def _flat_weights(self):
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self):
        """The parameters, a list per layer and direction (in the order of their names)."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def extra_repr(self):
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s

    # ---- forward -------------------------------------------------------------------------

    def _call(self):
        return "RNN" if self.mode.startswith("RNN") else self.mode

    def _weights(self, index):
        """(w_ih, w_hh, b_ih, b_hh, w_hr) of layer-direction `index`, None where absent."""
        got = {n.split("_l")[0]: getattr(self, n) for n in self._all_weights[index]}
        return tuple(got.get(k) for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"))

    def _states(self, input, hx, batched, n):
        """The initial states as [num_layers * D, N, size] tensors, checked against the input."""
        call = self._call()
        directions = 2 if self.bidirectional else 1
        out_size = self.proj_size or self.hidden_size
        size_names = {self.hidden_size: "hidden_size", self.proj_size: "proj_size"}
        lstm = self.mode == "LSTM"
        if hx is None:
            dtype = input.dtype
            h = _C.zeros(self.num_layers * directions, n, out_size, dtype=dtype)
            return (h, _C.zeros(self.num_layers * directions, n, self.hidden_size, dtype=dtype)) if lstm else (h,)
        if lstm:
            if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                raise TypeError(f"LSTM: hx must be a pair (h_0, c_0), got a {type(hx).__name__}")
            named = [("h_0", hx[0], out_size), ("c_0", hx[1], self.hidden_size)]
        else:
            if not isinstance(hx, Tensor):
                raise TypeError(f"{call}: hx must be a lazyrt.Tensor (h_0), got a {type(hx).__name__}")
            named = [("h_0", hx, out_size)]
        dims = 3 if batched else 2
        for name, s, _ in named:
            _check_dtype(call, name, s, self.weight_ih_l0)
        if any(s.dim() != dims for _, s, _ in named):
            got = ", ".join(f"{name} {_shape(s)}" for name, s, _ in named)
            raise _C.Error(f"{call}: for {'a batched 3-D' if batched else 'an unbatched 2-D'} input "
                           f"{_shape(input)}, the initial states must be {dims}-D too, got {got}")
        states = []
        for name, s, size in named:
            want = (self.num_layers * directions, n, size) if batched else (self.num_layers * directions, size)
            if tuple(s.shape) != want:
                raise _C.Error(f"{call}: {name} has shape {_shape(s)}, expected {list(want)} (num_layers * "
                               f"num_directions, {'batch, ' if batched else ''}{size_names[size]}) for input "
                               f"{_shape(input)}")
            states.append(s if batched else s.unsqueeze(1))
        return tuple(states)

    def _direction(self, x, index, h0, c0, reverse):
        """One layer in one direction over x [L, N, in]: (ys [L, N, H_out], h_n, c_n or None)."""
        w_ih, w_hh, b_ih, b_hh, w_hr = self._weights(index)
        xg = F.linear(x, w_ih, b_ih)  # every step's input projection in one matmul
        if self.mode == "LSTM":
            def lstm(carry, g):
                h, c = _lstm_step(g, carry[0], carry[1], w_hh, b_hh, w_hr)
                return (h, c), h
            (h, c), ys = scan(lstm, (h0, c0), xg, reverse=reverse)
            return ys, h, c
        if self.mode == "GRU":
            def gru(h, g):
                h = _gru_step(g, h, w_hh, b_hh)
                return h, h
            h, ys = scan(gru, h0, xg, reverse=reverse)
            return ys, h, None
        act = _ACTIVATIONS["tanh" if self.mode == "RNN_TANH" else "relu"]

        def rnn(h, g):
            h = _rnn_step(act, g, h, w_hh, b_hh)
            return h, h
        h, ys = scan(rnn, h0, xg, reverse=reverse)
        return ys, h, None

    def forward(self, input, hx=None):
        call = self._call()
        if not isinstance(input, Tensor):
            raise TypeError(f"{call}: input must be a lazyrt.Tensor (PackedSequence is not supported; pass a "
                            f"padded tensor), got {type(input).__name__}")
        # The module's input checks raise ValueError, as PyTorch 2.x's RNNBase.forward does.
        _check_dtype(call, "input", input, self.weight_ih_l0, ValueError)
        if input.dim() not in (2, 3):
            raise ValueError(f"{call}: expected a 3-D input ([seq, batch, input_size], or [batch, seq, input_size] "
                           f"with batch_first) or a 2-D unbatched one [seq, input_size], got shape {_shape(input)}")
        if input.shape[-1] != self.input_size:
            raise _C.Error(f"{call}: input has shape {_shape(input)}, its last dim should be input_size "
                           f"{self.input_size}")
        batched = input.dim() == 3
        if not batched:
            x = input.unsqueeze(1)
        else:
            x = input.transpose(0, 1) if self.batch_first else input
        if x.shape[0] == 0:
            raise _C.Error(f"{call}: the sequence length must be larger than 0, got input shape {_shape(input)}")
        states = self._states(input, hx, batched, x.shape[1])
        lstm = self.mode == "LSTM"
        directions = 2 if self.bidirectional else 1
        h0 = states[0].unbind(0)
        c0 = states[1].unbind(0) if lstm else [None] * len(h0)
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outs = []
            for direction in range(directions):
                k = layer * directions + direction
                ys, h, c = self._direction(x, k, h0[k], c0[k], reverse=direction == 1)
                outs.append(ys)
                h_n.append(h)
                c_n.append(c)
            x = outs[0] if directions == 1 else _C.cat(outs, -1)
            if self.training and self.dropout > 0 and layer < self.num_layers - 1:
                x = _C.dropout(x, self.dropout, True)
        h_n = _C.stack(h_n, 0)
        c_n = _C.stack(c_n, 0) if lstm else None
        if not batched:
            x, h_n = x.squeeze(1), h_n.squeeze(1)
            c_n = c_n.squeeze(1) if lstm else None
        elif self.batch_first:
            x = x.transpose(0, 1)
        return (x, (h_n, c_n)) if lstm else (x, h_n)


class RNN(RNNBase):
    """An Elman RNN: h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), act tanh or relu
    (nonlinearity=), layer by layer. See RNNBase for forward's shapes.

    As in PyTorch 1.13, nonlinearity is a keyword argument; proj_size is refused (ValueError).
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, *, nonlinearity="tanh", device=None, dtype=None, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("RNN: proj_size is only supported by LSTM, not RNN or GRU")
        if kwargs:
            raise TypeError(f"RNN: unexpected keyword arguments {sorted(kwargs)}")
        if nonlinearity not in _ACTIVATIONS:
            raise ValueError(f"RNN: unknown nonlinearity '{nonlinearity}' (expected 'tanh' or 'relu')")
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size, hidden_size, num_layers,
                         bias, batch_first, dropout, bidirectional, 0, device, dtype)
        self.nonlinearity = nonlinearity


class LSTM(RNNBase):
    """A multi-layer LSTM (gates as LSTMCell's). With proj_size > 0 each step's h is projected
    by weight_hr_l{k} [proj_size, hidden_size]: h_n and the output have proj_size features, c_n
    hidden_size. forward(input, (h_0, c_0)=None) -> (output, (h_n, c_n)); see RNNBase.
    """

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, proj_size=0, device=None, dtype=None):
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         proj_size, device, dtype)


class GRU(RNNBase):
    """A multi-layer GRU (gates as GRUCell's). forward(input, h_0=None) -> (output, h_n); see
    RNNBase. proj_size is refused (ValueError), as in PyTorch."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, *, device=None, dtype=None, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("GRU: proj_size is only supported by LSTM, not RNN or GRU")
        if kwargs:
            raise TypeError(f"GRU: unexpected keyword arguments {sorted(kwargs)}")
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         0, device, dtype)
