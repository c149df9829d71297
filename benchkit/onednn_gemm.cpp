#include "benchkit/onednn_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/common/threads.h"
#include "benchkit/median_timer.h"

// A sanitizer build never loads oneDNN: the library is not instrumented (its timings would mean
// nothing there) and LeakSanitizer's exit-time tracer crashes on the thread-local state of its
// OpenMP workers, which aborts an otherwise clean bench run.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTNOPS_SANITIZED_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ATTNOPS_SANITIZED_BUILD 1
#endif
#endif
#if defined(ATTNOPS_HAVE_ONEDNN_HEADERS) && !defined(ATTNOPS_SANITIZED_BUILD)
#define ATTNOPS_USE_ONEDNN 1
#endif

#if defined(ATTNOPS_USE_ONEDNN)
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#endif

namespace attnops::benchkit {

#if !defined(ATTNOPS_USE_ONEDNN)

std::string onednn_version() {
#if defined(ATTNOPS_SANITIZED_BUILD)
  return "not loaded in a sanitizer build (oneDNN is not instrumented)";
#else
  return "built without oneDNN's headers (install libdnnl-dev and rebuild)";
#endif
}
struct OnednnMatmul::State {};
OnednnMatmul::OnednnMatmul(int, DType, int) : error_(onednn_version()) {}
OnednnMatmul::~OnednnMatmul() = default;
void OnednnMatmul::run() {}
double OnednnMatmul::check() const {
  return NAN;
}
GemmCeiling measure_onednn_matmul(int n, DType dtype, int, int) {
  GemmCeiling g;
  g.name = dtype == DType::bf16 ? "onednn_bf16" : "onednn_f32";
  g.dtype = dtype;
  g.n = n;
  g.error = onednn_version();
  return g;
}

#else

namespace {

// The C API functions the measurement calls, looked up once in libdnnl.so.2.
struct Api {
  std::string error;  // empty when every symbol was found
  decltype(&dnnl_version) version = nullptr;
  decltype(&dnnl_engine_create) engine_create = nullptr;
  decltype(&dnnl_engine_destroy) engine_destroy = nullptr;
  decltype(&dnnl_stream_create) stream_create = nullptr;
  decltype(&dnnl_stream_wait) stream_wait = nullptr;
  decltype(&dnnl_stream_destroy) stream_destroy = nullptr;
  decltype(&dnnl_memory_desc_init_by_tag) md_init = nullptr;
  decltype(&dnnl_matmul_desc_init) matmul_desc_init = nullptr;
  decltype(&dnnl_primitive_desc_create) pd_create = nullptr;
  decltype(&dnnl_primitive_desc_query) pd_query = nullptr;
  decltype(&dnnl_primitive_desc_destroy) pd_destroy = nullptr;
  decltype(&dnnl_primitive_create) prim_create = nullptr;
  decltype(&dnnl_primitive_execute) prim_execute = nullptr;
  decltype(&dnnl_primitive_destroy) prim_destroy = nullptr;
  decltype(&dnnl_memory_create) mem_create = nullptr;
  decltype(&dnnl_memory_destroy) mem_destroy = nullptr;
};

template <class F>
void find(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f && error.empty()) error = std::string("libdnnl.so.2 lacks ") + name;
}

const Api& api() {
  static const Api a = [] {
    Api r;
    // Kept open for the process (never dlclose'd: oneDNN's thread-local state outlives a call).
    void* lib = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      r.error = std::string("libdnnl.so.2 not found (") + (why ? why : "dlopen failed") +
                "; Debian: apt-get install libdnnl2)";
      return r;
    }
    find(lib, "dnnl_version", r.version, r.error);
    find(lib, "dnnl_engine_create", r.engine_create, r.error);
    find(lib, "dnnl_engine_destroy", r.engine_destroy, r.error);
    find(lib, "dnnl_stream_create", r.stream_create, r.error);
    find(lib, "dnnl_stream_wait", r.stream_wait, r.error);
    find(lib, "dnnl_stream_destroy", r.stream_destroy, r.error);
    find(lib, "dnnl_memory_desc_init_by_tag", r.md_init, r.error);
    find(lib, "dnnl_matmul_desc_init", r.matmul_desc_init, r.error);
    find(lib, "dnnl_primitive_desc_create", r.pd_create, r.error);
    find(lib, "dnnl_primitive_desc_query", r.pd_query, r.error);
    find(lib, "dnnl_primitive_desc_destroy", r.pd_destroy, r.error);
    find(lib, "dnnl_primitive_create", r.prim_create, r.error);
    find(lib, "dnnl_primitive_execute", r.prim_execute, r.error);
    find(lib, "dnnl_primitive_destroy", r.prim_destroy, r.error);
    find(lib, "dnnl_memory_create", r.mem_create, r.error);
    find(lib, "dnnl_memory_destroy", r.mem_destroy, r.error);
    return r;
  }();
  return a;
}

