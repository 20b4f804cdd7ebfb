#include "collectives/device_op.h"

#include <algorithm>
#include <set>
#include <string>

namespace lowcomm::collectives {
namespace {

// A sender residual in device memory, freed on the communicator's stream of its device.
class DeviceResidualBuffer final : public DeviceResidual {
 public:
  DeviceResidualBuffer(DeviceContext& ctx, int device, device::Stream s, float* p, uint64_t n)
      : ctx_(ctx), device_(device), stream_(s), p_(p), n_(n) {}
  ~DeviceResidualBuffer() override {
    // Freed on the executor (or with the communicator): the stream's device, set, not restored.
    (void)ctx_.rt().set_device(device_);
    ctx_.free_device(p_, stream_);
  }
  float* data() override { return p_; }
  int device() const override { return device_; }
  Status to_host(float* dst) override {
    LOWCOMM_CHECK(ctx_.rt().set_device(device_));  // on the executor: not restored
    LOWCOMM_CHECK(ctx_.rt().copy(dst, p_, n_ * sizeof(float), stream_));
    return ctx_.rt().synchronize(stream_);
  }

 private:
  DeviceContext& ctx_;
  int device_;
  device::Stream stream_;
  float* p_;
  uint64_t n_;
};

}  // namespace

DeviceCall::~DeviceCall() {
  if (rt != nullptr && ready != nullptr) rt->destroy_event(ready);
}

DeviceContext::~DeviceContext() {
  for (auto& [dev, s] : streams_) {
    device::DeviceGuard guard(rt_, dev);
    (void)rt_.synchronize(s);
    rt_.destroy_stream(s);
  }
}

Result<void*> DeviceContext::alloc_device(uint64_t bytes, device::Stream s) {
  if (allocator_.alloc == nullptr) return rt_.alloc_device(bytes, s);
  void* p = allocator_.alloc(bytes, s, allocator_.ctx);
  if (p == nullptr)
    return Status(StatusCode::kSystem, "the installed device allocator could not give " +
                                           std::to_string(bytes) + " bytes: out of memory");
  return p;
}

void DeviceContext::free_device(void* p, device::Stream s) {
  if (allocator_.release == nullptr)
    rt_.free_device(p, s);
  else
    allocator_.release(p, s, allocator_.ctx);
}

Result<device::Stream> DeviceContext::stream(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = streams_.find(device); it != streams_.end()) return it->second;
  auto s = rt_.create_stream();
  if (!s) return s.status();
  streams_[device] = *s;
  return *s;
}

Result<std::shared_ptr<DeviceCall>> DeviceContext::begin_call(
    const char* what, std::initializer_list<const void*> buffers, void* user_stream,
    const std::vector<uint64_t>& blocks, uint64_t worst_pinned) {
  int dev = -1;
  for (const void* p : buffers) {
    if (p == nullptr) continue;
    auto d = rt_.device_of(p);
    if (!d)
      return invalid_argument(std::string(what) + ": MemoryKind::kCuda takes device buffers; " +
                              d.status().message());
    if (dev >= 0 && *d != dev)
      return invalid_argument(std::string(what) + ": buffers on devices " + std::to_string(dev) +
                              " and " + std::to_string(*d) + "; one call takes one device");
    dev = *d;
  }
  auto call = std::make_shared<DeviceCall>();
  call->rt = &rt_;
  call->user = user_stream;
  if (dev < 0) return call;  // no buffer (a count of 0): nothing to order or copy
  const uint64_t pinned = std::max(device::pinned_bytes(blocks), worst_pinned);
  if (pinned > pinned_.limit())
    return Status(StatusCode::kUnsupported,
                  std::string(what) + ": " + std::to_string(pinned) +
                      " bytes of pinned host memory needed for these CUDA buffers pass the "
                      "pool's limit of " +
                      std::to_string(pinned_.limit()) + " bytes (LOWCOMM_PINNED_BYTES)");
  auto capturing = rt_.capturing(user_stream);
  if (!capturing) return capturing.status();
  if (*capturing)
    return invalid_argument(std::string(what) +
                            ": the stream is being captured into a CUDA graph; lowcomm's "
                            "collectives run on the host and cannot be captured");
  call->device = dev;
  device::DeviceGuard guard(rt_, dev);  // the caller's current device is left as it was
  LOWCOMM_CHECK(guard.status());
  auto e = rt_.create_event();
  if (!e) return e.status();
  call->ready = *e;
  LOWCOMM_CHECK(rt_.record(call->ready, user_stream));
  // The communicator's stream, and the pinned blocks, made now rather than on the executor.
  auto s = stream(dev);
  if (!s) return s.status();
  // Deferred while a running operation holds blocks (they come back); a failed allocation is
  // this rank's failure, reported at the call (Communicator: the group's).
  LOWCOMM_CHECK(pinned_.reserve(blocks));
  return call;
}

