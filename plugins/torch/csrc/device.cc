#include "device.h"

#include <c10/util/Exception.h>

#ifdef LOWCOMM_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace lowcomm::torch_backend {
namespace {

// The device of an operation's tensors: the first defined one's; every other must match.
std::optional<c10::Device> common_device(const char* op, const std::vector<at::Tensor>& tensors) {
  std::optional<c10::Device> device;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    if (!device) {
      device = t.device();
      continue;
    }
    TORCH_CHECK(t.device() == *device, "lowcomm: ", op, " takes tensors of one device, got ",
                *device, " and ", t.device());
  }
  return device;
}

}  // namespace

#ifdef LOWCOMM_WITH_CUDA

void install_torch_device_allocator() {
  lowcomm::DeviceAllocator a;
  a.alloc = [](uint64_t bytes, void* stream, void*) -> void* {
    try {  // on the memory's device (the library made it current)
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(
          bytes, static_cast<cudaStream_t>(stream));
    } catch (const c10::Error&) {  // c10::OutOfMemoryError among them: the library says so
      return nullptr;
    }
  };
  // The block is reused only by allocations on the stream it was made for, ordered after the
  // work queued there before this.
  a.release = [](void* p, void*, void*) { c10::cuda::CUDACachingAllocator::raw_delete(p); };
  lowcomm::set_device_allocator(a);
}

c10::cuda::CUDAStream SideStreams::get(c10::DeviceIndex device) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto i = static_cast<size_t>(device);
  if (streams_.size() <= i) streams_.resize(i + 1);
  if (!streams_[i]) streams_[i] = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
  return *streams_[i];
}

c10::Device DeviceDone::device() const {
  return device_;
}

void DeviceDone::finish(const std::function<void()>& copy_back) {
  if (!copy_back) return;
  // On the thread completing the operation (often lowcomm's executor): guard the device and
  // the stream, leaving the thread's own as they were.
  c10::cuda::CUDAGuard guard(device_);
  c10::cuda::CUDAStreamGuard on(side_);
  copy_back();
  c10::Event done(c10::DeviceType::CUDA);
  done.record(side_);
  done_ = std::move(done);
}

void DeviceDone::block_current_stream() const {
  if (!done_) return;
  c10::cuda::CUDAGuard guard(device_);
  done_->block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

void DeviceDone::synchronize() const {
  if (done_) done_->synchronize();
}

bool DeviceDone::query() const {
  return !done_ || done_->query();
}

void DeviceDone::mark_completed(c10::ivalue::Future& future, const c10::IValue& value) const {
  // Any thread (lowcomm's executor: its current device and stream are torch's defaults), so
  // guard both; the future records its events on a pool stream that first waits for the
  // copies back.
  c10::cuda::CUDAGuard guard(device_);
  c10::cuda::CUDAStream s = c10::cuda::getStreamFromPool(false, device_.index());
  if (done_) done_->block(s);
  c10::cuda::CUDAStreamGuard on(s);
  future.markCompleted(value);
}

DeviceScope::DeviceScope(SideStreams& streams, Path path, const char* op,
                         const std::vector<at::Tensor>& tensors)
    : path_(path) {
  std::optional<c10::Device> device = common_device(op, tensors);
  if (!device || device->is_cpu()) return;
  TORCH_CHECK(device->is_cuda(), "lowcomm: ", op, " takes CPU or CUDA tensors, got ", *device);
  cuda_ = true;
  device_ = *device;
  guard_.emplace(device_);
  // lowcomm's collectives run on the host: a capture would record copies no replay orders.
  TORCH_CHECK(c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None,
              "lowcomm: ", op,
              " cannot be captured in a CUDA graph (its collectives run on the host); run it "
              "outside torch.cuda.graph()");
  caller_ = c10::cuda::getCurrentCUDAStream(device_.index());
  side_ = streams.get(device_.index());
  for (const auto& t : tensors)
    if (t.defined()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *side_);
  // The side stream follows the caller's: the plugin's copies there, the library's reads
  // (kDevice) and the copies back see everything the caller queued before the call.
  c10::Event ready(c10::DeviceType::CUDA);
  ready.record(*caller_);
  ready.block(*side_);
  if (path_ == Path::kDevice) on_side_.emplace(*side_);
}

DeviceScope::~DeviceScope() = default;

void DeviceScope::check(const at::Tensor& t) const {
  if (!cuda_) {
    TORCH_CHECK(t.device().is_cpu(), "lowcomm: an operation takes tensors of one device, got cpu ",
                "and ", t.device());
    return;
  }
  TORCH_CHECK(t.device() == device_, "lowcomm: an operation takes tensors of one device, got ",
              device_, " and ", t.device());
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *side_);
}

