"""DistributedSampler: each rank's share of a dataset's indices, as torch.utils.data's."""

import numpy as _np


class DistributedSampler:
    """The indices of rank ``rank``'s share of a dataset of ``len(dataset)`` items (or an int):
    shuffled by ``seed + epoch`` (the same permutation on every rank; ``set_epoch`` changes it)
    unless ``shuffle`` is False, padded by repeating the first indices (or, with ``drop_last``,
    cut) to a multiple of ``num_replicas``, then every ``num_replicas``-th from ``rank``. The
    ranks' shares are disjoint and together cover the dataset. ``num_replicas`` and ``rank``
    default to the process group's."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        from lazyrt import distributed as _dist
        from lazyrt import _C
        if num_replicas is None:
            num_replicas = _dist.get_world_size()
        if rank is None:
            rank = _dist.get_rank()
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise _C.Error(f"DistributedSampler: rank {rank} is not in [0, {num_replicas})")
        self.size = dataset if isinstance(dataset, int) else len(dataset)
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, int(seed), drop_last, 0
        if drop_last:
            self.num_samples = self.size // self.num_replicas
        else:
            self.num_samples = -(-self.size // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch):
        self.epoch = int(epoch)

    def indices(self):
        if self.shuffle:
            order = _np.random.default_rng(self.seed + self.epoch).permutation(self.size)
        else:
            order = _np.arange(self.size)
        if self.total_size > self.size:
            reps = -(-self.total_size // max(self.size, 1))
            order = _np.concatenate([order] * reps)[:self.total_size]
        else:
            order = order[:self.total_size]
        return order[self.rank:self.total_size:self.num_replicas]

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples
