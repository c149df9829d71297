#!/usr/bin/env bash
# The CPU kernels on an AMX Xeon (the GPU machine's 16-core host), in one batched run of about
# 4 minutes: correctness of every ISA tier, then speed of this build against the old one
# (OLD_REF of bench/cpu_amx/pack.sh), alternated, with oneDNN's GEMM ceilings in the same runs.
# Packed here by `bash bench/cpu_amx/pack.sh`; on the device, from the project root with .gpu/:
#
#   OUT=/some/dir bash .gpu/cpu_amx/on_device.sh [correctness] [speed]      (default: both)
#
# correctness  test_cpu_tiers under ATTNOPS_CPU_ISA=avx512, avx512bf16 and uncapped (amx): the
#              tier choice, each tier through the public API, the bf16 instructions against
#              their emulation bit for bit (Bf16Ops.RealInstructionsMatchTheEmulation); the
#              kernel suites uncapped (every real tier, baseline to amx): tiled parity and
#              steps, backward, vanilla (the decode), paged; the emulated tiers on this CPU
#              (ATTNOPS_CPU_ISA=avx2: they run above the cap); the differential fuzzer on each
#              of avx512 / avx512bf16 / amx when this attnops has `verify --fuzz`.
# speed        old and new attnops, rounds alternating old, new, old, new (the second round only
#              while the time budget lasts), each with `--sgemm 2048` (Eigen; the new one also
#              oneDNN f32 and bf16 with their implementation strings), B1 H16:
#                1 thread    flash_attn2 T2048/T4096 D128 bf16/f32 non-causal
#                16 threads  flash_attn2 + blocksparse T2048/T4096 D128, T4096 D64/D256,
#                            bf16/f32, causal and not
#                backward    T2048 D128 bf16/f32 (16 threads), bf16 (1 thread)
#                serving     one sequence of 2048 prefilled (page 16) and one decode over 32768
#                            keys, each against the dense call on the same data, bf16/f32,
#                            1 and 16 threads (KV GB/s against the run's read bandwidth)
#              summarize.py prints the ratios (new / old, vs the best GEMM) from the CSVs.
# Everything lands in $OUT (default /tmp/cpu_amx): one log per step, CSVs, summary.txt.
set -uo pipefail
G=$PWD/.gpu
out=${OUT:-/tmp/cpu_amx}
mkdir -p "$out"
start=$(date +%s)
budget=${BUDGET_S:-270}  # seconds for the whole script; round 2 of the speed part only within it
elapsed() { echo $(($(date +%s) - start)); }
say() { echo "[$(elapsed) s] $*" | tee -a "$out/summary.txt"; }

# Shared libraries: .gpu/lib, with libdnnl unpacked (xz, or Python's lzma where xz is missing).
lib=/tmp/cpu_amx_lib
mkdir -p "$lib"
if [ -f "$G/lib/libdnnl.so.2.xz" ] && [ ! -f "$lib/libdnnl.so.2" ]; then
  if command -v xz >/dev/null; then
    xz -dc "$G/lib/libdnnl.so.2.xz" > "$lib/libdnnl.so.2"
  else
    python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
      "$G/lib/libdnnl.so.2.xz" "$lib/libdnnl.so.2"
  fi
fi
export LD_LIBRARY_PATH=$lib:$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset ATTNOPS_CPU_ISA OMP_NUM_THREADS
want=${*:-correctness speed}
has() { [[ " $want " == *" $1 "* ]]; }

{
  echo "new: $(cat "$G/cpu_amx/new_ref.txt" 2>/dev/null)"
  echo "old: $(cat "$G/cpu_amx/old_ref.txt" 2>/dev/null)"
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|L2|L3'
  echo "flags: $(grep -o -w -E 'amx[a-z_0-9]*|avx512_bf16|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  "$G/attnops" info 2>&1 | grep -E '^CPU' | head -4
} | tee -a "$out/summary.txt"

# run NAME TIMEOUT CMD...: one step, its log in $OUT/NAME.log, a PASS/FAIL line in the summary.
run() {
  local name=$1 tmo=$2
  shift 2
  local t0
  t0=$(date +%s)
  timeout "$tmo" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local verdict=PASS
  [ $rc -eq 0 ] || verdict="FAIL(rc=$rc)"
  say "$verdict $name ($(($(date +%s) - t0)) s) $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr -s ' ' | tr '\n' ' ' | cut -c1-160)"
}

