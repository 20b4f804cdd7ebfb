#include "elastic_bindings.h"

#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/python.h>

#include <memory>
#include <string>
#include <vector>

#include "lowcomm/elastic.h"
#include "tensor_util.h"

namespace py = pybind11;

namespace lowcomm::torch_backend {
namespace {

// A Status as a Python exception: kAborted (a member failed; inputs untouched; call again) is
// ElasticAborted; kFenced (this member is out of the group for good: rejoin) is ElasticFenced,
// not a subclass of ElasticAborted, so a loop that calls again on ElasticAborted ends; everything
// else RuntimeError; all with lowcomm's text.
py::object* g_fenced = nullptr;

void raise_if(const Status& s, const py::object& aborted) {
  if (s.is_ok()) return;
  if (s.code() == StatusCode::kAborted || (s.code() == StatusCode::kFenced && g_fenced)) {
    PyErr_SetString(s.code() == StatusCode::kAborted ? aborted.ptr() : g_fenced->ptr(),
                    s.to_string().c_str());
    throw py::error_already_set();
  }
  throw std::runtime_error("lowcomm: " + s.to_string());
}

ElasticOptions options_of(int retries, int failure_timeout_ms, int view_change_timeout_ms,
                          int timeout_s) {
  ElasticOptions o;
  o.retries = retries;
  o.failure_timeout = std::chrono::milliseconds(failure_timeout_ms);
  o.view_change_timeout = std::chrono::milliseconds(view_change_timeout_ms);
  o.comm.timeout = std::chrono::seconds(timeout_s);
  return o;
}

UniqueId parse_id(const std::string& text) {
  auto id = UniqueId::parse(text);
  TORCH_CHECK_VALUE(id.is_ok(), "lowcomm: elastic group id: ", id.status().to_string());
  return *id;
}

void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), "lowcomm: ", what, " must be a CPU tensor");
  TORCH_CHECK_VALUE(t.is_contiguous(), "lowcomm: ", what, " must be contiguous");
}

}  // namespace

