"""Normalization layers with state: BatchNorm1d/2d, InstanceNorm1d/2d and GroupNorm, as torch.nn's.

BatchNorm keeps its running statistics in buffers (running_mean, running_var,
num_batches_tracked) that training updates in place, so a compiled step (compile_step) writes
them back on every replay like any other state. Switching between train() and eval() changes
which statistics normalize: compiled steps retrace.
"""

import warnings

from lazyrt import _C
from lazyrt._autograd import no_grad
from lazyrt.nn import functional as F
from lazyrt.nn.module import Module, Parameter


class _BatchNorm(Module):
    _expected_dims = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 device=None, dtype=None):
        super().__init__()
        if num_features <= 0:
            raise _C.Error(f"{type(self).__name__}: num_features must be positive, got {num_features}")
        dtype = dtype or _C.float32
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(_C.ones(num_features, dtype=dtype))
            self.bias = Parameter(_C.zeros(num_features, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", _C.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", _C.ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", _C.zeros((), dtype=_C.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self):
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.copy_(_C.ones_like(self.running_var))
                self.num_batches_tracked.zero_()

    def _check_input_dim(self, input):
        if input.dim() not in self._expected_dims:
            want = " or ".join(f"{d}D" for d in self._expected_dims)
            raise ValueError(f"{type(self).__name__}: expected {want} input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if input.shape[1] != self.num_features:
            raise _C.Error(f"{type(self).__name__}: expected {self.num_features} channels in dim 1, "
                           f"got input of shape {tuple(input.shape)}")
        tracking = self.training and self.track_running_stats
        if tracking:
            with no_grad():
                self.num_batches_tracked.add_(1)
        use_batch_stats = self.training or self.running_mean is None
        # Running statistics are read in eval mode and updated while tracking in training;
        # momentum=None is a cumulative average, its count read from num_batches_tracked when
        # the graph runs (never on the host, so replays stay exact).
        read_running = not self.training or self.track_running_stats
        return _C._nn.batch_norm(input, self.running_mean if read_running else None,
                                 self.running_var if read_running else None, self.weight, self.bias,
                                 use_batch_stats, self.momentum, self.eps,
                                 self.num_batches_tracked if tracking else None)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Over [N, C] or [N, C, L]."""
    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Over [N, C, H, W]."""
    _expected_dims = (4,)


class _InstanceNorm(_BatchNorm):
    """Per-sample, per-channel normalization (F.instance_norm), with PyTorch's defaults: no
    affine parameters, no running statistics. With track_running_stats, training updates the
    running statistics and eval() normalizes by them. Unbatched inputs (one dim fewer) are
    taken as a batch of one. Same parameters and buffers as BatchNorm, as in PyTorch."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False,
                 device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def forward(self, input):
        self._check_input_dim(input)
        feature_dim = input.dim() - (self._expected_dims[1] - 1)
        if input.shape[feature_dim] != self.num_features:
            if self.affine:
                raise ValueError(f"expected input's size at dim={feature_dim} to match num_features "
                                 f"({self.num_features}), but got: {input.shape[feature_dim]}.")
            warnings.warn(f"input's size at dim={feature_dim} does not match num_features. You can silence this "
                          "warning by not passing in num_features, which is not used because affine=False",
                          stacklevel=2)
        unbatched = input.dim() == self._expected_dims[0]
        x = _C.unsqueeze(input, 0) if unbatched else input
        use_input_stats = self.training or not self.track_running_stats
        out = F.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias, use_input_stats,
                              0.1 if self.momentum is None else self.momentum, self.eps)
        return _C.squeeze(out, 0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """Over [N, C, L] or [C, L]."""
    _expected_dims = (2, 3)


class InstanceNorm2d(_InstanceNorm):
    """Over [N, C, H, W] or [C, H, W]."""
    _expected_dims = (3, 4)


class GroupNorm(Module):
    """Normalizes groups of num_channels / num_groups channels of [N, C, *]."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True, device=None, dtype=None):
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups != 0:
            raise ValueError(f"GroupNorm: num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
        dtype = dtype or _C.float32
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = Parameter(_C.ones(num_channels, dtype=dtype))
            self.bias = Parameter(_C.zeros(num_channels, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
