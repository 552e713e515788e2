"""lazyrt.torch on whole, unmodified PyTorch programs: a transformer encoder layer and a small
nanoGPT-style GPT, trained for a few steps with SGD (momentum), Adam and AdamW, foreach on and off.

PyTorch eager is the oracle: each test trains one copy of the model eagerly and a deep copy
(made before the optimizers) through lazyrt.torch.compile, on the same batches, and compares
the losses, the parameters and their gradients and optimizer.state_dict() after every step
(float32, rtol 1e-5).
"""

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from conftest import same_tree

RTOL, ATOL = 1e-5, 1e-6
STEPS = 4


def close(a, b, what, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol, err_msg=what)


def same_training_state(m_lazy, o_lazy, m_eager, o_eager, what):
    named = list(m_eager.named_parameters())
    assert [n for n, _ in m_lazy.named_parameters()] == [n for n, _ in named]
    for (name, p1), (_, p2) in zip(m_lazy.named_parameters(), named):
        a, b = p1.detach().numpy(), p2.detach().numpy()
        if name.endswith("in_proj_bias") and isinstance(o_eager, torch.optim.Adam):
            # The key third of the bias: its gradient is rounding noise (see EPS below), which
            # eager's fused attention kernel and lazyrt's products round differently; Adam
            # turns it into steps of up to lr * noise / eps. The rest is compared as usual.
            third = a.shape[0] // 3
            lr = max(g["lr"] for g in o_eager.param_groups)
            close(a[third:2 * third], b[third:2 * third], f"{what} parameter {name} (keys)", rtol=0, atol=0.01 * lr)
            a, b = np.concatenate([a[:third], a[2 * third:]]), np.concatenate([b[:third], b[2 * third:]])
        close(a, b, f"{what} parameter {name}")
        assert (p1.grad is None) == (p2.grad is None), f"{what} {name}.grad: {p1.grad} vs {p2.grad}"
        if p1.grad is not None:
            close(p1.grad.numpy(), p2.grad.numpy(), f"{what} {name}.grad")
    same_tree(o_lazy.state_dict(), o_eager.state_dict(), f"{what} optimizer.state_dict()")


# Adam's eps: attention's key bias has a gradient that is zero in exact arithmetic (softmax does
# not change when a row of scores shifts), so what backward gives there is rounding noise
# (~1e-9) that differs with the order of summation. With the default eps=1e-8 Adam scales that
# noise to steps of about lr, in eager as in lazyrt; eps=1e-5 keeps it far below the
# tolerance while every other gradient here (>= 1e-5) is still normalized.
EPS = 1e-5
OPTIMIZERS = {
    "sgd_momentum": lambda p, foreach: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=foreach),
    "adam": lambda p, foreach: torch.optim.Adam(p, lr=3e-3, eps=EPS, foreach=foreach),
    "adamw": lambda p, foreach: torch.optim.AdamW(p, lr=3e-3, eps=EPS, weight_decay=0.1, foreach=foreach),
}
OPTIMIZER_CASES = [(name, foreach) for name in OPTIMIZERS for foreach in (False, True)]


def train_both(make_model, make_opt, loss_of, data):
    """Trains make_model() eagerly and a deep copy through lazyrt.torch.compile on `data`
    (argument tuples of loss_of(model, *args)), comparing after every step. Returns the lazy
    losses and the compiled step."""
    m_eager = make_model()
    m_lazy = copy.deepcopy(m_eager)
    o_eager, o_lazy = make_opt(m_eager.parameters()), make_opt(m_lazy.parameters())

    def step_of(model, opt):
        def step(*args):  # an unmodified PyTorch training step
            loss = loss_of(model, *args)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        return step

    eager = step_of(m_eager, o_eager)
    lazy = lazyrt.torch.compile(step_of(m_lazy, o_lazy))
    losses = []
    for k, args in enumerate(data):
        got, want = lazy(*args), eager(*args)
        assert got.shape == () and got.dtype == torch.float32
        close(got.item(), want.item(), f"loss at step {k}")
        losses.append(got.item())
        same_training_state(m_lazy, o_lazy, m_eager, o_eager, f"after step {k}:")
    assert lazy.captures == 1 and lazy.traces == 1, "one capture, traced once, replayed after"
    assert len(set(losses)) == len(losses), "the model trains: every step's loss differs"
    return losses, lazy


# ---- (a) a transformer encoder layer ----------------------------------------------------------

D_MODEL, HEADS, FF, SEQ, BATCH = 16, 2, 32, 8, 4


def encoder_layer(dropout=0.0, seed=0, **kwargs):
    torch.manual_seed(seed)
    return nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, dropout=dropout, batch_first=True, **kwargs)


def encoder_batches(n=STEPS, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, SEQ, D_MODEL, generator=g), torch.randn(BATCH, SEQ, D_MODEL, generator=g))
            for _ in range(n)]


def mse_of_output(model, x, y):
    return F.mse_loss(model(x), y)


