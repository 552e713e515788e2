// Sharing tensor data with NumPy and PyTorch without copies.
//
// lazyrt -> NumPy (t.numpy()): a read-only array over the tensor's buffer, holding the buffer.
//   A lazyrt buffer never changes once it holds a value, except that a replay or an in-place
//   sync may write a new value into a buffer whose only owner is the tensor being updated. The
//   array holds the buffer, so the tensor is no longer its only owner and nothing is ever
//   written into it while the array lives: the array shows the value at the time of the call.
//   It is read-only because other tensors (detach(), cached constants) may share the buffer.
// NumPy / DLPack -> lazyrt (from_numpy, from_dlpack): the tensor adopts the memory and holds
//   its owner; lazyrt only reads adopted memory (runtime/buffer.h). Writing into the array
//   afterwards changes the tensor's value, as torch.from_numpy does.
// lazyrt -> DLPack (t.__dlpack__()): the consumer (torch.from_dlpack) gets the buffer's memory
//   and holds the buffer. DLPack has no read-only flag: the consumer must not write into it.
#include <algorithm>
#include <pybind11/numpy.h>

#include "bindings.h"

namespace lazyrt::python {

namespace {


// ---- DLPack (the stable C ABI of dlpack.h v0.6+) -------------------------------------------
struct DLDevice {
  int32_t device_type;  // kDLCPU = 1
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
constexpr int32_t kDLCPU = 1;

// Runs f with the GIL held, unless the interpreter is gone (then what f would release leaks,
// which is all one can do at exit). Buffers may die on any thread, with or without the GIL.
template <class F>
void with_gil(F&& f) {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  f();
}

std::optional<DType> dtype_of_numpy(const py::dtype& dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 8) return DType::f64;
  if (kind == 'f' && size == 2) return DType::f16;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  if (kind == 'b' && size == 1) return DType::b8;
  return std::nullopt;
}

const char* numpy_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::b8: return "bool";
    case DType::bf16: break;
  }
  throw Error("numpy: NumPy has no bfloat16; convert the tensor first, e.g. t.to(lazyrt.float32).numpy()");
}

DType checked_dtype(const py::array& a, const char* op) {
  std::optional<DType> d = dtype_of_numpy(a.dtype());
  if (!d)
    throw Error(std::string(op) + ": NumPy dtype " + std::string(py::str(a.dtype())) +
                " has no lazyrt counterpart (float16/32/64, int32/64 and bool do)");
  return *d;
}

Shape shape_of(const py::array& a) {
  Shape s;
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s.push_back(a.shape(i));
  return s;
}

Tensor copy_of(const py::array& a, const char* op) {
  const DType d = checked_dtype(a, op);
  // asarray (unlike ascontiguousarray) keeps 0-d arrays 0-d.
  py::array c = py::module_::import("numpy").attr("asarray")(a, py::dtype(numpy_name(d)), py::arg("order") = "C");
  return from_blob(c.data(), shape_of(c), d);
}

// The array's memory, shared, when its layout is lazyrt's (C order, aligned, native order).
std::optional<Tensor> share(const py::array& a, DType d) {
  const int flags = a.flags();
  const bool native = a.dtype().attr("isnative").cast<bool>();
  if (!(flags & py::array::c_style) || !(flags & py::detail::npy_api::NPY_ARRAY_ALIGNED_) || !native ||
      a.nbytes() == 0)
    return std::nullopt;
  auto* owner = new py::object(py::reinterpret_borrow<py::object>(a));
  return from_blob(const_cast<void*>(a.data()), shape_of(a), d, [owner] { with_gil([owner] { delete owner; }); });
}

Tensor from_numpy(py::handle h) {
  if (!py::isinstance<py::array>(h))
    throw py::type_error("from_numpy: expected a numpy.ndarray, got " +
                         std::string(py::str(py::type::handle_of(h).attr("__name__"))));
  auto a = py::reinterpret_borrow<py::array>(h);
  const DType d = checked_dtype(a, "from_numpy");
  if (std::optional<Tensor> t = share(a, d)) return *t;
  return copy_of(a, "from_numpy");
}

py::array numpy_view(const Tensor& t) {
  const char* name = numpy_name(t.dtype());
  std::shared_ptr<const void> host = host_released(t);
  const void* data = host.get();
  py::capsule base(new std::shared_ptr<const void>(std::move(host)),
                   [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  py::array a(py::dtype(name), shape, {}, data, base);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

// ---- DLPack ----------------------------------------------------------------------------------

struct Exported {
  DLManagedTensor managed{};
  std::shared_ptr<const void> host;
  std::vector<int64_t> shape, strides;
};

void capsule_destructor(PyObject* capsule) {
  // A capsule nobody consumed still owns its tensor.
  if (PyCapsule_IsValid(capsule, "used_dltensor")) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m) m->deleter(m);
  else PyErr_Clear();
  PyErr_Restore(type, value, traceback);
}

py::capsule to_dlpack(const Tensor& t, bool bool_as_uint8) {
  DLDataType dt{};
  switch (t.dtype()) {
    case DType::f32: dt = {2, 32, 1}; break;
    case DType::f64: dt = {2, 64, 1}; break;
    case DType::f16: dt = {2, 16, 1}; break;
    case DType::bf16: dt = {4, 16, 1}; break;
    case DType::i32: dt = {0, 32, 1}; break;
    case DType::i64: dt = {0, 64, 1}; break;
    case DType::b8:
      if (!bool_as_uint8)
        throw Error("__dlpack__: DLPack (as PyTorch 1.13 and NumPy 1.24 read it) has no bool type; "
                    "use lazyrt.to_torch(t) or t.numpy()");
      dt = {1, 8, 1};
      break;
  }
  auto* e = new Exported();
  e->host = host_released(t);
  e->shape = t.shape();
  e->strides.assign(e->shape.size(), 1);
  for (size_t i = e->shape.size(); i-- > 1;) e->strides[i - 1] = e->strides[i] * e->shape[i];
  DLTensor& d = e->managed.dl_tensor;
  d.data = const_cast<void*>(e->host.get());
  d.device = {kDLCPU, 0};
  d.ndim = static_cast<int32_t>(e->shape.size());
  d.dtype = dt;
  d.shape = e->shape.data();
  d.strides = e->strides.data();
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); };
  return py::reinterpret_steal<py::capsule>(PyCapsule_New(&e->managed, "dltensor", capsule_destructor));
}

