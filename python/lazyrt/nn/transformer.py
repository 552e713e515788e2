"""Multi-head attention and the Transformer, as torch.nn (PyTorch 1.13) defines them.

MultiheadAttention, TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer,
TransformerDecoder and Transformer take PyTorch 1.13's arguments, register the same
parameters and submodules under the same names and shapes (so a PyTorch state_dict loads as
it is), and compute what PyTorch's reference path computes: the attention is written here
from matmul, softmax, masked_fill and dropout, so it differentiates and traces like any other
lazyrt code.

PyTorch 1.13 also has inference fast paths (eval mode, no gradients recorded, batch_first, an
even number of heads, ...) that can differ from its reference path: TransformerEncoder given a
src_key_padding_mask then runs on a nested tensor and returns zeros at the padded positions.
lazyrt always computes the reference path: the non-padded positions agree, the padded ones hold
what the layers compute there. (So does Transformer's encoder; PyTorch 1.13's decoder has no
fast path.)

Initialization follows PyTorch's scheme with lazyrt's random numbers: xavier-uniform input
projections, zero biases, Linear's uniform out_proj.weight, xavier-normal bias_k / bias_v;
Transformer then redraws every parameter of two or more dims xavier-uniform, as PyTorch's does.
"""

import copy
import math
import warnings

from lazyrt import _C
from lazyrt._autograd import no_grad
from lazyrt.nn import functional as F
from lazyrt.nn import init
from lazyrt.nn.layers import Dropout, LayerNorm, Linear, ModuleList
from lazyrt.nn.module import Module, Parameter


# ---- initialization ---------------------------------------------------------------------------
# Private helpers: the fan computation of torch.nn.init for the shapes used here (dim 0 is
# fan_out, dim 1 fan_in, trailing dims multiply both).