@pytest.mark.parametrize("opt_name,foreach", OPTIMIZER_CASES)
def test_transformer_encoder_layer_trains_as_in_eager(opt_name, foreach):
    make_opt = lambda p: OPTIMIZERS[opt_name](p, foreach)
    train_both(encoder_layer, make_opt, mse_of_output, encoder_batches())


def test_pre_norm_gelu_encoder_with_a_causal_mask_and_eval_mode_dropout_trains_as_in_eager():
    # Dropout 0.3 but the module in eval mode: dropout is the identity, as in eager.
    def make():
        layer = encoder_layer(dropout=0.3, norm_first=True, activation="gelu")
        layer.eval()
        return layer

    causal = nn.Transformer.generate_square_subsequent_mask(SEQ)  # float, -inf above the diagonal

    def loss_of(model, x, y):
        return F.mse_loss(model(x, src_mask=causal), y)

    train_both(make, lambda p: OPTIMIZERS["adamw"](p, False), loss_of, encoder_batches(seed=2))


class ReplayedDropout(nn.Module):
    """The eager reference's dropout: multiplies by a given mask (kept / (1 - p)), the mask
    lazyrt drew for the same step."""

    def __init__(self):
        super().__init__()
        self.mask = None

    def forward(self, x):
        return x * self.mask


class ObservedDropout(nn.Dropout):
    """nn.Dropout that keeps what it saw and gave, for the step to return (overwritten every
    call: the step returns it, and no one reads it between calls)."""

    def forward(self, x):
        out = super().forward(x)
        self.seen = (x.detach(), out.detach())
        return out


def test_encoder_layer_dropout_draws_new_masks_and_trains_as_eager_given_them():
    # lazyrt draws dropout masks from its own generator, not torch's stream. The compiled step
    # returns what each nn.Dropout of the layer saw and gave (traced with the step); eager
    # PyTorch then runs the same step with those masks. The attention weights'
    # own dropout (inside multi_head_attention_forward, no module to hook) is off.
    p = 0.25
    names = ("dropout", "dropout1", "dropout2")
    m_lazy = encoder_layer(dropout=p)
    m_lazy.self_attn.dropout = 0.0
    m_ref = copy.deepcopy(m_lazy)
    for name in names:
        setattr(m_ref, name, ReplayedDropout())
    o_lazy = OPTIMIZERS["adamw"](m_lazy.parameters(), False)
    o_ref = OPTIMIZERS["adamw"](m_ref.parameters(), False)

    for name in names:
        setattr(m_lazy, name, ObservedDropout(p))

    def step(x, y):
        loss = F.mse_loss(m_lazy(x), y)
        loss.backward()
        o_lazy.step()
        o_lazy.zero_grad()
        return loss, {name: getattr(m_lazy, name).seen for name in names}

    compiled = lazyrt.torch.compile(step)
    kept_fraction, first_masks = [], None
    for k, (x, y) in enumerate(encoder_batches(seed=3)):
        loss, dropped = compiled(x, y)
        assert sorted(dropped) == sorted(names)
        for name, (before, after) in dropped.items():
            kept = after != 0
            torch.testing.assert_close(after[kept], before[kept] / (1 - p), rtol=RTOL, atol=ATOL)
            live = before != 0  # zeros of a ReLU say nothing about the mask
            kept_fraction.append(((kept & live).sum().item(), live.sum().item()))
            getattr(m_ref, name).mask = kept.float() / (1 - p)
        masks = {name: dropped[name][1] != 0 for name in names}
        if first_masks is None:
            first_masks = masks
        else:
            assert any(not torch.equal(masks[n], first_masks[n]) for n in names), "a new mask every call"
        ref_loss = F.mse_loss(m_ref(x), y)
        ref_loss.backward()
        o_ref.step()
        o_ref.zero_grad()
        close(loss.item(), ref_loss.item(), f"loss at step {k}")
        same_training_state(m_lazy, o_lazy, m_ref, o_ref, f"after step {k}:")
    kept_total = sum(k for k, _ in kept_fraction) / sum(n for _, n in kept_fraction)
    assert abs(kept_total - (1 - p)) < 0.03, kept_total
    assert compiled.captures == 1 and compiled.traces == 1


# ---- (b) a nanoGPT-style GPT in plain torch.nn -------------------------------------------------

