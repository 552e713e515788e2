"""pytorch/examples word_language_model, ported: an RNN language model (Embedding, a 2-layer
LSTM or GRU with dropout, a decoder whose weight may be tied to the embedding, log_softmax and
NLLLoss) and its Transformer variant (positional encoding, nn.TransformerEncoder with a causal
mask the model builds and caches itself), trained as the example's train() does: the hidden
state repackaged (detached) between batches, model.zero_grad(), backward, clip_grad_norm_ with
args.clip read from an argparse Namespace, and the hand-written SGD update
p.data.add_(p.grad, alpha=-lr) with lr a module-level global, divided by 4 between epochs as the
example does when the validation loss stops improving (evaluate() runs eagerly between epochs,
in eval mode).

Dropout: lazyrt draws its own masks, so the numeric test swaps the nn.Dropout modules for ones
that report their masks to the eager oracle (see _compare); the LSTM's/GRU's own dropout between
its layers and the attention's dropout, which no module exposes, are 0 there. A separate test runs
the example's dropout everywhere and checks that the compiled step trains and draws new masks
on every call. Sizes are tiny (vocabulary 40, 16 units, bptt 5, batch 4)."""

import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F
import pytest

import lazyrt.torch
from _compare import (close, kept_fraction_ok, observe_dropouts, replay_masks, same_results, same_state,
                      seen, seeded)

parser = argparse.ArgumentParser(description="word-level language model (tiny)")
parser.add_argument("--emsize", type=int, default=16)
parser.add_argument("--nhid", type=int, default=16)
parser.add_argument("--nlayers", type=int, default=2)
parser.add_argument("--nhead", type=int, default=2)
parser.add_argument("--lr", type=float, default=20)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--bptt", type=int, default=5)
parser.add_argument("--dropout", type=float, default=0.2)
args = parser.parse_args([])

ntokens = 40
lr = args.lr  # the example's global learning rate, read by the hand-written update


