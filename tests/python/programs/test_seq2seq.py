"""The PyTorch tutorial "NLP From Scratch: Translation with a Sequence to Sequence Network and
Attention" (seq2seq_translation_tutorial, its per-pair version), ported: EncoderRNN (Embedding,
GRU) run token by token filling encoder_outputs, AttnDecoderRNN (embedding, dropout 0.1,
attention weights from [embedded; hidden] over max_length encoder outputs, bmm, attn_combine,
ReLU, GRU, log_softmax), NLLLoss summed over the target tokens, and the tutorial's train():
both optimizers (SGD lr 0.01) zeroed, the encoder loop, the decoder loop with teacher forcing
(feed the target) or without (feed its own top-1 prediction, topk(1).squeeze().detach()),
backward, both optimizers stepped. The whole train() function is what is compiled.

Deterministic variations of the tutorial: whether to use teacher forcing is decided by
random.random() inside train(); here the decisions are fixed and passed in (each value is a
capture of its own). Without teacher forcing the tutorial stops at EOS with
`if decoder_input.item() == EOS_token: break`, a value read no captured graph can make, so this
loop runs the target's length. train() returns the loss tensor / target_length instead of its
.item(). Dropout masks: drawn by lazyrt, replayed in the eager oracle (see _compare)."""

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from _compare import (close, kept_fraction_ok, observe_dropouts, replay_masks, same_state, seen, seeded)

SOS_token, EOS_token = 0, 1
MAX_LENGTH = 6
INPUT_WORDS, OUTPUT_WORDS, HIDDEN = 12, 10, 16
TEACHER_FORCING = [True, False, True, False, True]


class EncoderRNN(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = nn.Embedding(input_size, hidden_size)
        self.gru = nn.GRU(hidden_size, hidden_size)

    def forward(self, input, hidden):
        embedded = self.embedding(input).view(1, 1, -1)
        return self.gru(embedded, hidden)

    def initHidden(self):
        return torch.zeros(1, 1, self.hidden_size)


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, output_size, dropout_p=0.1, max_length=MAX_LENGTH):
        super().__init__()
        self.hidden_size, self.output_size, self.max_length = hidden_size, output_size, max_length
        self.embedding = nn.Embedding(output_size, hidden_size)
        self.attn = nn.Linear(hidden_size * 2, max_length)
        self.attn_combine = nn.Linear(hidden_size * 2, hidden_size)
        self.dropout = nn.Dropout(dropout_p)
        self.gru = nn.GRU(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, output_size)

    def forward(self, input, hidden, encoder_outputs):
        embedded = self.dropout(self.embedding(input).view(1, 1, -1))
        attn_weights = F.softmax(self.attn(torch.cat((embedded[0], hidden[0]), 1)), dim=1)
        attn_applied = torch.bmm(attn_weights.unsqueeze(0), encoder_outputs.unsqueeze(0))
        output = torch.cat((embedded[0], attn_applied[0]), 1)
        output = F.relu(self.attn_combine(output).unsqueeze(0))
        output, hidden = self.gru(output, hidden)
        output = F.log_softmax(self.out(output[0]), dim=1)
        return output, hidden, attn_weights


def train(input_tensor, target_tensor, encoder, decoder, encoder_optimizer, decoder_optimizer, criterion,
          use_teacher_forcing, max_length=MAX_LENGTH):
    encoder_hidden = encoder.initHidden()
    encoder_optimizer.zero_grad()
    decoder_optimizer.zero_grad()
    input_length = input_tensor.size(0)
    target_length = target_tensor.size(0)
    encoder_outputs = torch.zeros(max_length, encoder.hidden_size)
    loss = 0
    for ei in range(input_length):
        encoder_output, encoder_hidden = encoder(input_tensor[ei], encoder_hidden)
        encoder_outputs[ei] = encoder_output[0, 0]
    decoder_input = torch.tensor([[SOS_token]])
    decoder_hidden = encoder_hidden
    if use_teacher_forcing:  # feed the target as the next input
        for di in range(target_length):
            decoder_output, decoder_hidden, decoder_attention = decoder(decoder_input, decoder_hidden, encoder_outputs)
            loss += criterion(decoder_output, target_tensor[di])
            decoder_input = target_tensor[di]
    else:  # feed its own predictions as the next input
        for di in range(target_length):
            decoder_output, decoder_hidden, decoder_attention = decoder(decoder_input, decoder_hidden, encoder_outputs)
            topv, topi = decoder_output.topk(1)
            decoder_input = topi.squeeze().detach()
            loss += criterion(decoder_output, target_tensor[di])
    loss.backward()
    encoder_optimizer.step()
    decoder_optimizer.step()
    return loss / target_length, seen(decoder)


def program():
    encoder = EncoderRNN(INPUT_WORDS, HIDDEN)
    decoder = AttnDecoderRNN(HIDDEN, OUTPUT_WORDS, dropout_p=0.1)
    learning_rate = 0.01
    encoder_optimizer = torch.optim.SGD(encoder.parameters(), lr=learning_rate)
    decoder_optimizer = torch.optim.SGD(decoder.parameters(), lr=learning_rate)
    return {"encoder": encoder, "decoder": decoder, "encoder_optimizer": encoder_optimizer,
            "decoder_optimizer": decoder_optimizer}


def test_seq2seq_with_attention_trains_as_in_eager():
    g = torch.Generator().manual_seed(17)
    pairs = []
    for _ in TEACHER_FORCING:
        source = torch.cat([torch.randint(2, INPUT_WORDS, (4,), generator=g), torch.tensor([EOS_token])]).view(-1, 1)
        target = torch.cat([torch.randint(2, OUTPUT_WORDS, (3,), generator=g), torch.tensor([EOS_token])]).view(-1, 1)
        pairs.append((source, target))
    s_eager, s_lazy = seeded(program), seeded(program)
    observe_dropouts(s_lazy["decoder"], s_eager["decoder"])
    criterion = nn.NLLLoss()
    lazy = lazyrt.torch.compile(train)
    kept = []
    for k, ((source, target), forcing) in enumerate(zip(pairs, TEACHER_FORCING)):
        loss, dropped = lazy(source, target, s_lazy["encoder"], s_lazy["decoder"], s_lazy["encoder_optimizer"],
                             s_lazy["decoder_optimizer"], criterion, forcing)
        replay_masks(s_eager["decoder"], dropped, kept)
        want, _ = train(source, target, s_eager["encoder"], s_eager["decoder"], s_eager["encoder_optimizer"],
                        s_eager["decoder_optimizer"], criterion, forcing)
        close(loss, want, f"pair {k} (teacher forcing {forcing}) loss")
        same_state(s_lazy, s_eager, f"after pair {k}:")
    kept_fraction_ok(kept, slack=0.1)
    assert lazy.captures == 2, "one capture with teacher forcing, one without"