Status DeviceContext::preload(const DeviceCall& call, const CodecSpec& wire, DType dtype) {
  if (call.device < 0 || !(wire.quantized() || wire.sparse())) return Status::ok();
  static std::mutex mu;
  static std::set<std::string>* done = new std::set<std::string>;
  const std::string key =
      std::to_string(call.device) + "/" + to_string(wire) + "/" + std::string(dtype_name(dtype));
  std::lock_guard<std::mutex> lock(mu);
  if (done->count(key)) return Status::ok();
  device::DeviceGuard guard(rt_, call.device);
  LOWCOMM_CHECK(guard.status());
  auto s = rt_.create_stream();
  if (!s) return s.status();
  struct Cleanup {
    DeviceContext& ctx;
    device::Stream s;
    std::vector<void*> mem;
    ~Cleanup() {
      (void)ctx.rt().synchronize(s);
      for (void* p : mem) ctx.free_device(p, s);
      (void)ctx.rt().synchronize(s);
      ctx.rt().destroy_stream(s);
    }
  } c{*this, *s, {}};
  // Two scale groups (sparse: chunks; per-column scales: rows).
  const uint64_t n = 2 * uint64_t{wire.grouping == Grouping::kColumn ? wire.cols : wire.block};
  const uint64_t bytes = encoded_size(wire, n);
  for (uint64_t b : {n * dtype_size(dtype), bytes, n * sizeof(float), n * dtype_size(dtype)}) {
    auto p = alloc_device(b, *s);
    if (!p) return p.status();
    c.mem.push_back(*p);
    LOWCOMM_CHECK(rt_.zero(*p, b, *s));
  }
  LOWCOMM_CHECK(rt_.encode(wire, dtype, c.mem[0], n, c.mem[1], bytes, {}, *s));
  if (wire.sparse() || wire.ef_decay == 1.0f)  // the dense kernels take no decay
    LOWCOMM_CHECK(rt_.encode_error_feedback(wire, dtype, c.mem[0], static_cast<float*>(c.mem[2]), n,
                                            c.mem[1], bytes, {}, *s));
  LOWCOMM_CHECK(rt_.decode(wire, c.mem[1], bytes, n, dtype, c.mem[3], *s));
  LOWCOMM_CHECK(rt_.synchronize(*s));
  done->insert(key);
  return Status::ok();
}

DeviceOp::~DeviceOp() {
  if (begun_) (void)ctx_.rt().synchronize(stream_);
  for (void* p : scratch_) ctx_.free_device(p, stream_);
  pinned_.clear();
  if (previous_device_ >= 0) (void)ctx_.rt().set_device(previous_device_);
}

Status DeviceOp::begin(const char* path) {
  counters_.device_path = path;
  if (call_.device < 0) return Status::ok();  // no buffer: nothing to order
  if (restore_device_) {
    auto cur = ctx_.rt().current_device();
    if (!cur) return cur.status();
    if (*cur != call_.device) previous_device_ = *cur;
  }
  LOWCOMM_CHECK(ctx_.rt().set_device(call_.device));
  auto s = ctx_.stream(call_.device);
  if (!s) return s.status();
  stream_ = *s;
  begun_ = true;
  return ctx_.rt().wait(stream_, call_.ready);
}

Result<uint8_t*> DeviceOp::pinned(uint64_t bytes) {
  auto b = ctx_.pinned().acquire(bytes);
  if (!b) return b.status();
  uint8_t* p = b->data();
  pinned_.push_back(std::move(b).value());
  return p;
}