def _fans(shape):
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _xavier_uniform(shape, gain=1.0):
    fan_in, fan_out = _fans(shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return _C.rand(*shape) * (2 * bound) - bound


def _xavier_normal(shape, gain=1.0):
    fan_in, fan_out = _fans(shape)
    return _C.randn(*shape) * (gain * math.sqrt(2.0 / (fan_in + fan_out)))


# ---- checks -----------------------------------------------------------------------------------

def _shape(t):
    return list(t.shape)


def _check_mask_dtype(mask, what, call):
    if mask is not None and not (mask.dtype is _C.bool or mask.is_floating_point()):
        raise _C.Error(f"{call}: only bool and floating types of {what} are supported, got {mask.dtype} "
                       f"with shape {_shape(mask)}")


def _is_batched(query, key, value, key_padding_mask, attn_mask, call):
    """True for batched 3-D inputs, False for unbatched 2-D ones; raises on anything else."""
    shapes = f"query {_shape(query)}, key {_shape(key)}, value {_shape(value)}"
    if query.dim() == 3:
        batched, kpm_dims = True, 2
    elif query.dim() == 2:
        batched, kpm_dims = False, 1
    else:
        raise _C.Error(f"{call}: query should be an unbatched 2-D or a batched 3-D tensor, got {shapes}")
    if key.dim() != query.dim() or value.dim() != query.dim():
        raise _C.Error(f"{call}: query, key and value must all be {query.dim()}-D, got {shapes}")
    if key_padding_mask is not None and key_padding_mask.dim() != kpm_dims:
        raise _C.Error(f"{call}: key_padding_mask must be {kpm_dims}-D for a {query.dim()}-D query, got "
                       f"shape {_shape(key_padding_mask)} with {shapes}")
    if attn_mask is not None and attn_mask.dim() not in (2, 3):
        raise _C.Error(f"{call}: attn_mask must be 2-D or 3-D, got shape {_shape(attn_mask)} with {shapes}")
    return batched


# ---- attention --------------------------------------------------------------------------------

def _float_mask(mask, dtype):
    """A mask as the float mask added to the scores: a bool True is -inf (masked out), False 0."""
    if mask is None:
        return None
    if mask.dtype is _C.bool:
        return _C.zeros(*mask.shape, dtype=dtype).masked_fill(mask, float("-inf"))
    return mask.to(dtype)


def _pad_last(mask):
    """The mask with one more, unmasked, position at the end of its last dim."""
    return None if mask is None else _C.pad(mask, (0, 1))


def _multi_head_attention(mha, query, key, value, key_padding_mask, need_weights, attn_mask,
                          average_attn_weights, shapes):
    """The attention of `mha` on sequence-first inputs: query [L, N, E], key [S, N, kdim],
    value [S, N, vdim]. Returns ([L, N, E], weights [N, L, S] or [N, H, L, S] or None).
    `shapes` describes the inputs as the caller gave them, for error messages."""
    call = "MultiheadAttention"
    E, H = mha.embed_dim, mha.num_heads
    head_dim = E // H
    L, N = query.shape[0], query.shape[1]
    S = key.shape[0]
    if query.shape[2] != E or key.shape[2] != mha.kdim or value.shape[2] != mha.vdim:
        raise _C.Error(f"{call}: expected the last dims of query, key and value to be embed_dim {E}, kdim "
                       f"{mha.kdim} and vdim {mha.vdim}, got {shapes}")
    if key.shape[:2] != value.shape[:2] or key.shape[1] != N:
        raise _C.Error(f"{call}: key and value must have the same sequence length, and all three the same "
                       f"batch size, got {shapes}")
    if not query.is_floating_point():
        raise _C.Error(f"{call}: expected a floating-point query, got {query.dtype}")

    # Masks: checked against the sizes before bias_k / add_zero_attn add key positions.
    _check_mask_dtype(attn_mask, "attn_mask", call)
    _check_mask_dtype(key_padding_mask, "key_padding_mask", call)
    if attn_mask is not None:
        want = (L, S) if attn_mask.dim() == 2 else (N * H, L, S)
        if tuple(attn_mask.shape) != want:
            raise _C.Error(f"{call}: the {attn_mask.dim()}-D attn_mask has shape {_shape(attn_mask)}, but "
                           f"should be {list(want)} for {shapes} and {H} heads")
    if key_padding_mask is not None and tuple(key_padding_mask.shape) != (N, S):
        raise _C.Error(f"{call}: key_padding_mask has shape {_shape(key_padding_mask)}, expected [{N}, {S}] "
                       f"(batch, source length) for {shapes}")
    if (attn_mask is not None and key_padding_mask is not None
            and (attn_mask.dtype is _C.bool) != (key_padding_mask.dtype is _C.bool)):
        warnings.warn("Support for mismatched key_padding_mask and attn_mask is deprecated. Use same type "
                      "for both instead.", UserWarning)
    # As PyTorch 2.x: each mask becomes a float mask in the query's dtype (a bool True is -inf),
    # and the two are added, whatever their types.
    attn_mask = _float_mask(attn_mask, query.dtype)
    key_padding_mask = _float_mask(key_padding_mask, query.dtype)

    # Input projections. One matmul for self-attention, two when key is value: the same values
    # as the three separate projections, in fewer ops.
    b = mha.in_proj_bias
    bq, bk, bv = (None, None, None) if b is None else b.chunk(3)
    if mha._qkv_same_embed_dim:
        w = mha.in_proj_weight
        if query is key and key is value:
            q, k, v = F.linear(query, w, b).chunk(3, -1)
        elif key is value:
            wq, wkv = w.split([E, 2 * E])
            q = F.linear(query, wq, bq)
            k, v = F.linear(key, wkv, None if b is None else b.split([E, 2 * E])[1]).chunk(2, -1)
        else:
            wq, wk, wv = w.chunk(3)
            q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    else:
        q = F.linear(query, mha.q_proj_weight, bq)
        k = F.linear(key, mha.k_proj_weight, bk)
        v = F.linear(value, mha.v_proj_weight, bv)

    if mha.bias_k is not None:
        # One more key position, the same learned key and value for every sequence.
        k = _C.cat([k, mha.bias_k.expand(1, N, E)], 0)
        v = _C.cat([v, mha.bias_v.expand(1, N, E)], 0)
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)

    # Heads: [seq, N, E] -> [N, H, seq, head_dim].
    q = q.reshape(L, N, H, head_dim).permute(1, 2, 0, 3)
    k = k.reshape(k.shape[0], N, H, head_dim).permute(1, 2, 0, 3)
    v = v.reshape(v.shape[0], N, H, head_dim).permute(1, 2, 0, 3)
    if mha.add_zero_attn:
        # One more key position whose key and value are zero.
        k = _C.cat([k, _C.zeros(N, H, 1, head_dim, dtype=k.dtype)], 2)
        v = _C.cat([v, _C.zeros(N, H, 1, head_dim, dtype=v.dtype)], 2)
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    src_len = k.shape[2]

    # Scores [N, H, L, src_len]. A 3-D attn_mask is per (batch, head) in batch-major order; the
    # padding mask is per (batch, key). As PyTorch, the masks are added into one first, and that
    # sum is added to the scores.
    scores = _C.matmul(q / math.sqrt(head_dim), k.transpose(2, 3))
    if attn_mask is not None and attn_mask.dim() == 3:
        attn_mask = attn_mask.reshape(N, H, L, src_len)
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.reshape(N, 1, 1, src_len)
        attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
    if attn_mask is not None:
        scores = scores + attn_mask
    weights = _C.softmax(scores, -1)
    if mha.training and mha.dropout > 0.0:
        weights = _C.dropout(weights, mha.dropout, True)
    out = _C.matmul(weights, v)  # [N, H, L, head_dim]
    out = out.permute(2, 0, 1, 3).reshape(L, N, E)
    out = mha.out_proj(out)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = weights.sum(1) / H
    return out, weights


