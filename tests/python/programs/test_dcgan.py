"""pytorch/examples dcgan, ported at 16x16: the Generator (ConvTranspose2d, BatchNorm2d, ReLU,
Tanh) and the Discriminator (Conv2d, LeakyReLU(0.2), BatchNorm2d, Sigmoid) with the example's
weights_init (conv weights N(0, 0.02), batch-norm weights N(1, 0.02), biases 0), BCELoss and two
Adam optimizers (lr 2e-4, betas (0.5, 0.999)), trained by the example's three-phase loop body:
(1) D on a real batch with label 1, backward; D on G(noise).detach() with label 0, backward;
optimizerD.step(); (2) G with the label filled with 1, through D, backward; optimizerG.step().
The example reads D(x), D(G(z)) with .item() in the loop body; here the step returns those
tensors and they are read after the call.

The noise: the example draws it with torch.randn inside the loop body. lazyrt draws from its
own generator, so the numeric test passes the noise in as an argument; a separate test draws
it inside the compiled step and checks the step trains and draws new noise on every call.
nz 8, ngf = ndf = 4, 3 channels, batch 4."""

import torch
from torch import nn

import lazyrt.torch
from _compare import close, same_results, same_state, seeded

nz, ngf, ndf, nc, BATCH, STEPS = 8, 4, 4, 3, 4, 4
real_label, fake_label = 1.0, 0.0


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False),  # 4x4
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),  # 8x8
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, nc, 4, 2, 1, bias=False),  # 16x16
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),  # 8x8
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),  # 4x4
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),  # 1x1
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


def program(noise_inside=False):
    netG = Generator()
    netG.apply(weights_init)
    netD = Discriminator()
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))

    def step(data, noise=None):  # the example's loop body
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real_cpu = data
        batch_size = real_cpu.size(0)
        label = torch.full((batch_size,), real_label, dtype=real_cpu.dtype)
        output = netD(real_cpu)
        errD_real = criterion(output, label)
        errD_real.backward()
        D_x = output.mean()

        if noise_inside:
            noise = torch.randn(batch_size, nz, 1, 1)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach())
        errD_fake = criterion(output, label)
        errD_fake.backward()
        D_G_z1 = output.mean()
        errD = errD_real + errD_fake
        optimizerD.step()

        # (2) Update G network: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)  # fake labels are real for generator cost
        output = netD(fake)
        errG = criterion(output, label)
        errG.backward()
        D_G_z2 = output.mean()
        optimizerG.step()
        return errD, errG, D_x, D_G_z1, D_G_z2

    state = {"netG": netG, "netD": netD, "optimizerD": optimizerD, "optimizerG": optimizerG}
    return step, state


def test_dcgan_trains_as_in_eager():
    g = torch.Generator().manual_seed(7)
    data = [(torch.rand(BATCH, nc, 16, 16, generator=g) * 2 - 1, torch.randn(BATCH, nz, 1, 1, generator=g))
            for _ in range(STEPS)]
    eager, s_eager = seeded(program)
    lazy_fn, s_lazy = seeded(program)
    lazy = lazyrt.torch.compile(lazy_fn)
    for k, (real, noise) in enumerate(data):
        same_results(lazy(real, noise), eager(real, noise), f"step {k}")
        same_state(s_lazy, s_eager, f"after step {k}:")
    assert lazy.captures == 1


def test_dcgan_with_its_own_noise_draws_new_noise_and_trains():
    # torch.randn inside the step, as the example: lazyrt's generator, a new draw every call.
    # With both learning rates 0 the networks stay put (the batch-norm running statistics still
    # move), so D(G(z)) differs between calls on one batch only through the noise.
    step, s = seeded(lambda: program(noise_inside=True))
    lazy = lazyrt.torch.compile(step)
    real = torch.rand(BATCH, nc, 16, 16, generator=torch.Generator().manual_seed(8)) * 2 - 1
    for opt in (s["optimizerD"], s["optimizerG"]):
        opt.param_groups[0]["lr"] = 0.0
    before = {k: p.detach().clone() for k, p in s["netG"].named_parameters()}
    d_g_z = [lazy(real)[3].item() for _ in range(3)]
    assert len(set(d_g_z)) == 3, d_g_z
    assert all(torch.equal(p, before[k]) for k, p in s["netG"].named_parameters())
    for opt in (s["optimizerD"], s["optimizerG"]):
        opt.param_groups[0]["lr"] = 2e-4
    results = [lazy(real) for _ in range(4)]
    assert all(torch.isfinite(torch.stack(r)).all() for r in results)
    assert not all(torch.equal(p, before[k]) for k, p in s["netG"].named_parameters())
    assert lazy.captures == 1, "the learning rate is a graph input"
