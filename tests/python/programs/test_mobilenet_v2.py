"""MobileNetV2 (torchvision's classification model, the reference recipe's training step),
ported small: a 3x3 stride-2 stem, inverted residual blocks (a 1x1 expansion by t with BatchNorm
and ReLU6, a 3x3 depthwise convolution with BatchNorm and ReLU6, a 1x1 linear projection with
BatchNorm; the residual sum where stride is 1 and the widths agree), a 1x1 head with BatchNorm
and ReLU6, global average pooling, Dropout(0.2) and a Linear classifier; SGD with momentum 0.9
and weight decay 4e-5, cross-entropy with label smoothing 0.1, the loop body zero_grad, forward,
loss, backward, step. Widths 8..24 and 64 instead of 32..320 and 1280, four stages, 32x32
images, batch 8. Depthwise convolutions and many normalizations: one of the programs whose
gradients drifted from float64 faster than eager's (tests/python/programs/test_accuracy.py holds
the deterministic variant, without dropout, to eager's accuracy)."""

import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from _compare import (close, kept_fraction_ok, observe_dropouts, replay_masks, same_state, seeded, seen)

STEPS, BATCH, SIZE, CLASSES = 4, 8, 32, 10
# (expansion t, output width, repeats, first stride), as torchvision's table, narrowed
SETTINGS = [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2), (6, 24, 1, 1)]


def conv_bn_relu6(inp, out, kernel, stride, groups=1):
    return nn.Sequential(nn.Conv2d(inp, out, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(out), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp, out, stride, expand_ratio):
        super().__init__()
        hidden = inp * expand_ratio
        self.use_res_connect = stride == 1 and inp == out
        layers = [conv_bn_relu6(inp, hidden, 1, 1)] if expand_ratio != 1 else []
        layers += [conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, out, 1, 1, 0, bias=False), nn.BatchNorm2d(out)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=CLASSES, dropout=0.2, last_channel=64):
        super().__init__()
        features, width = [conv_bn_relu6(3, 8, 3, 2)], 8
        for t, c, n, s in SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(width, c, s if i == 0 else 1, t))
                width = c
        features.append(conv_bn_relu6(width, last_channel, 1, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(last_channel, num_classes))
        for m in self.modules():  # torchvision's initialization
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def program(dropout=0.2):
    model = MobileNetV2(dropout=dropout)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.045, momentum=0.9, weight_decay=4e-5)

    def train_step(image, target):  # the reference script's train_one_epoch body
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss, seen(model)

    return train_step, {"model": model, "optimizer": optimizer}


def batches(n=STEPS):
    g = torch.Generator().manual_seed(21)
    return [(torch.randn(BATCH, 3, SIZE, SIZE, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g))
            for _ in range(n)]


def test_mobilenet_v2_trains_as_in_eager():
    eager, s_eager = seeded(program)
    lazy_fn, s_lazy = seeded(program)
    observe_dropouts(s_lazy["model"], s_eager["model"])
    lazy = lazyrt.torch.compile(lazy_fn)
    kept = []
    for k, (image, target) in enumerate(batches()):
        loss, dropped = lazy(image, target)
        replay_masks(s_eager["model"], dropped, kept)
        want, _ = eager(image, target)
        close(loss, want, f"step {k} loss")
        same_state(s_lazy, s_eager, f"after step {k}:")
    kept_fraction_ok(kept, slack=0.1)
    assert lazy.captures == 1
