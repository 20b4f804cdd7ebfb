#pragma once
// lowcomm._C's elastic group: lowcomm::ElasticCommunicator on torch tensors, for
// lowcomm/elastic.py (and lowcomm.diloco on an elastic group).

#include <pybind11/pybind11.h>

namespace lowcomm::torch_backend {

void bind_elastic(pybind11::module_& m);

}  // namespace lowcomm::torch_backend
