// The lazyrt device's place in PyTorch's C++ side: PyTorch's PrivateUse1 device type (renamed
// "lazyrt" by lazyrt.torch._device) gets a device guard and accelerator hooks, which PyTorch asks
// for before it moves a tensor to a device or runs a backward pass over its tensors, and one
// boxed kernel for every op that reaches the PrivateUse1 key: factories (which have no tensor
// to dispatch on), and ops on device values while PyTorch has the Python key turned off (as
// torch.tensor(..., device=) does), which would otherwise miss the values' __torch_dispatch__.
// It hands the op, by name, and its arguments to the Python dispatcher lazyrt.torch._device sets
// (set_device_dispatcher). The device has one index (lazyrt:0), no streams and no events.
// Registered when lazyrt._torch_C is loaded.
#include <pybind11/pybind11.h>

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <string>

#include "torch_device.h"

namespace py = pybind11;

namespace {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

c10::Device the_device() { return c10::Device(kDevice, 0); }

struct LazyrtGuard final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kDevice; }
  c10::Device exchangeDevice(c10::Device d) const override {
    check(d);
    return the_device();
  }
  c10::Device getDevice() const override { return the_device(); }
  void setDevice(c10::Device d) const override { check(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, the_device());
  }
  c10::Stream getNewStream(c10::Device, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, the_device());
  }
  c10::Stream exchangeStream(c10::Stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, the_device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  void record(void**, const c10::Stream&, const c10::DeviceIndex, const c10::EventFlag) const override {
    TORCH_CHECK(false, "the lazyrt device has no events");
  }
  void block(void*, const c10::Stream&) const override {
    TORCH_CHECK(false, "the lazyrt device has no events");
  }
  bool queryEvent(void*) const override { return true; }
  void destroyEvent(void*, const c10::DeviceIndex) const noexcept override {}
  bool queryStream(const c10::Stream&) const override { return true; }
  void synchronizeStream(const c10::Stream&) const override {}

 private:
  static void check(c10::Device d) {
    TORCH_CHECK(d.type() == kDevice && d.index() <= 0, "lazyrt has one device, lazyrt:0; got ", d);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, LazyrtGuard);

struct LazyrtHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
  bool isPinnedPtr(const void*) const override { return false; }
};

const bool registered = [] {
  static LazyrtHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

py::object* dispatcher = nullptr;  // set once by Python, never freed (outlives the interpreter's teardown)

void to_python(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  py::gil_scoped_acquire gil;
  TORCH_CHECK(dispatcher != nullptr, "the lazyrt device: ", schema.name(),
              " reached the device before lazyrt.torch registered it");
  py::list args;
  py::dict kwargs;
  auto arguments = torch::jit::last(*stack, n);
  for (size_t i = 0; i < n; ++i) {
    const c10::Argument& a = schema.arguments()[i];
    py::object v = torch::jit::toPyObject(arguments[i]);
    if (a.kwarg_only())
      kwargs[py::str(a.name())] = v;
    else
      args.append(v);
  }
  torch::jit::drop(*stack, n);
  std::string name = schema.name();
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  py::object out;
  try {
    out = (*dispatcher)(name, py::tuple(args), kwargs);
  } catch (py::error_already_set& e) {
    throw std::runtime_error(e.what());
  }
  const auto& returns = schema.returns();
  if (returns.size() == 1) {
    stack->push_back(torch::jit::toIValue(out, returns[0].type()));
  } else if (!returns.empty()) {
    py::tuple items = py::reinterpret_borrow<py::tuple>(out);
    for (size_t i = 0; i < returns.size(); ++i) stack->push_back(torch::jit::toIValue(items[i], returns[i].type()));
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&to_python>()); }

// Factories whose composite kernels would build their result through out= ops: the device makes
// them itself.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"empty.memory_format", "empty_strided", "zeros", "ones", "full", "arange",
                           "arange.start", "arange.start_step", "scalar_tensor", "linspace", "eye", "eye.m", "rand",
                           "randn", "randint", "randint.low", "randperm", "tril_indices", "triu_indices"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&to_python>());
}

// torch.autocast("lazyrt"): PyTorch's autocast policy for devices (the op lists it keeps for
// backends to share: matrix products and convolutions in the lower precision, reductions,
// norms and losses in float32, mixed inputs promoted), registered on the device's autocast key
// with PyTorch's own kernels; every other op falls through. Device tensors are cast by
// _to_copy, which the device records as lazyrt casts.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

namespace at::autocast {  // the names PyTorch's op lists use unqualified
namespace {
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define LAZYRT_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define LAZYRT_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define LAZYRT_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define LAZYRT_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(LAZYRT_LOWER_PRECISION_FP)
  AT_FORALL_FP32(LAZYRT_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(LAZYRT_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(LAZYRT_PROMOTE)
#undef LAZYRT_LOWER_PRECISION_FP
#undef LAZYRT_FP32
#undef LAZYRT_FP32_SET_OPT_DTYPE
#undef LAZYRT_PROMOTE
}
}  // namespace
}  // namespace at::autocast

void lazyrt_torch::set_device_dispatcher(py::object fn) {
  if (dispatcher == nullptr) dispatcher = new py::object();
  *dispatcher = std::move(fn);
}

void lazyrt_torch::set_device_shape(const at::Tensor& t, c10::IntArrayRef sizes) {
  TORCH_CHECK(t.device().type() == kDevice, "set_device_shape: expected a tensor on the lazyrt device, got one on ",
              t.device());
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
}
