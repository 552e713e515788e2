"""lazyrt.nn.MultiheadAttention, TransformerEncoderLayer and TransformerEncoder against PyTorch
1.13's: the same parameters (names, shapes, order) so that a torch state_dict loads, forward
outputs and attention weights with every kind of mask, gradients of every parameter and input,
training side by side with torch, and compile_step replays of a training step.

Every PyTorch module gets random parameter values (biases included: PyTorch starts them at
zero, which would leave the bias paths untested) and the lazyrt module loads them. Dropout is 0
or the modules are in eval mode wherever values are compared with PyTorch.
"""

import math

import numpy as np
import pytest
import torch

import lazyrt as lr
import lazyrt.nn as nn
import lazyrt.nn.functional as F
from conftest import assert_same, pair, randomize

E, H = 8, 2          # embed_dim, num_heads
N, L, S = 3, 4, 5    # batch, target length, source length
FWD = dict(rtol=1e-5, atol=1e-6)
GRAD = dict(rtol=1e-4, atol=1e-5)


def load_from_torch(module, tmodule):
    # Clones: from_torch shares memory, and torch's optimizers update their parameters in place.
    result = module.load_state_dict({k: v.detach().clone() for k, v in tmodule.state_dict().items()})
    assert result.missing_keys == [] and result.unexpected_keys == []
    return module


def mha_pair(rng, *args, **kwargs):
    tm = randomize(torch.nn.MultiheadAttention(*args, **kwargs), rng)
    return load_from_torch(nn.MultiheadAttention(*args, **kwargs), tm), tm


def layout(shape_lne, batch_first):
    """[seq, batch, E] as given, or [batch, seq, E] with batch_first."""
    seq, batch, e = shape_lne
    return (batch, seq, e) if batch_first else (seq, batch, e)


def bool_mask(rng, shape):
    """A random bool mask (True = masked out) that leaves the first key of every row unmasked,
    so that no softmax row is all -inf."""
    m = rng.random(shape) < 0.4
    m[..., 0] = False
    return m


def float_mask(rng, shape):
    """A random additive mask with some zeros and some -inf entries; the first key is always 0.
    (Combined with a bool attn_mask, PyTorch 1.13 treats a float key_padding_mask as bool:
    nonzero masks out. The zeros keep such rows from being masked out entirely.)"""
    m = rng.uniform(-2, 2, size=shape).astype(np.float32)
    m[rng.random(shape) < 0.3] = 0.0
    m[bool_mask(rng, shape) & (rng.random(shape) < 0.5)] = -np.inf
    m[..., 0] = 0.0
    return m


def both(a):
    """The same mask as a lazyrt tensor and a torch tensor (None stays None)."""
    if a is None:
        return None, None
    return lr.tensor(a), torch.from_numpy(np.array(a))


def make_masks(rng, kind, tgt=L, src=S):
    """(attn_mask, key_padding_mask) as NumPy arrays for a mask kind such as 'bool2d+kpm_float'."""
    attn, kpm = None, None
    for part in kind.split("+"):
        if part == "bool2d":
            attn = bool_mask(rng, (tgt, src))
        elif part == "float2d":
            attn = float_mask(rng, (tgt, src))
        elif part == "bool3d":
            attn = bool_mask(rng, (N * H, tgt, src))
        elif part == "float3d":
            attn = float_mask(rng, (N * H, tgt, src))
        elif part == "causal":
            attn = np.triu(np.ones((tgt, src), dtype=bool), k=1)
        elif part == "kpm_bool":
            kpm = bool_mask(rng, (N, src))
        elif part == "kpm_float":
            kpm = float_mask(rng, (N, src))
        elif part != "none":
            raise ValueError(part)
    return attn, kpm


