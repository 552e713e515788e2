"""A CIFAR-style ResNet trained as the common public CIFAR-10 recipes do (kuangliu/pytorch-cifar,
the torchvision reference classification scripts): BasicBlock (3x3 conv, BatchNorm, ReLU, 3x3
conv, BatchNorm, a 1x1 conv + BatchNorm shortcut where the shape changes, ReLU after the sum), SGD
with momentum 0.9, nesterov and weight decay 5e-4, cross-entropy with label smoothing 0.1, and a
learning-rate scheduler stepped after every batch outside the step (OneCycleLR, which also cycles
the momentum; CosineAnnealingLR; MultiStepLR). The loop body: model.train(), zero_grad, forward,
loss, backward, step. Three stages of widths 4/8/16, one block each, 8x8 images, batch 4."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler

import lazyrt.torch
from _compare import close, same_state, seeded

STEPS, BATCH = 5, 4


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != self.expansion * planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, self.expansion * planes, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(self.expansion * planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return F.relu(out)


class ResNet(nn.Module):
    def __init__(self, block, num_blocks, widths=(4, 8, 16), num_classes=10):
        super().__init__()
        self.in_planes = widths[0]
        self.conv1 = nn.Conv2d(3, widths[0], kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.layer1 = self._make_layer(block, widths[0], num_blocks[0], stride=1)
        self.layer2 = self._make_layer(block, widths[1], num_blocks[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], num_blocks[2], stride=2)
        self.linear = nn.Linear(widths[2] * block.expansion, num_classes)

    def _make_layer(self, block, planes, num_blocks, stride):
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


SCHEDULERS = {
    "onecycle": lambda opt: lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=STEPS + 1),
    "cosine": lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS),
    "multistep": lambda opt: lr_scheduler.MultiStepLR(opt, milestones=[2, 4], gamma=0.1),
}


def program(schedule):
    net = ResNet(BasicBlock, [1, 1, 1])
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = SCHEDULERS[schedule](optimizer)

    def train_step(inputs, targets):
        net.train()
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, targets)
        loss.backward()
        optimizer.step()
        return loss, outputs.argmax(1).eq(targets).sum()

    return train_step, {"net": net, "optimizer": optimizer, "scheduler": scheduler}


@pytest.mark.parametrize("schedule", sorted(SCHEDULERS))
def test_cifar_resnet_with_a_per_batch_scheduler_trains_as_in_eager(schedule):
    g = torch.Generator().manual_seed(15)
    batches = [(torch.randn(BATCH, 3, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
               for _ in range(STEPS)]
    eager, s_eager = seeded(lambda: program(schedule))
    lazy_fn, s_lazy = seeded(lambda: program(schedule))
    lazy = lazyrt.torch.compile(lazy_fn)
    for k, (inputs, targets) in enumerate(batches):
        (loss, correct), (want, want_correct) = lazy(inputs, targets), eager(inputs, targets)
        close(loss, want, f"step {k} loss")
        assert correct.item() == want_correct.item()
        for s in (s_eager, s_lazy):
            s["scheduler"].step()
        same_state(s_lazy, s_eager, f"after step {k}:")
    # OneCycleLR cycles the momentum too, a hyperparameter the capture keeps: one capture per
    # momentum value; the others change the learning rate only, a graph input.
    assert lazy.captures == (STEPS if schedule == "onecycle" else 1), lazy.captures
