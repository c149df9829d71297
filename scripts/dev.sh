#!/usr/bin/env bash
# attnops developer entry point. Every command first installs what is missing (Debian 12 packages,
# apt-get), configures and builds, so that on a fresh machine one command does all the set-up.
#
#   bash scripts/dev.sh demo     # build, then `attnops info` and `attnops demo` (the main job)
#   bash scripts/dev.sh test     # build, then every test through CTest (the Python package's too)
#   bash scripts/dev.sh bench    # build, then the benchmark binaries and bench/compare_torch.py
#   bash scripts/dev.sh build    # set-up and build only
#   bash scripts/dev.sh asan     # ASan+UBSan build (build-asan/: the build dir + -asan), every test
#   bash scripts/dev.sh tsan     # TSan build of the library (build-tsan/), then the concurrency test
#   bash scripts/dev.sh fuzz [S] # libFuzzer build (build-fuzz/, clang-14), each target for S s (60)
#   bash scripts/dev.sh verify   # build, then the differential fuzzer (attnops verify) on CI's budget
#   bash scripts/dev.sh coverage # --coverage build (build-coverage/), the tests + the fuzzer, gcovr report
#
# Environment: ATTNOPS_BUILD_DIR (default build/), ATTNOPS_CMAKE_ARGS (extra -D flags),
# ATTNOPS_JOBS (default nproc).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${ATTNOPS_BUILD_DIR:-$root/build}
jobs=${ATTNOPS_JOBS:-$(nproc)}

# Everything attnops builds and tests with, from Debian's archive. glslc compiles the Vulkan
# shaders; mesa-vulkan-drivers (lavapipe) and the validation layers let the GPU suite run on CPUs.
deps=(cmake ninja-build g++ pkg-config
      libeigen3-dev libyaml-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
      libvulkan-dev glslc spirv-tools mesa-vulkan-drivers vulkan-validationlayers vulkan-tools
      libcli11-dev nlohmann-json3-dev python3-numpy gnuplot-nox
      # the Python package (python/): pybind11, DLPack's header, pytest and PyTorch for its tests
      python3-dev pybind11-dev libdlpack-dev python3-pytest python3-torch
      openmpi-bin libopenmpi-dev)  # distributed attention over MPI (distributed/, tests/dist)
# The fuzz targets need clang with libFuzzer and its OpenMP (the sanitizer builds use g++'s own runtimes).
fuzz_deps=(clang-14 libclang-rt-14-dev libfuzzer-14-dev libomp-14-dev)
# The coverage report (scripts/dev.sh coverage) reads gcc's .gcda files with gcovr.
coverage_deps=(gcovr)

install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "attnops: installing ${missing[*]}" >&2
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  install_packages "${deps[@]}"
  # shellcheck disable=SC2086
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release ${ATTNOPS_CMAKE_ARGS:-}
  cmake --build "$build" -j "$jobs"
}

# Sanitizer and fuzz builds: their own trees beside build/, configured with the given -D flags
# (ATTNOPS_CMAKE_ARGS is not applied: -Werror is checked by the main build, and GCC's warnings
# under sanitizer instrumentation include false positives). Then the given targets (all if none).
sanitized_build() {
  local dir=$1 flags=$2
  shift 2
  install_packages "${deps[@]}"
  # shellcheck disable=SC2086
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release $flags
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$dir" -j "$jobs" "${targets[@]}"
}

# Run-time options of the sanitizers (tests/sanitizers/README.md): every report is fatal, and
# the leak checker ignores the allocations of lavapipe, LLVM and the validation layer, which
# are not ours (tests/sanitizers/lsan.supp; detection stays on for everything else).
sanitizer_env() {
  local san_dir="$root/tests/sanitizers"
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
  export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$san_dir/lsan.supp:print_suppressions=0}"
  export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:suppressions=$san_dir/tsan.supp}"
}