class NonDynamicallyQuantizableLinear(Linear):
    """A Linear, under the name PyTorch gives MultiheadAttention's out_proj."""


class MultiheadAttention(Module):
    """Attention from `num_heads` heads of embed_dim // num_heads channels each.

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (attn_output, attn_weights or None). Inputs
    are [L, N, E] (sequence first), [N, L, E] with batch_first, or [L, E] unbatched. attn_mask is
    [L, S] or [N * num_heads, L, S]; key_padding_mask is [N, S]. In a bool mask True masks a
    position out; a float mask is added to the attention scores (both masks given: they are
    added into one, as in PyTorch 2.x). is_causal, as PyTorch's, is a hint that attn_mask is
    the causal mask: the mask is what is applied, so is_causal=True needs one. The layers,
    TransformerEncoder/Decoder and Transformer take PyTorch's is_causal hints and pass them on.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, device=None, dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise _C.Error(f"MultiheadAttention: embed_dim and num_heads must be positive, got {embed_dim} "
                           f"and {num_heads}")
        if embed_dim % num_heads:
            raise _C.Error(f"MultiheadAttention: embed_dim must be divisible by num_heads, got {embed_dim} "
                           f"and {num_heads}")
        if dtype is not None and dtype is not _C.float32:
            raise _C.Error(f"MultiheadAttention: dtype {dtype} is not supported; the module is float32")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        # PyTorch's registration order, so that state_dict lists the same keys in the same order.
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(_xavier_uniform((3 * embed_dim, embed_dim)))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight = Parameter(_xavier_uniform((embed_dim, embed_dim)))
            self.k_proj_weight = Parameter(_xavier_uniform((embed_dim, self.kdim)))
            self.v_proj_weight = Parameter(_xavier_uniform((embed_dim, self.vdim)))
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter(_C.zeros(3 * embed_dim))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias)
        if bias:
            with no_grad():
                self.out_proj.bias.zero_()
        if add_bias_kv:
            self.bias_k = Parameter(_xavier_normal((1, 1, embed_dim)))
            self.bias_v = Parameter(_xavier_normal((1, 1, embed_dim)))
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if is_causal and attn_mask is None:
            # As PyTorch 2.x: is_causal is a hint that attn_mask is the causal mask; the mask is
            # what is applied, so it must be given.
            raise _C.Error("MultiheadAttention: need attn_mask if specifying the is_causal hint; "
                           "Transformer.generate_square_subsequent_mask(sz) makes the causal mask")
        batched = _is_batched(query, key, value, key_padding_mask, attn_mask, "MultiheadAttention")
        shapes = f"query {_shape(query)}, key {_shape(key)}, value {_shape(value)}" + (
            " (batch first)" if batched and self.batch_first else "")
        if batched and self.batch_first:
            # Sequence first inside; keeping which inputs are the same tensor keeps the packed
            # projections of self-attention.
            tq = query.transpose(0, 1)
            tk = tq if key is query else key.transpose(0, 1)
            tv = tk if value is key else (tq if value is query else value.transpose(0, 1))
            query, key, value = tq, tk, tv
        elif not batched:
            uq = query.unsqueeze(1)
            uk = uq if key is query else key.unsqueeze(1)
            uv = uk if value is key else (uq if value is query else value.unsqueeze(1))
            query, key, value = uq, uk, uv
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        out, weights = _multi_head_attention(self, query, key, value, key_padding_mask, need_weights, attn_mask,
                                             average_attn_weights, shapes)
        if not batched:
            out = out.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        elif self.batch_first:
            out = out.transpose(0, 1)
        return out, weights


_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


def _activation(activation, call):
    """The feedforward activation: 'relu', 'gelu' or a callable (a Module is kept as given, so
    that it is a submodule, as in PyTorch)."""
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise _C.Error(f"{call}: activation should be relu/gelu, not {activation}")
        return _ACTIVATIONS[activation]
    if not callable(activation):
        raise _C.Error(f"{call}: activation should be 'relu', 'gelu' or a callable, "
                       f"not {type(activation).__name__}")
    return activation


class TransformerEncoderLayer(Module):
    """Self-attention then a feedforward block, each with dropout, a residual connection and
    LayerNorm (after the residual sum, or before the block with norm_first).

    forward(src, src_mask=None, src_key_padding_mask=None); src is [S, N, d_model] ([N, S,
    d_model] with batch_first, [S, d_model] unbatched); the masks as MultiheadAttention's.
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=F.relu, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation, "TransformerEncoderLayer")  # a Module is a submodule

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        _check_mask_dtype(src_key_padding_mask, "src_key_padding_mask", "TransformerEncoderLayer")
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


