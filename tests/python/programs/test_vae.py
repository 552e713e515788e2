"""pytorch/examples vae, ported: the fully connected VAE (784 -> 400 -> 20 (mu, logvar) -> 400
-> 784, ReLU, sigmoid), the reparameterization trick (mu + eps * exp(0.5 * logvar) with eps from
torch.randn_like), the loss BCE (summed) + KLD, and Adam (lr 1e-3) in the example's train() loop
body (zero_grad, forward, loss, backward, step).

The noise: lazyrt draws randn_like from its own generator, not torch's stream. The numeric test
hands the noise in (the model's reparameterize takes an optional eps, otherwise as the example);
a separate test runs the example's randn_like inside the compiled step and checks that it draws
new noise on every call, of the right statistics, and trains. Batch 8 random "images"."""

import math

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from _compare import AdamNoise, same_results, same_state, seeded

BATCH, STEPS = 8, 5


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar, eps=None):
        std = torch.exp(0.5 * logvar)
        if eps is None:
            eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x, eps=None):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar, eps)
        return self.decode(z), mu, logvar, z


def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2), see Kingma and Welling, appendix B
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def program():
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def train_step(data, eps=None):  # the example's train() loop body
        optimizer.zero_grad()
        recon_batch, mu, logvar, z = model(data, eps)
        loss = loss_function(recon_batch, data, mu, logvar)
        loss.backward()
        optimizer.step()
        return loss, mu.detach(), logvar.detach(), z.detach()

    return train_step, {"model": model, "optimizer": optimizer}


def test_vae_trains_as_in_eager_given_the_noise():
    g = torch.Generator().manual_seed(9)
    data = [(torch.rand(BATCH, 1, 28, 28, generator=g), torch.randn(BATCH, 20, generator=g)) for _ in range(STEPS)]
    eager, s_eager = seeded(program)
    lazy_fn, s_lazy = seeded(program)
    lazy = lazyrt.torch.compile(lazy_fn)
    # A decoder weight whose gradient sums products of near-zero ReLU outputs is rounding noise
    # (2e-7 against a largest gradient of 2: lazyrt 1.8e-7, eager 2.3e-7 on one CPU), which
    # Adam's first step turns into about lr either way.
    noise = AdamNoise(lr=1e-3)
    for k, (x, eps) in enumerate(data):
        # The summed loss is ~5e3: its float32 rounding alone is ~5e-4 absolute.
        same_results(lazy(x, eps), eager(x, eps), f"step {k}")
        noise.update(s_eager["model"])
        same_state(s_lazy, s_eager, f"after step {k}:", adam_noise={"model": noise})
    assert lazy.captures == 1


def test_vae_draws_new_noise_every_call_and_trains():
    step, s = seeded(program)
    lazy = lazyrt.torch.compile(step)
    x = torch.rand(64, 1, 28, 28, generator=torch.Generator().manual_seed(10))
    s["optimizer"].param_groups[0]["lr"] = 0.0  # the model stays put: only the noise differs
    draws = []
    for _ in range(3):
        _, mu, logvar, z = lazy(x)
        draws.append((z - mu) / torch.exp(0.5 * logvar))
    for a, b in zip(draws, draws[1:]):
        assert not torch.allclose(a, b), "new noise every call"
    eps = torch.cat([d.flatten() for d in draws])
    assert abs(eps.mean().item()) < 0.05 and abs(eps.std().item() - 1) < 0.05, "standard normal noise"
    s["optimizer"].param_groups[0]["lr"] = 1e-3
    losses = [lazy(x)[0].item() for _ in range(6)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    assert lazy.captures == 1
