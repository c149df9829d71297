#!/usr/bin/env bash
# Packs what bench/cpu_amx/on_device.sh needs for the AMX Xeon (the GPU machine's host), here,
# from the project root:
#
#   bash bench/cpu_amx/pack.sh [OLD_REF]
#
#  1. ../shared/gpu/pack.sh: the portable build (build-gpu/: every target, tests included) and
#     .gpu/ (attnops, its shared libraries in .gpu/lib, the golden sets, on-gpu.sh).
#  2. The CPU test programs of build-gpu, stripped, into .gpu/cpu_tests/.
#  3. The attnops of OLD_REF (default: main before the AMX work, 1f55795), built the same portable
#     way in a worktree beside this checkout (../attnops-old-<ref>, kept for the next time), as
#     .gpu/attnops-old: on_device.sh times it against the new one in the same run.
#  4. oneDNN for the GEMM ceilings: libdnnl.so.2 xz-compressed (40 MiB -> 7 MiB; on_device.sh
#     unpacks it), its libOpenCL.so.1, and libvulkan.so.1 (so that the programs start without
#     .gl's packages) into .gpu/lib.
#  5. on_device.sh and summarize.py into .gpu/cpu_amx/.
# Then the lead runs on the device, with carry [".gpu"] (".gl" is not needed):
#   OUT=... bash .gpu/cpu_amx/on_device.sh
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
old_ref=${1:-1f55795}

bash ../shared/gpu/pack.sh

mkdir -p .gpu/cpu_tests .gpu/cpu_amx
for t in test_cpu_tiers test_backward_tiers tiled_kernels_test test_vanilla_cpu test_paged; do
  f=$(find build-gpu/tests -type f -name "$t" -perm -u+x | head -1)
  [ -n "$f" ] || { echo "cpu_amx/pack.sh: $t not built in build-gpu" >&2; exit 1; }
  cp "$f" .gpu/cpu_tests/ && strip .gpu/cpu_tests/"$t"
done

old_dir=$(cd .. && pwd)/attnops-old-$old_ref
if [ ! -d "$old_dir" ]; then
  git worktree add --detach "$old_dir" "$old_ref"
fi
cmake -S "$old_dir" -B "$old_dir/build-old" -G Ninja -DCMAKE_BUILD_TYPE=Release -DATTNOPS_NATIVE_ARCH=OFF \
  -DATTNOPS_BUILD_TESTS=OFF -DATTNOPS_BUILD_BENCH=OFF -DATTNOPS_BUILD_EXAMPLES=OFF ${GPU_CMAKE_ARGS:-} >/dev/null
cmake --build "$old_dir/build-old" -j "$(nproc)" --target attnops_cli >/dev/null
cp "$old_dir/build-old/cli/attnops" .gpu/attnops-old && strip .gpu/attnops-old
(cd "$old_dir" && git log -1 --format='%h %s' | cut -c1-100) > .gpu/cpu_amx/old_ref.txt
git log -1 --format='%h %s' | cut -c1-100 > .gpu/cpu_amx/new_ref.txt

libdir=/usr/lib/x86_64-linux-gnu
if [ -e "$libdir/libdnnl.so.2" ]; then
  xz -T0 -6 -c "$libdir/libdnnl.so.2" > .gpu/lib/libdnnl.so.2.xz
  cp -L "$libdir/libOpenCL.so.1" .gpu/lib/
else
  echo "cpu_amx/pack.sh: no libdnnl.so.2 here (apt-get install libdnnl-dev): no oneDNN ceilings there" >&2
fi
cp -L "$libdir/libvulkan.so.1" .gpu/lib/
cp "$here/on_device.sh" "$here/summarize.py" .gpu/cpu_amx/
du -sh .gpu