def _clone(module):
    """An independent copy of a module: its own parameters and buffers, with equal values.
    (Tensors that are not leaves cannot be deep-copied; each is copied here with clone(), which
    shares no later in-place update with the original.)"""
    memo = {}
    for m in module.modules():
        for store in (m._parameters, m._buffers):
            for t in store.values():
                if t is None or id(t) in memo:
                    continue
                c = t.detach().clone()
                if isinstance(t, Parameter):
                    memo[id(t)] = Parameter(c, requires_grad=t.requires_grad)
                else:
                    memo[id(t)] = c.requires_grad_() if t.requires_grad else c
    return copy.deepcopy(module, memo)


def _stack(layer, num_layers, call, what):
    """num_layers independent copies of layer, as a ModuleList."""
    if not isinstance(layer, Module):
        raise _C.Error(f"{call}: {what} must be a lazyrt.nn.Module, got {type(layer).__name__}")
    if num_layers < 0:
        raise _C.Error(f"{call}: num_layers must be non-negative, got {num_layers}")
    return ModuleList([_clone(layer) for _ in range(num_layers)])


class TransformerEncoder(Module):
    """num_layers copies of encoder_layer (each with its own parameters, all starting equal to
    encoder_layer's), applied in turn, then `norm` if given.

    forward(src, mask=None, src_key_padding_mask=None). enable_nested_tensor and mask_check
    are accepted for PyTorch's signature; lazyrt has no nested tensors (see the module notes).
    """

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = _stack(encoder_layer, num_layers, "TransformerEncoder", "encoder_layer")
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        _check_mask_dtype(src_key_padding_mask, "src_key_padding_mask", "TransformerEncoder")
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, src_key_padding_mask=src_key_padding_mask,
                           is_causal=bool(is_causal))
        if self.norm is not None:
            output = self.norm(output)
        return output