void bind_elastic(py::module_& m) {
  py::object aborted = py::reinterpret_steal<py::object>(
      PyErr_NewException("lowcomm._C.ElasticAborted", PyExc_RuntimeError, nullptr));
  m.attr("ElasticAborted") = aborted;
  // Kept for the process's life (the module is never unloaded).
  g_fenced = new py::object(py::reinterpret_steal<py::object>(
      PyErr_NewException("lowcomm._C.ElasticFenced", PyExc_RuntimeError, nullptr)));
  m.attr("ElasticFenced") = *g_fenced;
  m.def("create_unique_id", [](const std::string& bind) {
    auto id = create_unique_id(bind);
    TORCH_CHECK(id.is_ok(), "lowcomm: create_unique_id: ", id.status().to_string());
    return id->to_string();
  });
  py::class_<ElasticCommunicator>(m, "ElasticGroup")
      .def_static(
          "found",
          [aborted](const std::string& id, int rank, int nranks, int retries, int failure_ms,
                    int change_ms, int timeout_s) {
            UniqueId uid = parse_id(id);
            Result<std::unique_ptr<ElasticCommunicator>> c = Status();
            {
              py::gil_scoped_release nogil;
              c = ElasticCommunicator::init(uid, rank, nranks,
                                            options_of(retries, failure_ms, change_ms, timeout_s));
            }
            raise_if(c.status(), aborted);
            return std::move(c).value();
          },
          py::arg("id"), py::arg("rank"), py::arg("nranks"), py::arg("retries"),
          py::arg("failure_timeout_ms"), py::arg("view_change_timeout_ms"), py::arg("timeout_s"))
      .def_static(
          "join",
          [aborted](const std::string& id, const std::vector<std::string>& seeds, int retries,
                    int failure_ms, int change_ms, int timeout_s) {
            UniqueId uid = parse_id(id);
            Result<std::unique_ptr<ElasticCommunicator>> c = Status();
            {
              py::gil_scoped_release nogil;
              c = ElasticCommunicator::join(uid, seeds,
                                            options_of(retries, failure_ms, change_ms, timeout_s));
            }
            raise_if(c.status(), aborted);
            return std::move(c).value();
          },
          py::arg("id"), py::arg("seeds"), py::arg("retries"), py::arg("failure_timeout_ms"),
          py::arg("view_change_timeout_ms"), py::arg("timeout_s"))
      .def(
          "all_reduce",
          [aborted](ElasticCommunicator& c, at::Tensor& t, bool average, const std::string& codec,
                    const std::string& key) {
            check_tensor(t, "the tensor");
            TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat,
                              "lowcomm: elastic all_reduce takes "
                              "float32 tensors");
            AllReduceOptions o;
            if (!codec.empty()) {
              auto spec = parse_codec_spec(codec);
              TORCH_CHECK_VALUE(spec.is_ok(), "lowcomm: codec '", codec,
                                "': ", spec.status().to_string());
              o.codec = *spec;
            }
            o.error_feedback_key = key;
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.all_reduce(t.data_ptr(), t.data_ptr(), static_cast<uint64_t>(t.numel()),
                               DType::kFloat32, average ? ReduceOp::kAverage : ReduceOp::kSum, o);
            }
            raise_if(s, aborted);
          },
          py::arg("tensor"), py::arg("average"), py::arg("codec") = "",
          py::arg("error_feedback_key") = "")
      .def(
          "broadcast",
          [aborted](ElasticCommunicator& c, at::Tensor& t, int64_t root) {
            check_tensor(t, "the tensor");
            TORCH_CHECK_VALUE(root >= 0, "lowcomm: broadcast root ", root, " is not a member id");
            DType dt = to_dtype(t.scalar_type());
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.broadcast(t.data_ptr(), t.data_ptr(), static_cast<uint64_t>(t.numel()), dt,
                              static_cast<uint32_t>(root));
            }
            raise_if(s, aborted);
          },
          py::arg("tensor"), py::arg("root"))
      .def(
          "all_gather",
          [aborted](ElasticCommunicator& c, const at::Tensor& t) {
            check_tensor(t, "the tensor");
            DType dt = to_dtype(t.scalar_type());
            std::vector<int64_t> shape{static_cast<int64_t>(c.size())};
            for (int64_t d : t.sizes()) shape.push_back(d);
            at::Tensor out = at::empty(shape, t.options());
            ElasticView layout;
            Status s;
            {
              py::gil_scoped_release nogil;
              s = c.all_gather(t.data_ptr(), out.data_ptr(), static_cast<uint64_t>(t.numel()), dt,
                               &layout);
            }
            raise_if(s, aborted);
            out = out.narrow(0, 0, static_cast<int64_t>(layout.members.size()));
            return py::make_tuple(out, py::make_tuple(layout.id, layout.members));
          },
          py::arg("tensor"))
      .def(
          "register_state",
          [aborted](ElasticCommunicator& c, const std::string& name, at::Tensor& t) {
            check_tensor(t, "registered state");
            raise_if(c.register_state(name, t.data_ptr(), t.nbytes()), aborted);
          },
          py::arg("name"), py::arg("tensor"))
      .def("view",
           [](const ElasticCommunicator& c) {
             ElasticView v = c.view();
             return py::make_tuple(v.id, v.members);
           })
      .def("rank", &ElasticCommunicator::rank)
      .def("size", &ElasticCommunicator::size)
      .def("member_id", &ElasticCommunicator::member_id)
      .def("member_address", &ElasticCommunicator::member_address)
      .def("status",
           [](const ElasticCommunicator& c) {
             Status s = c.status();
             return s.is_ok() ? std::string() : s.to_string();
           })
      .def("state",
           [](const ElasticCommunicator& c) {
             switch (c.state()) {
               case ElasticState::kLive:
                 return std::string("live");
               case ElasticState::kChanging:
                 return std::string("changing");
               case ElasticState::kFenced:
                 break;
             }
             return std::string("fenced");
           })
      .def("view_current", [](const ElasticCommunicator& c) { return c.view().current; })
      .def("stats", [](const ElasticCommunicator& c) {
        ElasticStats s = c.stats();
        py::dict d;
        d["committed"] = s.committed;
        d["view_changes"] = s.view_changes;
        d["retried"] = s.retried;
        d["state_hash"] = s.state_hash;
        d["last_view_change_s"] = std::chrono::duration<double>(s.last_view_change).count();
        return d;
      });
}

}  // namespace lowcomm::torch_backend
