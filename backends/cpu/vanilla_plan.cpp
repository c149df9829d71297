// vanilla_plan (vanilla_cpu.h): how the materialised-scores path of VanillaAttn::forward_cpu
// divides a call into tasks and how much scratch each thread holds. Baseline code: the plan is
// made here, once per call, and handed to the tier's kernel (vanilla_cpu.cpp), so every tier
// runs the same tasks and tests can check the working set without running a kernel.
#include <algorithm>

#include "attnops/ext/problem.h"
#include "backends/cpu/vanilla_cpu.h"

namespace attnops::cpu {

namespace {
using i64 = std::int64_t;
i64 round16(i64 x) {
  return (x + 15) / 16 * 16;
}
}  // namespace

VanillaPlan vanilla_plan(const AttentionProblem& p, int threads, i64 max_working_floats) {
  const i64 G = std::max<i64>(1, p.group()), cap = std::max<i64>(1, max_working_floats);
  const i64 width = std::max<i64>(1, p.Tk) + p.D + p.Dv;  // scores, query and output of one row
  const i64 widest = std::max<i64>(1, std::max(p.D, p.Dv));
  // Lanes over rows: per lane also the 1 / denominator, a constant 1, the visible range (2) and
  // the segment id (+1 for the chunk bookkeeping); per thread one widened row and one bias vector.
  const i64 per_lane = width + 6, fixed = widest + 16;
  VanillaPlan pl;
  pl.lanes_over_rows = 16 * per_lane + fixed <= cap;
  // Rows of one task that fit the cap (at least one; lanes over rows: a multiple of 16, so that
  // the rows rounded up to whole vectors fit too).
  const i64 rows_cap =
      pl.lanes_over_rows ? (cap - fixed) / per_lane / 16 * 16 : std::max<i64>(1, cap / width);

  // M = G * qc rows of about 128..256 make the products efficient while causal chunks stay short
  // enough that computing the chunk's whole visible kv range wastes little above the diagonal.
  pl.qc = std::min<i64>(std::max<i64>(1, p.Tq), std::max<i64>(16, 128 / G));
  pl.gc = G;
  if (G * pl.qc > rows_cap) {
    pl.qc = std::max<i64>(1, std::min(pl.qc, rows_cap / G));
    if (G * pl.qc > rows_cap) pl.gc = std::max<i64>(1, rows_cap / pl.qc);  // qc == 1: split the group
  }
  const auto count = [&] {
    pl.chunks = (p.Tq + pl.qc - 1) / pl.qc;
    pl.gslices = (G + pl.gc - 1) / pl.gc;
    pl.tasks = p.B * p.Hkv * pl.gslices * pl.chunks;
  };
  count();
  while (pl.tasks < 2 * threads && pl.qc > 1) {  // small B x Hkv: split q rows further
    pl.qc = (pl.qc + 1) / 2;
    count();
  }
  pl.rows = pl.gc * pl.qc;
  pl.convert_rows = std::clamp<i64>(cap / widest, 1, 256);
  if (pl.lanes_over_rows) {
    pl.lanes = round16(pl.rows);
    pl.scratch_floats = pl.lanes * per_lane + fixed + (p.dtype == DType::f32 ? 0 : pl.convert_rows * widest);
  } else {  // row-major reads f16 / bf16 K and V in place (no conversion buffer)
    pl.lanes = pl.rows;
    pl.scratch_floats = pl.rows * width;
  }
  return pl;
}

}  // namespace attnops::cpu
