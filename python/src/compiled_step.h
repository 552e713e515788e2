// The Python face of a compiled step (lazyrt.compile_step's result), shared by lazyrt._C, which
// defines and binds it (replay.cpp), and lazyrt._torch_C, whose replay of captured PyTorch
// steps calls the C++ step directly (both modules link liblazyrt and share pybind11's type
// registry, so either can take the other's objects).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include <lazyrt/lazyrt.h>

namespace lazyrt::python {

/// The Python step function, called by the C++ step when it traces.
struct StepFunction {
  pybind11::object fn;
  bool single = false;  // fn returned a lone tensor rather than a tuple
};

class PyCompiledStep {
 public:
  PyCompiledStep(std::shared_ptr<StepFunction> fn, CompiledStep step)
      : fn_(std::move(fn)), step_(std::move(step)) {}

  /// One step on lazyrt tensors, without the GIL (a retrace takes it back); the results are the
  /// caller's. Whether the step function returned a lone tensor: single().
  std::vector<Tensor> run(const std::vector<Tensor>& in) {
    pybind11::gil_scoped_release release;
    return step_(in);
  }
  bool single() const { return fn_->single; }
  int traces() const { return step_.traces(); }
  CompiledStep& step() { return step_; }

 private:
  std::shared_ptr<StepFunction> fn_;
  CompiledStep step_;
};

}  // namespace lazyrt::python
