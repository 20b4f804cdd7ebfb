// The C API: a thin translation of lowcomm.h onto Communicator. Status codes become
// lowcommResult_t here and only here; every entry point catches everything (bad_alloc
// included) so no exception crosses the C ABI.

#include "lowcomm/lowcomm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "collectives/c_conversions.h"
#include "core/log.h"
#include "core/params.h"
#include "lowcomm/communicator.h"
#include "lowcomm/version.h"

namespace {

// Where a communicator's failed calls leave their text. Its requests share it with the comm
// (never a raw lowcommComm*), so a request may complete after lowcommCommDestroy/Abort freed
// the comm -- a watchdog aborting while another thread waits -- and still record safely. From
// the moment the comm is being closed nobody can ask it any more, so the text goes to the
// completing thread's last error (lowcommGetLastError(NULL)) instead.
struct ErrorSink {
  std::mutex mu;  // guards everything below
  bool comm_open = true;
  std::string last_error;
  std::string shown;  // what lowcommGetLastError handed out
};

}  // namespace

struct lowcommComm {
  std::unique_ptr<lowcomm::Communicator> comm;
  std::shared_ptr<ErrorSink> errors = std::make_shared<ErrorSink>();
};

struct lowcommRequest {
  lowcomm::Work work;
  std::shared_ptr<ErrorSink> errors;  // its comm's; outlives the comm when it must
};