if has correctness; then
  T=$G/cpu_tests
  for isa in avx512 avx512bf16; do
    run "cpu_tiers_$isa" 60 env ATTNOPS_CPU_ISA=$isa "$T/test_cpu_tiers" --gtest_brief=1
  done
  run cpu_tiers_amx 60 "$T/test_cpu_tiers" --gtest_brief=1
  run tiled_all_tiers 90 "$T/tiled_kernels_test" --gtest_brief=1
  run backward_all_tiers 60 "$T/test_backward_tiers" --gtest_brief=1
  run vanilla_all_tiers 90 "$T/test_vanilla_cpu" --gtest_brief=1
  run paged_all_tiers 60 "$T/test_paged" --gtest_brief=1
  run tiled_emulated_here 60 env ATTNOPS_CPU_ISA=avx2 "$T/tiled_kernels_test" --gtest_brief=1 \
    --gtest_filter='TiledSteps*:TiledDeterminism*:*bf16*'
  if "$G/attnops" verify --help 2>&1 | grep -q -- '--fuzz'; then
    for isa in avx512 avx512bf16 amx; do
      run "fuzz_$isa" 45 "$G/attnops" verify --fuzz --tiers "$isa" --seed 7 --problems 300 --seconds 35 --progress 0
      tail -3 "$out/fuzz_$isa.log" | tee -a "$out/summary.txt"
    done
  else
    say "fuzzer: this attnops has no 'verify --fuzz' (not landed when packed)"
  fi
fi

if has speed; then
  cat > /tmp/cpu_amx_fwd1.yaml <<'EOF'
ops: [flash_attn2]
backends: [cpu]
shapes: ["1,16,2048,128", "1,16,4096,128"]
dtypes: [bf16, f32]
causal: false
repeats: 2
sgemm: 2048
EOF
  cat > /tmp/cpu_amx_fwd16.yaml <<'EOF'
ops: [flash_attn2, blocksparse]
backends: [cpu]
shapes: ["1,16,2048,128", "1,16,4096,128", "1,16,4096,64", "1,16,4096,256"]
dtypes: [bf16, f32]
causal: both
repeats: 3
sgemm: 2048
EOF
  cat > /tmp/cpu_amx_bwd16.yaml <<'EOF'
ops: [flash_attn2]
backends: [cpu]
shapes: ["1,16,2048,128"]
dtypes: [bf16, f32]
causal: false
passes: [backward]
repeats: 3
sgemm: 0
EOF
  cat > /tmp/cpu_amx_bwd1.yaml <<'EOF'
ops: [flash_attn2]
backends: [cpu]
shapes: ["1,16,2048,128"]
dtypes: [bf16]
causal: false
passes: [backward]
repeats: 1
sgemm: 0
EOF
  cat > /tmp/cpu_amx_serving.yaml <<'EOF'
backends: [auto]
dtypes: [bf16, f32]
repeats: 3
serving:
  - {label: prefill2048, seqs: 1, kv_len: 2048, q_len: 2048, heads: [16, 16], head_dim: 128, page_size: 16,
     compare: dense}
  - {label: long_decode, seqs: 1, kv_len: 32768, q_len: 1, heads: [16, 16], head_dim: 128, page_size: 16,
     compare: dense}
EOF
  # bench NAME BIN FILE THREADS ROUND: one attnops bench, CSV (or serving JSON) into $OUT.
  bench() {
    local name=$1 bin=$2 file=$3 threads=$4 round=$5 which
    which=$([ "$bin" = "$G/attnops" ] && echo new || echo old)
    local base="$out/${name}_t${threads}_${which}_r${round}"
    if [ "$name" = serving ]; then
      run "$(basename "$base")" 120 "$bin" bench --file "$file" --threads "$threads" --no-progress \
        --serving-json "$base.json"
    else
      run "$(basename "$base")" 150 "$bin" bench --file "$file" --threads "$threads" --no-progress --csv "$base.csv"
    fi
  }
  for round in 1 2; do
    if [ "$round" = 2 ] && [ "$(elapsed)" -gt $((budget - 110)) ]; then
      say "speed round 2 skipped: $(elapsed) s of the ${budget} s budget used"
      break
    fi
    for bin in "$G/attnops-old" "$G/attnops"; do
      bench fwd1 "$bin" /tmp/cpu_amx_fwd1.yaml 1 "$round"
      bench fwd16 "$bin" /tmp/cpu_amx_fwd16.yaml 16 "$round"
      bench bwd16 "$bin" /tmp/cpu_amx_bwd16.yaml 16 "$round"
      [ "$round" = 1 ] && bench bwd1 "$bin" /tmp/cpu_amx_bwd1.yaml 1 "$round"
      for t in 16 1; do bench serving "$bin" /tmp/cpu_amx_serving.yaml "$t" "$round"; done
    done
  done
  if command -v python3 >/dev/null; then
    python3 "$G/cpu_amx/summarize.py" "$out" 2>&1 | tee -a "$out/summary.txt"
  fi
fi
say "done"
