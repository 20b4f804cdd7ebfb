#pragma once
// lowcomm._C's codec functions: lowcomm's CPU codecs on torch tensors (what the AQ-SGD link in
// lowcomm/aqsgd.py sends, and what tests compare against).

#include <pybind11/pybind11.h>

namespace lowcomm::torch_backend {

void bind_codecs(pybind11::module_& m);

}  // namespace lowcomm::torch_backend