namespace {

using lowcomm::Status;
using lowcomm::StatusCode;

thread_local std::string t_last_error;

static_assert(sizeof(lowcommUniqueId) == lowcomm::UniqueId::kOpaqueBytes);

using lowcomm::to_result;

// Records a failure in `sink` (NULL: no communicator; or one being closed: this thread's last
// error) and translates its code.
lowcommResult_t record_to(ErrorSink* sink, const Status& s) {
  if (s.is_ok()) return lowcommSuccess;
  std::string text = s.to_string();
  if (sink) {
    std::lock_guard<std::mutex> lock(sink->mu);
    if (sink->comm_open) {
      sink->last_error = std::move(text);
      return to_result(s.code());
    }
  }
  t_last_error = std::move(text);
  return to_result(s.code());
}

ErrorSink* sink_of(const lowcommComm* comm) {
  return comm ? comm->errors.get() : nullptr;
}

lowcommResult_t record(lowcommComm* comm, const Status& s) {
  return record_to(sink_of(comm), s);
}

template <typename F>
lowcommResult_t guarded(ErrorSink* sink, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return record_to(sink, Status(StatusCode::kSystem, "out of memory"));
  } catch (const std::exception& e) {
    return record_to(sink,
                     lowcomm::internal_error(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return record_to(sink, lowcomm::internal_error("unexpected exception"));
  }
}

using lowcomm::to_dtype;
using lowcomm::to_op;

// NULL: none named (the communicator's LOWCOMM_CODEC default applies where it can).
lowcomm::Status parse_codec_arg(const char* codec, std::optional<lowcomm::CodecSpec>* out) {
  if (!codec) return lowcomm::Status::ok();
  auto spec = lowcomm::parse_codec_spec(codec);
  if (!spec) return spec.status();
  *out = *spec;
  return lowcomm::Status::ok();
}

// Either hands the Work to the caller as a request or waits for it here. A call refused for
// its arguments returns the error now and hands out no request (the comm is unaffected).
lowcommResult_t finish(lowcommComm* comm, lowcomm::Work w, lowcommRequest_t* request) {
  if (w.refused()) return record(comm, w.status());
  if (request) {
    *request = new lowcommRequest{std::move(w), comm->errors};
    return lowcommSuccess;
  }
  // Another thread may abort and free the communicator while this one waits (a watchdog): only
  // its error sink, held here, is touched after the wait.
  std::shared_ptr<ErrorSink> sink = comm->errors;
  return record_to(sink.get(), w.wait());
}

// A call on CUDA buffers: the host waits for the operation before the call returns, so the work
// queued on `stream` after it sees the result (docs/collectives.md, "CUDA buffers": no
// device-side wait, which could deadlock against the driver's lock). Without a request the call
// returns the operation's result; with one, as finish(): lowcommWait / lowcommTest on it (which
// then return at once) say how it ended.
lowcommResult_t finish_on_stream(lowcommComm* comm, lowcomm::Work w, lowcommRequest_t* request) {
  if (w.refused()) return record(comm, w.status());
  // As finish(): after the wait only the error sink is touched (a watchdog may have aborted and
  // freed the communicator meanwhile).
  std::shared_ptr<ErrorSink> sink = comm->errors;
  lowcomm::Status s = w.wait();
  if (request) {
    *request = new lowcommRequest{std::move(w), sink};
    return lowcommSuccess;
  }
  return record_to(sink.get(), s);
}

uint64_t to_ns(std::chrono::nanoseconds d) {
  return d.count() > 0 ? static_cast<uint64_t>(d.count()) : 0;
}

// Copies `text` into a fixed C field, truncated and always NUL-terminated.
template <size_t N>
void copy_text(char (&field)[N], const std::string& text) {
  const size_t n = std::min(text.size(), N - 1);
  std::memcpy(field, text.data(), n);
  std::memset(field + n, 0, N - n);
}

// lowcommOpStats is versioned by its size (lowcomm.h): where each field after structSize ends,
// in order, so a caller's struct of structSize bytes gets exactly the fields that end within it.
#define LOWCOMM_OP_STATS_END(f) (offsetof(lowcommOpStats, f) + sizeof(lowcommOpStats::f))
constexpr size_t kOpStatsFieldEnds[] = {LOWCOMM_OP_STATS_END(kind),
                                        LOWCOMM_OP_STATS_END(codec),
                                        LOWCOMM_OP_STATS_END(sequence),
                                        LOWCOMM_OP_STATS_END(count),
                                        LOWCOMM_OP_STATS_END(wallNs),
                                        LOWCOMM_OP_STATS_END(bytesSent),
                                        LOWCOMM_OP_STATS_END(bytesReceived),
                                        LOWCOMM_OP_STATS_END(payloadBytesSent),
                                        LOWCOMM_OP_STATS_END(uncompressedBytesSent),
                                        LOWCOMM_OP_STATS_END(compressionRatio),
                                        LOWCOMM_OP_STATS_END(encodeNs),
                                        LOWCOMM_OP_STATS_END(decodeNs),
                                        LOWCOMM_OP_STATS_END(networkWaitNs),
                                        LOWCOMM_OP_STATS_END(linkLimitNs),
                                        LOWCOMM_OP_STATS_END(linkEfficiency),
                                        LOWCOMM_OP_STATS_END(density),
                                        LOWCOMM_OP_STATS_END(indexBytesSent),
                                        LOWCOMM_OP_STATS_END(valueBytesSent),
                                        LOWCOMM_OP_STATS_END(deviceToHostBytes),
                                        LOWCOMM_OP_STATS_END(hostToDeviceBytes),
                                        LOWCOMM_OP_STATS_END(chunksResent)};
#undef LOWCOMM_OP_STATS_END
static_assert(kOpStatsFieldEnds[sizeof(kOpStatsFieldEnds) / sizeof(size_t) - 1] ==
                  sizeof(lowcommOpStats),
              "a field appended to lowcommOpStats must be listed in kOpStatsFieldEnds");
static_assert(kOpStatsFieldEnds[0] == LOWCOMM_OP_STATS_MIN_SIZE);

// A caller's structSize that the stats functions refuse, before anything is written or waited.
Status check_stats_size(const lowcommOpStats* out) {
  const size_t size = out->structSize;
  if (size == 0)
    return lowcomm::invalid_argument(
        "lowcommOpStats.structSize is 0: set it to sizeof(lowcommOpStats) "
        "(lowcommOpStats stats = LOWCOMM_OP_STATS_INIT;)");
  if (size < LOWCOMM_OP_STATS_MIN_SIZE)
    return lowcomm::invalid_argument(
        "lowcommOpStats.structSize " + std::to_string(size) +
        " is below the smallest lowcommOpStats (LOWCOMM_OP_STATS_MIN_SIZE, " +
        std::to_string(LOWCOMM_OP_STATS_MIN_SIZE) + " bytes): set it to sizeof(lowcommOpStats)");
  return Status::ok();
}

// Writes the fields of *out that end within out->structSize bytes (check_stats_size passed),
// nothing else: not structSize, not a byte past the caller's struct.
void to_c_stats(const lowcomm::OpStats& s, lowcommOpStats* out) {
  lowcommOpStats all;
  std::memset(&all, 0, sizeof(all));
  copy_text(all.kind, s.kind);
  copy_text(all.codec, s.codec);
  all.sequence = s.sequence;
  all.count = s.count;
  all.wallNs = to_ns(s.wall);
  all.bytesSent = s.bytes_sent;
  all.bytesReceived = s.bytes_received;
  all.payloadBytesSent = s.payload_bytes_sent;
  all.uncompressedBytesSent = s.uncompressed_bytes_sent;
  all.compressionRatio = s.compression_ratio;
  all.encodeNs = to_ns(s.encode);
  all.decodeNs = to_ns(s.decode);
  all.networkWaitNs = to_ns(s.network_wait);
  all.linkLimitNs = to_ns(s.link_limit);
  all.linkEfficiency = s.link_efficiency;
  all.density = s.density;
  all.indexBytesSent = s.index_bytes_sent;
  all.valueBytesSent = s.value_bytes_sent;
  all.deviceToHostBytes = s.device_to_host_bytes;
  all.hostToDeviceBytes = s.host_to_device_bytes;
  all.chunksResent = s.chunks_resent;
  constexpr size_t kFirst = offsetof(lowcommOpStats, kind);
  size_t end = kFirst;
  for (size_t e : kOpStatsFieldEnds)
    if (e <= out->structSize) end = e;
  std::memcpy(reinterpret_cast<char*>(out) + kFirst, reinterpret_cast<const char*>(&all) + kFirst,
              end - kFirst);
}

// Destroy and abort: from here on the comm's errors go to the completing thread (ErrorSink).
void close_errors(lowcommComm* comm) {
  std::lock_guard<std::mutex> lock(comm->errors->mu);
  comm->errors->comm_open = false;
}

#define LOWCOMM_C_CHECK_COMM(comm) \
  if (!(comm) || !(comm)->comm)    \
  return record(nullptr, lowcomm::invalid_argument("NULL communicator"))

}  // namespace

extern "C" {

const char* lowcommGetErrorString(lowcommResult_t r) {
  switch (r) {
    case lowcommSuccess:
      return "no error";
    case lowcommUnhandledCudaError:
      return "unhandled cuda error";
    case lowcommSystemError:
      return "unhandled system error (network, OS)";
    case lowcommInternalError:
      return "internal error - please report this issue";
    case lowcommInvalidArgument:
      return "invalid argument";
    case lowcommInvalidUsage:
      return "invalid usage";
    case lowcommRemoteError:
      return "remote process exited or there was a network error";
    case lowcommInProgress:
      return "operation in progress";
    case lowcommTimeout:
      return "operation deadline passed";
    case lowcommAborted:
      return "communicator aborted";
    case lowcommCorruptData:
      return "received data failed validation";
    case lowcommUnsupported:
      return "not supported";
    case lowcommFenced:
      return "this elastic member is out of its group for good (rejoin as a new member)";
    default:
      return "unknown result code";
  }
}

const char* lowcommGetLastError(lowcommComm_t comm) {
  if (!comm) return t_last_error.c_str();
  ErrorSink& e = *comm->errors;
  std::lock_guard<std::mutex> lock(e.mu);
  e.shown = e.last_error;
  return e.shown.c_str();
}

lowcommResult_t lowcommGetVersion(int* version) {
  return guarded(nullptr, [&] {
    if (!version) return record(nullptr, lowcomm::invalid_argument("NULL version"));
    *version = lowcomm::version();
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommGetUniqueIdAt(const char* address, lowcommUniqueId* out) {
  return guarded(nullptr, [&] {
    if (!out) return record(nullptr, lowcomm::invalid_argument("NULL unique id"));
    auto id = lowcomm::create_unique_id(address ? address : "");
    if (!id) return record(nullptr, id.status());
    auto b = id->to_bytes();
    std::memcpy(out->internal, b.data(), b.size());
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommGetUniqueId(lowcommUniqueId* out) {
  return lowcommGetUniqueIdAt(nullptr, out);
}

lowcommResult_t lowcommUniqueIdToString(const lowcommUniqueId* id, char* buf, size_t len) {
  return guarded(nullptr, [&] {
    if (!id || !buf) return record(nullptr, lowcomm::invalid_argument("NULL argument"));
    auto u = lowcomm::UniqueId::from_bytes(id->internal, sizeof(id->internal));
    if (!u) return record(nullptr, u.status());
    std::string s = u->to_string();
    if (s.size() + 1 > len) return record(nullptr, lowcomm::invalid_argument("buffer too small"));
    std::memcpy(buf, s.c_str(), s.size() + 1);
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommUniqueIdFromString(const char* text, lowcommUniqueId* out) {
  return guarded(nullptr, [&] {
    if (!text || !out) return record(nullptr, lowcomm::invalid_argument("NULL argument"));
    auto u = lowcomm::UniqueId::parse(text);
    if (!u) return record(nullptr, u.status());
    auto b = u->to_bytes();
    std::memcpy(out->internal, b.data(), b.size());
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommCommInitRank(lowcommComm_t* comm, int nranks, lowcommUniqueId commId,
                                    int rank) {
  return guarded(nullptr, [&] {
    if (!comm) return record(nullptr, lowcomm::invalid_argument("NULL communicator out-parameter"));
    auto id = lowcomm::UniqueId::from_bytes(commId.internal, sizeof(commId.internal));
    if (!id) return record(nullptr, id.status());
    lowcomm::CommOptions opts;
    if (lowcomm::params::text("LOWCOMM_CODEC")) {
      auto codec = lowcomm::codec_spec_from_env("LOWCOMM_CODEC", "");
      if (!codec) return record(nullptr, codec.status());
      opts.codec = *codec;
    }
    auto c = lowcomm::Communicator::init(*id, rank, nranks, opts);
    if (!c) return record(nullptr, c.status());
    auto* h = new lowcommComm();
    h->comm = std::move(c).value();
    *comm = h;  // out-parameters are set only on success
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommCommDestroy(lowcommComm_t comm) {
  return guarded(nullptr, [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    close_errors(comm);
    delete comm;  // outstanding requests keep the ErrorSink
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommCommAbort(lowcommComm_t comm) {
  return guarded(nullptr, [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    close_errors(comm);
    comm->comm->abort();
    delete comm;  // outstanding requests keep the ErrorSink
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommCommCount(const lowcommComm_t comm, int* count) {
  LOWCOMM_C_CHECK_COMM(comm);
  if (!count) return record(comm, lowcomm::invalid_argument("NULL count"));
  *count = comm->comm->size();
  return lowcommSuccess;
}

lowcommResult_t lowcommCommUserRank(const lowcommComm_t comm, int* rank) {
  LOWCOMM_C_CHECK_COMM(comm);
  if (!rank) return record(comm, lowcomm::invalid_argument("NULL rank"));
  *rank = comm->comm->rank();
  return lowcommSuccess;
}

lowcommResult_t lowcommCommGetAsyncError(lowcommComm_t comm, lowcommResult_t* asyncError) {
  LOWCOMM_C_CHECK_COMM(comm);
  if (!asyncError) return record(comm, lowcomm::invalid_argument("NULL asyncError"));
  Status s = comm->comm->status();
  if (!s.is_ok()) record(comm, s);
  *asyncError = to_result(s.code());
  return lowcommSuccess;
}

namespace {

// lowcommAllReduce and lowcommAllReduceErrorFeedback: one body, the key empty for the first.
lowcommResult_t all_reduce_c(const void* sendbuff, void* recvbuff, size_t count,
                             lowcommDataType_t datatype, lowcommRedOp_t op, const char* codec,
                             const char* errorFeedbackKey, int ownerErrorFeedback,
                             lowcommComm_t comm, lowcommRequest_t* request,
                             const cudaStream_t* stream = nullptr) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    auto rop = to_op(op);
    if (!rop) return record(comm, rop.status());
    lowcomm::AllReduceOptions o;
    if (auto s = parse_codec_arg(codec, &o.codec); !s) return record(comm, s);
    o.error_feedback_key = errorFeedbackKey ? errorFeedbackKey : "";
    o.owner_error_feedback = ownerErrorFeedback != 0;
    if (stream != nullptr) {
      o.memory = lowcomm::MemoryKind::kCuda;
      o.cuda_stream = *stream;
      return finish_on_stream(comm, comm->comm->all_reduce(sendbuff, recvbuff, count, *dt, *rop, o),
                              request);
    }
    return finish(comm, comm->comm->all_reduce(sendbuff, recvbuff, count, *dt, *rop, o), request);
  });
}

// The calls that take CUDA buffers with a stream (stream set) or host buffers (null).
lowcommResult_t finish_call(lowcommComm* comm, lowcomm::Work w, const cudaStream_t* stream,
                            lowcommRequest_t* request) {
  return stream ? finish_on_stream(comm, std::move(w), request)
                : finish(comm, std::move(w), request);
}

lowcommResult_t reduce_scatter_c(const void* sendbuff, void* recvbuff, size_t recvcount,
                                 lowcommDataType_t datatype, lowcommRedOp_t op, const char* codec,
                                 lowcommComm_t comm, lowcommRequest_t* request,
                                 const cudaStream_t* stream) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    auto rop = to_op(op);
    if (!rop) return record(comm, rop.status());
    lowcomm::ReduceScatterOptions o;
    if (auto s = parse_codec_arg(codec, &o.codec); !s) return record(comm, s);
    if (stream) {
      o.memory = lowcomm::MemoryKind::kCuda;
      o.cuda_stream = *stream;
    }
    return finish_call(comm,
                       comm->comm->reduce_scatter(sendbuff, recvbuff, recvcount, *dt, *rop, o),
                       stream, request);
  });
}

lowcomm::BufferOptions where_of(const cudaStream_t* stream) {
  if (!stream) return {};
  return lowcomm::BufferOptions{lowcomm::MemoryKind::kCuda, *stream};
}

lowcommResult_t all_gather_c(const void* sendbuff, void* recvbuff, size_t sendcount,
                             lowcommDataType_t datatype, lowcommComm_t comm,
                             lowcommRequest_t* request, const cudaStream_t* stream) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    return finish_call(comm,
                       comm->comm->all_gather(sendbuff, recvbuff, sendcount, *dt, where_of(stream)),
                       stream, request);
  });
}

lowcommResult_t broadcast_c(const void* sendbuff, void* recvbuff, size_t count,
                            lowcommDataType_t datatype, int root, lowcommComm_t comm,
                            lowcommRequest_t* request, const cudaStream_t* stream) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    return finish_call(
        comm, comm->comm->broadcast(sendbuff, recvbuff, count, *dt, root, where_of(stream)), stream,
        request);
  });
}

}  // namespace

lowcommResult_t lowcommAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 lowcommDataType_t datatype, lowcommRedOp_t op, const char* codec,
                                 lowcommComm_t comm, lowcommRequest_t* request) {
  return all_reduce_c(sendbuff, recvbuff, count, datatype, op, codec, nullptr, 0, comm, request);
}

lowcommResult_t lowcommAllReduceErrorFeedback(const void* sendbuff, void* recvbuff, size_t count,
                                              lowcommDataType_t datatype, lowcommRedOp_t op,
                                              const char* codec, const char* errorFeedbackKey,
                                              int ownerErrorFeedback, lowcommComm_t comm,
                                              lowcommRequest_t* request) {
  if (!errorFeedbackKey || !*errorFeedbackKey)
    return guarded(sink_of(comm), [&] {
      return record(comm, lowcomm::invalid_argument(
                              "lowcommAllReduceErrorFeedback: errorFeedbackKey must name the "
                              "residual (use lowcommAllReduce for none)"));
    });
  return all_reduce_c(sendbuff, recvbuff, count, datatype, op, codec, errorFeedbackKey,
                      ownerErrorFeedback, comm, request);
}

lowcommResult_t lowcommResetErrorFeedback(lowcommComm_t comm, const char* errorFeedbackKey,
                                          size_t* dropped) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto n = comm->comm->reset_error_feedback(errorFeedbackKey ? errorFeedbackKey : "");
    if (!n) return record(comm, n.status());
    if (dropped) *dropped = *n;
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 lowcommDataType_t datatype, lowcommComm_t comm,
                                 lowcommRequest_t* request) {
  return all_gather_c(sendbuff, recvbuff, sendcount, datatype, comm, request, nullptr);
}

lowcommResult_t lowcommReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     lowcommDataType_t datatype, lowcommRedOp_t op,
                                     const char* codec, lowcommComm_t comm,
                                     lowcommRequest_t* request) {
  return reduce_scatter_c(sendbuff, recvbuff, recvcount, datatype, op, codec, comm, request,
                          nullptr);
}

lowcommResult_t lowcommBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                 lowcommDataType_t datatype, int root, lowcommComm_t comm,
                                 lowcommRequest_t* request) {
  return broadcast_c(sendbuff, recvbuff, count, datatype, root, comm, request, nullptr);
}

lowcommResult_t lowcommReduce(const void* sendbuff, void* recvbuff, size_t count,
                              lowcommDataType_t datatype, lowcommRedOp_t op, int root,
                              const char* codec, lowcommComm_t comm, lowcommRequest_t* request) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    auto rop = to_op(op);
    if (!rop) return record(comm, rop.status());
    lowcomm::AllReduceOptions o;
    if (auto s = parse_codec_arg(codec, &o.codec); !s) return record(comm, s);
    return finish(comm, comm->comm->reduce(sendbuff, recvbuff, count, *dt, *rop, root, o), request);
  });
}

lowcommResult_t lowcommGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                              lowcommDataType_t datatype, int root, lowcommComm_t comm,
                              lowcommRequest_t* request) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    return finish(comm, comm->comm->gather(sendbuff, recvbuff, sendcount, *dt, root), request);
  });
}