Tensor from_dlpack(py::object obj, bool uint8_as_bool) {
  py::object capsule = obj;
  if (!PyCapsule_CheckExact(obj.ptr())) {
    if (!py::hasattr(obj, "__dlpack__"))
      throw py::type_error("from_dlpack: expected an object with __dlpack__ or a DLPack capsule");
    capsule = obj.attr("__dlpack__")();
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  if (!m) throw py::error_already_set();  // a used capsule, or not a DLPack one
  const DLTensor& dl = m->dl_tensor;
  if (dl.device.device_type != kDLCPU)
    throw Error("from_dlpack: the tensor is not in CPU memory (DLPack device type " +
                std::to_string(dl.device.device_type) + "); copy it to the CPU first");
  std::optional<DType> d;
  if (dl.dtype.lanes == 1) {
    const int code = dl.dtype.code, bits = dl.dtype.bits;
    if (code == 2 && bits == 32) d = DType::f32;
    if (code == 2 && bits == 64) d = DType::f64;
    if (code == 2 && bits == 16) d = DType::f16;
    if (code == 4 && bits == 16) d = DType::bf16;
    if (code == 0 && bits == 32) d = DType::i32;
    if (code == 0 && bits == 64) d = DType::i64;
    if ((code == 6 && bits == 8) || (code == 1 && bits == 8 && uint8_as_bool)) d = DType::b8;
  }
  if (!d)
    throw Error("from_dlpack: DLPack dtype (code " + std::to_string(dl.dtype.code) + ", bits " +
                std::to_string(dl.dtype.bits) + ", lanes " + std::to_string(dl.dtype.lanes) +
                ") has no lazyrt counterpart");
  Shape shape(dl.shape, dl.shape + dl.ndim);
  // An empty tensor addresses nothing: any strides are compact (PyTorch exports some odd ones).
  if (dl.strides && std::find(shape.begin(), shape.end(), 0) == shape.end()) {
    int64_t expect = 1;
    for (int32_t i = dl.ndim; i-- > 0;) {
      if (shape[i] != 1 && dl.strides[i] != expect)
        throw Error("from_dlpack: only compact row-major tensors can be shared; make it contiguous first");
      expect *= shape[i];
    }
  }
  char* data = static_cast<char*>(dl.data) + dl.byte_offset;
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  if (shape_numel(shape) == 0) {
    m->deleter(m);  // with the GIL held, as here
    return from_blob(nullptr, std::move(shape), *d, nullptr);
  }
  return from_blob(data, std::move(shape), *d, [m] { with_gil([m] { m->deleter(m); }); });
}

}  // namespace

void bind_interop(py::module_& m, py::class_<Tensor>& cls) {
  m.def("from_numpy", &from_numpy, py::arg("ndarray"),
        "A tensor sharing the array's memory where its layout allows (C order, aligned, a dtype "
        "lazyrt has), else a copy. lazyrt never writes into shared memory.");
  m.def("_tensor_from_array", [](const py::array& a) { return copy_of(a, "tensor"); },
        "A tensor holding a copy of the array's values.");
  m.def("_scalar_data", [](double value, DType dtype) {
        // The number as the dtype's kernels round it (a Python float is a double).
        if (dtype == DType::f64) return from_blob(&value, {}, dtype);
        if (dtype != DType::f32)
          throw Error(std::string("_scalar_data: expected dtype f32 or f64, got ") + dtype_name(dtype));
        const float f = static_cast<float>(value);
        return from_blob(&f, {}, dtype);
      }, py::arg("value"), py::arg("dtype"),
      "A 0-dim f32 or f64 tensor holding the number (data, as a tensor made from an array is).");
  m.def("from_dlpack", [](py::object o) { return from_dlpack(std::move(o), false); }, py::arg("ext_tensor"),
        "A tensor sharing the memory of a DLPack-capable CPU tensor (or capsule).");
  m.def("_from_dlpack", [](py::object o, bool uint8_as_bool) { return from_dlpack(std::move(o), uint8_as_bool); },
        py::arg("ext_tensor"), py::arg("uint8_as_bool"));
  m.def("_to_dlpack", &to_dlpack, py::arg("tensor"), py::arg("bool_as_uint8"));
  cls.def("numpy", &numpy_view,
          "A read-only NumPy array over the tensor's data, without a copy (syncs the tensor).")
      .def("__array__", [](const Tensor& t, py::object dtype) -> py::object {
        py::array a = numpy_view(t);
        if (dtype.is_none()) return a;
        return a.attr("astype")(dtype);
      }, py::arg("dtype") = py::none())
      .def("__dlpack__", [](const Tensor& t, py::object stream) { return to_dlpack(t, false); },
           py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const Tensor&) { return py::make_tuple(kDLCPU, 0); });
}

}  // namespace lazyrt::python
