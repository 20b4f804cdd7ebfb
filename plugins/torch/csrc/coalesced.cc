// The coalesced collectives: a list of tensors in one Work, each tensor's result exactly what
// its own collective gives (Gloo's semantics, which torch's FSDP2, DTensor's functional
// collectives and dist._coalescing_manager rely on), in as few lowcomm operations as the data
// allows: each operation costs at least a round trip over the group's slowest link, so N
// tensors in one operation save N - 1 of them.
//
// all_gather_into_tensor_coalesced: outputs[i] = every rank's inputs[i], rank-major. An
//   all-gather moves bytes, so inputs of any dtypes are laid end to end as bytes and gathered
//   in one all_gather; rank r's block holds its inputs in order, copied into each output's
//   r-th slice. One tensor: gathered straight into its output, no copy.
// reduce_scatter_tensor_coalesced: outputs[i] = op over the ranks of inputs[i]'s slice `rank`.
//   Per dtype, one reduce_scatter of the inputs laid out slice-major ([slice j][tensor i]), so
//   rank j's reduced block is its slice of every tensor, in order. Exact, as
//   reduce_scatter_tensor is. One tensor: straight from its input into its output.
// allreduce_coalesced: the exact tensors, per dtype, in one all_reduce of them end to end (an
//   element-wise reduction: the same bits as one by one); the ones the group compresses one by
//   one, each under its own error-feedback key (LowcommBackend::allreduce's).
//
// Every rank issues the same operations in the same order: groups are taken in the order of
// their first tensor, and what is compressed depends only on dtype, size and reduction.

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "backend.h"
#include "work.h"