lowcommResult_t lowcommScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               lowcommDataType_t datatype, int root, lowcommComm_t comm,
                               lowcommRequest_t* request) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    return finish(comm, comm->comm->scatter(sendbuff, recvbuff, recvcount, *dt, root), request);
  });
}

lowcommResult_t lowcommAllToAllv(const void* sendbuff, const size_t* sendcounts,
                                 const size_t* sdispls, void* recvbuff, const size_t* recvcounts,
                                 const size_t* rdispls, lowcommDataType_t datatype,
                                 lowcommComm_t comm, lowcommRequest_t* request) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    if (!sendcounts || !sdispls || !recvcounts || !rdispls)
      return record(comm, lowcomm::invalid_argument(
                              "lowcommAllToAllv: counts and displacements must not be NULL"));
    const auto n = static_cast<size_t>(comm->comm->size());
    std::vector<uint64_t> sc(sendcounts, sendcounts + n), sd(sdispls, sdispls + n),
        rc(recvcounts, recvcounts + n), rd(rdispls, rdispls + n);
    return finish(comm,
                  comm->comm->all_to_all(sendbuff, std::move(sc), std::move(sd), recvbuff,
                                         std::move(rc), std::move(rd), *dt),
                  request);
  });
}

lowcommResult_t lowcommSend(const void* sendbuff, size_t count, lowcommDataType_t datatype,
                            int peer, lowcommComm_t comm, lowcommRequest_t* request) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    return finish(comm, comm->comm->send(sendbuff, count, *dt, peer), request);
  });
}

