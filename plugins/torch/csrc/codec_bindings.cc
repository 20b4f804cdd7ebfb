#include "codec_bindings.h"

#include <pybind11/stl.h>
#include <torch/python.h>

#include <optional>
#include <string>

#include "lowcomm/codec.h"

#ifdef LOWCOMM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "lowcomm/codec_cuda.h"
#endif

namespace py = pybind11;

namespace lowcomm::torch_backend {
namespace {

lowcomm::CodecSpec spec_of(const std::string& text) {
  auto spec = lowcomm::parse_codec_spec(text);
  TORCH_CHECK_VALUE(spec.is_ok(), "lowcomm: codec '", text, "': ", spec.status().to_string());
  return *spec;
}

// The codecs take fp32, bf16 and fp16 tensors, contiguous (the caller's to make them so: a
// silent copy would hide that an in-place cache was not updated), on the CPU or (a build with
// CUDA) a CUDA device: there the CUDA kernels run on the device's current stream, asynchronously,
// and write the same bytes as the CPU functions.
lowcomm::DType value_dtype(const at::Tensor& t, const char* what) {
#ifdef LOWCOMM_WITH_CUDA
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.device().is_cuda(), "lowcomm: ", what,
                    " must be a CPU or CUDA tensor, got ", t.device());
#else
  TORCH_CHECK_VALUE(t.device().is_cpu(), "lowcomm: ", what, " must be a CPU tensor, got ",
                    t.device(),
                    " (this build of lowcomm's torch extension has no CUDA: it was built without "
                    "CUDA, or with LOWCOMM_TORCH_CUDA=0)");
#endif
  TORCH_CHECK_VALUE(t.is_contiguous(), "lowcomm: ", what, " must be contiguous");
  switch (t.scalar_type()) {
    case at::kFloat:
      return lowcomm::DType::kFloat32;
    case at::kBFloat16:
      return lowcomm::DType::kBFloat16;
    case at::kHalf:
      return lowcomm::DType::kFloat16;
    default:
      TORCH_CHECK_VALUE(false, "lowcomm: ", what, " must be float32, bfloat16 or float16, got ",
                        t.scalar_type());
  }
}

uint64_t count(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel());
}

void check_same(const at::Tensor& a, const at::Tensor& b, const char* what) {
  TORCH_CHECK_VALUE(a.scalar_type() == b.scalar_type() && a.numel() == b.numel(), "lowcomm: ", what,
                    " must match the tensor (", a.scalar_type(), " x ", a.numel(), "), got ",
                    b.scalar_type(), " x ", b.numel());
}

// Every tensor of one call on one device: `first`'s.
void check_device(const at::Tensor& first, const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.device() == first.device(), "lowcomm: ", what, " is on ", t.device(),
                    " but the values are on ", first.device(),
                    ": a codec call takes tensors of one device (copy them with .to())");
}

void check_codes(const at::Tensor& codes, const lowcomm::CodecSpec& spec, uint64_t n) {
  TORCH_CHECK_VALUE(codes.is_contiguous() && codes.scalar_type() == at::kByte,
                    "lowcomm: codes must be a contiguous uint8 tensor");
  const uint64_t need = lowcomm::encoded_size(spec, n);
  TORCH_CHECK_VALUE(static_cast<uint64_t>(codes.numel()) == need, "lowcomm: ", need,
                    " code bytes expected for ", n, " elements of ", lowcomm::to_string(spec),
                    ", got ", codes.numel());
}

void ok(const lowcomm::Status& s) {
  TORCH_CHECK_VALUE(s.is_ok(), "lowcomm: ", s.to_string());
}

at::Tensor new_codes(const lowcomm::CodecSpec& spec, uint64_t n, const at::Tensor& like) {
  ok(lowcomm::check_count(spec, n));
  return at::empty({static_cast<int64_t>(lowcomm::encoded_size(spec, n))},
                   at::TensorOptions().dtype(at::kByte).device(like.device()));
}

// Runs `host` for CPU tensors, else `device` with the CUDA device guarded and its current stream.
template <typename Host, typename Device>
lowcomm::Status on_device_of(const at::Tensor& t, Host host, Device device) {
#ifdef LOWCOMM_WITH_CUDA
  if (t.device().is_cuda()) {
    c10::cuda::CUDAGuard guard(t.device());
    return device(c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
  }
#endif
  (void)device;
  return host();
}

}  // namespace