# ---- parameters and initialization -------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(), dict(bias=False), dict(kdim=6, vdim=4), dict(add_bias_kv=True), dict(bias=False, kdim=5),
])
def test_parameters_have_torch_names_shapes_and_order(kwargs):
    m = nn.MultiheadAttention(E, H, **kwargs)
    tm = torch.nn.MultiheadAttention(E, H, **kwargs)
    assert list(m.state_dict()) == list(tm.state_dict())
    assert [(n, tuple(p.shape)) for n, p in m.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tm.named_parameters()]
    assert type(m.out_proj).__name__ == type(tm.out_proj).__name__ == "NonDynamicallyQuantizableLinear"
    assert isinstance(m.out_proj, nn.Linear)
    assert (m.embed_dim, m.kdim, m.vdim, m.num_heads, m.head_dim, m.batch_first, m._qkv_same_embed_dim) == \
        (tm.embed_dim, tm.kdim, tm.vdim, tm.num_heads, tm.head_dim, tm.batch_first, tm._qkv_same_embed_dim)
    load_from_torch(m, tm)

    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16)
    tlayer = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=16)
    assert [(n, tuple(p.shape)) for n, p in layer.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in tlayer.named_parameters()]
    assert [n for n, _ in layer.named_children()] == [n for n, _ in tlayer.named_children()]


def test_initialization_follows_torch_scheme():
    e = 64
    lr.manual_seed(0)
    torch.manual_seed(0)
    m = nn.MultiheadAttention(e, 4)
    tm = torch.nn.MultiheadAttention(e, 4)
    w, tw = m.in_proj_weight.numpy(), tm.in_proj_weight.detach().numpy()
    bound = math.sqrt(6.0 / (e + 3 * e))  # xavier_uniform_ of a [3E, E] weight
    assert np.abs(tw).max() <= bound and np.abs(w).max() <= bound
    assert np.abs(w).max() > 0.95 * bound
    np.testing.assert_allclose(w.std(), tw.std(), rtol=0.05)
    assert m.in_proj_bias.tolist() == tm.in_proj_bias.tolist() == [0.0] * (3 * e)
    assert m.out_proj.bias.tolist() == tm.out_proj.bias.tolist() == [0.0] * e
    ow, tow = m.out_proj.weight.numpy(), tm.out_proj.weight.detach().numpy()
    assert np.abs(ow).max() <= 1 / math.sqrt(e) and np.abs(tow).max() <= 1 / math.sqrt(e)
    np.testing.assert_allclose(ow.std(), tow.std(), rtol=0.1)
    # Separate projections and bias_k / bias_v (xavier_normal_ of [1, 1, E]: std sqrt(1 / E)).
    m = nn.MultiheadAttention(e, 4, kdim=32, add_bias_kv=True)
    tm = torch.nn.MultiheadAttention(e, 4, kdim=32, add_bias_kv=True)
    for name in ["q_proj_weight", "k_proj_weight", "v_proj_weight"]:
        w, tw = getattr(m, name).numpy(), getattr(tm, name).detach().numpy()
        b = math.sqrt(6.0 / sum(tw.shape))
        assert np.abs(w).max() <= b and np.abs(tw).max() <= b, name
        np.testing.assert_allclose(w.std(), tw.std(), rtol=0.1, err_msg=name)
    both_k = np.concatenate([m.bias_k.numpy().ravel(), m.bias_v.numpy().ravel()])
    assert 0.5 / math.sqrt(e) < both_k.std() < 1.5 / math.sqrt(e)


# ---- forward against torch ------------------------------------------------------------------------

def attention_inputs(rng, mode, batch_first, requires_grad=False):
    """(query, key, value) as lazyrt and torch tensors; 'self' passes one tensor three times,
    'kv' one key-value tensor, 'cross' three different tensors."""
    q, tq = pair(rng, layout((L, N, E), batch_first), lr.float32, -1, 1, requires_grad)
    if mode == "self":
        return (q, q, q), (tq, tq, tq)
    k, tk = pair(rng, layout((S, N, E), batch_first), lr.float32, -1, 1, requires_grad)
    if mode == "kv":
        return (q, k, k), (tq, tk, tk)
    v, tv = pair(rng, layout((S, N, E), batch_first), lr.float32, -1, 1, requires_grad)
    return (q, k, v), (tq, tk, tv)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mode", ["self", "kv", "cross"])
