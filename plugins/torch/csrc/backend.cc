#include "backend.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "work.h"

namespace lowcomm::torch_backend {
namespace {

constexpr const char* kIdKey = "lowcomm/unique_id";
// Set right after the id, and what the others wait for: TCPStore's compareSet on a missing key
// wakes every client waiting for that key (torch 2.15), so a wait on the id itself would end
// early whenever another rank looked for it first.
constexpr const char* kIdSetKey = "lowcomm/unique_id_set";

// The value of `key` if it is in the store, in one round trip: TCPStore's get is a wait and then
// a get, two round trips to a store across a WAN link. compareSet with an expected value no
// unique id has (ids are text) reads without writing: it answers the expected value while the key
// is missing, else the value. nullopt: missing, or a store without compareSet.
std::optional<std::vector<uint8_t>> read_if_present(c10d::Store& store, const std::string& key) {
  static const std::vector<uint8_t> kAbsent{0};
  try {
    std::vector<uint8_t> v = store.compareSet(key, kAbsent, {});
    if (v == kAbsent) return std::nullopt;
    return v;
  } catch (const c10::NotImplementedError&) {
    return std::nullopt;
  }
}

// Every LowcommBackend alive in this process, for close_all_at_exit.
std::mutex g_live_mu;
std::set<LowcommBackend*>& live_backends() {         // guarded by g_live_mu
  static auto* s = new std::set<LowcommBackend*>();  // never destroyed: used at exit
  return *s;
}

}  // namespace

LowcommBackend::LowcommBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                               std::chrono::milliseconds timeout, BackendConfig config,
                               bool reconfigurable)
    : c10d::Backend(rank, size),
      store_(store),
      timeout_(timeout),
      awaiting_members_(reconfigurable),
      config_(std::move(config)) {
  if (!config_.codec.empty()) {
    auto spec = lowcomm::parse_codec_spec(config_.codec);
    TORCH_CHECK(spec.is_ok(), "lowcomm: codec '", config_.codec, "': ", spec.status().to_string());
    codec_ = *spec;
  }
  if (reconfigurable) {  // reconfigure() builds the communicator
    remember();
    return;
  }
  lowcomm::UniqueId id;
  if (rank == 0) {
    auto made = lowcomm::create_unique_id();
    TORCH_CHECK(made.is_ok(), "lowcomm: ", made.status().to_string());
    id = *made;
    const std::string text = id.to_string();
    store->set(kIdKey, std::vector<uint8_t>(text.begin(), text.end()));
    store->set(kIdSetKey, std::vector<uint8_t>{1});  // after the id: a store keeps the order
  } else {
    // Rank 0 writes the id as it starts, so the ranks of a group configured together usually
    // find it at once (one round trip to the store). Else they wait for it: with a join timeout,
    // a rank 0 that has not written it within that is frozen or gone (the store itself would
    // wait for its own, longer, timeout).
    std::optional<std::vector<uint8_t>> got = read_if_present(*store, kIdKey);
    if (!got) {
      if (config_.join_timeout.count() > 0) {
        try {
          store->wait({kIdSetKey}, config_.join_timeout);
        } catch (const c10::DistStoreError& e) {
          C10_THROW_ERROR(
              DistBackendError,
              "lowcomm: init rank " + std::to_string(rank) + " of " + std::to_string(size) +
                  ": rank 0 did not publish the group's id within " +
                  std::to_string(config_.join_timeout.count()) +
                  " ms (the join timeout; frozen, gone or late): " + e.what_without_backtrace());
        }
      } else {
        store->wait({kIdSetKey});  // the store's own timeout
      }
      got = read_if_present(*store, kIdKey);
    }
    // A store without compareSet: the id is there (its set came first).
    std::vector<uint8_t> bytes = got ? std::move(*got) : store->get(kIdKey);
    auto parsed = lowcomm::UniqueId::parse(std::string(bytes.begin(), bytes.end()));
    TORCH_CHECK(parsed.is_ok(), "lowcomm: the id in the store: ", parsed.status().to_string());
    id = *parsed;
  }
  auto comm = lowcomm::Communicator::init(id, rank, size, comm_options());
  if (!comm) C10_THROW_ERROR(DistBackendError, "lowcomm: " + comm.status().to_string());
  comm_ = std::move(comm).value();
  remember();  // last: a constructor that throws leaves nothing behind
}

