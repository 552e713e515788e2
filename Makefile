# Entry points: `make demo` and `make test` work from a fresh clone (as root, or with sudo).

ROOT   := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
BUILD  := $(ROOT)/build
FUZZ_BUILD := $(ROOT)/build-fuzz
ASAN_BUILD := $(ROOT)/build-asan
TSAN_BUILD := $(ROOT)/build-tsan
# The project's Python environment, made by scripts/setup.sh from Debian's python3 and
# requirements.txt (PyTorch 2.9 from PyPI, NumPy, pytest, ...): the build, the tests and the
# benchmarks all use its interpreter.
VENV   ?= $(ROOT)/.venv
PYTHON := $(VENV)/bin/python
JOBS   ?= 2
# Each target of `make fuzz` stops after this many inputs or this many seconds, whichever
# comes first. On two cores graph_fuzz takes about 1,650 s for a million inputs from an empty
# corpus, entry_parser_fuzz about 450 s: the time limit is a guard against a stuck run.
FUZZ_RUNS    ?= 1000000
FUZZ_SECONDS ?= 3600
# `make fuzz-replay`: random programs of this many actions, from this seed on.
FUZZ_REPLAY_PROGRAMS ?= 10000
FUZZ_REPLAY_ACTIONS  ?= 12
FUZZ_REPLAY_SEED     ?= 0
# `make fuzz-frontend`: random PyTorch programs for lazyrt.torch.compile (or, with mode device,
# on the lazyrt device), from this seed on.
FUZZ_FRONTEND_PROGRAMS ?= 10000
FUZZ_FRONTEND_SEED     ?= 0
FUZZ_FRONTEND_MODE     ?= lazyrt
# `make fuzz-jit`: random programs for generated code against the interpreter, from this seed on.
FUZZ_JIT_PROGRAMS ?= 3000
FUZZ_JIT_SEED     ?= 1000

# `make stress-threads`: rounds of work on several threads at once, each compared bit for bit
# with the same work done sequentially, from seed STRESS_SEED on.
ROUNDS      ?= 1000
STRESS_SEED ?= 1
# Under ThreadSanitizer (`make check-tsan`) it runs this many rounds, of shorter runs.
TSAN_STRESS_ROUNDS ?= 24

# Prerequisites must run in order: setup before build before running anything.
.NOTPARALLEL:
.PHONY: setup build demo demo-dp test bench fuzz fuzz-replay fuzz-frontend fuzz-jit stress-threads check-reference check-asan check-tsan clean

setup:
	@LAZYRT_VENV=$(VENV) bash $(ROOT)/scripts/setup.sh

# Configure only once; later builds let CMake re-run itself when its inputs change.
$(BUILD)/build.ninja:
	cmake -S $(ROOT) -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release --no-warn-unused-cli \
	  -DPython3_EXECUTABLE=$(PYTHON) -DPython_EXECUTABLE=$(PYTHON) -DPYTHON_EXECUTABLE=$(PYTHON)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j$(JOBS)

demo: setup build
	$(BUILD)/examples/demo

# The digits MLP of `make demo`, trained data-parallel on 2 processes (examples/distributed):
# the gradients averaged inside the replayed step, the same held-out accuracy as one process.
demo-dp: setup build
	PYTHONPATH=$(BUILD)/python PYTHONDONTWRITEBYTECODE=1 $(PYTHON) -m lazyrt.distributed.run --nproc 2 \
	  $(ROOT)/examples/distributed/digits_dp.py

test: setup build
	ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS)

# bench/suite.py runs every benchmark binary of build/bench (*_bench) and the Python workloads
# side by side with PyTorch, and writes bench/results.md and bench/plots/*.png. It builds only
# what the benchmarks run. Kept out of `make test`: timings are not tests. BENCH_THREADS: the
# thread count of every peer; at another count than 1 the report goes to
# bench/results-<n>-threads.md, without plots.
BENCH_THREADS ?= 1
BENCH_OUT = $(if $(filter 1,$(BENCH_THREADS)),--out $(ROOT)/bench/results.md --plots $(ROOT)/bench/plots,--out $(ROOT)/bench/results-$(BENCH_THREADS)-threads.md)
# The peers of bench/peers.py (PyTorch/XLA, JAX) are installed here only, never by `make test`:
# bench/install_peers.sh puts bench/requirements.txt into $(VENV) and bench/requirements-jax.txt
# into $(JAX_VENV) (jax 0.10 needs numpy>=2, the project 1.26.4); nothing to do when both are up
# to date, and a peer that cannot be installed gets a row saying why instead of failing the run.
JAX_VENV ?= $(VENV)-jax
bench: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j$(JOBS) --target lazyrt_benchmarks
	bash $(ROOT)/bench/install_peers.sh $(VENV) $(JAX_VENV)
	PYTHONPATH=$(BUILD)/python PYTHONDONTWRITEBYTECODE=1 LAZYRT_BENCH_JAX_VENV=$(JAX_VENV) $(PYTHON) \
	  $(ROOT)/bench/suite.py --build $(BUILD) --threads $(BENCH_THREADS) $(BENCH_OUT)

