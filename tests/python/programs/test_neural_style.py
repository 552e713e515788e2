"""The PyTorch tutorial "Neural Transfer Using PyTorch" (neural_style_tutorial), ported: a
frozen VGG-like feature network (here a small random one: conv 3x3 / ReLU / max-pool blocks,
requires_grad False, eval mode) behind a Normalization module, with ContentLoss and StyleLoss
modules (Gram matrices) inserted after its convolutions as the tutorial's
get_style_model_and_losses does, and the input image itself optimized: clamped to [0, 1] under
no_grad, zero_grad, the forward, style_weight * style + content_weight * content, backward.

The tutorial optimizes with LBFGS, passing that body as the closure of optimizer.step(closure);
lazyrt.torch.compile refuses LBFGS's step (it reads the loss with float() and decides by value
how many evaluations to run), which the last test checks is a clear CaptureError that changes
nothing. The numeric test uses the same body with Adam (optimizer.step() after it), as the
tutorial's own note suggests other optimizers work too. The tutorial's closure also counts its
calls in a list (run[0] += 1); a compiled step may not change Python state, so the count is kept
outside. 16x16 images, 8 and 16 channels."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import lazyrt.torch
from _compare import same_results, same_state, seeded

SIZE, STEPS = 16, 5
content_layers_default = ["conv_4"]
style_layers_default = ["conv_1", "conv_2", "conv_3", "conv_4"]


def gram_matrix(input):
    a, b, c, d = input.size()  # batch, feature maps, height, width
    features = input.view(a * b, c * d)
    G = torch.mm(features, features.t())
    return G.div(a * b * c * d)


class ContentLoss(nn.Module):
    def __init__(self, target):
        super().__init__()
        self.target = target.detach()

    def forward(self, input):
        self.loss = F.mse_loss(input, self.target)
        return input


class StyleLoss(nn.Module):
    def __init__(self, target_feature):
        super().__init__()
        self.target = gram_matrix(target_feature).detach()

    def forward(self, input):
        self.loss = F.mse_loss(gram_matrix(input), self.target)
        return input


class Normalization(nn.Module):
    def __init__(self, mean, std):
        super().__init__()
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def forward(self, img):
        return (img - self.mean) / self.std


def small_vgg_features():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(8, 8, 3, padding=1),
                         nn.ReLU(inplace=True), nn.MaxPool2d(2, 2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(inplace=True), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(inplace=True)).eval()


def get_style_model_and_losses(cnn, mean, std, style_img, content_img):
    model = nn.Sequential(Normalization(mean, std))
    content_losses, style_losses = [], []
    i = 0
    for layer in cnn.children():
        if isinstance(layer, nn.Conv2d):
            i += 1
            name = f"conv_{i}"
        elif isinstance(layer, nn.ReLU):
            name = f"relu_{i}"
            layer = nn.ReLU(inplace=False)  # the in-place one does not play well with the losses
        elif isinstance(layer, nn.MaxPool2d):
            name = f"pool_{i}"
        else:
            raise RuntimeError(f"Unrecognized layer: {layer.__class__.__name__}")
        model.add_module(name, layer)
        if name in content_layers_default:
            target = model(content_img).detach()
            content_loss = ContentLoss(target)
            model.add_module(f"content_loss_{i}", content_loss)
            content_losses.append(content_loss)
        if name in style_layers_default:
            target_feature = model(style_img).detach()
            style_loss = StyleLoss(target_feature)
            model.add_module(f"style_loss_{i}", style_loss)
            style_losses.append(style_loss)
    for i in range(len(model) - 1, -1, -1):  # trim the layers after the last loss
        if isinstance(model[i], (ContentLoss, StyleLoss)):
            break
    return model[:i + 1], style_losses, content_losses


def program(optimizer_class, style_weight=1000000, content_weight=1):
    g = torch.Generator().manual_seed(11)
    style_img, content_img = torch.rand(1, 3, SIZE, SIZE, generator=g), torch.rand(1, 3, SIZE, SIZE, generator=g)
    cnn = small_vgg_features()
    model, style_losses, content_losses = get_style_model_and_losses(
        cnn, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], style_img, content_img)
    input_img = content_img.clone()
    input_img.requires_grad_(True)
    model.eval()
    model.requires_grad_(False)
    optimizer = optimizer_class([input_img])

    def closure():  # the tutorial's closure
        with torch.no_grad():
            input_img.clamp_(0, 1)
        optimizer.zero_grad()
        model(input_img)
        style_score = 0
        content_score = 0
        for sl in style_losses:
            style_score += sl.loss
        for cl in content_losses:
            content_score += cl.loss
        style_score *= style_weight
        content_score *= content_weight
        loss = style_score + content_score
        loss.backward()
        return style_score + content_score

    return closure, optimizer, input_img, model


def test_style_transfer_with_adam_trains_as_in_eager():
    def adam_program():
        closure, optimizer, input_img, model = program(lambda params: torch.optim.Adam(params, lr=0.02))

        def step():  # the closure's body, then the optimizer's step
            loss = closure()
            optimizer.step()
            return loss

        return step, {"model": model, "input_img": input_img, "optimizer": optimizer}

    eager, s_eager = seeded(adam_program)
    lazy_fn, s_lazy = seeded(adam_program)
    lazy = lazyrt.torch.compile(lazy_fn)
    losses = []
    for k in range(STEPS):
        got, want = lazy(), eager()
        same_results(got, want, f"step {k}")
        same_state(s_lazy, s_eager, f"after step {k}:")
        close_grad = (s_lazy["input_img"].grad, s_eager["input_img"].grad)
        same_results(*close_grad, f"step {k} input_img.grad")
        losses.append(got.item())
    with torch.no_grad():  # the tutorial's last clamp
        s_lazy["input_img"].clamp_(0, 1)
        s_eager["input_img"].clamp_(0, 1)
    same_state(s_lazy, s_eager, "at the end:")
    assert losses[-1] < losses[0]
    assert lazy.captures == 1


def test_style_transfer_with_lbfgs_runs_in_eager_as_eager():
    # The tutorial's optimizer: LBFGS's step cannot be captured (it decides by values how many
    # evaluations to run), so the compiled step runs it in PyTorch eager, giving eager's image.
    closure, optimizer, input_img, model = seeded(lambda: program(torch.optim.LBFGS))
    closure_e, optimizer_e, input_img_e, _ = seeded(lambda: program(torch.optim.LBFGS))

    @lazyrt.torch.compile
    def step():
        return optimizer.step(closure)

    with pytest.warns(lazyrt.torch.GraphBreakWarning, match="LBFGS"):
        got = step()
    want = optimizer_e.step(closure_e)
    same_results(got, want, "the first loss")
    same_results(input_img.detach(), input_img_e.detach(), "the image after one step")
    assert step.captures == 0
