"""Prints the importable PyTorch's package directory, version and C++ ABI flag, a line each
(read by cmake/Torch.cmake)."""
import os

import torch

print(os.path.dirname(torch.__file__))
print(torch.__version__)
print(int(torch.compiled_with_cxx11_abi()))