class RNNModel(nn.Module):
    """Encoder (embedding), a recurrent module and a decoder, as the example's model.py."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            assert nhid == ninp, "tied weights need nhid == emsize"
            self.decoder.weight = self.encoder.weight
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=64):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Module):
    """The example's Transformer variant: the causal mask is built on first use and cached on
    the module (self.src_mask), rebuilt when the sequence length changes."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super().__init__()
        self.model_type = "Transformer"
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def _generate_square_subsequent_mask(self, sz):
        return torch.log(torch.tril(torch.ones(sz, sz)))

    def forward(self, src, has_mask=True):
        if has_mask:
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                self.src_mask = self._generate_square_subsequent_mask(len(src)).to(src.device)
        else:
            self.src_mask = None
        src = self.encoder(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.transformer_encoder(src, self.src_mask)
        return F.log_softmax(self.decoder(output), dim=-1)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    """Wraps hidden states in new tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def make_rnn_step(model, criterion):
    def step(data, targets, hidden):  # the example's train() loop body
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        return loss, hidden, seen(model)
    return step


def make_transformer_step(model, criterion):
    def step(data, targets):  # the example's train() loop body, Transformer branch
        model.zero_grad()
        output = model(data)
        output = output.view(-1, ntokens)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        return loss, seen(model)
    return step


def evaluate(model, criterion, data_source, recurrent):
    model.eval()
    total_loss = 0.0
    with torch.no_grad():
        hidden = model.init_hidden(args.batch_size) if recurrent else None
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            if recurrent:
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
            else:
                output = model(data).view(-1, ntokens)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def corpus(seed, length):
    g = torch.Generator().manual_seed(seed)
    return batchify(torch.randint(0, ntokens, (length,), generator=g), args.batch_size)


def build(kind, dropout):
    if kind == "Transformer":
        model = TransformerModel(ntokens, args.emsize, args.nhead, args.nhid, args.nlayers, dropout)
    else:
        rnn_type, tied = kind.split("_")
        model = RNNModel(rnn_type, ntokens, args.emsize, args.nhid, args.nlayers, dropout, tied == "tied")
    return model


KINDS = ["LSTM_tied", "GRU_untied"]  # the Transformer variant: test_word_language_model_transformer.py


@pytest.mark.parametrize("kind", KINDS)
def test_word_language_model_trains_as_in_eager(kind):
    trains_as_in_eager(kind)


@pytest.mark.parametrize("kind", KINDS)
def test_word_language_model_with_all_its_dropout_draws_new_masks(kind):
    draws_new_masks(kind)


def trains_as_in_eager(kind):
    global lr
    lr = args.lr
    recurrent = kind != "Transformer"
    m_eager, m_lazy = seeded(lambda: build(kind, args.dropout)), seeded(lambda: build(kind, args.dropout))
    for m in (m_eager, m_lazy):  # dropout that no module exposes: off (see the docstring)
        if recurrent:
            m.rnn.dropout = 0.0
        else:
            for layer in m.transformer_encoder.layers:
                layer.self_attn.dropout = 0.0
    observe_dropouts(m_lazy, m_eager)
    criterion = nn.NLLLoss()
    maker = make_rnn_step if recurrent else make_transformer_step
    eager, lazy = maker(m_eager, criterion), lazyrt.torch.compile(maker(m_lazy, criterion))
    train_data, val_data = corpus(1, 3 * args.bptt * args.batch_size + args.batch_size), corpus(2, 41)
    kept, losses = [], []
    for epoch in range(1, args.epochs + 1):
        m_eager.train()
        m_lazy.train()
        h_eager = h_lazy = m_eager.init_hidden(args.batch_size) if recurrent else None
        for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
            data, targets = get_batch(train_data, i)
            what = f"epoch {epoch} batch {batch}"
            if recurrent:
                loss, h_lazy, dropped = lazy(data, targets, h_lazy)
                replay_masks(m_eager, dropped, kept)
                want, h_eager, _ = eager(data, targets, h_eager)
                same_results(h_lazy, repackage_hidden(h_eager), f"{what} hidden")
            else:
                loss, dropped = lazy(data, targets)
                replay_masks(m_eager, dropped, kept)
                want, _ = eager(data, targets)
            close(loss, want, f"{what} loss")
            same_state({"model": m_lazy}, {"model": m_eager}, f"{what}:")
            losses.append(loss.item())
        val_lazy = evaluate(m_lazy, criterion, val_data, recurrent)
        val_eager = evaluate(m_eager, criterion, val_data, recurrent)
        close(val_lazy, val_eager, f"epoch {epoch} validation loss")
        lr /= 4.0  # the example anneals when validation stops improving; here after every epoch
    kept_fraction_ok(kept, slack=0.08)
    assert len(set(losses)) == len(losses)
    # One capture per learning rate (the global is read by the step). The transformer caches its
    # mask on itself (a tensor the step reads from the module: its shape is what the capture
    # depends on): on the first call the capture sets it (a result of the step), and the next
    # call reads it (`src_mask is None` changed); evaluate() between epochs leaves a mask of the
    # last validation batch's length there, so the next epoch's first call reads a mask of
    # another shape (and rebuilds it) and its second the rebuilt one: two captures per epoch.
    assert lazy.captures == args.epochs * (1 if recurrent else 2), lazy.captures


def draws_new_masks(kind):
    # The example's dropout everywhere (inside the LSTM/GRU and the attention too), no oracle for
    # the masks: with lr 0 the update is a no-op, so the same batch from the same hidden state
    # gives another loss on the next call only because new masks were drawn; with lr > 0 the
    # model trains.
    global lr
    recurrent = kind != "Transformer"
    model = seeded(lambda: build(kind, 0.3))
    criterion = nn.NLLLoss()
    step = lazyrt.torch.compile((make_rnn_step if recurrent else make_transformer_step)(model, criterion))
    data, targets = get_batch(corpus(3, 41), 0)
    extra = (model.init_hidden(args.batch_size),) if recurrent else ()
    model.train()
    lr = 0.0
    before = [p.detach().clone() for p in model.parameters()]
    first = [step(data, targets, *extra)[0].item() for _ in range(3)]
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert len(set(first)) == 3, f"new dropout masks every call: {first}"
    model.eval()
    with torch.no_grad():
        plain = criterion(model(data, *extra)[0] if recurrent else model(data).view(-1, ntokens), targets).item()
    model.train()
    assert all(abs(f - plain) > 1e-6 for f in first), "dropout changes the loss"
    lr = 1.0
    trained = [step(data, targets, *extra)[0].item() for _ in range(6)]
    assert all(math.isfinite(t) for t in trained) and trained[-1] < trained[0]
    model.eval()
    with torch.no_grad():
        after = criterion(model(data, *extra)[0] if recurrent else model(data).view(-1, ntokens), targets).item()
    assert after < plain
    lr = args.lr
