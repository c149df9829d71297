#!/usr/bin/env bash
# The differential fuzzer (attnops verify) on a machine CI never has: a 16-core Xeon with AVX-512,
# AVX512-BF16 and AMX, and an NVIDIA GPU (Vulkan, the NVIDIA driver). 120 s of fuzzing in four
# parts (about 2.5 minutes with start-up and the last problem of each part).
#
# Here:      bash ../shared/gpu/pack.sh        (the attnops program into .gpu/, Vulkan into .gl/)
# There:     bash verify/on_device.sh          (from a copy of the project's root with .gpu/ and .gl/)
# Logs and JSON summaries go to $OUT (default /tmp). Every part runs even when one finds mismatches;
# the last lines list each part's exit status (0: no mismatch, 1: mismatches, see the MISMATCH lines
# and their replay commands, which rerun a case with "$G/attnops" verify --replay ...).
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export LD_LIBRARY_PATH=$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
G=$PWD/.gpu
out=${OUT:-/tmp}
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! "$G/attnops" info 2>&1 | grep -q 'type=discrete\|type=integrated' && [ -f "$icd" ]; then
  export VK_DRIVER_FILES=$icd
fi
lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-200
"$G/attnops" info 2>&1 | head -12
seed=$(date -u +%Y%m%d%H)
echo "on_device: the changing seed of this run is $seed"
status=()
part() {  # part NAME SECONDS attnops-verify-arguments...
  local name=$1 limit=$2
  shift 2
  echo "== $name"
  timeout $((limit + 20)) "$G/attnops" verify --fuzz --seconds "$limit" --progress 30 \
    --json "$out/verify_$name.json" "$@" 2>&1 | tee "$out/verify_$name.log" | grep -E '^(MISMATCH|  smallest|verify: [0-9]+ problems|verify: note)' | head -40
  status+=("$name: exit ${PIPESTATUS[0]}")
}

# 1. The cpu tiers this build machine cannot run, every operator and pass, 1, 3, all and more
#    threads than cores (the library clamps the last).
part cpu_high_tiers 50 --tiers avx512,avx512bf16,amx --seed 1..16 --seed "$seed" --problems 40 \
  --threads 1,3,16,17
# 2. The GPU with the self-check on as in production: the default choice, then one kernel variant
#    forced per case (a variant the device or problem cannot take runs the default and is counted
#    as "not applicable").
part gpu_auto 15 --backends gpu --gpu-kernels auto --seed 1..4 --seed "$seed" --problems 20 \
  --work 16777216 --gpu-work 16777216
part gpu_variants 25 --backends gpu --gpu-kernels all --seed 5..12 --seed "$seed" --problems 20 \
  --work 16777216 --gpu-work 16777216
# 3. The cooperative-matrix kernels with the self-check off (ATTNOPS_VK_SELFTEST=0), f16 prefill
#    on flash_attn2: the self-check disabled flash_coopmat_nv on the first H100 run; its mismatch
#    lines say which rows, heads and columns are wrong, and for which shapes.
ATTNOPS_VK_SELFTEST=0 part gpu_coopmat_unchecked 30 --backends gpu --gpu-kernels flash_coopmat_nv,flash_coopmat_khr \
  --ops flash_attn2 --passes forward --seed 1..8 --problems 30 --work 16777216 --gpu-work 16777216 --no-shrink
printf 'on_device: %s\n' "${status[@]}"
