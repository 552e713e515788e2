"""The programs suite as data: each program of tests/python/programs/ as its test builds and feeds
it (sizes as there), for the checks and benchmarks that run them all alike (test_accuracy.py,
bench/programs.py).

A Program's make() builds the program (run it under _compare.seeded for a fixed initial state)
and returns (step, state: {name: module, optimizer, scheduler or tensor}); batches() gives the
argument tuples of BATCHES calls; random: the step itself draws values (dropout masks, noise),
so it cannot match eager bit for bit; clone: the step writes into its arguments (give each call
a copy)."""

import torch
from torch import nn

BATCHES = 4


class Program:
    """make() -> (step, state); batches() -> [args tuple]; random: the step draws values."""

    def __init__(self, name, make, batches, random=False, clone=False):
        self.name, self.make, self.batches, self.random, self.clone = name, make, batches, random, clone


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def programs():
    """The suite's programs, each as its test runs it (sizes as there)."""
    import test_cifar_resnet as cifar
    import test_dcgan as dcgan
    import test_fast_neural_style as fns
    import test_graph_networks as gn
    import test_mnist as mnist
    import test_mobilenet_v2 as mbv2
    import test_nanogpt as gpt
    import test_neural_style as ns
    import test_regression_graph_break as det
    import test_seq2seq as s2s
    import test_two_optimizers as two
    import test_vae as vae
    import test_word_language_model as wlm

    out = []

    def mnist_batches():
        g = _gen(5)
        return [(torch.rand(mnist.BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (mnist.BATCH,), generator=g))
                for _ in range(BATCHES)]
    out.append(Program("mnist (Adadelta, dropout)", lambda: mnist.program(nn.Dropout), mnist_batches, random=True))

    def cifar_batches():
        g = _gen(15)
        return [(torch.randn(cifar.BATCH, 3, 8, 8, generator=g), torch.randint(0, 10, (cifar.BATCH,), generator=g))
                for _ in range(BATCHES)]
    out.append(Program("cifar ResNet (SGD nesterov, cosine)", lambda: cifar.program("cosine"), cifar_batches))

    out.append(Program("MobileNetV2 (depthwise convolutions, no dropout)", lambda: mbv2.program(dropout=0.0),
                       lambda: mbv2.batches(BATCHES)))

    def dcgan_batches():
        g = _gen(7)
        return [(torch.rand(dcgan.BATCH, dcgan.nc, 16, 16, generator=g) * 2 - 1,
                 torch.randn(dcgan.BATCH, dcgan.nz, 1, 1, generator=g)) for _ in range(BATCHES)]
    out.append(Program("DCGAN (two Adams)", dcgan.program, dcgan_batches))

    def style_batches():
        g = _gen(13)
        return [(torch.rand(fns.args.batch_size, 3, fns.SIZE, fns.SIZE, generator=g) * 255,) for _ in range(BATCHES)]
    out.append(Program("fast neural style (VGG loss, InstanceNorm)", fns.program, style_batches, clone=True))

    def graph_batches(adjacency):
        def make():
            features, labels, adj, adj_norm, idx_train = gn.graph()
            return [(features, adj_norm if adjacency == "normalized" else adj, labels, idx_train)] * BATCHES
        return make
    out.append(Program("GCN (dropout)", lambda: gn.program(lambda: gn.GCN(gn.FEATURES, 16, gn.CLASSES, dropout_p=0.5),
                                                             0.01), graph_batches("normalized"), random=True))
    out.append(Program("GAT", lambda: gn.program(lambda: gn.GAT(gn.FEATURES, 16, 4, gn.CLASSES, concat=True,
                                                                dropout=0.0), 0.005), graph_batches("binary")))

    def gpt_batches():
        g = _gen(16)
        data = torch.randint(0, gpt.GPTConfig.vocab_size, (200,), generator=g)
        out = []
        for _ in range(BATCHES):
            ix = torch.randint(len(data) - gpt.block_size, (gpt.gradient_accumulation_steps, gpt.batch_size),
                               generator=g)
            x = torch.stack([torch.stack([data[i:i + gpt.block_size] for i in row]) for row in ix])
            y = torch.stack([torch.stack([data[i + 1:i + 1 + gpt.block_size] for i in row]) for row in ix])
            out.append((x, y))
        return out
    out.append(Program("nanoGPT (AdamW, accumulation, clipping)", gpt.program, gpt_batches))

    def neural_style():
        closure, optimizer, input_img, model = ns.program(lambda params: torch.optim.Adam(params, lr=0.02))

        def step():
            loss = closure()
            optimizer.step()
            return loss
        return step, {"model": model, "input_img": input_img, "optimizer": optimizer}
    out.append(Program("neural style (Adam on the image)", neural_style, lambda: [()] * BATCHES))

    def det_batches():
        g = _gen(3)
        return [(torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)) for _ in range(BATCHES)]
    out.append(Program("regression with det (a graph break)", det.program, det_batches))

    def seq2seq():
        s = s2s.program()
        criterion = nn.NLLLoss()

        def step(source, target):
            return s2s.train(source, target, s["encoder"], s["decoder"], s["encoder_optimizer"],
                             s["decoder_optimizer"], criterion, True)
        return step, s

    def seq2seq_batches():
        g = _gen(17)
        return [(torch.cat([torch.randint(2, s2s.INPUT_WORDS, (4,), generator=g),
                            torch.tensor([s2s.EOS_token])]).view(-1, 1),
                 torch.cat([torch.randint(2, s2s.OUTPUT_WORDS, (3,), generator=g),
                            torch.tensor([s2s.EOS_token])]).view(-1, 1)) for _ in range(BATCHES)]
    out.append(Program("seq2seq with attention (GRU, teacher forcing)", seq2seq, seq2seq_batches, random=True))

    out.append(Program("two optimizers (Adam + SGD)", two.program, lambda: two.batches(BATCHES)))

    def vae_batches():
        g = _gen(9)
        return [(torch.rand(vae.BATCH, 1, 28, 28, generator=g), torch.randn(vae.BATCH, 20, generator=g))
                for _ in range(BATCHES)]
    out.append(Program("VAE (noise given)", vae.program, vae_batches))

    for kind in ("LSTM_tied", "Transformer"):
        def language_model(kind=kind):
            wlm.lr = wlm.args.lr
            model = wlm.build(kind, wlm.args.dropout)
            criterion = nn.NLLLoss()
            if kind == "Transformer":
                return wlm.make_transformer_step(model, criterion), {"model": model}
            rnn_step = wlm.make_rnn_step(model, criterion)

            def step(data, targets, hidden):  # the hidden state each batch starts from: zeros
                loss, _, dropped = rnn_step(data, targets, hidden)
                return loss, dropped
            return step, {"model": model}

        def lm_batches(kind=kind):
            train = wlm.corpus(1, 3 * wlm.args.bptt * wlm.args.batch_size + wlm.args.batch_size)
            batches = [wlm.get_batch(train, i) for i in range(0, train.size(0) - 1, wlm.args.bptt)][:BATCHES]
            if kind == "Transformer":
                return batches
            shape = (wlm.args.nlayers, wlm.args.batch_size, wlm.args.nhid)
            return [(x, y, (torch.zeros(shape), torch.zeros(shape))) for x, y in batches]
        out.append(Program(f"word language model {kind} (dropout, clipping, hand-written SGD)", language_model,
                           lm_batches, random=True))
    return out
