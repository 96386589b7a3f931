# The two commands of the README. Both install what is missing first (scripts/install-deps.sh
# is idempotent and quick when everything is present), then configure and build.
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DGANGLION_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: all deps configure build test demo bench format format-check structure-check clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure --timeout 300

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
