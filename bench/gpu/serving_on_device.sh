#!/usr/bin/env bash
# The serving figures (8-bit KV caches, shared prefixes) on the GPU machine: its 16-core AMX Xeon
# and its GPU, in about 60 s. Packed here, from the project root:
#
#   bash ../shared/gpu/pack.sh                      # build-gpu/ (portable) and .gpu/, .gl/
#   cp build-gpu/tests/paged/test_paged build-gpu/tests/paged/test_paged_gpu .gpu/
#   strip .gpu/test_paged .gpu/test_paged_gpu
#
# On the device, from a copy of the project root with .gpu/ and .gl/ (carry [".gpu", ".gl"]):
#
#   OUT=/some/dir bash bench/gpu/serving_on_device.sh
#
# 1. The 8-bit and shared-prefix kernels on the tiers this machine has and this one lacks
#    (avx512, avx512bf16, amx): test_paged's 8-bit, shared-prefix and invariance cases.
# 2. The same on the GPU (test_paged_gpu: 8-bit pools and paged_decode against the oracle).
# 3. cpu, 16 threads, bf16 q: decode of 64 sequences (kv 128..8192, Hq32 Hkv8 D128, page 16) with
#    bf16 / int8 / fp8 caches and 64 sequences sharing a 4096-token prompt, sharing on / off, rows
#    alternated, against the STREAM-like read of the same run.
# 4. gpu (pools resident), f16 q: the same decode batch with f16 / int8 / fp8 pools, and a
#    16-sequence decode against the dense gpu decode of the same tokens (vs_dense).
# Logs in $OUT (default /tmp/serving): one per step, and summary.txt.
set -uo pipefail
G=$PWD/.gpu
out=${OUT:-/tmp/serving}
mkdir -p "$out"
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
ldconfig 2>/dev/null
export LD_LIBRARY_PATH=$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! "$G/attnops" info 2>&1 | grep -q 'type=discrete\|type=integrated' && [ -f "$icd" ]; then
  export VK_DRIVER_FILES=$icd
fi
unset ATTNOPS_CPU_ISA OMP_NUM_THREADS
start=$(date +%s)
say() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$out/summary.txt"; }
{
  lscpu | grep -E 'Model name|^CPU\(s\)'
  "$G/attnops" info 2>&1 | grep -iE '^CPU|gpu|device' | head -6
} | tee -a "$out/summary.txt"

# run NAME TIMEOUT CMD...: one step, its log in $OUT/NAME.log, a PASS/FAIL line in the summary.
run() {
  local name=$1 tmo=$2
  shift 2
  timeout "$tmo" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  say "$([ $rc -eq 0 ] && echo PASS || echo "FAIL(rc=$rc)") $name $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' \
    "$out/$name.log" | tr -s ' ' | tr '\n' ' ' | cut -c1-160)"
}

filter='*Quant*:*SharedPrefix*:*Invariance*:*RoundTrip*'
[ -x "$G/test_paged" ] && run test_paged_tiers 12 "$G/test_paged" --gtest_brief=1 --gtest_filter="$filter"
[ -x "$G/test_paged_gpu" ] && run test_paged_gpu 10 "$G/test_paged_gpu" --gtest_brief=1

# One bench per file, so that a row past its timeout loses only its own file's table.
cat > /tmp/serving_cpu_decode.yaml <<'EOF'
backends: [cpu]
dtypes: [bf16]
repeats: 3
serving:
  - {label: decode64, seqs: 64, kv_len: [128, 8192], q_len: 1, heads: [32, 8], head_dim: 128, page_size: 16,
     kv_dtype: [same, int8, fp8_e4m3]}
EOF
cat > /tmp/serving_cpu_shared.yaml <<'EOF'
backends: [cpu]
dtypes: [bf16]
repeats: 3
serving:
  - {label: shared64, seqs: 64, shared_prefix: 4096, kv_len: [128, 1024], q_len: 1, heads: [32, 8], head_dim: 128,
     page_size: 16, share: [on, off]}
EOF
cat > /tmp/serving_gpu.yaml <<'EOF'
backends: [gpu_resident]
dtypes: [f16]
repeats: 3
serving:
  - {label: decode64, seqs: 64, kv_len: [128, 8192], q_len: 1, heads: [32, 8], head_dim: 128, page_size: 16,
     kv_dtype: [same, int8, fp8_e4m3]}
  - {label: dec16_dense, seqs: 16, kv_len: 4096, q_len: 1, heads: [32, 8], head_dim: 128, page_size: 16,
     compare: dense}
EOF
for f in cpu_decode cpu_shared; do
  run "serving_$f" 14 "$G/attnops" bench --file "/tmp/serving_$f.yaml" --threads 16 --no-progress \
    --serving-json "$out/serving_$f.json"
done
run serving_gpu 14 "$G/attnops" bench --file /tmp/serving_gpu.yaml --no-progress --serving-json "$out/serving_gpu.json"
for f in serving_cpu_decode serving_cpu_shared serving_gpu; do
  echo "== $f"
  grep -vE '^\s*$' "$out/$f.log" | tail -8 | cut -c1-240
done | tee -a "$out/summary.txt"
say "done"
