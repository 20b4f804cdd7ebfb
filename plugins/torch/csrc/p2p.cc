// Point-to-point operations (send, recv, any-source recv), the barrier and Gloo's monitored
// barrier. CUDA tensors take the staged path (device.h): the library's point-to-point takes host
// memory, so a send copies its tensor to pinned host memory first (the host waits for the
// caller's stream) and a receive copies its result back on the side stream once it completes.

#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

#include "backend.h"
#include "work.h"

namespace lowcomm::torch_backend {
namespace {

// monitoredBarrier's messages: above every tag torch can pass (an int), below the core's 2^60.
constexpr uint64_t kMonitorArriveTag = 1ull << 40;
constexpr uint64_t kMonitorReleaseTag = kMonitorArriveTag + 1;

}  // namespace

c10::intrusive_ptr<c10d::Work> LowcommBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                    int tag) {
  TORCH_CHECK(tensors.size() == 1, "lowcomm: send takes one tensor");
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "send", tensors);
  auto in = std::make_shared<Staged>(tensors[0], dev);
  std::vector<lowcomm::Work> works{comm()->send(in->buf.data_ptr(), elems(in->buf),
                                                to_dtype(in->buf.scalar_type()), dst,
                                                static_cast<uint64_t>(tag))};
  // Nothing to copy back: `finish` only holds the staged input until the send completes.
  return launch(dev, c10d::OpType::SEND, tensors, std::move(works), [in] {});
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                    int tag) {
  TORCH_CHECK(tensors.size() == 1, "lowcomm: recv takes one tensor");
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "recv", tensors);
  auto out = std::make_shared<Staged>(tensors[0], dev, /*input=*/false);
  std::vector<lowcomm::Work> works{comm()->recv(out->buf.data_ptr(), elems(out->buf),
                                                to_dtype(out->buf.scalar_type()), src,
                                                static_cast<uint64_t>(tag))};
  std::function<void()> finish = [out] { out->write_back(); };
  std::shared_ptr<DeviceDone> device = dev.done();
  auto w = c10::make_intrusive<LowcommWork>(c10d::OpType::RECV, rank_, tensors, std::move(finish),
                                            tensors);
  w->set_source_rank(src);
  if (device) w->set_device(std::move(device));
  w->start(std::move(works));
  return w;
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                             int tag) {
  TORCH_CHECK(tensors.size() == 1, "lowcomm: recv takes one tensor");
  DeviceScope dev(streams_, DeviceScope::Path::kStaged, "recv", tensors);
  auto out = std::make_shared<Staged>(tensors[0], dev, /*input=*/false);
  std::vector<lowcomm::Work> works{comm()->recv_any(out->buf.data_ptr(), elems(out->buf),
                                                    to_dtype(out->buf.scalar_type()),
                                                    static_cast<uint64_t>(tag))};
  return launch(dev, c10d::OpType::RECVANYSOURCE, tensors, std::move(works),
                [out] { out->write_back(); });
}

void LowcommBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  using Clock = std::chrono::steady_clock;
  const auto timeout = opts.timeout;
  const auto deadline = Clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  lowcomm::Communicator* c = comm();
  uint8_t token = 1;
  if (rank_ != 0) {
    Status s = c->send(&token, 1, DType::kUInt8, 0, kMonitorArriveTag).wait_for(left());
    if (s.is_ok()) s = c->recv(&token, 1, DType::kUInt8, 0, kMonitorReleaseTag).wait_for(left());
    if (!s.is_ok()) {
      c->abort();  // a send or receive may still hold `token`
      C10_THROW_ERROR(DistBackendError,
                      "lowcomm: Rank " + std::to_string(rank_) +
                          " successfully reached monitoredBarrier, but received errors while "
                          "waiting for send/recv from rank 0 (" +
                          s.to_string() + "). Please check rank 0 logs for faulty rank.");
    }
    return;
  }
  // Rank 0: one any-source receive per other rank, so a missing rank does not hold up the
  // accounting of the others.
  std::vector<uint8_t> got(static_cast<size_t>(size_), 0);
  std::vector<lowcomm::Work> arrivals;
  for (int r = 1; r < size_; ++r)
    arrivals.push_back(
        c->recv_any(&got[static_cast<size_t>(r)], 1, DType::kUInt8, kMonitorArriveTag));
  std::vector<bool> came(static_cast<size_t>(size_), false);
  came[0] = true;
  for (auto& w : arrivals) {
    if (!waitAllRanks && left().count() <= 0 && !w.test()) {
      // As Gloo: the time ran out before this rank's turn (a zero timeout, or slow arrivals)
      c->abort();  // receives still hold `got`
      C10_THROW_ERROR(DistBackendError,
                      "lowcomm: [Rank 0]: Rank 0 timed out in monitoredBarrier after " +
                          std::to_string(timeout.count()) + " ms");
    }
    Status s = w.wait_for(left());
    if (s.is_ok()) {
      came[static_cast<size_t>(w.source())] = true;
      continue;
    }
    c->abort();  // receives still hold `got`
    std::vector<int> missing;
    for (int r = 1; r < size_; ++r)
      if (!came[static_cast<size_t>(r)]) missing.push_back(r);
    if (s.code() != StatusCode::kTimeout || missing.empty())
      C10_THROW_ERROR(DistBackendError,
                      "lowcomm: [Rank 0]: monitoredBarrier failed: " + s.to_string());
    if (!waitAllRanks) missing.resize(1);  // Gloo names the first
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    C10_THROW_ERROR(DistBackendError, std::string("lowcomm: [Rank 0]: ") +
                                          (missing.size() == 1 ? "Rank " : "Ranks ") + list +
                                          " failed to pass monitoredBarrier in " +
                                          std::to_string(timeout.count()) + " ms");
  }
  std::vector<lowcomm::Work> releases;
  for (int r = 1; r < size_; ++r)
    releases.push_back(c->send(&token, 1, DType::kUInt8, r, kMonitorReleaseTag));
  for (auto& w : releases) {
    Status s = w.wait_for(left());
    if (!s.is_ok()) {
      c->abort();
      C10_THROW_ERROR(DistBackendError,
                      "lowcomm: [Rank 0]: monitoredBarrier release failed: " + s.to_string());
    }
  }
}

c10::intrusive_ptr<c10d::Work> LowcommBackend::barrier(const c10d::BarrierOptions& opts) {
  DeviceScope host(streams_, DeviceScope::Path::kStaged, "barrier", {});  // waits on the host
  return started(opts, launch(host, c10d::OpType::BARRIER, {}, {comm()->barrier()}));
}

}  // namespace lowcomm::torch_backend
