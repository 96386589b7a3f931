# The two commands of the README. Both install what is missing first (scripts/install-deps.sh
# is idempotent and quick when everything is present), then configure and build.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DGANGLION_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps configure build test sanitize sanitize-asan sanitize-tsan sanitize-emu cuda-emu demo bench \
	format format-check structure-check clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300

# The sanitizer jobs of CI (.ci/run runs them after `make test`), each in its own build
# folder: ASAN+UBSAN over the tests labelled unit and mp-fast, TSAN over those labelled
# threads (tests/labels.cmake), and ASAN+UBSAN over the CUDA emulator's tests
# (sanitize-emu, below). A report fails the job, from whichever process of a test it came
# (cmake/sanitize.cmake; suppressions, each with its reason, in tests/sanitizers/). The
# first two build without CUDA (no GPU here: the emulator's job covers the CUDA backend);
# the fuzzers are built with their own sanitizers by `make test`.
SAN_FLAGS ?= -DGANGLION_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGANGLION_CUDA=OFF \
	-DGANGLION_FUZZ=OFF

sanitize: sanitize-asan sanitize-tsan sanitize-emu

sanitize-asan: deps
	@cmake -S . -B build-asan $(SAN_FLAGS) -DGANGLION_SANITIZE=address,undefined >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@cd build-asan && ctest --output-on-failure --timeout 600 -L '^(unit|mp-fast)$$'

sanitize-tsan: deps
	@cmake -S . -B build-tsan $(SAN_FLAGS) -DGANGLION_SANITIZE=thread >/dev/null
	@cmake --build build-tsan -j $(JOBS)
	@cd build-tsan && ctest --output-on-failure --timeout 600 -L '^threads$$'

# The CUDA emulator's tests under ASAN+UBSAN (a report fails the job, as above): the CUDA
# and NCCL backends' host code, the engine's device paths and the GPU workers instrumented,
# the emulated kernels and the emulator itself not (their threads are fibers on stacks of
# the emulator's own: cmake/cuda-emu.cmake). The k8s simulations (network namespaces,
# several Pods' resolvers) stay with `make test`.
sanitize-emu: deps
	@cmake -S . -B build-emu-asan -DGANGLION_CUDA_EMU=ON -DGANGLION_FUZZ=OFF -DGANGLION_WERROR=ON \
		-DCMAKE_BUILD_TYPE=RelWithDebInfo -DGANGLION_SANITIZE=address,undefined >/dev/null
	@cmake --build build-emu-asan -j $(JOBS) --target cuda-emu-tests
	@cd build-emu-asan && ctest --output-on-failure --timeout 900 -j $(JOBS) -L '^cuda-emu$$' \
		-E '^k8s-sim'

# The CUDA kernels and backend on the CPU emulator (tests/cuda-emu/, docs/gpu.md "The CUDA
# emulator"), in a build folder of its own: the GPU tests (test-cuda, test-cuda-step,
# test-cuda-blocks, test-cuda-trace, test-engine-cuda) run there instead of skipping, on the
# device code nvcc compiles, with cuBLAS, CUPTI and the CUDA runtime emulated. `make test` runs the same
# (its ctest cuda-emu, in $(BUILD)/cuda-emu).
cuda-emu: deps
	@JOBS=$(JOBS) bash tests/cuda-emu/run-emu.sh . build-emu ON

demo: build
	@bash scripts/demo.sh $(BUILD)/bin/ganglion

bench: build
	@bash bench/run-control-plane.sh $(BUILD)/bin/ganglion

# Rewrites every C/CUDA source with .clang-format (Debian's clang-format 14); `ctest -R
# format-check` (part of `make test`) fails while a source differs.
format: deps
	@python3 scripts/check-format.py --fix

format-check:
	@python3 scripts/check-format.py

# The structure rules of docs/design.md section 5 (also a test of `make test`).
structure-check:
	@python3 scripts/check-structure.py

clean:
	@rm -rf $(BUILD)