// Restores OpenMP's thread count of the calling thread (oneDNN's OpenMP build reads it).
struct OmpThreads {
  int saved = omp_get_max_threads();
  explicit OmpThreads(int n) { omp_set_num_threads(n); }
  ~OmpThreads() { omp_set_num_threads(saved); }
};

}  // namespace

std::string onednn_version() {
  const Api& a = api();
  if (!a.error.empty()) return a.error;
  const dnnl_version_t* v = a.version();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (libdnnl.so.2)";
}

// The objects of one matmul, released in reverse order.
struct OnednnMatmul::State {
  explicit State(const Api& api) : a(api) {}
  const Api& a;
  int n = 0, threads = 0;
  std::size_t es = 4;  // element size
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_primitive_t prim = nullptr;
  dnnl_memory_t mem[3] = {nullptr, nullptr, nullptr};
  std::vector<unsigned char> buf[3];  // A, B, C
  ~State() {
    for (dnnl_memory_t m : mem)
      if (m) a.mem_destroy(m);
    if (prim) a.prim_destroy(prim);
    if (pd) a.pd_destroy(pd);
    if (stream) a.stream_destroy(stream);
    if (engine) a.engine_destroy(engine);
  }
  double value(int m, std::size_t i) const {
    if (es == 2) {
      std::uint16_t b;
      std::memcpy(&b, buf[m].data() + i * 2, 2);
      return static_cast<double>(bf16_bits_to_float(b));
    }
    float f;
    std::memcpy(&f, buf[m].data() + i * 4, 4);
    return static_cast<double>(f);
  }
};

