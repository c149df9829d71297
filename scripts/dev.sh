#!/usr/bin/env bash
# attnops developer entry point. Every command first installs what is missing (Debian 12 packages,
# apt-get), configures and builds, so that on a fresh machine one command does all the set-up.
#
#   bash scripts/dev.sh demo     # build, then `attnops info` and `attnops demo` (the main job)
#   bash scripts/dev.sh test     # build, then every test through CTest
#   bash scripts/dev.sh bench    # build, then the benchmark binaries and bench/compare_torch.py
#   bash scripts/dev.sh build    # set-up and build only
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
      libvulkan-dev glslc mesa-vulkan-drivers vulkan-validationlayers vulkan-tools
      libcli11-dev nlohmann-json3-dev python3-numpy gnuplot-nox)

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
  bench)
    install_packages python3-torch
    build
    "$build/bench/bench_attention" --benchmark_counters_tabular=true
    "$build/bench/bench_decode" --benchmark_counters_tabular=true
    /usr/bin/python3 "$root/bench/compare_torch.py" --bench "$build/bench/bench_attention"
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