def test_forward_matches_torch(batch_first, mode, rng):
    m, tm = mha_pair(rng, E, H, batch_first=batch_first)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, mode, batch_first)
    for need_weights, average in [(True, True), (True, False), (False, True)]:
        out, w = m(q, k, v, need_weights=need_weights, average_attn_weights=average)
        tout, tw = tm(tq, tk, tv, need_weights=need_weights, average_attn_weights=average)
        what = f"need_weights={need_weights} average={average}"
        assert_same(out, tout, what=what, **FWD)
        if need_weights:
            assert_same(w, tw, what=what, **FWD)
        else:
            assert w is None and tw is None


MASK_KINDS = ["bool2d", "float2d", "bool3d", "float3d", "causal", "kpm_bool", "kpm_float",
              "bool2d+kpm_bool", "float2d+kpm_bool", "float3d+kpm_bool", "bool3d+kpm_float", "causal+kpm_float"]


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_masks_match_torch(kind, rng):
    batch_first = "3d" in kind  # both layouts, spread over the mask kinds
    m, tm = mha_pair(rng, E, H, batch_first=batch_first)
    mode = "self" if kind.startswith("causal") else "cross"
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, mode, batch_first)
    attn, kpm = make_masks(rng, kind, src=L if mode == "self" else S)
    (a, ta), (p, tp) = both(attn), both(kpm)
    for average in [True, False]:
        out, w = m(q, k, v, attn_mask=a, key_padding_mask=p, average_attn_weights=average)
        tout, tw = tm(tq, tk, tv, attn_mask=ta, key_padding_mask=tp, average_attn_weights=average)
        assert_same(out, tout, what=f"{kind} output", **FWD)
        assert_same(w, tw, what=f"{kind} weights", **FWD)
        if attn is not None and attn.dtype == bool and attn.ndim == 2:
            assert (w.numpy()[..., attn] == 0).all(), "masked positions get exactly zero weight"


def test_fully_masked_rows_give_nan_like_torch(rng):
    m, tm = mha_pair(rng, E, H)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, "cross", False)
    kpm = np.zeros((N, S), dtype=bool)
    kpm[1] = True  # every key of sequence 1 is padding
    (p, tp) = both(kpm)
    out, w = m(q, k, v, key_padding_mask=p)
    tout, tw = tm(tq, tk, tv, key_padding_mask=tp)
    assert np.isnan(tout.detach().numpy()[:, 1]).all()
    assert_same(out, tout, **FWD)
    assert_same(w, tw, **FWD)


def test_float_padding_mask_adds_to_a_float_attn_mask_as_in_torch(rng):
    # PyTorch 2.x adds the two float masks (1.13 refused the pair).
    m, tm = mha_pair(rng, E, H)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, "cross", False)
    (a, ta), (p, tp) = both(float_mask(rng, (L, S))), both(float_mask(rng, (N, S)))
    out, w = m(q, k, v, attn_mask=a, key_padding_mask=p)
    tout, tw = tm(tq, tk, tv, attn_mask=ta, key_padding_mask=tp)
    assert_same(out, tout, **FWD)
    assert_same(w, tw, **FWD)


def test_masks_of_mixed_types_warn_as_in_torch(rng):
    m, tm = mha_pair(rng, E, H)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, "cross", False)
    (a, ta), (p, tp) = both(bool_mask(rng, (L, S))), both(float_mask(rng, (N, S)))
    with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
        tm(tq, tk, tv, attn_mask=ta, key_padding_mask=tp)
    with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
        m(q, k, v, attn_mask=a, key_padding_mask=p)