# Two libFuzzer targets, with ASan and UBSan, in their own build tree (clang, everything
# instrumented), one after the other, each for FUZZ_RUNS inputs or FUZZ_SECONDS, whichever
# comes first:
# - entry_parser_fuzz, the persistent cache's entry parser, from seed entries the cache itself
#   writes (build-fuzz/seeds); new inputs accumulate in build-fuzz/corpus, crashes go to
#   build-fuzz/artifacts/.
# - graph_fuzz, random programs of ops through the public API, where the only exception
#   allowed out is lazyrt::Error; from an empty corpus, build-fuzz/graph-corpus, crashes to
#   build-fuzz/graph-artifacts/. ASan's allocator returns null for requests beyond its limit,
#   as malloc does, so a huge allocation is lazyrt's 'out of memory' error, not an abort.
# Replay a crash with `build-fuzz/fuzz/entry_parser_fuzz FILE` (or graph_fuzz FILE).
fuzz:
	cmake -S $(ROOT) -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DLAZYRT_BUILD_FUZZ=ON \
	  -DLAZYRT_BUILD_TESTS=OFF -DLAZYRT_BUILD_EXAMPLES=OFF -DLAZYRT_BUILD_BENCH=OFF -DLAZYRT_BUILD_PYTHON=OFF
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target entry_parser_fuzz make_entry_seeds graph_fuzz
	rm -rf $(FUZZ_BUILD)/seeds
	$(FUZZ_BUILD)/fuzz/make_entry_seeds $(FUZZ_BUILD)/seeds
	mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/artifacts
	$(FUZZ_BUILD)/fuzz/entry_parser_fuzz -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS) \
	  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	  -artifact_prefix=$(FUZZ_BUILD)/artifacts/ $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/seeds
	mkdir -p $(FUZZ_BUILD)/graph-corpus $(FUZZ_BUILD)/graph-artifacts
	ASAN_OPTIONS=allocator_may_return_null=1 $(FUZZ_BUILD)/fuzz/graph_fuzz -runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS) \
	  -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	  -artifact_prefix=$(FUZZ_BUILD)/graph-artifacts/ $(FUZZ_BUILD)/graph-corpus

# Randomized differential test of cached-graph replay (tests/python/replay_fuzz.py): seeded
# programs of user actions run with compile_step / run_cached_graph and with plain traced
# steps, compared, and each kind of failure shrunk to its shortest program. Rerun one with
# `PYTHONPATH=build/python python3 tests/python/replay_fuzz.py --seed S --only I,J,...`.
# The C++ side (tests/cpp/replay/replay_fuzz_test.cpp: autocast, GradScaler and non-finite
# steps among the actions) runs as many programs.
fuzz-replay: setup build
	PYTHONPATH=$(BUILD)/python PYTHONDONTWRITEBYTECODE=1 $(PYTHON) $(ROOT)/tests/python/replay_fuzz.py \
	  --programs $(FUZZ_REPLAY_PROGRAMS) --actions $(FUZZ_REPLAY_ACTIONS) --seed $(FUZZ_REPLAY_SEED)
	LAZYRT_REPLAY_FUZZ_PROGRAMS=$(FUZZ_REPLAY_PROGRAMS) LAZYRT_REPLAY_FUZZ_SEED=$$(( $(FUZZ_REPLAY_SEED) + 1 )) \
	  $(BUILD)/tests/lazyrt_replay_tests --gtest_filter='ReplayFuzz.*'

# Randomized differential test of the PyTorch frontend (tests/python/frontend_fuzz.py): seeded
# PyTorch training programs (a model from a zoo of modules and aten ops, some without a lowering,
# views and in-place edits; an optimizer or a hand-written update, schedulers, clipping, autocast,
# modes, batch sizes, Python values, tensors and functions the step reads changed between calls)
# run in eager and through
# lazyrt.torch.compile, compared after every call; a refusal is counted, a difference is shrunk
# and printed; FUZZ_FRONTEND_MODE=device runs them on the lazyrt device instead (sync() after
# every call). Rerun one with `PYTHONPATH=build/python .venv/bin/python
# tests/python/frontend_fuzz.py --seed S --programs 1 [--mode device]`. ctest runs fixed slices.
fuzz-frontend: setup build
	PYTHONPATH=$(BUILD)/python PYTHONDONTWRITEBYTECODE=1 $(PYTHON) $(ROOT)/tests/python/frontend_fuzz.py \
	  --programs $(FUZZ_FRONTEND_PROGRAMS) --seed $(FUZZ_FRONTEND_SEED) --mode $(FUZZ_FRONTEND_MODE)