OnednnMatmul::OnednnMatmul(int n, DType dtype, int threads) {
  const Api& a = api();
  if (!a.error.empty()) {
    error_ = a.error;
    return;
  }
  s_ = std::make_unique<State>(a);
  State& s = *s_;
  s.n = n;
  s.threads = worker_threads(threads);
  s.es = dtype == DType::bf16 ? 2 : 4;
  const OmpThreads omp(s.threads);
  const dnnl_data_type_t dt = dtype == DType::bf16 ? dnnl_bf16 : dnnl_f32;
  const dnnl_dims_t dims = {n, n};
  dnnl_memory_desc_t md;
  dnnl_matmul_desc_t desc;
  const char* impl = nullptr;
  if (a.engine_create(&s.engine, dnnl_cpu, 0) != dnnl_success ||
      a.stream_create(&s.stream, s.engine, dnnl_stream_default_flags) != dnnl_success ||
      a.md_init(&md, 2, dims, dt, dnnl_ab) != dnnl_success ||
      a.matmul_desc_init(&desc, &md, &md, nullptr, &md) != dnnl_success) {
    error_ = "oneDNN refused the matmul's description";
    return;
  }
  const dnnl_status_t st = a.pd_create(&s.pd, &desc, nullptr, s.engine, nullptr);
  if (st == dnnl_unimplemented) {
    error_ = std::string("oneDNN has no ") + (dtype == DType::bf16 ? "bf16" : "f32") + " matmul for this CPU";
    return;
  }
  if (st != dnnl_success || a.pd_query(s.pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success) {
    error_ = "oneDNN refused the matmul (status " + std::to_string(static_cast<int>(st)) + ")";
    return;
  }
  impl_ = impl ? impl : "?";
  if (impl_.rfind("ref", 0) == 0) {  // oneDNN's reference loops: no kernel for this dtype here
    error_ = "only oneDNN's reference kernel (" + impl_ + ") on this CPU: not timed";
    return;
  }
  // Operands filled with random values (see the header), in the matmul's dtype.
  const std::size_t elems = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (int m = 0; m < 3; ++m) {
    s.buf[m].resize(elems * s.es);
    for (std::size_t i = 0; i < elems; ++i) {
      const float x = m < 2 ? u(rng) : 0.f;
      if (s.es == 2) {
        const std::uint16_t b = float_to_bf16_bits(x);
        std::memcpy(s.buf[m].data() + i * 2, &b, 2);
      } else {
        std::memcpy(s.buf[m].data() + i * 4, &x, 4);
      }
    }
    if (a.mem_create(&s.mem[m], &md, s.engine, s.buf[m].data()) != dnnl_success) {
      error_ = "oneDNN could not wrap the operands";
      return;
    }
  }
  if (a.prim_create(&s.prim, s.pd) != dnnl_success)
    error_ = "oneDNN could not create the matmul (" + impl_ + ")";
}

OnednnMatmul::~OnednnMatmul() = default;

void OnednnMatmul::run() {
  if (!error_.empty()) return;
  const OmpThreads omp(s_->threads);
  const dnnl_exec_arg_t args[3] = {
      {DNNL_ARG_SRC, s_->mem[0]}, {DNNL_ARG_WEIGHTS, s_->mem[1]}, {DNNL_ARG_DST, s_->mem[2]}};
  s_->a.prim_execute(s_->prim, s_->stream, 3, args);
  s_->a.stream_wait(s_->stream);
}

double OnednnMatmul::check() const {
  if (!error_.empty()) return NAN;
  const State& s = *s_;
  const std::size_t n = static_cast<std::size_t>(s.n);
  std::mt19937 rng(2);
  std::uniform_int_distribution<std::size_t> pick(0, n - 1);
  double worst = 0;
  for (int t = 0; t < 32; ++t) {
    const std::size_t i = pick(rng), j = pick(rng);
    double want = 0;
    for (std::size_t k = 0; k < n; ++k) want += s.value(0, i * n + k) * s.value(1, k * n + j);
    const double e = std::abs(s.value(2, i * n + j) - want) / (1.0 + std::abs(want));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

GemmCeiling measure_onednn_matmul(int n, DType dtype, int repeats, int threads) {
  GemmCeiling g;
  g.name = dtype == DType::bf16 ? "onednn_bf16" : "onednn_f32";
  g.dtype = dtype;
  g.n = n;
  OnednnMatmul mm(n, dtype, threads);
  g.impl = mm.impl();
  if (!mm.error().empty()) {
    g.error = mm.error();
    return g;
  }
  mm.run();  // warm-up: oneDNN's kernel generation, the thread pool
  // A wrong result (or nothing computed) is no ceiling. bf16: C's rounding (2^-8 relative) on
  // sums of n products of |x| <= 1.
  const double err = mm.check();
  if (!(err <= (dtype == DType::bf16 ? 1e-2 : 1e-4))) {
    g.error =
        "oneDNN's result does not match double dot products (relative error " + std::to_string(err) + ")";
    return g;
  }
  std::vector<double> ms;
  for (int i = 0; i < std::max(1, repeats); ++i) ms.push_back(mean_call_ms([&] { mm.run(); }));
  g.median_ms = median_of(ms);
  g.gflops = 2.0 * n * static_cast<double>(n) * n / (g.median_ms * 1e6);
  return g;
}

#endif

}  // namespace attnops::benchkit
