# The two commands a newcomer needs on a fresh Debian 12 machine:
#   make run    set up, build, run the conformance suite on every backend present,
#               then serve one mixed batch of the fixture adapters through `tovl run`
#   make test   set up, build, and run the whole test suite through CTest, then
#               again under ASan+UBSan and ThreadSanitizer (scripts/sanitize.sh),
#               the Rust bindings' checks (scripts/test-rust.sh), the Python
#               package's suite (scripts/setup-python.sh), then the release
#               artifacts from one Release build (make dist; -O3, whose warnings
#               differ from -O2's), that build installed and an example consumer
#               built against the installed tree (scripts/check-install.sh), and
#               the artifacts installed and used (scripts/check-dist.sh)
#   make dist   set up and make the release artifacts in dist/: the wheel, its
#               sdist, the .deb, the tarball, SHA256SUMS (scripts/dist.sh)
# Everything else is CMake (CMakePresets.json); this file only strings it together.

JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: run test dist setup build clean

run: build
	./build/tools/tovl devices
	./build/tools/tovl conform
	python3 scripts/serve-demo.py ./build/tools/tovl --out build/serve-demo

test: build
	ctest --preset default -j $(JOBS)
	JOBS=$(JOBS) scripts/test-rust.sh
	JOBS=$(JOBS) scripts/sanitize.sh
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) scripts/setup-python.sh
	JOBS=$(JOBS) scripts/dist.sh
	JOBS=$(JOBS) scripts/check-install.sh build-dist
	scripts/check-dist.sh dist

dist: setup
	JOBS=$(JOBS) scripts/dist.sh

setup:
	scripts/setup-debian.sh

build: setup
	cmake --preset default
	cmake --build --preset default -j $(JOBS)

clean:
	rm -rf build build-dist dist