namespace lowcomm::torch_backend {
namespace {

// String literals: the profiler keeps the pointer. Gloo's names.
constexpr const char* kAllGatherTitle = "lowcomm:all_gather_into_tensor_coalesced";
constexpr const char* kReduceScatterTitle = "lowcomm:reduce_scatter_tensor_coalesced";

void check_pairs(const char* what, const std::vector<at::Tensor>& outputs,
                 const std::vector<at::Tensor>& inputs) {
  TORCH_CHECK(!inputs.empty() && outputs.size() == inputs.size(), "lowcomm: ", what,
              " needs one output per input, got ", outputs.size(), " outputs and ", inputs.size(),
              " inputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].scalar_type() == inputs[i].scalar_type(), "lowcomm: ", what, " output ",
                i, " is ", outputs[i].scalar_type(), " but input ", i, " is ",
                inputs[i].scalar_type());
  }
}

// The indices of `tensors` grouped by dtype, groups in the order of their first tensor.
std::vector<std::vector<size_t>> by_dtype(const std::vector<at::Tensor>& tensors,
                                          const std::vector<size_t>& which) {
  std::vector<std::pair<at::ScalarType, std::vector<size_t>>> groups;
  for (size_t i : which) {
    const at::ScalarType t = tensors[i].scalar_type();
    auto it =
        std::find_if(groups.begin(), groups.end(), [t](const auto& g) { return g.first == t; });
    if (it == groups.end()) {
      groups.push_back({t, {i}});
    } else {
      it->second.push_back(i);
    }
  }
  std::vector<std::vector<size_t>> out;
  for (auto& g : groups) out.push_back(std::move(g.second));
  return out;
}

std::vector<size_t> all_indices(size_t n) {
  std::vector<size_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

c10::intrusive_ptr<c10d::Work> LowcommBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  check_pairs("all_gather_into_tensor_coalesced", outputs, inputs);
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "all_gather_into_tensor_coalesced",
                  all_of({&inputs, &outputs}));
  for (size_t i = 0; i < inputs.size(); ++i)
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_,
                "lowcomm: all_gather_into_tensor_coalesced output ", i, " must hold ", size_,
                " times input ", i, "'s ", inputs[i].numel(), " elements, has ",
                outputs[i].numel());
  if (inputs.size() == 1) {
    auto in = std::make_shared<Staged>(inputs[0], dev);
    auto out = std::make_shared<Staged>(outputs[0], dev);
    std::vector<lowcomm::Work> works{
        comm()->all_gather(in->buf.data_ptr(), out->buf.data_ptr(), elems(in->buf),
                           to_dtype(in->buf.scalar_type()), dev.where())};
    return launch(
        dev, c10d::OpType::COALESCED, outputs, std::move(works), [in, out] { out->write_back(); },
        inputs, kAllGatherTitle);
  }
  const size_t n = inputs.size();
  std::vector<int64_t> nbytes(n);
  int64_t per_rank = 0;
  for (size_t i = 0; i < n; ++i) {
    nbytes[i] = static_cast<int64_t>(inputs[i].nbytes());
    per_rank += nbytes[i];
  }
  auto send = std::make_shared<at::Tensor>(dev.empty(per_rank, at::kByte));
  int64_t pos = 0;
  for (size_t i = 0; i < n; ++i) {
    send->narrow(0, pos, nbytes[i]).copy_(bytes_of(inputs[i].contiguous()));
    pos += nbytes[i];
  }
  auto recv = std::make_shared<at::Tensor>(dev.empty(per_rank * size_, at::kByte));
  auto outs = std::make_shared<std::vector<Staged>>();
  for (const auto& o : outputs) outs->emplace_back(o, dev);
  std::vector<lowcomm::Work> works{comm()->all_gather(send->data_ptr(), recv->data_ptr(),
                                                      static_cast<uint64_t>(per_rank),
                                                      DType::kUInt8, dev.where())};
  const int ranks = size_;
  return launch(
      dev, c10d::OpType::COALESCED, outputs, std::move(works),
      [send, recv, outs, nbytes, per_rank, ranks] {
        for (int r = 0; r < ranks; ++r) {
          int64_t from = r * per_rank;
          for (size_t i = 0; i < outs->size(); ++i) {
            bytes_of((*outs)[i].buf)
                .narrow(0, r * nbytes[i], nbytes[i])
                .copy_(recv->narrow(0, from, nbytes[i]));
            from += nbytes[i];
          }
        }
        for (const auto& o : *outs) o.write_back();
      },
      inputs, kAllGatherTitle);
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  check_pairs("reduce_scatter_tensor_coalesced", outputs, inputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * size_,
                "lowcomm: reduce_scatter_tensor_coalesced input ", i, " must hold ", size_,
                " times output ", i, "'s ", outputs[i].numel(), " elements, has ",
                inputs[i].numel());
  const lowcomm::ReduceOp op = to_op(opts.reduceOp);
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "reduce_scatter_tensor_coalesced",
                  all_of({&inputs, &outputs}));
  lowcomm::ReduceScatterOptions rs;
  dev.apply(rs);
  if (inputs.size() == 1) {
    auto in = std::make_shared<Staged>(inputs[0], dev);
    auto out = std::make_shared<Staged>(outputs[0], dev);
    std::vector<lowcomm::Work> works{
        comm()->reduce_scatter(in->buf.data_ptr(), out->buf.data_ptr(), elems(out->buf),
                               to_dtype(out->buf.scalar_type()), op, rs)};
    return launch(
        dev, c10d::OpType::COALESCED, outputs, std::move(works), [in, out] { out->write_back(); },
        inputs, kReduceScatterTitle);
  }
  struct Block {
    at::Tensor send, recv;
    std::vector<size_t> members;
  };
  auto blocks = std::make_shared<std::vector<Block>>();
  std::vector<at::Tensor> flat_in;
  for (const auto& t : inputs) flat_in.push_back(t.reshape({-1}));
  std::vector<lowcomm::Work> works;
  for (auto& members : by_dtype(inputs, all_indices(inputs.size()))) {
    int64_t per_rank = 0;
    for (size_t i : members) per_rank += outputs[i].numel();
    Block b{at::empty({per_rank * size_}, inputs[members[0]].options()),
            at::empty({per_rank}, inputs[members[0]].options()), std::move(members)};
    int64_t pos = 0;
    for (int64_t j = 0; j < size_; ++j) {
      for (size_t i : b.members) {
        const int64_t k = outputs[i].numel();
        b.send.narrow(0, pos, k).copy_(flat_in[i].narrow(0, j * k, k));
        pos += k;
      }
    }
    works.push_back(comm()->reduce_scatter(b.send.data_ptr(), b.recv.data_ptr(),
                                           static_cast<uint64_t>(per_rank),
                                           to_dtype(b.send.scalar_type()), op, rs));
    blocks->push_back(std::move(b));
  }
  auto outs = outputs;
  return launch(
      dev, c10d::OpType::COALESCED, outputs, std::move(works),
      [blocks, outs] {
        for (const auto& b : *blocks) {
          int64_t pos = 0;
          for (size_t i : b.members) {
            const int64_t k = outs[i].numel();
            outs[i].copy_(b.recv.narrow(0, pos, k).view(outs[i].sizes()), /*non_blocking=*/true);
            pos += k;
          }
        }
      },
      inputs, kReduceScatterTitle);
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "lowcomm: allreduce_coalesced needs at least one tensor");
  for (const auto& t : tensors)
    TORCH_CHECK(!t.is_sparse(), "lowcomm: allreduce_coalesced takes dense tensors");
  const lowcomm::ReduceOp op = to_op(opts.reduceOp);
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "all_reduce_coalesced", tensors);
  std::vector<lowcomm::Work> works;
  // Compressed ones in place (each its own key); exact ones per dtype, end to end.
  auto staged = std::make_shared<std::vector<Staged>>();
  std::vector<size_t> exact;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!group_compresses(tensors[i], op)) {
      exact.push_back(i);
      continue;
    }
    Staged s(tensors[i], dev);
    lowcomm::AllReduceOptions ar = group_allreduce_options(tensors[i], op);
    dev.apply(ar);
    works.push_back(comm()->all_reduce(s.buf.data_ptr(), s.buf.data_ptr(), elems(s.buf),
                                       to_dtype(s.buf.scalar_type()), op, ar));
    staged->push_back(std::move(s));
  }
  struct Block {
    at::Tensor flat;
    std::vector<at::Tensor> members;
  };
  auto blocks = std::make_shared<std::vector<Block>>();
  for (const auto& members : by_dtype(tensors, exact)) {
    Block b;
    for (size_t i : members) b.members.push_back(tensors[i]);
    if (b.members.size() == 1) {
      staged->emplace_back(b.members[0], dev);
      b.flat = staged->back().buf;
      b.members.clear();  // written back through `staged`
    } else {
      b.flat = flat_of(b.members, dev, b.members[0].scalar_type(), true);
    }
    lowcomm::AllReduceOptions exact_ar;
    dev.apply(exact_ar);
    works.push_back(comm()->all_reduce(b.flat.data_ptr(), b.flat.data_ptr(), elems(b.flat),
                                       to_dtype(b.flat.scalar_type()), op, exact_ar));
    blocks->push_back(std::move(b));
  }
  return started(opts, launch(dev, c10d::OpType::ALLREDUCE_COALESCED, tensors, std::move(works),
                              [staged, blocks] {
                                for (const auto& s : *staged) s.write_back();
                                for (const auto& b : *blocks) {
                                  if (!b.members.empty()) unflatten(b.flat, b.members);
                                }
                              }));
}

}  // namespace lowcomm::torch_backend
