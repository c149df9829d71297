// What `attnops info` reports, as data: the CPU (ISA, the cpu backend's tier), the Vulkan
// devices with their limits, and whether each backend is available on this host. attnops/info.py
// puts these together with the registry into attnops.info().
#include <pybind11/stl.h>

#include <string>

#include "attnops/attnops.h"
#include "attnops/environment.h"
#include "bindings.h"
#include "device.h"

namespace attnops::python {
namespace {

GpuSettings settings(const std::string& device, bool allow_software, const std::string& pipeline_cache) {
  GpuSettings g;
  g.device = device;
  g.allow_software = allow_software;
  g.pipeline_cache = pipeline_cache;
  return g;
}

}  // namespace

void bind_host_info(py::module_& m) {
  m.def(
      "host_cpu",
      [] {
        const CpuInfo c = registry().host().cpu();
        py::dict d;
        d["isa"] = c.isa_summary;
        d["threads"] = c.threads;
        d["avx2"] = c.avx2;
        d["fma"] = c.fma;
        d["f16c"] = c.f16c;
        d["avx512f"] = c.avx512f;
        d["avx512bf16"] = c.avx512bf16;
        d["amx_tile"] = c.amx_tile;
        d["amx_bf16"] = c.amx_bf16;
        d["tier"] = c.cpu_tier;
        d["tier_detected"] = c.cpu_tier_detected;
        d["tier_detail"] = c.cpu_tier_detail;
        return d;
      },
      "The CPU as the registry's host sees it (the keys of `attnops info --json`'s \"cpu\").");
  m.def(
      "host_gpu_devices",
      [](const std::string& device, bool allow_software, const std::string& pipeline_cache) {
        // The first probe loads the Vulkan driver: without the GIL.
        const auto devices = without_gil(
            [&] { return registry().host().gpu_devices(settings(device, allow_software, pipeline_cache)); });
        py::list l;
        for (const GpuDeviceInfo& g : devices) {
          py::dict d;
          d["index"] = g.index;
          d["name"] = g.name;
          d["type"] = g.type;
          d["api_version"] = g.api_version;
          d["software"] = g.software;
          d["qualifies"] = g.qualifies;
          d["why_not"] = g.why_not;
          d["max_shared_memory"] = g.max_shared_memory;
          d["max_workgroup_invocations"] = g.max_workgroup_invocations;
          d["subgroup_size"] = g.subgroup_size;
          d["max_storage_buffer_range"] = g.max_storage_buffer_range;
          d["shader_f16"] = g.shader_f16;
          l.append(d);
        }
        return l;
      },
      py::arg("device") = "", py::arg("allow_software") = false, py::arg("pipeline_cache") = "",
      "The Vulkan devices the loader reports, with the limits attnops relies on.");
  m.def(
      "host_availability",
      [](const std::string& backend, const std::string& device, bool allow_software,
         const std::string& pipeline_cache) {
        const auto b = parse_backend(backend);
        if (!b) throw Error(ErrorCode::invalid_argument, "unknown backend '" + backend + "'");
        const Availability a = without_gil([&] {
          return registry().host().availability(*b, settings(device, allow_software, pipeline_cache));
        });
        return py::make_tuple(a.available, a.detail);
      },
      py::arg("backend"), py::arg("device") = "", py::arg("allow_software") = false,
      py::arg("pipeline_cache") = "", "(available, detail) of a backend on this host.");
  m.def("max_worker_threads", &max_worker_threads, "The most worker threads one call uses.");
  m.def("reload_environment", &reload_environment,
        "Read ATTNOPS_FORCE_NATIVE, ATTNOPS_LOG, ATTNOPS_PROFILE and ATTNOPS_CPU_ISA again: the library "
        "reads them once per process, so a change to os.environ after the first call takes effect "
        "only then.");
}

}  // namespace attnops::python
