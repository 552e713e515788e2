"""Spatial layers without parameters: adaptive average pooling and upsampling, as torch.nn's."""

from lazyrt.nn import functional as F
from lazyrt.nn.module import Module


class AdaptiveAvgPool2d(Module):
    """Averages [N, C, H, W] (or [C, H, W]) into output_size bins (an int, or a pair whose
    None entries keep that dim)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class Upsample(Module):
    """Resizes [N, C, H, W] to size, or by scale_factor, with mode 'nearest' or 'bilinear'."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        self.size = size
        self.scale_factor = float(scale_factor) if isinstance(scale_factor, (int, float)) else scale_factor
        self.mode = mode
        self.align_corners = align_corners
        self.recompute_scale_factor = recompute_scale_factor

    def forward(self, input):
        return F.interpolate(input, self.size, self.scale_factor, self.mode, self.align_corners,
                             self.recompute_scale_factor)

    def extra_repr(self):
        info = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{info}, mode={self.mode}"
