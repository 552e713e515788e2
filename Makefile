# Entry points: `make demo` and `make test` work from a fresh clone (as root, or with sudo).

ROOT   := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
BUILD  := $(ROOT)/build
# Debian's interpreter sees the Debian packages (numpy, torch, pytest); a python3 earlier
# on PATH (pyenv, venv) may not.
PYTHON := /usr/bin/python3
JOBS   ?= 2

# Prerequisites must run in order: setup before build before running anything.
.NOTPARALLEL:
.PHONY: setup build demo test clean

setup:
	@bash $(ROOT)/scripts/setup.sh

# Configure only once; later builds let CMake re-run itself when its inputs change.
$(BUILD)/build.ninja:
	cmake -S $(ROOT) -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release --no-warn-unused-cli \
	  -DPython3_EXECUTABLE=$(PYTHON) -DPython_EXECUTABLE=$(PYTHON) -DPYTHON_EXECUTABLE=$(PYTHON)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j$(JOBS)

demo: setup build
	$(BUILD)/examples/demo

test: setup build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

clean:
	rm -rf $(BUILD)