@pytest.mark.parametrize("kind", ["none", "bool3d", "kpm_bool"])
def test_unbatched_input_matches_torch(kind, rng):
    m, tm = mha_pair(rng, E, H, batch_first=True)
    q, tq = pair(rng, (L, E), lr.float32, -1, 1)
    k, tk = pair(rng, (S, E), lr.float32, -1, 1)
    attn = bool_mask(rng, (H, L, S)) if kind == "bool3d" else None
    kpm = bool_mask(rng, (S,)) if kind == "kpm_bool" else None
    if kpm is not None:
        kpm[0] = False
    (a, ta), (p, tp) = both(attn), both(kpm)
    for average in [True, False]:
        out, w = m(q, k, k, attn_mask=a, key_padding_mask=p, average_attn_weights=average)
        tout, tw = tm(tq, tk, tk, attn_mask=ta, key_padding_mask=tp, average_attn_weights=average)
        assert_same(out, tout, **FWD)
        assert_same(w, tw, **FWD)


@pytest.mark.parametrize("kwargs,kind", [
    (dict(kdim=6, vdim=4), "float2d+kpm_bool"),
    (dict(kdim=6, vdim=4, bias=False, batch_first=True), "bool3d"),
    (dict(add_bias_kv=True), "bool2d+kpm_bool"),
    (dict(add_zero_attn=True), "float3d"),
    (dict(add_bias_kv=True, add_zero_attn=True, kdim=6, vdim=6), "causal+kpm_float"),
    (dict(bias=False), "kpm_float"),
])
def test_options_match_torch(kwargs, kind, rng):
    m, tm = mha_pair(rng, E, H, **kwargs)
    bf = kwargs.get("batch_first", False)
    q, tq = pair(rng, layout((L, N, E), bf), lr.float32, -1, 1, requires_grad=True)
    k, tk = pair(rng, layout((S, N, kwargs.get("kdim", E)), bf), lr.float32, -1, 1, requires_grad=True)
    v, tv = pair(rng, layout((S, N, kwargs.get("vdim", E)), bf), lr.float32, -1, 1, requires_grad=True)
    attn, kpm = make_masks(rng, kind)
    (a, ta), (p, tp) = both(attn), both(kpm)
    for need_weights, average in [(True, True), (True, False), (False, True)]:
        out, w = m(q, k, v, attn_mask=a, key_padding_mask=p, need_weights=need_weights,
                   average_attn_weights=average)
        tout, tw = tm(tq, tk, tv, attn_mask=ta, key_padding_mask=tp, need_weights=need_weights,
                      average_attn_weights=average)
        assert_same(out, tout, what=str(kwargs), **FWD)
        if need_weights:
            assert_same(w, tw, what=str(kwargs), **FWD)
        else:
            assert w is None and tw is None
    # Gradients through the last call (need_weights=False) and the unaveraged weights.
    _, w = m(q, k, v, attn_mask=a, key_padding_mask=p, average_attn_weights=False)
    _, tw = tm(tq, tk, tv, attn_mask=ta, key_padding_mask=tp, average_attn_weights=False)
    g, tg = pair(rng, tuple(out.shape), lr.float32, -1, 1)
    gw, tgw = pair(rng, tuple(w.shape), lr.float32, -1, 1)
    ((out * g).sum() + (w * gw).sum()).backward()
    ((tout * tg).sum() + (tw * tgw).sum()).backward()
    check_grads(m, tm, [q, k, v], [tq, tk, tv])


def test_dropout_on_attention_weights_only_while_training(rng):
    m, tm = mha_pair(rng, E, H, dropout=0.5)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, "cross", False)
    m.eval()
    tm.eval()
    out, w = m(q, k, v, average_attn_weights=False)
    tout, tw = tm(tq, tk, tv, average_attn_weights=False)
    assert_same(out, tout, **FWD)
    assert_same(w, tw, **FWD)
    m.train()
    lr.manual_seed(3)
    _, wd = m(q, k, v, average_attn_weights=False)
    # Each weight is dropped (0) or kept and scaled by 1 / (1 - p), as torch's dropout does.
    wd, w = wd.numpy(), tw.detach().numpy()
    kept = wd != 0
    assert 0.2 < kept.mean() < 0.8
    np.testing.assert_allclose(wd[kept], 2 * w[kept], rtol=1e-6)


