// lazyrt._torch_C: what lazyrt.torch needs of PyTorch's C++ side (libtorch and its Python
// bindings). Built when CMake finds Torch; imported by lazyrt.torch only (after torch itself).
//
// bump_versions: a replay writes the new values of parameters, gradients and optimizer state
// into the torch tensors' own memory (lent with from_torch(_lend=True)). PyTorch counts every
// in-place change in the tensor's version counter, and autograd checks that counter before it
// uses a tensor it saved for backward; bumping it keeps that check: a graph recorded before a
// compiled step changed a parameter refuses to backpropagate, as it would in eager.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <string>
#include <vector>

namespace py = pybind11;

PYBIND11_MODULE(_torch_C, m) {
  m.doc() = "lazyrt.torch's use of PyTorch's C++ API";
  m.def(
      "bump_versions",
      [](const py::list& tensors, const std::vector<int64_t>& slots, const std::vector<int64_t>& skip) {
        size_t next_skip = 0;
        for (size_t j = 0; j < slots.size(); ++j) {
          if (next_skip < skip.size() && skip[next_skip] == static_cast<int64_t>(j)) {
            ++next_skip;
            continue;
          }
          py::handle h = tensors[slots[j]];
          if (!THPVariable_Check(h.ptr()))
            throw py::type_error("bump_versions: item " + std::to_string(slots[j]) + " is a " +
                                 std::string(py::str(py::type::handle_of(h).attr("__name__"))) +
                                 ", not a torch.Tensor");
          torch::autograd::impl::bump_version(THPVariable_Unpack(h.ptr()));
        }
      },
      py::arg("tensors"), py::arg("slots"), py::arg("skip"),
      "Counts one in-place change of tensors[s] for every s in slots, except the positions in "
      "skip (ascending).");
}
