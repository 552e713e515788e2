"""Run by run_install_test.cmake: the installed lazyrt package imports from the install prefix,
loads the installed library, and works. Arguments: the prefix and its library directory."""

import os
import sys

prefix, libdir = (os.path.realpath(p) for p in sys.argv[1:3])

import lazyrt as lr  # noqa: E402

package = os.path.realpath(lr.__file__)
assert package.startswith(prefix + os.sep), f"lazyrt imported from {package}, not from {prefix}"
with open("/proc/self/maps") as maps:
    libraries = {line.split()[-1] for line in maps if "liblazyrt.so" in line}
assert libraries, "liblazyrt.so is not loaded"
assert all(os.path.realpath(p).startswith(libdir + os.sep) for p in libraries), libraries

step = lr.compile_step(lambda x: (x * 2).sum(), (lr.ones(3),))
assert step(lr.tensor([1.0, 2.0, 3.0])).item() == 12.0
assert lr.nn.Linear(2, 2)(lr.ones(1, 2)).shape == (1, 2)
print("installed package OK:", package)