def test_bad_arguments_raise_clear_errors(rng):
    with pytest.raises(AssertionError):
        torch.nn.MultiheadAttention(10, 3)
    with pytest.raises(lr.Error, match="embed_dim must be divisible by num_heads, got 10 and 3"):
        nn.MultiheadAttention(10, 3)
    m, tm = mha_pair(rng, E, H)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, "cross", False)
    bad_cases = [
        # (lazyrt call, torch call, message)
        (lambda: m(q, k[:, :, :6], v), lambda: tm(tq, tk[:, :, :6], tv), r"key \[5, 3, 6\]"),
        (lambda: m(q[0], k, v), lambda: tm(tq[0], tk, tv), "must all be 2-D"),
        (lambda: m(q, k, v[:3]), lambda: tm(tq, tk, tv[:3]), "same sequence length"),
        (lambda: m(q, k, v, attn_mask=lr.zeros(L, L)), lambda: tm(tq, tk, tv, attn_mask=torch.zeros(L, L)),
         r"2-D attn_mask has shape \[4, 4\], but should be \[4, 5\]"),
        (lambda: m(q, k, v, attn_mask=lr.zeros(N, L, S)), lambda: tm(tq, tk, tv, attn_mask=torch.zeros(N, L, S)),
         r"should be \[6, 4, 5\]"),
        (lambda: m(q, k, v, attn_mask=lr.zeros(L, S, dtype=lr.int64)),
         lambda: tm(tq, tk, tv, attn_mask=torch.zeros(L, S, dtype=torch.int64)), "types of attn_mask"),
        (lambda: m(q, k, v, key_padding_mask=lr.zeros(N, S, dtype=lr.int64)),
         lambda: tm(tq, tk, tv, key_padding_mask=torch.zeros(N, S, dtype=torch.int64)), "key_padding_mask"),
        (lambda: m(q, k, v, key_padding_mask=lr.zeros(N, L, dtype=lr.bool)),
         lambda: tm(tq, tk, tv, key_padding_mask=torch.zeros(N, L, dtype=torch.bool)), r"expected \[3, 5\]"),
    ]
    for call, tcall, message in bad_cases:
        with pytest.raises((AssertionError, RuntimeError)):
            tcall()
        with pytest.raises(lr.Error, match=message):
            call()
    with pytest.raises(RuntimeError, match="activation should be relu/gelu"):
        torch.nn.TransformerEncoderLayer(E, H, activation="tanh")
    with pytest.raises(lr.Error, match="activation should be relu/gelu, not tanh"):
        nn.TransformerEncoderLayer(E, H, activation="tanh")


# ---- gradients ------------------------------------------------------------------------------------

def check_grads(module, tmodule, inputs, tinputs):
    for (n, p), (tn, tp) in zip(module.named_parameters(), tmodule.named_parameters()):
        assert n == tn
        assert p.grad is not None, n
        assert_same(p.grad, tp.grad, what=f"grad of {n}", **GRAD)
    for i, (x, t) in enumerate(zip(inputs, tinputs)):
        assert_same(x.grad, t.grad, what=f"grad of input {i}", **GRAD)


