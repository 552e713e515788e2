"""A small CNN trained side by side with PyTorch from the same initial weights."""
import numpy as np
import torch

import lazyrt as lr


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.fc = torch.nn.Linear(6 * 2 * 2, 3)

    def forward(self, x):
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.tanh(self.conv2(h))
        return self.fc(torch.flatten(h, 1))


class LazyNet(lr.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = lr.nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = lr.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.fc = lr.nn.Linear(6 * 2 * 2, 3)
        self.pool = lr.nn.MaxPool2d(2)

    def forward(self, x):
        h = self.pool(lr.relu(self.conv1(x)))
        h = lr.tanh(self.conv2(h))
        return self.fc(lr.flatten(h, 1))


def test_small_cnn_trains_like_torch():
    torch.manual_seed(3)
    tnet = TorchNet()
    lnet = LazyNet()
    lnet.load_state_dict({k: lr.from_numpy(v.detach().numpy().copy()) for k, v in tnet.state_dict().items()})
    topt = torch.optim.Adam(tnet.parameters(), lr=1e-2)
    lopt = lr.optim.Adam(lnet.parameters(), lr=1e-2)
    rng = np.random.RandomState(0)
    for step in range(6):
        x = rng.randn(5, 1, 8, 8).astype(np.float32)
        y = rng.randint(0, 3, size=5)
        tloss = torch.nn.functional.cross_entropy(tnet(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        topt.zero_grad()
        lloss = lr.nn.functional.cross_entropy(lnet(lr.tensor(x)), lr.tensor(y))
        lloss.backward()
        lopt.step()
        lopt.zero_grad()
        lr.mark_step()
        np.testing.assert_allclose(lloss.item(), tloss.item(), rtol=1e-5, err_msg=f"step {step}")
    for name, p in tnet.state_dict().items():
        np.testing.assert_allclose(lnet.state_dict()[name].numpy(), p.numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=name)


def test_conv_embedding_and_layer_norm_layers_initialise_as_torch_does():
    lr.manual_seed(5)
    conv = lr.nn.Conv2d(4, 6, (3, 2), groups=2)
    bound = 1.0 / np.sqrt(2 * 3 * 2)
    w = conv.weight.numpy()
    assert w.shape == (6, 2, 3, 2)
    assert np.all(np.abs(w) < bound)
    emb = lr.nn.Embedding(4, 3, padding_idx=1)
    assert np.all(emb.weight.numpy()[1] == 0)
    ln = lr.nn.LayerNorm(5)
    np.testing.assert_allclose(ln(lr.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])).numpy()[0, 2], 0, atol=1e-6)