Result<void*> DeviceOp::device_scratch(uint64_t bytes) {
  auto p = ctx_.alloc_device(bytes == 0 ? 1 : bytes, stream_);
  if (!p) return p.status();
  scratch_.push_back(*p);
  return *p;
}

Status DeviceOp::to_host(void* host, const void* dev, uint64_t bytes) {
  counters_.device_to_host += bytes;
  return ctx_.rt().copy(host, dev, bytes, stream_);
}

Status DeviceOp::to_device(void* dev, const void* host, uint64_t bytes) {
  counters_.host_to_device += bytes;
  return ctx_.rt().copy(dev, host, bytes, stream_);
}

Status DeviceOp::sync() {
  return ctx_.rt().synchronize(stream_);
}

Status run_staged(DeviceOp& d, const void* send, uint64_t send_bytes, void* recv,
                  uint64_t recv_bytes, const std::function<Status(const void*, void*)>& body) {
  const bool in_place = send != nullptr && send == recv;
  uint8_t* hs = nullptr;
  uint8_t* hr = nullptr;
  if (in_place) {
    auto b = d.pinned(std::max(send_bytes, recv_bytes));
    if (!b) return b.status();
    hs = hr = *b;
  } else {
    if (send != nullptr) {
      auto b = d.pinned(send_bytes);
      if (!b) return b.status();
      hs = *b;
    }
    if (recv != nullptr) {
      auto b = d.pinned(recv_bytes);
      if (!b) return b.status();
      hr = *b;
    }
  }
  if (send != nullptr) {
    LOWCOMM_CHECK(d.to_host(hs, send, send_bytes));
    LOWCOMM_CHECK(d.sync());
  }
  LOWCOMM_CHECK(body(send != nullptr ? hs : nullptr, recv != nullptr ? hr : nullptr));
  if (recv != nullptr) {
    LOWCOMM_CHECK(d.to_device(recv, hr, recv_bytes));
    LOWCOMM_CHECK(d.sync());
  }
  return Status::ok();
}

Result<float*> device_residual(DeviceOp& d, ErrorFeedbackEntry& e) {
  if (e.device && e.device->device() == d.device()) return e.device->data();
  if (e.device) {  // kept on another device: through the host to this one
    e.sender.resize(e.n);
    LOWCOMM_CHECK(e.device->to_host(e.sender.data()));
    e.device.reset();
    LOWCOMM_CHECK(d.rt().set_device(d.device()));
  }
  auto mem = d.context().alloc_device(e.n * sizeof(float), d.stream());
  if (!mem) return mem.status();
  auto* r = static_cast<float*>(*mem);
  e.device = std::make_unique<DeviceResidualBuffer>(d.context(), d.device(), d.stream(), r, e.n);
  if (e.sender.size() == e.n) {
    // Kept on the host until now (an earlier staged call): moved, counted as a copy.
    LOWCOMM_CHECK(d.to_device(r, e.sender.data(), e.n * sizeof(float)));
    LOWCOMM_CHECK(d.sync());
    e.sender.clear();
    e.sender.shrink_to_fit();
  } else {
    LOWCOMM_CHECK(d.rt().zero(r, e.n * sizeof(float), d.stream()));  // new: zero, as on the host
  }
  return r;
}

Status encode_on_device(DeviceOp& d, ErrorFeedbackStore& ef, const std::string& ef_key,
                        const CodecSpec& wire, DType dtype, const void* x, uint64_t n,
                        uint8_t* codes, uint64_t bytes, RoundingKey key) {
  auto dev = d.device_scratch(bytes);
  if (!dev) return dev.status();
  if (!ef_key.empty()) {
    auto e = ef.entry_for_device(ef_key, n);
    if (!e) return e.status();
    auto r = device_residual(d, **e);
    if (!r) return r.status();
    LOWCOMM_CHECK(
        d.rt().encode_error_feedback(wire, dtype, x, *r, n, *dev, bytes, key, d.stream()));
  } else {
    LOWCOMM_CHECK(d.rt().encode(wire, dtype, x, n, *dev, bytes, key, d.stream()));
  }
  LOWCOMM_CHECK(d.to_host(codes, *dev, bytes));
  return d.sync();
}

}  // namespace lowcomm::collectives