@pytest.mark.parametrize("batch_first,mode,kind", [
    (False, "self", "float2d+kpm_bool"),
    (True, "cross", "bool3d"),
    (True, "kv", "kpm_float"),
])
def test_attention_gradients_match_torch(batch_first, mode, kind, rng):
    m, tm = mha_pair(rng, E, H, batch_first=batch_first)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, mode, batch_first, requires_grad=True)
    attn, kpm = make_masks(rng, kind, src=L if mode == "self" else S)
    (a, ta), (p, tp) = both(attn), both(kpm)
    out, w = m(q, k, v, attn_mask=a, key_padding_mask=p, average_attn_weights=False)
    tout, tw = tm(tq, tk, tv, attn_mask=ta, key_padding_mask=tp, average_attn_weights=False)
    g, tg = pair(rng, tuple(out.shape), lr.float32, -1, 1)
    gw, tgw = pair(rng, tuple(w.shape), lr.float32, -1, 1)
    ((out * g).sum() + (w * gw).sum()).backward()
    ((tout * tg).sum() + (tw * tgw).sum()).backward()
    inputs = {"self": [q], "kv": [q, k], "cross": [q, k, v]}[mode]
    tinputs = {"self": [tq], "kv": [tq, tk], "cross": [tq, tk, tv]}[mode]
    check_grads(m, tm, inputs, tinputs)


# ---- TransformerEncoderLayer and TransformerEncoder ---------------------------------------------

def activation_pair(name):
    if name == "module":
        return nn.GELU(approximate="tanh"), torch.nn.GELU(approximate="tanh")
    if name == "function":
        return F.silu, torch.nn.functional.silu
    return name, name


@pytest.mark.parametrize("batch_first,norm_first,activation,kind", [
    (False, False, "relu", "none"),
    (True, False, "gelu", "causal+kpm_bool"),
    (False, True, "module", "float2d"),
    (True, True, "function", "kpm_float"),
])
def test_encoder_layer_forward_and_gradients_match_torch(batch_first, norm_first, activation, kind, rng):
    act, tact = activation_pair(activation)
    kwargs = dict(dim_feedforward=16, dropout=0.0, batch_first=batch_first, norm_first=norm_first,
                  layer_norm_eps=1e-6)
    tlayer = randomize(torch.nn.TransformerEncoderLayer(E, H, activation=tact, **kwargs), rng)
    layer = load_from_torch(nn.TransformerEncoderLayer(E, H, activation=act, **kwargs), tlayer)
    x, t = pair(rng, layout((S, N, E), batch_first), lr.float32, -1, 1, requires_grad=True)
    attn, kpm = make_masks(rng, kind, tgt=S, src=S)
    (a, ta), (p, tp) = both(attn), both(kpm)
    out = layer(x, src_mask=a, src_key_padding_mask=p)
    tout = tlayer(t, src_mask=ta, src_key_padding_mask=tp)
    assert_same(out, tout, **FWD)
    g, tg = pair(rng, tuple(out.shape), lr.float32, -1, 1)
    (out * g).sum().backward()
    (tout * tg).sum().backward()
    check_grads(layer, tlayer, [x], [t])


def test_encoder_layer_eval_mode_matches_torch_with_dropout(rng):
    tlayer = randomize(torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.3), rng).eval()
    layer = load_from_torch(nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.3), tlayer).eval()
    x, t = pair(rng, (S, N, E), lr.float32, -1, 1)
    # Gradients stay enabled on the torch side: its no-grad inference fast path is not the reference.
    assert_same(layer(x), tlayer(t), **FWD)


