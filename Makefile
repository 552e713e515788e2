# Entry points: `make demo` and `make test` work from a fresh clone (as root, or with sudo).

ROOT   := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
BUILD  := $(ROOT)/build
# Debian's interpreter sees the Debian packages (numpy, torch, pytest); a python3 earlier
# on PATH (pyenv, venv) may not.
PYTHON := /usr/bin/python3
JOBS   ?= 2

# Prerequisites must run in order: setup before build before running anything.
.NOTPARALLEL:
.PHONY: setup build demo test bench clean

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

# Every benchmark binary in build/bench (*_bench) runs in turn; their markdown reports, one
# after another, become bench/results.md. Kept out of `make test`: timings are not tests.
bench: setup build
	@out=$(ROOT)/bench/results.md; tmp=$(BUILD)/bench/report.md; found=0; : > "$$out"; \
	for b in $(BUILD)/bench/*_bench; do \
	  [ -x "$$b" ] || continue; found=1; \
	  echo "running $$b"; \
	  "$$b" > "$$tmp" || { echo "$$b failed" >&2; exit 1; }; \
	  cat "$$tmp"; cat "$$tmp" >> "$$out"; echo >> "$$out"; \
	done; \
	[ $$found = 1 ] || { echo "no benchmark binaries in $(BUILD)/bench" >&2; exit 1; }; \
	echo "wrote $$out"

clean:
	rm -rf $(BUILD)
