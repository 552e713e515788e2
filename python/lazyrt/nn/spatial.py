"""Spatial layers without parameters, as torch.nn's: adaptive pooling, upsampling, pixel
shuffles, sliding blocks (Unfold / Fold) and padding by reflection or replication."""

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


class AdaptiveAvgPool1d(Module):
    """Averages [N, C, L] (or [C, L]) into output_size bins."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool1d(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


class _AdaptiveMaxPool(Module):
    def __init__(self, output_size, return_indices=False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def extra_repr(self):
        return f"output_size={self.output_size}"


class AdaptiveMaxPool1d(_AdaptiveMaxPool):
    """The maximum of each of output_size adaptive bins of [N, C, L] (or [C, L]), and with
    return_indices where it is."""

    def forward(self, input):
        return F.adaptive_max_pool1d(input, self.output_size, self.return_indices)


class AdaptiveMaxPool2d(_AdaptiveMaxPool):
    """The maximum of each of output_size adaptive bins of [N, C, H, W] (or [C, H, W]), and with
    return_indices where it is (h * W + w)."""

    def forward(self, input):
        return F.adaptive_max_pool2d(input, self.output_size, self.return_indices)


class PixelShuffle(Module):
    """[*, C * r^2, H, W] -> [*, C, H * r, W * r]."""

    def __init__(self, upscale_factor):
        super().__init__()
        self.upscale_factor = upscale_factor

    def forward(self, input):
        return F.pixel_shuffle(input, self.upscale_factor)

    def extra_repr(self):
        return f"upscale_factor={self.upscale_factor}"


class PixelUnshuffle(Module):
    """[*, C, H * r, W * r] -> [*, C * r^2, H, W]."""

    def __init__(self, downscale_factor):
        super().__init__()
        self.downscale_factor = downscale_factor

    def forward(self, input):
        return F.pixel_unshuffle(input, self.downscale_factor)

    def extra_repr(self):
        return f"downscale_factor={self.downscale_factor}"


class Unfold(Module):
    """The sliding blocks of [N, C, H, W] as columns [N, C * kH * kW, L] (F.unfold)."""

    def __init__(self, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride

    def forward(self, input):
        return F.unfold(input, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, dilation={self.dilation}, padding={self.padding}, "
                f"stride={self.stride}")


class Fold(Module):
    """Columns [N, C * kH * kW, L] summed into [N, C, *output_size] (F.fold)."""

    def __init__(self, output_size, kernel_size, dilation=1, padding=0, stride=1):
        super().__init__()
        self.output_size = output_size
        self.kernel_size, self.dilation, self.padding, self.stride = kernel_size, dilation, padding, stride

    def forward(self, input):
        return F.fold(input, self.output_size, self.kernel_size, self.dilation, self.padding, self.stride)

    def extra_repr(self):
        return (f"output_size={self.output_size}, kernel_size={self.kernel_size}, dilation={self.dilation}, "
                f"padding={self.padding}, stride={self.stride}")


class _ModePad(Module):
    _mode, _dims = "reflect", 1

    def __init__(self, padding):
        super().__init__()
        n = 2 * self._dims
        self.padding = (padding,) * n if isinstance(padding, int) else tuple(padding)
        if len(self.padding) != n:
            raise ValueError(f"{type(self).__name__}: padding must be an int or {n} values, got {padding!r}")

    def forward(self, input):
        return F.pad(input, self.padding, mode=self._mode)

    def extra_repr(self):
        return f"{self.padding}"


class ReflectionPad1d(_ModePad):
    """Pads the last dim by reflection (the edge not repeated): padding an int or (left, right)."""
    _mode, _dims = "reflect", 1


class ReflectionPad2d(_ModePad):
    """Pads the last two dims by reflection: padding an int or (left, right, top, bottom)."""
    _mode, _dims = "reflect", 2


class ReplicationPad1d(_ModePad):
    """Pads the last dim by repeating the edge: padding an int or (left, right)."""
    _mode, _dims = "replicate", 1


class ReplicationPad2d(_ModePad):
    """Pads the last two dims by repeating the edges: padding an int or (left, right, top, bottom)."""
    _mode, _dims = "replicate", 2