LowcommBackend::~LowcommBackend() {
  forget();
}

void LowcommBackend::remember() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_backends().insert(this);
}

void LowcommBackend::forget() {
  std::lock_guard<std::mutex> lock(g_live_mu);
  live_backends().erase(this);
}

int LowcommBackend::close_all_at_exit() {
  // The communicators are taken out under the lock (a backend in the set has not reached its
  // members' destruction: its destructor erases it first) and closed outside it (closing may
  // complete operations whose callbacks release the last reference to a backend).
  std::vector<std::unique_ptr<lowcomm::Communicator>> open;
  {
    std::lock_guard<std::mutex> lock(g_live_mu);
    for (LowcommBackend* b : live_backends())
      if (b->comm_) open.push_back(std::move(b->comm_));
  }
  for (auto& c : open) {
    c->abort();
    c.reset();  // joins the communicator's threads
  }
  return static_cast<int>(open.size());
}

c10::intrusive_ptr<c10d::Backend> LowcommBackend::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<c10d::Backend::Options>& /*opts_override*/) {
  std::vector<int64_t> ex = ranks_to_exclude;
  std::sort(ex.begin(), ex.end());
  TORCH_CHECK(!ex.empty(), "lowcomm: shrink needs at least one rank to exclude");
  TORCH_CHECK(std::adjacent_find(ex.begin(), ex.end()) == ex.end(),
              "lowcomm: shrink: a rank is excluded twice");
  TORCH_CHECK(ex.front() >= 0 && ex.back() < size_, "lowcomm: shrink: rank ",
              ex.front() < 0 ? ex.front() : ex.back(), " is not in this group of ", size_);
  TORCH_CHECK(!std::binary_search(ex.begin(), ex.end(), static_cast<int64_t>(rank_)),
              "lowcomm: shrink: rank ", rank_,
              " is excluded and must not call shrink (only the remaining ranks do)");
  TORCH_CHECK(static_cast<int64_t>(ex.size()) < size_, "lowcomm: shrink would exclude every rank");
  const int new_rank =
      rank_ - static_cast<int>(std::lower_bound(ex.begin(), ex.end(), rank_) - ex.begin());
  const int new_size = size_ - static_cast<int>(ex.size());
  if (shrink_flags & 1) abort();  // SHRINK_ABORT: fail what is in flight on this group first
  std::string key = "lowcomm/shrink/" + std::to_string(++shrinks_) + "/";
  for (size_t i = 0; i < ex.size(); ++i) key += (i ? "," : "") + std::to_string(ex[i]);
  auto store = c10::make_intrusive<c10d::PrefixStore>(key, store_);
  return c10::make_intrusive<LowcommBackend>(store, new_rank, new_size, timeout_, config_);
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::launch(DeviceScope& dev, c10d::OpType type,
                                                      std::vector<at::Tensor> outputs,
                                                      std::vector<lowcomm::Work> works,
                                                      std::function<void()> finish,
                                                      std::optional<std::vector<at::Tensor>> inputs,
                                                      const char* title) {
  if (type != c10d::OpType::SEND && type != c10d::OpType::RECV &&
      type != c10d::OpType::RECVANYSOURCE)
    ++seq_;
  if (!inputs) inputs = outputs;  // in-place operations: the same tensors
  // The Work keeps `finish` (and the buffers it holds) until the operation completes, then runs
  // it (for CUDA, on the side stream, unless there is nothing to copy back).
  std::shared_ptr<DeviceDone> device = dev.done();
  auto w = c10::make_intrusive<LowcommWork>(type, rank_, std::move(outputs), std::move(finish),
                                            *inputs, title);
  if (device) w->set_device(std::move(device));
  w->start(std::move(works));
  return w;
}

c10::intrusive_ptr<c10d::Backend> LowcommBackend::create(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const std::chrono::duration<float>& timeout, const std::string& codec, int64_t codec_threshold,
    const std::string& error_feedback, int64_t direct_bytes, bool enable_reconfigure,
    const std::string& sparse_schedule, int64_t join_timeout_ms) {
  TORCH_CHECK_VALUE(join_timeout_ms >= 0, "lowcomm: join_timeout must not be negative, got ",
                    join_timeout_ms, " ms");
  BackendConfig config;
  config.join_timeout = std::chrono::milliseconds(join_timeout_ms);
  config.direct_bytes = direct_bytes;
  TORCH_CHECK_VALUE(sparse_schedule.empty() || sparse_schedule == "auto" ||
                        sparse_schedule == "gather-all" || sparse_schedule == "owner",
                    "lowcomm: sparse_schedule must be \"auto\", \"gather-all\" or \"owner\", got '",
                    sparse_schedule, "'");
  config.sparse_schedule = sparse_schedule;
  config.codec = codec;
  config.codec_threshold = codec_threshold;
  if (error_feedback == "address") {
    config.error_feedback = BackendConfig::ErrorFeedback::kAddress;
  } else if (error_feedback == "order") {
    config.error_feedback = BackendConfig::ErrorFeedback::kCallOrder;
  } else {
    TORCH_CHECK_VALUE(error_feedback.empty(),
                      "lowcomm: error_feedback must be \"address\", "
                      "\"order\" or off, got '",
                      error_feedback, "'");
  }
  if (!codec.empty()) {
    auto spec = lowcomm::parse_codec_spec(codec);
    TORCH_CHECK(spec.is_ok(), "lowcomm: codec '", codec, "': ", spec.status().to_string());
  }
  return c10::make_intrusive<LowcommBackend>(
      store, rank, size, std::chrono::duration_cast<std::chrono::milliseconds>(timeout), config,
      enable_reconfigure);
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                         const c10d::BroadcastOptions& opts) {
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "broadcast", tensors);
  std::vector<lowcomm::Work> works;
  auto staged = std::make_shared<std::vector<Staged>>();
  for (auto& t : tensors) {
    staged->emplace_back(t, dev);
    const at::Tensor& b = staged->back().buf;
    works.push_back(comm()->broadcast(b.data_ptr(), b.data_ptr(), elems(b),
                                      to_dtype(b.scalar_type()), static_cast<int>(opts.rootRank),
                                      dev.where()));
  }
  return started(opts, launch(dev, c10d::OpType::BROADCAST, tensors, std::move(works), [staged] {
                   for (auto& s : *staged) s.write_back();
                 }));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].is_sparse()) return allreduce_sparse(tensors[0], opts);
  const lowcomm::ReduceOp op = to_op(opts.reduceOp);
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "all_reduce", tensors);
  std::vector<lowcomm::Work> works;
  auto staged = std::make_shared<std::vector<Staged>>();
  for (auto& t : tensors) {
    staged->emplace_back(t, dev);
    const at::Tensor& b = staged->back().buf;
    lowcomm::AllReduceOptions ar = group_allreduce_options(t, op);
    dev.apply(ar);
    works.push_back(comm()->all_reduce(b.data_ptr(), b.data_ptr(), elems(b),
                                       to_dtype(b.scalar_type()), op, ar));
  }
  return started(opts, launch(dev, c10d::OpType::ALLREDUCE, tensors, std::move(works), [staged] {
                   for (auto& s : *staged) s.write_back();
                 }));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::allreduce_sparse(
    at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  // As Gloo does: every rank's (indices, values) to every rank, summed there. The counts come
  // first (one small all-gather), then indices and values padded to the largest count; the
  // call returns once they are here (a completed Work).
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM, "lowcomm: sparse all_reduce supports SUM only");
  // CUDA, as Gloo: through the host (the copies block; the result is in place on return).
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "all_reduce (sparse)", {tensor});
  at::Tensor c = (dev.cuda() ? tensor.cpu() : tensor).coalesce();
  const int64_t sparse_dim = c.sparse_dim();
  at::Tensor idx = c._indices().contiguous();
  at::Tensor val = c._values().contiguous();
  const int64_t nnz = idx.size(1);
  std::vector<int64_t> counts(static_cast<size_t>(size_));
  auto wait = [](lowcomm::Work w, const char* what) {
    lowcomm::Status s = w.wait();
    if (!s.is_ok())
      C10_THROW_ERROR(DistBackendError,
                      std::string("lowcomm: sparse all_reduce (") + what + "): " + s.to_string());
  };
  int64_t mine = nnz;
  wait(comm()->all_gather(&mine, counts.data(), 1, DType::kInt64), "counts");
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  std::vector<int64_t> dense_shape{most};
  for (int64_t d = 1; d < val.dim(); ++d) dense_shape.push_back(val.size(d));
  at::Tensor idx_pad = at::zeros({sparse_dim, most}, idx.options());
  at::Tensor val_pad = at::zeros(dense_shape, val.options());
  idx_pad.narrow(1, 0, nnz).copy_(idx);
  val_pad.narrow(0, 0, nnz).copy_(val);
  at::Tensor idx_all = at::empty({size_, sparse_dim, most}, idx.options());
  std::vector<int64_t> val_all_shape{size_};
  val_all_shape.insert(val_all_shape.end(), dense_shape.begin(), dense_shape.end());
  at::Tensor val_all = at::empty(val_all_shape, val.options());
  wait(comm()->all_gather(idx_pad.data_ptr(), idx_all.data_ptr(), elems(idx_pad), DType::kInt64),
       "indices");
  wait(comm()->all_gather(val_pad.data_ptr(), val_all.data_ptr(), elems(val_pad),
                          to_dtype(val.scalar_type())),
       "values");
  std::vector<at::Tensor> idx_parts, val_parts;
  for (int r = 0; r < size_; ++r) {
    idx_parts.push_back(idx_all[r].narrow(1, 0, counts[static_cast<size_t>(r)]));
    val_parts.push_back(val_all[r].narrow(0, 0, counts[static_cast<size_t>(r)]));
  }
  at::Tensor sum = at::sparse_coo_tensor(at::cat(idx_parts, 1), at::cat(val_parts, 0),
                                         tensor.sizes(), c.options())
                       .coalesce();
  tensor.copy_(sum);
  return launch(dev, c10d::OpType::ALLREDUCE, {tensor}, {});
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::reduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::ReduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "lowcomm: reduce takes one tensor");
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "reduce", tensors);
  auto staged = std::make_shared<Staged>(tensors[0], dev);
  const at::Tensor& b = staged->buf;
  const int root = static_cast<int>(opts.rootRank);
  lowcomm::AllReduceOptions ar;
  dev.apply(ar);
  std::vector<lowcomm::Work> works{comm()->reduce(b.data_ptr(), b.data_ptr(), elems(b),
                                                  to_dtype(b.scalar_type()), to_op(opts.reduceOp),
                                                  root, ar)};
  const bool is_root = root == rank_;
  return started(opts,
                 launch(dev, c10d::OpType::REDUCE, tensors, std::move(works), [staged, is_root] {
                   if (is_root) staged->write_back();
                 }));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1, "lowcomm: allgather takes one tensor");
  TORCH_CHECK(static_cast<int>(outputs[0].size()) == size_, "lowcomm: allgather needs ", size_,
              " output tensors");
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "all_gather",
                  all_of({&inputs, &outputs[0]}));
  auto in = std::make_shared<Staged>(inputs[0], dev);
  for (const auto& o : outputs[0]) {
    TORCH_CHECK(o.numel() == inputs[0].numel() && o.scalar_type() == inputs[0].scalar_type(),
                "lowcomm: allgather output tensors must match the input's size and dtype");
  }
  auto flat = std::make_shared<at::Tensor>(flat_of(outputs[0], dev, in->buf.scalar_type(), false));
  std::vector<lowcomm::Work> works{
      comm()->all_gather(in->buf.data_ptr(), flat->data_ptr(), elems(in->buf),
                         to_dtype(in->buf.scalar_type()), dev.where())};
  auto outs = outputs[0];
  return started(opts, launch(
                           dev, c10d::OpType::ALLGATHER, outs, std::move(works),
                           [flat, outs, in] { unflatten(*flat, outs); }, inputs));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // output_lists[r][i] receives rank r's inputs[i]: one all-gather of the inputs laid end to end.
  TORCH_CHECK(!inputs.empty(), "lowcomm: allgather_coalesced needs at least one input");
  TORCH_CHECK(static_cast<int>(output_lists.size()) == size_, "lowcomm: allgather_coalesced needs ",
              size_, " output lists");
  std::vector<at::Tensor> every = inputs;
  for (const auto& list : output_lists) every.insert(every.end(), list.begin(), list.end());
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "all_gather_coalesced", every);
  for (const auto& in : inputs) {
    TORCH_CHECK(in.scalar_type() == inputs[0].scalar_type(),
                "lowcomm: allgather_coalesced inputs must share one dtype");
  }
  for (const auto& list : output_lists) {
    TORCH_CHECK(list.size() == inputs.size(),
                "lowcomm: allgather_coalesced output lists must have one tensor per input");
    for (size_t i = 0; i < list.size(); ++i) {
      TORCH_CHECK(
          list[i].numel() == inputs[i].numel() && list[i].scalar_type() == inputs[i].scalar_type(),
          "lowcomm: allgather_coalesced output ", i, " must match input ", i, "'s size and dtype");
    }
  }
  auto send = std::make_shared<at::Tensor>(flat_of(inputs, dev, inputs[0].scalar_type(), true));
  const int64_t per_rank = send->numel();
  auto flat = std::make_shared<at::Tensor>(dev.empty(per_rank * size_, send->scalar_type()));
  std::vector<lowcomm::Work> works{comm()->all_gather(send->data_ptr(), flat->data_ptr(),
                                                      static_cast<uint64_t>(per_rank),
                                                      to_dtype(send->scalar_type()), dev.where())};
  std::vector<at::Tensor> outs;
  for (const auto& list : output_lists) outs.insert(outs.end(), list.begin(), list.end());
  return started(opts, launch(
                           dev, c10d::OpType::ALLGATHER_COALESCED, outs, std::move(works),
                           [send, flat, outs] { unflatten(*flat, outs); }, inputs));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::_allgather_base(at::Tensor& output,
                                                               at::Tensor& input,
                                                               const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(output.numel() == input.numel() * size_,
              "lowcomm: all_gather_into_tensor output must hold size() inputs");
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "all_gather_into_tensor", {input, output});
  auto in = std::make_shared<Staged>(input, dev);
  auto out = std::make_shared<Staged>(output, dev);
  std::vector<lowcomm::Work> works{
      comm()->all_gather(in->buf.data_ptr(), out->buf.data_ptr(), elems(in->buf),
                         to_dtype(in->buf.scalar_type()), dev.where())};
  return started(opts, launch(
                           dev, c10d::OpType::_ALLGATHER_BASE, {output}, std::move(works),
                           [in, out] { out->write_back(); }, std::vector<at::Tensor>{input}));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::GatherOptions& opts) {
  TORCH_CHECK(inputs.size() == 1, "lowcomm: gather takes one tensor");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs = rank_ == root ? outputs.at(0) : std::vector<at::Tensor>{};
  TORCH_CHECK(rank_ != root || static_cast<int>(outs.size()) == size_, "lowcomm: gather needs ",
              size_, " output tensors on the root");
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "gather", all_of({&inputs, &outs}));
  auto in = std::make_shared<Staged>(inputs[0], dev);
  auto flat = std::make_shared<at::Tensor>(
      rank_ == root ? flat_of(outs, dev, in->buf.scalar_type(), false) : at::Tensor());
  std::vector<lowcomm::Work> works{
      comm()->gather(in->buf.data_ptr(), rank_ == root ? flat->data_ptr() : nullptr, elems(in->buf),
                     to_dtype(in->buf.scalar_type()), root)};
  return started(opts, launch(
                           dev, c10d::OpType::GATHER, outs, std::move(works),
                           [flat, outs, in] {
                             if (flat->defined()) unflatten(*flat, outs);
                           },
                           inputs));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::scatter(std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1, "lowcomm: scatter takes one output tensor");
  const int root = static_cast<int>(opts.rootRank);
  TORCH_CHECK(rank_ != root || static_cast<int>(inputs.at(0).size()) == size_,
              "lowcomm: scatter needs ", size_, " input tensors on the root");
  std::vector<at::Tensor> ins = rank_ == root ? inputs.at(0) : std::vector<at::Tensor>{};
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "scatter", all_of({&outputs, &ins}));
  auto out = std::make_shared<Staged>(outputs[0], dev, /*input=*/false);
  at::Tensor flat;
  if (rank_ == root) flat = flat_of(ins, dev, out->buf.scalar_type(), true);
  auto keep = std::make_shared<at::Tensor>(flat);
  std::vector<lowcomm::Work> works{comm()->scatter(rank_ == root ? keep->data_ptr() : nullptr,
                                                   out->buf.data_ptr(), elems(out->buf),
                                                   to_dtype(out->buf.scalar_type()), root)};
  return started(opts, launch(dev, c10d::OpType::SCATTER, outputs, std::move(works),
                              [out, keep] { out->write_back(); }));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
              "lowcomm: reduce_scatter takes one tensor");
  TORCH_CHECK(static_cast<int>(inputs[0].size()) == size_, "lowcomm: reduce_scatter needs ", size_,
              " input tensors");
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "reduce_scatter",
                  all_of({&outputs, &inputs[0]}));
  auto out = std::make_shared<Staged>(outputs[0], dev);
  auto flat = std::make_shared<at::Tensor>(flat_of(inputs[0], dev, out->buf.scalar_type(), true));
  lowcomm::ReduceScatterOptions rs;
  dev.apply(rs);
  std::vector<lowcomm::Work> works{
      comm()->reduce_scatter(flat->data_ptr(), out->buf.data_ptr(), elems(out->buf),
                             to_dtype(out->buf.scalar_type()), to_op(opts.reduceOp), rs)};
  return started(opts, launch(
                           dev, c10d::OpType::REDUCE_SCATTER, outputs, std::move(works),
                           [out, flat] { out->write_back(); }, inputs.at(0)));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(input.numel() == output.numel() * size_,
              "lowcomm: reduce_scatter_tensor input must hold size() outputs");
  DeviceScope dev(streams_, DeviceScope::Path::kDevice, "reduce_scatter_tensor", {input, output});
  auto in = std::make_shared<Staged>(input, dev);
  auto out = std::make_shared<Staged>(output, dev);
  lowcomm::ReduceScatterOptions rs;
  dev.apply(rs);
  std::vector<lowcomm::Work> works{
      comm()->reduce_scatter(in->buf.data_ptr(), out->buf.data_ptr(), elems(out->buf),
                             to_dtype(out->buf.scalar_type()), to_op(opts.reduceOp), rs)};
  return started(opts, launch(
                           dev, c10d::OpType::_REDUCE_SCATTER_BASE, {output}, std::move(works),
                           [in, out] { out->write_back(); }, std::vector<at::Tensor>{input}));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                             std::vector<int64_t>& output_splits,
                                                             std::vector<int64_t>& input_splits,
                                                             const c10d::AllToAllOptions& opts) {
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "all_to_all_single", {input, output});
  auto in = std::make_shared<Staged>(input, dev);
  auto out = std::make_shared<Staged>(output, dev, /*input=*/false);
  const auto P = static_cast<size_t>(size_);
  // Splits are rows of dim 0; empty: equal rows per rank.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const uint64_t per_row = rows == 0 ? 0 : elems(t) / static_cast<uint64_t>(rows);
    std::vector<uint64_t> c(P), off(P);
    uint64_t at = 0;
    for (size_t j = 0; j < P; ++j) {
      const int64_t r = splits.empty() ? rows / static_cast<int64_t>(P) : splits.at(j);
      c[j] = static_cast<uint64_t>(r) * per_row;
      off[j] = at;
      at += c[j];
    }
    TORCH_CHECK(at <= elems(t), "lowcomm: all_to_all splits exceed the tensor");
    return std::make_pair(c, off);
  };
  TORCH_CHECK(input_splits.empty() || input_splits.size() == P, "lowcomm: input splits need ", P,
              " entries");
  TORCH_CHECK(output_splits.empty() || output_splits.size() == P, "lowcomm: output splits need ", P,
              " entries");
  auto [sc, so] = counts(in->buf, input_splits);
  auto [rc, ro] = counts(out->buf, output_splits);
  std::vector<lowcomm::Work> works{comm()->all_to_all(
      in->buf.data_ptr(), sc, so, out->buf.data_ptr(), rc, ro, to_dtype(in->buf.scalar_type()))};
  return started(opts, launch(
                           dev, c10d::OpType::ALLTOALL_BASE, {output}, std::move(works),
                           [in, out] { out->write_back(); }, std::vector<at::Tensor>{input}));
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllToAllOptions& opts) {
  // inputs[j] goes to rank j, outputs[j] comes from rank j (sizes may differ per rank): one
  // all_to_all over the tensors laid end to end.
  const auto P = static_cast<size_t>(size_);
  TORCH_CHECK(inputs.size() == P && outputs.size() == P, "lowcomm: alltoall needs ", P,
              " input and ", P, " output tensors");
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "all_to_all", all_of({&inputs, &outputs}));
  std::vector<uint64_t> sc(P), so(P), rc(P), ro(P);
  uint64_t s_at = 0, r_at = 0;
  for (size_t j = 0; j < P; ++j) {
    TORCH_CHECK(inputs[j].scalar_type() == inputs[0].scalar_type() &&
                    outputs[j].scalar_type() == inputs[0].scalar_type(),
                "lowcomm: alltoall tensors must share one dtype");
    sc[j] = elems(inputs[j]);
    so[j] = s_at;
    s_at += sc[j];
    rc[j] = elems(outputs[j]);
    ro[j] = r_at;
    r_at += rc[j];
  }
  const at::ScalarType dtype = inputs[0].scalar_type();
  auto send = std::make_shared<at::Tensor>(flat_of(inputs, dev, dtype, true));
  auto recv = std::make_shared<at::Tensor>(flat_of(outputs, dev, dtype, false));
  std::vector<lowcomm::Work> works{comm()->all_to_all(send->data_ptr(), sc, so, recv->data_ptr(),
                                                      rc, ro, to_dtype(inputs[0].scalar_type()))};
  auto outs = outputs;
  return started(opts, launch(
                           dev, c10d::OpType::ALLTOALL, outs, std::move(works),
                           [send, recv, outs] { unflatten(*recv, outs); }, inputs));
}

}  // namespace lowcomm::torch_backend

namespace lowcomm::torch_backend {

void LowcommBackend::abort() {
  if (comm_) comm_->abort();
}

void LowcommBackend::shutdown() {
  comm_.reset();  // the destructor finishes queued work and says goodbye
}

c10d::ErrorType LowcommBackend::getError() {
  if (!comm_) return c10d::ErrorType::SUCCESS;
  switch (comm_->status().code()) {
    case lowcomm::StatusCode::kOk:
      return c10d::ErrorType::SUCCESS;
    case lowcomm::StatusCode::kTimeout:
      return c10d::ErrorType::TIMEOUT;
    case lowcomm::StatusCode::kRemoteError:
      return c10d::ErrorType::REMOTE_ERROR;
    default:
      return c10d::ErrorType::COMM_ERROR;
  }
}

}  // namespace lowcomm::torch_backend