lowcomm::BufferOptions DeviceScope::where() const {
  if (!cuda_ || path_ != Path::kDevice) return {};
  return {lowcomm::MemoryKind::kCuda, side_->stream()};
}

void DeviceScope::apply(lowcomm::AllReduceOptions& o) const {
  const lowcomm::BufferOptions w = where();
  o.memory = w.memory;
  o.cuda_stream = w.cuda_stream;
}

at::Tensor DeviceScope::to_host(const at::Tensor& t) const {
  if (!cuda_) return t.is_contiguous() ? t : t.contiguous();
  at::Tensor h = host_like(t);
  c10::cuda::CUDAStreamGuard on(*caller_);
  h.copy_(t);  // blocking: the host operation reads it next
  return h;
}

at::Tensor DeviceScope::host_like(const at::Tensor& t) const {
  if (!cuda_) return t.is_contiguous() ? t : t.contiguous();
  return at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
}

at::Tensor DeviceScope::empty(int64_t n, at::ScalarType dtype) const {
  if (!cuda_) return at::empty({n}, at::TensorOptions().dtype(dtype));
  if (path_ == Path::kStaged)
    return at::empty({n}, at::TensorOptions().dtype(dtype).pinned_memory(true));
  return at::empty({n}, at::TensorOptions().dtype(dtype).device(device_));
}

std::shared_ptr<DeviceDone> DeviceScope::done() const {
  if (!cuda_) return nullptr;
  return std::make_shared<DeviceDone>(device_, *side_);
}

#else  // a build without CUDA: CPU tensors only

void install_torch_device_allocator() {}

c10::Device DeviceDone::device() const {
  return c10::kCPU;
}
void DeviceDone::finish(const std::function<void()>& copy_back) {
  if (copy_back) copy_back();
}
void DeviceDone::block_current_stream() const {}
void DeviceDone::synchronize() const {}
bool DeviceDone::query() const {
  return true;
}
void DeviceDone::mark_completed(c10::ivalue::Future& future, const c10::IValue& value) const {
  future.markCompleted(value);
}

DeviceScope::DeviceScope(SideStreams& /*streams*/, Path path, const char* op,
                         const std::vector<at::Tensor>& tensors)
    : path_(path) {
  std::optional<c10::Device> device = common_device(op, tensors);
  TORCH_CHECK(!device || device->is_cpu(), "lowcomm: ", op, " got a tensor on ", *device,
              ", but this build of lowcomm's torch extension takes CPU tensors only (it was built "
              "without CUDA: a torch without CUDA, no CUDA toolkit, or LOWCOMM_TORCH_CUDA=0)");
}

DeviceScope::~DeviceScope() = default;

void DeviceScope::check(const at::Tensor& t) const {
  TORCH_CHECK(t.device().is_cpu(), "lowcomm: got a tensor on ", t.device(),
              ", but this build of lowcomm's torch extension takes CPU tensors only");
}

lowcomm::BufferOptions DeviceScope::where() const {
  return {};
}

void DeviceScope::apply(lowcomm::AllReduceOptions& /*o*/) const {}

at::Tensor DeviceScope::to_host(const at::Tensor& t) const {
  return t.is_contiguous() ? t : t.contiguous();
}

at::Tensor DeviceScope::host_like(const at::Tensor& t) const {
  return t.is_contiguous() ? t : t.contiguous();
}

at::Tensor DeviceScope::empty(int64_t n, at::ScalarType dtype) const {
  return at::empty({n}, at::TensorOptions().dtype(dtype));
}

std::shared_ptr<DeviceDone> DeviceScope::done() const {
  return nullptr;
}

#endif

}  // namespace lowcomm::torch_backend