lowcommResult_t lowcommRecv(void* recvbuff, size_t count, lowcommDataType_t datatype, int peer,
                            lowcommComm_t comm, lowcommRequest_t* request) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    auto dt = to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    return finish(comm, comm->comm->recv(recvbuff, count, *dt, peer), request);
  });
}

lowcommResult_t lowcommBarrier(lowcommComm_t comm, lowcommRequest_t* request) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    return finish(comm, comm->comm->barrier(), request);
  });
}

// Both may run after the request's comm was destroyed or aborted: they touch only the request
// and the ErrorSink it shares (held here past `delete request`).
lowcommResult_t lowcommTest(lowcommRequest_t request, int* done) {
  std::shared_ptr<ErrorSink> sink = request ? request->errors : nullptr;
  return guarded(sink.get(), [&] {
    if (!request || !done)
      return record(nullptr, lowcomm::invalid_argument("NULL request or done"));
    *done = request->work.test() ? 1 : 0;
    if (!*done) return lowcommSuccess;
    Status s = request->work.status();
    delete request;
    return record_to(sink.get(), s);
  });
}

lowcommResult_t lowcommWait(lowcommRequest_t request) {
  std::shared_ptr<ErrorSink> sink = request ? request->errors : nullptr;
  return guarded(sink.get(), [&] {
    if (!request) return record(nullptr, lowcomm::invalid_argument("NULL request"));
    Status s = request->work.wait();
    delete request;
    return record_to(sink.get(), s);
  });
}

