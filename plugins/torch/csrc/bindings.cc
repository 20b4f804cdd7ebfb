// lowcomm._C: the backend class and its creator, for torch.distributed.Backend.register_backend.

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include "backend.h"
#include "codec_bindings.h"
#include "device.h"
#include "elastic_bindings.h"
#include "lowcomm/env.h"

namespace py = pybind11;
using lowcomm::torch_backend::LowcommBackend;

PYBIND11_MODULE(_C, m) {
  m.doc() = "lowcomm's torch.distributed backend";
  py::module::import("torch.distributed");  // registers c10d::Backend's Python type
  lowcomm::torch_backend::install_torch_device_allocator();
  py::class_<LowcommBackend, c10d::Backend, c10::intrusive_ptr<LowcommBackend>>(m, "LowcommBackend")
      .def("allreduce_with", &LowcommBackend::allreduce_with, py::arg("tensor"), py::arg("codec"),
           py::arg("error_feedback_key"), py::arg("op"), py::arg("step") = -1,
           py::arg("owner_ef") = false, py::call_guard<py::gil_scoped_release>())
      .def("save_error_feedback",
           [](LowcommBackend& b) {
             std::vector<uint8_t> v;
             {
               py::gil_scoped_release nogil;
               v = b.save_error_feedback();
             }
             return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
           })
      .def("restore_error_feedback",
           [](LowcommBackend& b, const py::bytes& data) {
             std::string s = data;
             std::vector<uint8_t> v(s.begin(), s.end());
             py::gil_scoped_release nogil;
             b.restore_error_feedback(v);
           })
      .def("error_feedback_keys", &LowcommBackend::error_feedback_keys,
           py::call_guard<py::gil_scoped_release>())
      .def("reset_error_feedback", &LowcommBackend::reset_error_feedback, py::arg("name") = "",
           py::call_guard<py::gil_scoped_release>())
      // getError() by name, for every torch (older ones do not bind Backend.get_error).
      .def("error_type",
           [](LowcommBackend& b) {
             switch (b.getError()) {
               case c10d::ErrorType::SUCCESS:
                 return "SUCCESS";
               case c10d::ErrorType::TIMEOUT:
                 return "TIMEOUT";
               case c10d::ErrorType::REMOTE_ERROR:
                 return "REMOTE_ERROR";
               default:
                 return "COMM_ERROR";
             }
           })
      .def("last_op_stats", [](const LowcommBackend& b) {
        lowcomm::OpStats s = b.last_op_stats();
        py::dict d;
        d["kind"] = s.kind;
        d["sequence"] = s.sequence;
        d["count"] = s.count;
        d["codec"] = s.codec;
        d["bytes_sent"] = s.bytes_sent;
        d["bytes_received"] = s.bytes_received;
        d["payload_bytes_sent"] = s.payload_bytes_sent;
        d["uncompressed_bytes_sent"] = s.uncompressed_bytes_sent;
        d["ucx_bytes_sent"] = s.ucx_bytes_sent;  // CommOptions::intra_site
        d["compression_ratio"] = s.compression_ratio;
        d["density"] = s.density;
        d["index_bytes_sent"] = s.index_bytes_sent;
        d["value_bytes_sent"] = s.value_bytes_sent;
        auto secs = [](std::chrono::nanoseconds ns) {
          return std::chrono::duration<double>(ns).count();
        };
        d["wall_s"] = secs(s.wall);
        d["encode_s"] = secs(s.encode);
        d["decode_s"] = secs(s.decode);
        d["network_wait_s"] = secs(s.network_wait);
        d["link_limit_s"] = secs(s.link_limit);
        d["link_efficiency"] = s.link_efficiency;
        d["shares"] = s.shares;  // owner shares by rank; empty: equal (docs/sites.md)
        d["rate_estimate"] = s.rate_estimate;
        // An all-reduce's schedule: flat, two-level, one-hop; sparse: gather-all or owner.
        d["schedule"] = s.schedule;
        // CUDA tensors on the library's device path (docs/torch.md, "CUDA tensors"): bytes
        // copied each way between the device and host memory, and "gpu-codec" (encoded and
        // decoded on the GPU) or "staged" (through pinned host memory); 0 and "" for host
        // buffers, and for operations the plugin stages itself (gather, scatter, all-to-all,
        // send/recv: the library sees host buffers).
        d["device_to_host_bytes"] = s.device_to_host_bytes;
        d["host_to_device_bytes"] = s.host_to_device_bytes;
        d["device_path"] = s.device_path;
        // Chunks of the operation's received messages that failed their payload check and were
        // sent again (docs/transport.md, "Re-sends"), in all and by sending rank.
        d["chunks_resent"] = s.chunks_resent;
        d["chunks_resent_by_rank"] = s.chunks_resent_by_rank;
        return d;
      });
  lowcomm::torch_backend::bind_codecs(m);
  lowcomm::torch_backend::bind_elastic(m);
  m.def("create_backend", &LowcommBackend::create, py::arg("store"), py::arg("rank"),
        py::arg("size"), py::arg("timeout"), py::arg("codec"), py::arg("codec_threshold"),
        py::arg("error_feedback"), py::arg("direct_bytes"), py::arg("enable_reconfigure") = false,
        py::arg("sparse_schedule") = "", py::arg("join_timeout_ms") = 0,
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "env_value",
      [](const std::string& name) -> py::object {
        auto v = lowcomm::env_value(name);
        if (!v) throw py::value_error(v.status().message());
        if (!v->has_value()) return py::none();
        return py::str(**v);
      },
      py::arg("name"),
      "A LOWCOMM_* variable as the library reads it (README, 'Environment'): None when unset, a "
      "byte count in bytes, a choice as declared; ValueError naming it when malformed.");
  m.def("close_all_at_exit", &LowcommBackend::close_all_at_exit,
        py::call_guard<py::gil_scoped_release>());
  // Whether this extension was built to take CUDA tensors (setup.py: LOWCOMM_WITH_CUDA).
#ifdef LOWCOMM_WITH_CUDA
  m.attr("WITH_CUDA") = true;
#else
  m.attr("WITH_CUDA") = false;
#endif
}