def test_encoder_stack_matches_torch_and_its_layers_are_independent(rng):
    tlayer = torch.nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, batch_first=True)
    tenc = randomize(torch.nn.TransformerEncoder(tlayer, 3, norm=torch.nn.LayerNorm(E)), rng)
    layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, batch_first=True)
    enc = nn.TransformerEncoder(layer, 3, norm=nn.LayerNorm(E))
    assert list(enc.state_dict()) == list(tenc.state_dict())
    # The copies start equal to the layer and are separate parameters.
    assert enc.layers[0].linear1.weight.tolist() == enc.layers[2].linear1.weight.tolist() == \
        layer.linear1.weight.tolist()
    ids = {lr.tensor_id(p) for p in enc.parameters()}
    assert len(ids) == len(list(tenc.parameters())) == 2 + 3 * len(list(layer.parameters()))
    assert not ids & {lr.tensor_id(p) for p in layer.parameters()}
    load_from_torch(enc, tenc)
    assert enc.layers[0].linear1.weight.tolist() != enc.layers[1].linear1.weight.tolist()
    x, t = pair(rng, (N, S, E), lr.float32, -1, 1, requires_grad=True)
    kpm = bool_mask(rng, (N, S))
    (p, tp) = both(kpm)
    out = enc(x, src_key_padding_mask=p)
    tout = tenc(t, src_key_padding_mask=tp)
    assert_same(out, tout, **FWD)
    g, tg = pair(rng, tuple(out.shape), lr.float32, -1, 1)
    (out * g).sum().backward()
    (tout * tg).sum().backward()
    check_grads(enc, tenc, [x], [t])
    # Without the final norm, with a mask.
    tenc2 = randomize(torch.nn.TransformerEncoder(tlayer, 2), rng)
    enc2 = load_from_torch(nn.TransformerEncoder(layer, 2), tenc2)
    assert enc2.norm is None and list(enc2.state_dict()) == list(tenc2.state_dict())
    (a, ta) = both(float_mask(rng, (S, S)))
    assert_same(enc2(x, mask=a), tenc2(t, mask=ta), **FWD)


# ---- training -------------------------------------------------------------------------------------

class Tiny:
    """A 2-layer encoder and a linear head on the mean over the sequence, in lazyrt or torch."""

    def __init__(self, lib, batch_first=True, dropout=0.0):
        n = lib.nn
        layer = n.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=dropout, batch_first=batch_first,
                                          activation="gelu")
        self.encoder = n.TransformerEncoder(layer, 2)
        self.head = n.Linear(E, 3)
        self.lib = lib

    def parameters(self):
        return list(self.encoder.parameters()) + list(self.head.parameters())

    def loss(self, x, y, kpm):
        h = self.encoder(x, src_key_padding_mask=kpm)
        logits = self.head(h.mean(1))
        if self.lib is torch:
            return torch.nn.functional.cross_entropy(logits, y)
        return F.cross_entropy(logits, y)


def tiny_pair(rng, dropout=0.0):
    tmodel = Tiny(torch, dropout=dropout)
    randomize(tmodel.encoder, rng)
    randomize(tmodel.head, rng)
    model = Tiny(lr, dropout=dropout)
    load_from_torch(model.encoder, tmodel.encoder)
    load_from_torch(model.head, tmodel.head)
    return model, tmodel


def training_batches(rng, count):
    batches = []
    for _ in range(count):
        x, t = pair(rng, (N, S, E), lr.float32, -1, 1)
        y = rng.integers(0, 3, size=N)
        kpm = np.zeros((N, S), dtype=bool)
        kpm[0, -2:] = True  # the first sequence is two shorter
        batches.append(((x, lr.tensor(y), lr.tensor(kpm)), (t, torch.tensor(y), torch.from_numpy(kpm))))
    return batches