case "${1:-help}" in
  build) build ;;
  demo)
    build
    "$build/cli/attnops" info
    "$build/cli/attnops" demo --config "$root/config/default.yaml"
    ;;
  test)
    build
    ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
    ;;
  asan)
    sanitizer_env
    # One CTest entry per test program (a sanitized process start costs ~0.3 s per case), and
    # the first 12 cases of each random sweep (hand-picked cases all run): this stage looks for
    # memory errors and UB, the test stage for numerical coverage.
    dir=$build-asan
    # Only the CPU tiers this machine runs (ATTNOPS_CPU_TIER_SET=host): its tests run no other.
    # Without MPI: Open MPI's own allocations would need LSan suppressions; the distributed
    # algorithms run here with in-process ranks (test_dist), MPI itself in the test stage.
    # -O1 (not -O3): the sanitizer finds the same errors and the build, most of this stage's
    # time, is much shorter (CI's 50-minute budget on a 2-core Zen 1).
    # Without the command-line program, its tests and the examples: CLI11 makes the CLI the
    # costliest code to compile, the CLI and golden tests reach the library's code through the
    # same calls the library's own tests make, and the CLI's input parsers (.npy, YAML, bench
    # files) are fuzzed under ASan in the fuzz stage. The test stage runs all of them. Nor the
    # differential fuzzer (verify/): its own code, checked in the test and verify stages.
    sanitized_build "$dir" "-DATTNOPS_SANITIZE=address,undefined -DATTNOPS_BUILD_BENCH=OFF -DATTNOPS_BUILD_CLI=OFF -DATTNOPS_BUILD_VERIFY=OFF -DATTNOPS_BUILD_EXAMPLES=OFF -DATTNOPS_TEST_PER_CASE=OFF -DATTNOPS_CPU_TIER_SET=host -DATTNOPS_WITH_MPI=OFF -DCMAKE_CXX_FLAGS_RELEASE=-O1"
    export ATTNOPS_TEST_RANDOM_CASES="${ATTNOPS_TEST_RANDOM_CASES:-12}"
    ctest --test-dir "$dir" --output-on-failure -j "$jobs" --timeout 900 ${ATTNOPS_CTEST_ARGS:-}
    ;;
  tsan)
    sanitizer_env
    # The library, the concurrency test and the CPU kernels' own thread pool; OpenMP at one
    # thread (libgomp is not instrumented: its barriers are invisible to TSan and would be
    # reported as races). The pool is ours (standard atomics and mutexes), so its tests run with
    # 2 and 3 threads: callers racing for it, nested calls, the decode merge by the last finisher.
    dir=$build-tsan
    # Only the CPU tiers this machine runs, as in the asan stage (its tests run no other).
    sanitized_build "$dir" "-DATTNOPS_SANITIZE=thread -DATTNOPS_BUILD_CLI=OFF -DATTNOPS_BUILD_BENCH=OFF -DATTNOPS_BUILD_EXAMPLES=OFF -DATTNOPS_CPU_TIER_SET=host" test_concurrency test_cpu_pool
    OMP_NUM_THREADS=1 "$dir/tests/concurrency/test_concurrency"
    OMP_NUM_THREADS=1 "$dir/tests/cpu_pool/test_cpu_pool"
    ;;
  fuzz)
    sanitizer_env
    # Each target for ${2:-60} seconds from the checked-in seeds; what it adds to the corpus stays
    # in the build tree (the first corpus directory is libFuzzer's output). A finding aborts with
    # the input saved as $dir/<target>-crash-*; reproduce with: $dir/fuzz/<target> FILE.
    dir=$build-fuzz
    seconds=${2:-60}
    install_packages "${fuzz_deps[@]}"
    sanitized_build "$dir" "-DCMAKE_CXX_COMPILER=clang++-14 -DATTNOPS_SANITIZE=address,undefined -DATTNOPS_FUZZ=ON -DATTNOPS_BUILD_TESTS=OFF -DATTNOPS_BUILD_BENCH=OFF -DATTNOPS_BUILD_EXAMPLES=OFF" fuzz_npy fuzz_config fuzz_bench_file
    [ "$seconds" -gt 0 ] || exit 0  # libFuzzer reads -max_total_time=0 as "no limit"
    failed=()  # every target runs even when one finds something
    for t in npy:npy config:yaml bench_file:yaml; do
      name=${t%%:*} dict=${t##*:}
      corpus=${name%_file}
      mkdir -p "$dir/corpus/$name"
      (cd "$dir" && "$dir/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
         -dict="$root/fuzz/$dict.dict" -artifact_prefix="$dir/fuzz_$name-" \
         "$dir/corpus/$name" "$root/fuzz/corpus/$corpus") || failed+=("fuzz_$name")
    done
    [ ${#failed[@]} -eq 0 ] || { echo "fuzz: findings in ${failed[*]}" >&2; exit 1; }
    ;;
  verify)
    # The differential fuzzer (README "Differential fuzzing") on the Release build, CI's budget
    # (a few minutes on 2 cores): fixed seeds 1..8 and one seed that changes every hour, printed
    # first (replay a failure with `attnops verify --replay SEED:CASE ...`, as its line says),
    # every operator, forward and backward, cpu on every ISA tier this CPU runs and 1, 2, 3 and
    # more threads than cores; then a lavapipe share (small problems, one forced kernel variant
    # per case). --seconds caps each part on a slow machine (the summary says when it was hit).
    build
    seed=${ATTNOPS_VERIFY_SEED:-$(date -u +%Y%m%d%H)}
    echo "verify: the changing seed of this run is $seed"
    status=0
    "$build/cli/attnops" verify --fuzz --seed 1..8 --seed "$seed" --problems "${ATTNOPS_VERIFY_PROBLEMS:-30}" \
      --seconds "${ATTNOPS_VERIFY_SECONDS:-170}" --progress 60 --json "$build/verify-cpu.json" || status=1
    "$build/cli/attnops" verify --fuzz --backends gpu --gpu-kernels auto,flash_subgroup,flash_rowwise,flash_decode,vanilla_gemm \
      --seed 1..2 --seed "$seed" --problems 4 --work 262144 --gpu-work 262144 --seconds 60 --progress 60 \
      --json "$build/verify-gpu.json" || status=1
    exit $status
    ;;
  coverage)
    # Line and branch coverage of backends/ and operators/ under the test suite plus the
    # differential fuzzer: a --coverage build at -O1 in build-coverage/ (every ISA tier compiled;
    # only those this CPU runs can be reached), every test, `attnops verify` as CI runs it, then
    # gcovr (exception-only and unreachable branches left out). Reports in build-coverage/coverage/:
    # summary.txt (per file), branches.txt, index.html (line by line), coverage.json.
    install_packages "${coverage_deps[@]}"
    dir=$build-coverage
    sanitized_build "$dir" "-DCMAKE_CXX_FLAGS=--coverage -DCMAKE_EXE_LINKER_FLAGS=--coverage -DCMAKE_SHARED_LINKER_FLAGS=--coverage -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DATTNOPS_BUILD_BENCH=OFF -DATTNOPS_BUILD_EXAMPLES=OFF -DATTNOPS_TEST_PER_CASE=OFF"
    find "$dir" -name '*.gcda' -delete
    ctest --test-dir "$dir" -j "$jobs" --timeout 1800 ${ATTNOPS_CTEST_ARGS:-} || echo "coverage: some tests failed (the report still counts what ran)"
    "$dir/cli/attnops" verify --fuzz --seed 1..8 --problems "${ATTNOPS_VERIFY_PROBLEMS:-30}" --progress 120 --no-shrink || true
    "$dir/cli/attnops" verify --fuzz --backends gpu,native --seed 1..2 --problems 5 --work 262144 --gpu-work 262144 --progress 120 --no-shrink || true
    out=$dir/coverage
    mkdir -p "$out"
    gcov_args=(--root "$root" --object-directory "$dir" --filter "$root/backends/" --filter "$root/operators/"
               --exclude-unreachable-branches --exclude-throw-branches -j "$jobs")
    gcovr "${gcov_args[@]}" --txt "$out/summary.txt" --json "$out/coverage.json" --html-details "$out/index.html" --print-summary
    gcovr "${gcov_args[@]}" --branches --txt "$out/branches.txt"
    echo "coverage: $out/summary.txt (lines), $out/branches.txt (branches), $out/index.html"
    ;;
  bench)
    # libdnnl-dev: oneDNN's matmuls as the benchmarks' GEMM ceiling (opened at run time, and only
    # by the benchmarks: benchkit/onednn_gemm.h); its headers must be there when the build configures.
    install_packages python3-torch libdnnl-dev
    build
    "$build/bench/bench_attention" --benchmark_counters_tabular=true
    "$build/bench/bench_decode" --benchmark_counters_tabular=true
    /usr/bin/python3 "$root/bench/compare_torch.py" --bench "$build/bench/bench_attention"
    ;;
  *)
    sed -n '2,15p' "$0"
    exit 2
    ;;
esac