# Randomized differential test of generated kernels (tests/cpp/jit/differential_test.cpp):
# seeded programs of elementwise ops, casts, constants and reductions over broadcast shapes,
# compiled whole and run with generation off and with every region compiled, compared bit for
# bit; a failure is shrunk and printed with the seed that reruns it alone. Then as many random
# while loops over one-element values, run by their sub-executables and as one generated loop.
# ctest runs 120 of each.
fuzz-jit: setup build
	LAZYRT_JIT_FUZZ_PROGRAMS=$(FUZZ_JIT_PROGRAMS) LAZYRT_JIT_FUZZ_SEED=$(FUZZ_JIT_SEED) \
	  $(BUILD)/tests/lazyrt_jit_tests --gtest_filter='Generated.Random*'

# tests/cpp/threads/threads_stress.cpp: four threads replaying compiled steps of their own models
# (one architecture, so one executable); three replaying beside one training with plain traced
# steps and one changing the cache and metrics settings; and seeded mixes of threads, models,
# settings changes, steps compiled on threads or shared by two, generated kernels on or off. A
# round that differs from its sequential run prints its seed (rerun it with --rounds 1 --seed S)
# and the target fails. ctest runs a slice of 30 rounds (Threads.StressSlice).
stress-threads: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j$(JOBS) --target threads_stress
	$(BUILD)/tests/threads_stress --rounds $(ROUNDS) --seed $(STRESS_SEED)

# `make check-reference`: the whole suite with every graph compiled for the reference backend
# (each op its own kernel, no fusion, no gemm): what the cpu backend computes must not depend on
# its rewrites. Tests of the cpu backend's own fusion name that backend and run as usual.
check-reference: setup build
	cd $(BUILD) && LAZYRT_BACKEND=reference ctest -j$(JOBS) --output-on-failure --timeout 600

# The sanitized trees (gcc, LAZYRT_SANITIZE in CMakeLists.txt): -O1 with line tables, for
# readable reports at half the compile time of -O2 -g; no examples or benchmarks.
SAN_CMAKE := -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
  --no-warn-unused-cli -DPython3_EXECUTABLE=$(PYTHON) -DPython_EXECUTABLE=$(PYTHON) -DPYTHON_EXECUTABLE=$(PYTHON) \
  -DLAZYRT_BUILD_TESTS=ON -DLAZYRT_BUILD_EXAMPLES=OFF -DLAZYRT_BUILD_BENCH=OFF
# Under sanitizers the randomized replay test runs this many programs (ctest's slice: 150).
SAN_REPLAY_FUZZ_PROGRAMS ?= 40

# `make check-asan`: the whole suite, C++ and Python, with AddressSanitizer and
# UndefinedBehaviorSanitizer (any undefined behaviour is fatal), in build-asan. The Python
# tests run the interpreter with the runtimes preloaded (tests/CMakeLists.txt says how), and
# so do the child interpreters some of them start. Nothing is skipped; the C++ replay fuzz
# test runs SAN_REPLAY_FUZZ_PROGRAMS programs instead of its 150, and the timeouts of ctest's
# tests are five times longer. Each C++ test binary is one ctest test, as in the normal
# build. ASan's allocator returns null
# for requests past its limit, as malloc does, so the tests of allocations too large to make
# see lazyrt's out-of-memory error rather than an abort.
check-asan: setup
	cmake -S $(ROOT) -B $(ASAN_BUILD) $(SAN_CMAKE) -DLAZYRT_SANITIZE=address
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=allocator_may_return_null=1 \
	  LAZYRT_REPLAY_FUZZ_PROGRAMS=$(SAN_REPLAY_FUZZ_PROGRAMS) ctest -j$(JOBS) --output-on-failure --no-tests=error --timeout 3000

# `make check-tsan`: ThreadSanitizer, in build-tsan, over the tests that run lazyrt from
# several threads at once (tests/cpp/threads: tracing, syncing, reads, compiled steps, one
# persistent cache directory, metrics; and TSAN_STRESS_ROUNDS rounds of threads_stress) and the
# kernels (tests/cpp/kernels), on lazyrt's own thread
# pool, which ThreadSanitizer builds use in place of OpenMP's team (kernels/parallel.cpp). Any
# race report fails it. The pool gets workers however few cores the machine has; OpenBLAS
# and oneDNN's OpenMP team (OMP_THREAD_LIMIT caps the team the convolution kernels ask for)
# run single-threaded, as their own threads are not instrumented and TSan cannot see how
# they hand results back.
check-tsan: setup
	cmake -S $(ROOT) -B $(TSAN_BUILD) $(SAN_CMAKE) -DLAZYRT_SANITIZE=thread -DLAZYRT_BUILD_PYTHON=OFF
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target lazyrt_threads_tests lazyrt_kernels_tests threads_stress
	cd $(TSAN_BUILD) && export TSAN_OPTIONS=second_deadlock_stack=1 LAZYRT_NUM_THREADS=4 OPENBLAS_NUM_THREADS=1 OMP_THREAD_LIMIT=1 \
	  LAZYRT_CACHE_DIR= && tests/lazyrt_threads_tests && tests/lazyrt_kernels_tests && \
	  tests/threads_stress --rounds $(TSAN_STRESS_ROUNDS) --steps 40 --quiet

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
