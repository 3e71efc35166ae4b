# The two commands a newcomer needs on a fresh Debian 12 machine:
#   make run    set up, build, run the conformance suite on every backend present,
#               then serve one mixed batch of the fixture adapters through `tovl run`
#   make test   set up, build, and run the whole test suite through CTest, then
#               again under ASan+UBSan (scripts/sanitize.sh), then build the
#               library as a packager would (Release: -O3, whose warnings differ
#               from -O2's), install it and build an example consumer against
#               the installed tree (scripts/check-install.sh); the Rust
#               bindings' checks (scripts/test-rust.sh) run after CTest
# Everything else is CMake (CMakePresets.json); this file only strings it together.

JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: run test setup build clean

run: build
	./build/tools/tovl devices
	./build/tools/tovl conform
	python3 scripts/serve-demo.py ./build/tools/tovl --out build/serve-demo

test: build
	ctest --preset default -j $(JOBS)
	JOBS=$(JOBS) scripts/test-rust.sh
	JOBS=$(JOBS) scripts/sanitize.sh
	JOBS=$(JOBS) scripts/check-install.sh
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) scripts/setup-python.sh

setup:
	scripts/setup-debian.sh

build: setup
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

clean:
	rm -rf build
