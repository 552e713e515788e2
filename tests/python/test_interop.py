"""Sharing data with NumPy and PyTorch: no copies where the layout allows, and lazyrt never
writes into memory it shares."""

import gc

import numpy as np
import pytest
import torch

import lazyrt as lr
from conftest import assert_same


def test_numpy_is_a_read_only_view_of_the_tensor_data():
    x = lr.tensor([[1.0, 2.0], [3.0, 4.0]])
    a, b = x.numpy(), x.numpy()
    assert np.shares_memory(a, b), "no copy"
    assert a.ctypes.data == x.data_ptr()
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 5
    assert a.dtype == np.float32 and a.shape == (2, 2)


def test_numpy_syncs_a_pending_tensor():
    x = lr.tensor([1.0, 2.0]) * 3
    assert x.is_pending()
    np.testing.assert_array_equal(x.numpy(), [3.0, 6.0])
    assert not x.is_pending()


def test_a_numpy_view_keeps_its_values_through_in_place_updates_and_replays():
    w = lr.tensor([1.0, 2.0, 3.0])
    view = w.numpy()
    w.add_(1)
    lr.mark_step()
    np.testing.assert_array_equal(view, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(w.numpy(), [2.0, 3.0, 4.0])
    step = lr.compile_step(lambda x: w.add_(x).sum(), (lr.ones(3),))
    before = w.numpy()
    step(lr.ones(3))
    np.testing.assert_array_equal(before, [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(w.numpy(), [3.0, 4.0, 5.0])


def test_a_view_outlives_its_tensor():
    a = lr.tensor(np.arange(1000, dtype=np.float64)).numpy()
    gc.collect()
    assert a[999] == 999.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32, np.int64, np.bool_])
def test_from_numpy_shares_memory_and_keeps_the_dtype(dtype):
    a = (np.arange(12) % 3).reshape(3, 4).astype(dtype)
    x = lr.from_numpy(a)
    assert_same(x, torch.from_numpy(a))
    assert x.data_ptr() == a.ctypes.data, "no copy"
    assert np.shares_memory(x.numpy(), a)


def test_from_numpy_keeps_the_array_alive():
    a = np.arange(5, dtype=np.float32)
    x = lr.from_numpy(a)
    del a
    gc.collect()
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_from_numpy_never_writes_into_the_array():
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    a.flags.writeable = False  # lazyrt only reads shared memory: read-only arrays are fine
    x = lr.from_numpy(a)
    x.add_(10)
    lr.mark_step()
    assert x.tolist() == [11.0, 12.0, 13.0]
    np.testing.assert_array_equal(a, [1.0, 2.0, 3.0])


def test_from_numpy_shares_like_torch_from_numpy():
    a = np.array([1.0, 2.0], dtype=np.float32)
    x = lr.from_numpy(a)
    a[0] = 7.0
    assert x.tolist() == [7.0, 2.0], "writes into the array show in the tensor, as in torch"


def test_from_numpy_copies_other_layouts():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for b in [a.T, a[:, ::2], a.astype(">f4"), np.zeros((0, 3), np.float32)]:
        x = lr.from_numpy(b)
        np.testing.assert_array_equal(x.numpy(), b)
        assert x.shape == b.shape
    with pytest.raises(lr.Error, match="uint8"):
        lr.from_numpy(np.zeros(3, np.uint8))
    with pytest.raises(TypeError):
        lr.from_numpy([1, 2])


def test_array_protocol():
    x = lr.tensor([1, 2, 3])
    np.testing.assert_array_equal(np.asarray(x), [1, 2, 3])
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert np.add(x, 1).tolist() == [2, 3, 4]


def test_bfloat16_has_no_numpy_type():
    with pytest.raises(lr.Error, match="bfloat16"):
        lr.tensor([1.0], dtype=lr.bfloat16).numpy()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int64, torch.bool])
def test_from_torch_and_to_torch_share_memory(dtype):
    t = (torch.arange(12) % 3).reshape(3, 4).to(dtype)
    x = lr.from_torch(t)
    assert_same(x, t)
    assert x.data_ptr() == t.data_ptr(), "from_torch: no copy"
    back = lr.to_torch(x)
    assert back.dtype == dtype and torch.equal(back, t)
    assert back.data_ptr() == x.data_ptr(), "to_torch: no copy"
    y = lr.to_torch(x * 2 if dtype != torch.bool else ~x)
    assert y.shape == (3, 4)


def test_from_torch_handles_grad_and_non_contiguous_tensors():
    p = torch.nn.Parameter(torch.randn(3, 4))
    x = lr.from_torch(p)
    assert not x.requires_grad
    assert_same(x, p.detach())
    nc = p.detach().t()
    assert_same(lr.from_torch(nc), nc)
    with pytest.raises(TypeError):
        lr.from_torch(np.zeros(2))
    with pytest.raises(lr.Error):
        lr.from_torch(torch.zeros(2, dtype=torch.uint8))


def test_empty_torch_tensors_are_shared_whatever_their_strides():
    # torch exports empty tensors with strides no row-major layout has ((3, 0): (1, 1)).
    for shape in [(0, 3, 6, 6), (3, 0), (0,), (2, 0, 4)]:
        t = torch.randn(*shape)
        x = lr.from_torch(t)
        assert tuple(x.shape) == shape
        assert_same(x, t)
        assert tuple(lr.from_dlpack(t).shape) == shape


def test_from_torch_keeps_the_torch_storage_alive():
    x = lr.from_torch(torch.arange(4.0))
    gc.collect()
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_dlpack_protocol():
    x = lr.tensor([[1.0, 2.0]])
    t = torch.utils.dlpack.from_dlpack(x)
    assert torch.equal(t, torch.tensor([[1.0, 2.0]])) and t.data_ptr() == x.data_ptr()
    n = np.from_dlpack(x)
    assert n.tolist() == [[1.0, 2.0]]
    assert x.__dlpack_device__() == (1, 0)
    y = lr.from_dlpack(torch.tensor([3, 4]))
    assert y.dtype is lr.int64 and y.tolist() == [3, 4]
    z = lr.from_dlpack(np.array([1.5, 2.5]))
    assert z.dtype is lr.float64 and z.tolist() == [1.5, 2.5]
    with pytest.raises(lr.Error, match="bool"):
        (x > 1).__dlpack__()


def test_as_tensor_shares_where_it_can():
    a = np.ones(3, np.float32)
    assert lr.as_tensor(a).data_ptr() == a.ctypes.data
    t = torch.ones(3)
    assert lr.as_tensor(t).data_ptr() == t.data_ptr()
    x = lr.tensor([1.0])
    assert lr.as_tensor(x) is x
    assert lr.as_tensor([1, 2]).dtype is lr.int64
    assert lr.as_tensor(a, dtype=lr.float64).dtype is lr.float64


def test_memory_accounting_counts_shared_arrays():
    lr.mark_step()
    gc.collect()
    before = lr.debug.live_memory_bytes()
    x = lr.from_numpy(np.zeros(1000, np.float64))
    assert lr.debug.live_memory_bytes() == before + 8000
    del x
    gc.collect()
    assert lr.debug.live_memory_bytes() == before