class TransformerDecoderLayer(Module):
    """Self-attention over the target, attention from the target to `memory` (the encoder's
    output), then a feedforward block; each with dropout, a residual connection and LayerNorm
    (after the residual sum, or before the block with norm_first).

    forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None); tgt is [T, N, d_model] and memory [S, N, d_model] ([N, T,
    d_model] and [N, S, d_model] with batch_first; [T, d_model] and [S, d_model] unbatched).
    tgt_mask is [T, T] or [N * nhead, T, T], memory_mask [T, S] or [N * nhead, T, S], the
    padding masks [N, T] and [N, S]; as MultiheadAttention's masks (True or -inf masks out).
    """

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation=F.relu, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                                 dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation, "TransformerDecoderLayer")  # a Module is a submodule

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        _check_mask_dtype(tgt_key_padding_mask, "tgt_key_padding_mask", "TransformerDecoderLayer")
        _check_mask_dtype(memory_key_padding_mask, "memory_key_padding_mask", "TransformerDecoderLayer")
        x = tgt
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _mha_block(self, x, memory, attn_mask, key_padding_mask, is_causal=False):
        x = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout3(x)


class TransformerDecoder(Module):
    """num_layers copies of decoder_layer (each with its own parameters, all starting equal to
    decoder_layer's), applied in turn to the target with the same memory and masks, then
    `norm` if given.

    forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None), as TransformerDecoderLayer's.
    """

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _stack(decoder_layer, num_layers, "TransformerDecoder", "decoder_layer")
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        output = tgt
        for layer in self.layers:
            output = layer(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask,
                           memory_key_padding_mask=memory_key_padding_mask,
                           tgt_is_causal=bool(tgt_is_causal), memory_is_causal=memory_is_causal)
        if self.norm is not None:
            output = self.norm(output)
        return output


class Transformer(Module):
    """An encoder-decoder Transformer: a TransformerEncoder of num_encoder_layers layers and a
    TransformerDecoder of num_decoder_layers layers, each followed by a LayerNorm (or
    custom_encoder / custom_decoder, used as they are). Every parameter of two or more dims
    then starts xavier-uniform (the custom modules' too), as in PyTorch.

    forward(src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None) -> the decoder's output, of tgt's
    shape: src goes through the encoder (src_mask, src_key_padding_mask), tgt through the
    decoder with the encoder's output as memory. Shapes as TransformerDecoderLayer's, src [S,
    N, d_model]. generate_square_subsequent_mask(sz) makes the usual causal tgt_mask.
    """

    def __init__(self, d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048,
                 dropout=0.1, activation=F.relu, custom_encoder=None, custom_decoder=None, layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, device=None, dtype=None):
        super().__init__()
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias, dtype=dtype)
            self.encoder = TransformerEncoder(layer, num_encoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias, dtype=dtype)
            self.decoder = TransformerDecoder(layer, num_decoder_layers,
                                              LayerNorm(d_model, eps=layer_norm_eps, bias=bias))
        self._reset_parameters()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def _reset_parameters(self):
        for p in self.parameters():
            if p.dim() > 1:
                init.xavier_uniform_(p)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None, src_key_padding_mask=None,
                tgt_key_padding_mask=None, memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal=False):
        if src.dim() == 3:
            batch_dim = 0 if self.batch_first else 1
            if tgt.dim() != 3 or src.shape[batch_dim] != tgt.shape[batch_dim]:
                raise _C.Error(f"Transformer: src {_shape(src)} and tgt {_shape(tgt)} must have the same batch size "
                               f"(dim {batch_dim}{', batch_first' if self.batch_first else ''})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise _C.Error(f"Transformer: the last dims of src {_shape(src)} and tgt {_shape(tgt)} must both be "
                           f"d_model {self.d_model}")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz, device="cpu"):
        """A float [sz, sz] causal mask: -inf above the diagonal (a position may not attend to
        later ones), 0 on and below it. `device` is accepted for PyTorch's signature."""
        return _C.triu(_C.full((sz, sz), float("-inf")), 1)