void bind_codecs(py::module_& m) {
  m.def(
      "encoded_size",
      [](const std::string& codec, uint64_t n) {
        lowcomm::CodecSpec spec = spec_of(codec);
        ok(lowcomm::check_count(spec, n));
        return lowcomm::encoded_size(spec, n);
      },
      py::arg("codec"), py::arg("n"), "Exact payload bytes of n elements in `codec`.");
  m.def(
      "encode",
      [](const std::string& codec, const at::Tensor& x, uint64_t seed, uint64_t offset) {
        lowcomm::CodecSpec spec = spec_of(codec);
        const lowcomm::DType dt = value_dtype(x, "x");
        at::Tensor codes = new_codes(spec, count(x), x);
        py::gil_scoped_release nogil;
        const uint64_t bytes = static_cast<uint64_t>(codes.numel());
        ok(on_device_of(
            x,
            [&] {
              return lowcomm::encode(spec, dt, x.data_ptr(), count(x), codes.data_ptr(), bytes,
                                     {seed, offset});
            },
            [&](auto stream) {
#ifdef LOWCOMM_WITH_CUDA
              return lowcomm::encode_cuda(spec, dt, x.data_ptr(), count(x), codes.data_ptr(), bytes,
                                          {seed, offset}, stream);
#else
              return lowcomm::Status();
#endif
            }));
        return codes;
      },
      py::arg("codec"), py::arg("x"), py::arg("seed") = 0, py::arg("offset") = 0,
      "codes = Q(x), as a uint8 tensor of encoded_size(codec, x.numel()) bytes.");
  m.def(
      "decode",
      [](const std::string& codec, const at::Tensor& codes, at::Tensor& out) {
        lowcomm::CodecSpec spec = spec_of(codec);
        const lowcomm::DType dt = value_dtype(out, "out");
        check_device(out, codes, "codes");
        check_codes(codes, spec, count(out));
        py::gil_scoped_release nogil;
        const uint64_t bytes = static_cast<uint64_t>(codes.numel());
        ok(on_device_of(
            out,
            [&] {
              return lowcomm::decode(spec, codes.data_ptr(), bytes, count(out), dt, out.data_ptr());
            },
            [&](auto stream) {
#ifdef LOWCOMM_WITH_CUDA
              return lowcomm::decode_cuda(spec, codes.data_ptr(), bytes, count(out), dt,
                                          out.data_ptr(), stream);
#else
              return lowcomm::Status();
#endif
            }));
      },
      py::arg("codec"), py::arg("codes"), py::arg("out"), "out = D(codes).");
  m.def(
      "encode_delta",
      [](const std::string& codec, const at::Tensor& a, at::Tensor& m, uint64_t seed,
         uint64_t offset) {
        lowcomm::CodecSpec spec = spec_of(codec);
        const lowcomm::DType dt = value_dtype(a, "a");
        value_dtype(m, "m");
        check_device(a, m, "the cache m");
        check_same(a, m, "the cache m");
        at::Tensor codes = new_codes(spec, count(a), a);
        py::gil_scoped_release nogil;
        const uint64_t bytes = static_cast<uint64_t>(codes.numel());
        ok(on_device_of(
            a,
            [&] {
              return lowcomm::encode_delta(spec, dt, a.data_ptr(), m.data_ptr(), count(a),
                                           codes.data_ptr(), bytes, {seed, offset});
            },
            [&](auto stream) {
#ifdef LOWCOMM_WITH_CUDA
              return lowcomm::encode_delta_cuda(spec, dt, a.data_ptr(), m.data_ptr(), count(a),
                                                codes.data_ptr(), bytes, {seed, offset}, stream);
#else
              return lowcomm::Status();
#endif
            }));
        return codes;
      },
      py::arg("codec"), py::arg("a"), py::arg("m"), py::arg("seed") = 0, py::arg("offset") = 0,
      "AQ-SGD sender: codes = Q(a - m); m += D(codes) in place. Returns the codes.");
  m.def(
      "decode_delta",
      [](const std::string& codec, const at::Tensor& codes, at::Tensor& m,
         std::optional<at::Tensor> out) {
        lowcomm::CodecSpec spec = spec_of(codec);
        const lowcomm::DType dt = value_dtype(m, "m");
        check_device(m, codes, "codes");
        check_codes(codes, spec, count(m));
        void* out_ptr = nullptr;
        if (out) {
          value_dtype(*out, "out");
          check_device(m, *out, "out");
          check_same(m, *out, "out");
          TORCH_CHECK_VALUE(!out->is_same(m) && out->data_ptr() != m.data_ptr(),
                            "lowcomm: out must not alias the cache m");
          out_ptr = out->data_ptr();
        }
        py::gil_scoped_release nogil;
        const uint64_t bytes = static_cast<uint64_t>(codes.numel());
        ok(on_device_of(
            m,
            [&] {
              return lowcomm::decode_delta(spec, codes.data_ptr(), bytes, count(m), dt,
                                           m.data_ptr(), out_ptr);
            },
            [&](auto stream) {
#ifdef LOWCOMM_WITH_CUDA
              return lowcomm::decode_delta_cuda(spec, codes.data_ptr(), bytes, count(m), dt,
                                                m.data_ptr(), out_ptr, stream);
#else
              return lowcomm::Status();
#endif
            }));
      },
      py::arg("codec"), py::arg("codes"), py::arg("m"), py::arg("out") = py::none(),
      "AQ-SGD receiver: m += D(codes) in place; out = m (a non-finite scale group resets m "
      "to 0 and writes NaN to out).");
}

}  // namespace lowcomm::torch_backend
