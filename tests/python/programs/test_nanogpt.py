"""karpathy/nanoGPT (model.py and train.py), ported tiny: the GPT (token and position embeddings,
pre-LayerNorm blocks of causal self-attention through F.scaled_dot_product_attention(is_causal=
True) and a GELU MLP, a final LayerNorm, the lm_head tied to the token embedding, normal(0, 0.02)
init with the residual projections scaled by 1/sqrt(2 n_layer)), GPTConfig(bias=False) (one of
nanoGPT's configurations; with biases the key bias's gradient is zero in exact arithmetic, noise
that AdamW's normalization blows up), configure_optimizers' two AdamW groups (weight decay 0.1 for
the >= 2-d tensors, none for the rest; betas (0.9, 0.95)), and train.py's iteration: the cosine
learning rate with linear warmup from get_lr(iter_num) set by hand on every param group before
the step, then (the compiled step) gradient accumulation over 2 micro-steps with the loss divided
by their count, a GradScaler (disabled, as train.py's for float32), clip_grad_norm_ 1.0,
scaler.step, scaler.update, zero_grad(set_to_none=True). The micro-batches come in as arguments
(train.py fetches the next one inside the loop with torch.randint)."""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from _compare import close, same_state, seeded

# train.py's configuration, shrunk
gradient_accumulation_steps = 2
batch_size = 2
block_size = 8
learning_rate = 6e-4
max_iters = 6
weight_decay = 1e-1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
decay_lr = True
warmup_iters = 2
lr_decay_iters = 6
min_lr = 6e-5


@dataclass
class GPTConfig:
    block_size: int = block_size
    vocab_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 16
    dropout: float = 0.0
    bias: bool = False


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has bias=... only since 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [{"params": decay_params, "weight_decay": weight_decay},
                        {"params": nodecay_params, "weight_decay": 0.0}]
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas)


def get_lr(it):
    if it < warmup_iters:  # linear warmup
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def program():
    model = GPT(GPTConfig())
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    def train_step(X, Y):  # train.py's loop body from the forward-backward update on
        for micro_step in range(gradient_accumulation_steps):
            logits, loss = model(X[micro_step], Y[micro_step])
            loss = loss / gradient_accumulation_steps  # scale the loss to account for accumulation
            scaler.scale(loss).backward()
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return train_step, {"model": model, "optimizer": optimizer}


def test_nanogpt_trains_as_in_eager():
    g = torch.Generator().manual_seed(16)
    data = torch.randint(0, GPTConfig.vocab_size, (200,), generator=g)

    def get_batch():
        ix = torch.randint(len(data) - block_size, (gradient_accumulation_steps, batch_size), generator=g)
        x = torch.stack([torch.stack([data[i:i + block_size] for i in row]) for row in ix])
        y = torch.stack([torch.stack([data[i + 1:i + 1 + block_size] for i in row]) for row in ix])
        return x, y

    eager, s_eager = seeded(program)
    lazy_fn, s_lazy = seeded(program)
    lazy = lazyrt.torch.compile(lazy_fn)
    losses = []
    for iter_num in range(max_iters):
        lr = get_lr(iter_num) if decay_lr else learning_rate
        for s in (s_eager, s_lazy):
            for param_group in s["optimizer"].param_groups:
                param_group["lr"] = lr
        X, Y = get_batch()
        got, want = lazy(X, Y), eager(X, Y)
        close(got, want, f"iter {iter_num} loss")
        same_state(s_lazy, s_eager, f"after iter {iter_num}:")
        losses.append(got.item())
    assert abs(losses[0] * gradient_accumulation_steps - math.log(GPTConfig.vocab_size)) < 0.1
    assert lazy.captures == 1, "the learning rate is a graph input"
