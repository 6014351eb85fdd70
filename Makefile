# Thin wrapper over CMake. `make train` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
JOBS      ?= $(shell nproc)
CONFIG    ?= configs/default.toml
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

DEB_PACKAGES := build-essential cmake pkg-config git \
	libopenmpi-dev openmpi-bin libsentencepiece-dev libtomlplusplus-dev libcli11-dev \
	nlohmann-json3-dev libfmt-dev libxxhash-dev libgtest-dev libgmock-dev libbenchmark-dev \
	libdnnl-dev libopenblas-dev libhwloc-dev fortunes fortunes-zh procps

.PHONY: deps configure build build-bin train test test-all prepare clean format

# Installs only what is missing, so a second run is quiet and fast.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "make deps: installing $$missing"; \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	fi

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null

# Everything, tests included.
build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The bagualu binary alone (what `make train` needs).
build-bin: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target bagualu

prepare: build-bin
	$(BUILD_DIR)/bagualu prepare --config $(CONFIG)

train: prepare
	$(BUILD_DIR)/bagualu train --config $(CONFIG) --force

# The whole suite except tests labelled `slow`.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE slow

test-all: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp')

clean:
	rm -rf $(BUILD_DIR)