VOCAB, DIM, LAYERS, GPT_HEADS, BLOCK = 50, 32, 2, 2, 8


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK)).view(1, 1, BLOCK, BLOCK))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, GPT_HEADS, C // GPT_HEADS).transpose(1, 2)
        k = k.view(B, T, GPT_HEADS, C // GPT_HEADS).transpose(1, 2)
        v = v.view(B, T, GPT_HEADS, C // GPT_HEADS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(DIM)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(BLOCK, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def gpt(seed=0):
    torch.manual_seed(seed)
    return GPT()


def token_batches(n=STEPS, seed=4):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, VOCAB, (BATCH, BLOCK + 1), generator=g)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


@pytest.mark.parametrize("opt_name,foreach", OPTIMIZER_CASES)
def test_gpt_trains_as_in_eager(opt_name, foreach):
    make_opt = lambda p: OPTIMIZERS[opt_name](p, foreach)
    losses, _ = train_both(gpt, make_opt, lambda model, idx, targets: model(idx, targets)[1], token_batches())
    assert abs(losses[0] - math.log(VOCAB)) < 0.1, "a fresh GPT's loss is about log(vocab)"


def test_gpt_tied_weights_stay_one_tensor():
    m_eager = gpt()
    m_lazy = copy.deepcopy(m_eager)
    o_eager = OPTIMIZERS["adamw"](m_eager.parameters(), False)
    o_lazy = OPTIMIZERS["adamw"](m_lazy.parameters(), False)

    @lazyrt.torch.compile
    def step(idx, targets):
        _, loss = m_lazy(idx, targets)
        loss.backward()
        o_lazy.step()
        o_lazy.zero_grad()
        return loss

    for idx, targets in token_batches(n=2):
        step(idx, targets)
        _, loss = m_eager(idx, targets)
        loss.backward()
        o_eager.step()
        o_eager.zero_grad()
    assert m_lazy.lm_head.weight is m_lazy.wte.weight
    close(m_lazy.wte.weight.detach().numpy(), m_eager.wte.weight.detach().numpy(), "tied weight")


# ---- (c) the forward under torch.autocast(bfloat16) ---------------------------------------------

def bf16_close(got, want, what, rtol=2e-2):
    """Tensors that bfloat16 rounding may set apart: each element within rtol of the largest
    magnitude of `want` (a relative tolerance per element would fail on values near zero,
    whose rounding errors come from the larger terms they were summed from)."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} vs {want.dtype}"
    got, want = got.detach().double(), want.detach().double()
    scale = want.abs().max().item()
    worst = (got - want).abs().max().item()
    assert worst <= rtol * scale, f"{what}: differs by {worst:.3g}, more than {rtol} of its largest magnitude {scale:.3g}"


def causal_encoder():
    return encoder_layer(norm_first=True, activation="gelu")


AUTOCAST_PROGRAMS = {  # model, batches, forward(model, *batch) -> (output, loss), the output's dtype
    "gpt": (gpt, token_batches, lambda model, idx, targets: model(idx, targets), torch.bfloat16),  # lm_head's
    "encoder_causal": (causal_encoder, encoder_batches,
                       lambda model, x, y: _output_and_mse(model(x, src_mask=CAUSAL), y),
                       torch.float32),  # the residual stream stays float32
}
CAUSAL = nn.Transformer.generate_square_subsequent_mask(SEQ)


def _output_and_mse(out, y):
    return out, F.mse_loss(out, y)


@pytest.mark.parametrize("program", sorted(AUTOCAST_PROGRAMS))
def test_forward_under_bf16_autocast_trains_as_eager_autocast(program):
    # The forward runs under torch.autocast("cpu", bfloat16), backward and the optimizer step
    # outside it, as PyTorch's autocast recipe has it. The captured graph holds autocast's casts:
    # matmuls in bfloat16, the loss in float32. Eager autocast is the reference, to bfloat16's
    # tolerance: losses and outputs, and how far each parameter and momentum buffer moved.
    # (SGD: its updates follow the gradients' rounding; Adam's normalized update turns the
    # rounding noise of near-zero gradients into steps of about lr.)
    make_model, make_batches, forward, out_dtype = AUTOCAST_PROGRAMS[program]
    m_eager = make_model()
    m_lazy = copy.deepcopy(m_eager)
    start = {n: p.detach().clone() for n, p in m_eager.named_parameters()}
    o_eager = OPTIMIZERS["sgd_momentum"](m_eager.parameters(), False)
    o_lazy = OPTIMIZERS["sgd_momentum"](m_lazy.parameters(), False)

    def step_of(model, opt):
        def step(*args):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, loss = forward(model, *args)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return out, loss
        return step

    eager = step_of(m_eager, o_eager)
    lazy = lazyrt.torch.compile(step_of(m_lazy, o_lazy))
    for k, args in enumerate(make_batches()):
        (out, loss), (want_out, want_loss) = lazy(*args), eager(*args)
        assert loss.dtype == want_loss.dtype == torch.float32
        assert out.dtype == want_out.dtype == out_dtype
        close(loss.item(), want_loss.item(), f"loss at step {k}", rtol=2e-3, atol=0)  # float32 of bf16 logits
        bf16_close(out, want_out, f"output at step {k}")
        for (name, p), (_, q) in zip(m_lazy.named_parameters(), m_eager.named_parameters()):
            assert p.dtype == torch.float32
            bf16_close(p - start[name], q - start[name], f"step {k}: how far {name} moved", rtol=5e-2)
            bf16_close(o_lazy.state[p]["momentum_buffer"], o_eager.state[q]["momentum_buffer"],
                       f"step {k}: momentum buffer of {name}", rtol=5e-2)
    assert lazy.captures == 1 and lazy.traces == 1