lowcommResult_t lowcommWaitStats(lowcommRequest_t request, lowcommOpStats* stats) {
  std::shared_ptr<ErrorSink> sink = request ? request->errors : nullptr;
  return guarded(sink.get(), [&] {
    if (!request || !stats)
      return record(nullptr, lowcomm::invalid_argument("NULL request or stats"));
    if (Status bad = check_stats_size(stats); !bad) return record_to(sink.get(), bad);
    Status s = request->work.wait();
    auto st = request->work.stats();  // complete: never the in-flight error
    to_c_stats(st.is_ok() ? *st : lowcomm::OpStats{}, stats);
    delete request;
    return record_to(sink.get(), s);
  });
}

lowcommResult_t lowcommCommGetLastOpStats(lowcommComm_t comm, lowcommOpStats* stats) {
  return guarded(sink_of(comm), [&] {
    LOWCOMM_C_CHECK_COMM(comm);
    if (!stats) return record(comm, lowcomm::invalid_argument("NULL stats"));
    if (Status bad = check_stats_size(stats); !bad) return record(comm, bad);
    to_c_stats(comm->comm->last_op_stats(), stats);
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommAllReduceOnStream(const void* sendbuff, void* recvbuff, size_t count,
                                         lowcommDataType_t datatype, lowcommRedOp_t op,
                                         const char* codec, const char* errorFeedbackKey,
                                         lowcommComm_t comm, cudaStream_t stream,
                                         lowcommRequest_t* request) {
  return all_reduce_c(sendbuff, recvbuff, count, datatype, op, codec,
                      errorFeedbackKey && *errorFeedbackKey ? errorFeedbackKey : nullptr, 0, comm,
                      request, &stream);
}

lowcommResult_t lowcommReduceScatterOnStream(const void* sendbuff, void* recvbuff, size_t recvcount,
                                             lowcommDataType_t datatype, lowcommRedOp_t op,
                                             const char* codec, lowcommComm_t comm,
                                             cudaStream_t stream, lowcommRequest_t* request) {
  return reduce_scatter_c(sendbuff, recvbuff, recvcount, datatype, op, codec, comm, request,
                          &stream);
}

lowcommResult_t lowcommAllGatherOnStream(const void* sendbuff, void* recvbuff, size_t sendcount,
                                         lowcommDataType_t datatype, lowcommComm_t comm,
                                         cudaStream_t stream, lowcommRequest_t* request) {
  return all_gather_c(sendbuff, recvbuff, sendcount, datatype, comm, request, &stream);
}

lowcommResult_t lowcommBroadcastOnStream(const void* sendbuff, void* recvbuff, size_t count,
                                         lowcommDataType_t datatype, int root, lowcommComm_t comm,
                                         cudaStream_t stream, lowcommRequest_t* request) {
  return broadcast_c(sendbuff, recvbuff, count, datatype, root, comm, request, &stream);
}

}  // extern "C"