def test_encoder_trains_like_torch(rng):
    model, tmodel = tiny_pair(rng)
    opt = lr.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1, momentum=0.9)
    batches = training_batches(rng, 3)
    losses, tlosses = [], []
    for step in range(6):
        args, targs = batches[step % 3]
        loss = model.loss(*args)
        loss.backward()
        opt.step()
        opt.zero_grad()
        lr.mark_step()
        losses.append(loss.item())
        tloss = tmodel.loss(*targs)
        tloss.backward()
        topt.step()
        topt.zero_grad()
        tlosses.append(tloss.item())
    np.testing.assert_allclose(losses, tlosses, rtol=1e-5)
    assert len(set(losses)) == len(losses), "every step changed the model"
    for p, tp in zip(model.parameters(), tmodel.parameters()):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_compile_step_of_encoder_training_matches_plain_steps(dropout, rng):
    batches = training_batches(rng, 4)
    init_rng_state = rng.bit_generator.state

    def run(compiled):
        rng.bit_generator.state = init_rng_state
        model, tmodel = tiny_pair(rng, dropout)
        opt = lr.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        lr.manual_seed(11)
        lr.mark_step()

        def step(x, y, kpm):
            loss = model.loss(x, y, kpm)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        if compiled:
            step = lr.compile_step(step, batches[0][0])
        losses = []
        for args, _ in batches:
            loss = step(*args)
            if not compiled:
                lr.mark_step()
            losses.append(loss.item())
        if compiled:
            assert step.traces == 1
        return losses, [p.numpy().copy() for p in model.parameters()], tmodel

    lr.metrics.reset()
    compiled_losses, compiled_params, tmodel = run(True)
    assert lr.metrics.counter("ReplayGraph") == len(batches)
    plain_losses, plain_params, _ = run(False)
    np.testing.assert_allclose(compiled_losses, plain_losses, rtol=1e-6)
    for a, b in zip(compiled_params, plain_params):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if dropout == 0.0:
        # And both are what torch computes.
        topt = torch.optim.SGD(tmodel.parameters(), lr=0.1, momentum=0.9)
        tlosses = []
        for _, targs in batches:
            tloss = tmodel.loss(*targs)
            tloss.backward()
            topt.step()
            topt.zero_grad()
            tlosses.append(tloss.item())
        np.testing.assert_allclose(compiled_losses, tlosses, rtol=1e-5)


def test_is_causal_is_a_hint_that_needs_the_mask_as_in_torch(rng):
    # PyTorch 2.x: is_causal says attn_mask is the causal mask; the mask is applied, and
    # is_causal=True without a mask is an error.
    m, tm = mha_pair(rng, E, H)
    (q, k, v), (tq, tk, tv) = attention_inputs(rng, "self", False)
    with pytest.raises(RuntimeError, match="attn_mask"):
        tm(tq, tk, tv, is_causal=True)
    with pytest.raises(lr.Error, match="attn_mask"):
        m(q, k, v, is_causal=True)
    causal = np.triu(np.ones((L, L), dtype=bool), k=1)
    (a, ta) = both(causal)
    out, w = m(q, k, v, attn_mask=a, is_causal=True)
    tout, tw = tm(tq, tk, tv, attn_mask=ta, is_causal=True)
    assert_same(out, tout, **FWD)
    assert_same(w, tw, **FWD)
    layer, tlayer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0), torch.nn.TransformerEncoderLayer(E, H, 16, dropout=0.0)
    tlayer.load_state_dict({k: torch.from_numpy(p.numpy().copy()) for k, p in layer.state_dict().items()})
    mask = nn.Transformer.generate_square_subsequent_mask(L)
    tmask = torch.nn.Transformer.generate_square_subsequent_mask(L)
    assert_same(layer(q, src_mask=mask, is_causal=True), tlayer(tq, src_mask=tmask, is_causal=True), **FWD)


def test_bias_false_layers_have_torchs_parameters_and_values(rng):
    # PyTorch 2.x's bias=False: no bias in the attention, the feedforward Linears and the
    # LayerNorms (which keep their weights).
    for make in [lambda m: m.TransformerEncoderLayer(E, H, 16, dropout=0.0, bias=False),
                 lambda m: m.TransformerDecoderLayer(E, H, 16, dropout=0.0, bias=False),
                 lambda m: m.Transformer(E, H, 1, 1, 16, dropout=0.0, bias=False),
                 lambda m: m.LayerNorm(E, bias=False)]:
        layer, tlayer = make(nn), make(torch.nn)
        names = [(k, tuple(p.shape)) for k, p in layer.named_parameters()]
        assert names == [(k, tuple(p.shape)) for k, p in tlayer.named_parameters()]
    layer = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, bias=False)
    tlayer = torch.nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, bias=False)
    tlayer.load_state_dict({k: torch.from_numpy(p.numpy().copy()) for k, p in layer.state_dict().items()})
    (q, _, _), (tq, _, _) = attention_inputs(rng, "self", False)
    assert_same(layer(q), tlayer(tq), **FWD)
