# The front door: `make demo` and `make test` (`./make demo`, `./make test` on a machine that
# has no GNU make yet: it installs it first). Each installs what it needs (Debian 12),
# configures, builds and runs. The other targets are the steps they are made of.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build build-binaries test demo bench image format clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) > $(BUILD_DIR).configure.log 2>&1 || \
	  { cat $(BUILD_DIR).configure.log; exit 1; }

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Only what the demo runs: the daemon and the client, not the tests and benchmarks.
build-binaries: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target zt ztd

test:
	@scripts/install-deps.sh --test
	@$(MAKE) --no-print-directory build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

demo:
	@scripts/install-deps.sh --demo
	@$(MAKE) --no-print-directory build-binaries
	@scripts/demo.sh $(BUILD_DIR)

bench:
	@scripts/install-deps.sh --bench
	@$(MAKE) --no-print-directory build
	@bench/run_training_bench.sh $(BUILD_DIR)

# zerotrain/ztd:latest, the image deploy/kubernetes runs, as an OCI archive (as root:
# scripts/build-image.sh; deploy/README.md says how to load it).
image: build-binaries
	@scripts/build-image.sh $(BUILD_DIR) $(BUILD_DIR)/zerotrain-ztd.oci.tar

format:
	@find kernels worker cli daemon offload tests bench -name '*.h' -o -name '*.cc' -o -name '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR).configure.log
