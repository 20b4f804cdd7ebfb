#pragma once
// The communicator: an NCCL-style group of ranks joined by authenticated TCP peers, and the
// collectives over host buffers (docs/collectives.md).
//
//   auto id = create_unique_id("10.0.0.5");              // on rank 0; distribute id.to_string()
//   auto comm = Communicator::init(*id, rank, nranks);  // every rank, same id
//   Work w = (*comm)->all_reduce(x, x, n, DType::kFloat32, ReduceOp::kAverage,
//                                {.codec = *parse_codec_spec("q4"), .error_feedback_key =
//                                "grads"});
//   Status s = w.wait();
//
// Every operation is asynchronous: it returns a Work at once and runs on the communicator's
// executor thread in call order (each collective gets the next operation sequence number). The
// caller's buffers stay lent out until the Work completes. Every operation has a deadline
// (CommOptions::timeout from the moment it starts running). The first failure of any operation
// latches: the communicator is broken from then on, every queued and later operation fails with
// the first cause, and the other ranks are told (docs/collectives.md, "Failure semantics").
//
// Thread safety: every method may be called from any thread; operations are ordered by the
// order in which the calls return. abort() may be called while other threads wait.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowcomm/codec.h"
#include "lowcomm/export.h"
#include "lowcomm/status.h"

namespace lowcomm {

// Where rank 0 listens and the communicator's shared secret. Fixed-size opaque form
// (to_bytes, 128 bytes, what lowcommUniqueId holds) and printable form (to_string, for
// environment variables and files): "lowcomm1:<address:port>/<64 hex digits>". The secret
// authenticates every connection; treat the id like a password.
struct LOWCOMM_API UniqueId {
  static constexpr size_t kSecretBytes = 32;
  static constexpr size_t kOpaqueBytes = 128;

  std::string root_address;  // numeric "a.b.c.d:port" or "[v6]:port"
  std::array<uint8_t, kSecretBytes> secret{};

  std::array<uint8_t, kOpaqueBytes> to_bytes() const;
  static Result<UniqueId> from_bytes(const void* bytes, size_t len);
  std::string to_string() const;
  static Result<UniqueId> parse(std::string_view text);
};

// A fresh id with a random secret. `bind` is rank 0's listen address: "" (the interface
// LOWCOMM_SOCKET_IFNAME selects), a numeric host ("127.0.0.1", port chosen now) or host:port.
// The listening socket is opened now and kept for Communicator::init(rank 0) in this process
// or a fork() of it; a rank 0 elsewhere binds root_address itself.
LOWCOMM_API Result<UniqueId> create_unique_id(std::string_view bind = {});

// `id` with its secret replaced by HMAC-SHA256(id.secret, context): one root address serves a
// series of communicators, each of whose members must agree on the context (torch's reconfigure
// passes its uuid), and a rank holding another context fails the handshake instead of joining
// the wrong one. A listening socket this process keeps for `id` is kept for the result instead.
LOWCOMM_API UniqueId derive_unique_id(const UniqueId& id, std::string_view context);

// Reductions. Codecs take kSum and kAverage on fp32/bf16/fp16; everything else is exact (the
// rules per dtype: docs/collectives.md, "Reductions"). Bitwise ones take integers and bool.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,
  kProduct = 2,
  kMin = 3,
  kMax = 4,
  kBAnd = 5,
  kBOr = 6,
  kBXor = 7,
};
inline constexpr uint8_t kMaxReduceOp = 7;
LOWCOMM_API const char* reduce_op_name(ReduceOp op);

// The communicator's options. One convention for "not given": an empty std::optional, or an
// empty string for the text fields; then the LOWCOMM_* variable named (README, "Environment")
// decides, else the default. A value given, whatever it is, is used as given: an explicit 4 MiB
// segment is not taken for the default.
struct CommOptions {
  // TCP streams per peer, all striped; unset: LOWCOMM_STREAMS, else 4 opened and as many
  // striped as the path needs (one on a LAN, four at 100 ms RTT with 32 MiB buffers;
  // docs/transport.md).
  std::optional<int> streams;
  std::string wan;  // emulated link of this rank's sends (LOWCOMM_WAN syntax); "": LOWCOMM_WAN
  // Which ranks share a site (a fast local network behind one WAN link): one label per rank,
  // comma-separated ("0,0,0,0,1,1,1,1"), or "flat". "": LOWCOMM_SITES, else the site= rules of
  // the emulated WAN, else flat. Sites of equal size (two or more ranks each) run large fp32
  // all-reduces in two levels (docs/collectives.md); every rank must pass the same map.
  std::string sites;
  // Owner shares of the flat all-reduce: "auto" sizes them from the rates each rank measures
  // on its downlink during large all-reduces (a slow rank owns less; docs/sites.md), "equal"
  // keeps them equal. "": LOWCOMM_SHARES, else auto when the ranks span more than one host or
  // an emulated WAN is set (LOWCOMM_WAN), equal otherwise (on one host the rates measure the
  // CPU, not a link) and where a site holds several ranks (its link is shared, which per-rank
  // rates cannot see). Every rank must pass the same.
  std::string shares;
  // The transport between ranks of one site (the same host, or a site of `sites`): "tcp"
  // (lowcomm's own streams, authenticated and optionally sealed), or "ucx" (UCX: shared memory
  // on one host, TCP or RDMA between hosts; every message still checked by XXH3-128, but UCX
  // authenticates nothing, so use it inside a trusted site; never with `encrypt`). "":
  // LOWCOMM_INTRA_SITE, else tcp. A pair of ranks uses UCX only where both ask for it and both
  // have it (a build without UCX, or UCX failing to start, keeps TCP and says so at INFO);
  // links of an emulated WAN stay on TCP. Collective payloads travel over it; descriptors,
  // control and point-to-point messages stay on TCP.
  std::string intra_site;
  // Random-k (randk codecs) all-reduces: "gather-all" (every rank's message to every rank,
  // summed in rank order: one quantization, one one-way delay, (P-1)·m bytes sent), "owner"
  // (the owner reduction over the positions every rank shares: two quantizations, two delays,
  // 2(P-1)/P·m), or "auto" (with three ranks or more, whichever has run faster for calls of
  // that size, both tried first; docs/sparse.md). "": LOWCOMM_SPARSE_SCHEDULE, else auto. Every
  // rank must pass the same. Top-k always gathers (its positions differ by rank).
  std::string sparse_schedule;
  // Deadline of init and of every operation (from when it starts running); unset:
  // LOWCOMM_TIMEOUT_S, else 30 minutes.
  std::optional<std::chrono::milliseconds> timeout;
  // Deadline of init alone, when it must differ from the operations' (torch's reconfigure has a
  // timeout of its own); unset: `timeout`.
  std::optional<std::chrono::milliseconds> init_timeout;
  // The least silence after which a peer that an operation waits on is failed as frozen or cut
  // off (SIGSTOP, a hung host, a cut path keep sockets open: without this only `timeout` ends
  // the wait). The peer's progress thread answers pings whatever its caller does, so a rank
  // merely late to a collective is not silent; the timeout in use grows with the measured round
  // trip. Every rank's operation then fails naming the peer. 0: off; unset:
  // LOWCOMM_FAILURE_TIMEOUT_MS (0 there: off), else 1500 ms.
  std::optional<std::chrono::milliseconds> failure_timeout;
  // How long init waits for the other ranks to join once it has started (the root: for every
  // rank's hello, then for every rank's connections; the others: for the root's answer, twice
  // this), before it fails naming the ranks missing as frozen, gone or late. For groups whose
  // members are alive and start together, as torchft's quorums do: a member frozen since the
  // quorum then fails init in seconds, not at its deadline. 0: none, init waits until its
  // deadline (the ranks of a job may start minutes apart).
  std::chrono::milliseconds join_timeout{0};
  // This rank's listen address (numeric host, port 0 allowed). "": LOWCOMM_SOCKET_IFNAME when
  // set, else the local address that routes to the root.
  std::string listen_address;
  // The codec of all_reduce and reduce_scatter calls that name none, where a codec can take
  // the call (fp32/bf16/fp16, sum or avg; other calls stay exact); unset: uncompressed.
  std::optional<CodecSpec> codec;
  // The default codec applies only to calls of at least this many input bytes (smaller ones are
  // latency-bound: compressing them saves nothing). 0: every size.
  uint64_t codec_min_bytes = 0;
  // The reduce algorithms' largest pipelining unit (input bytes): segments are an eighth of an
  // owner chunk, at least 64 KiB, at most this (at least 4096); unset: LOWCOMM_SEGMENT_BYTES,
  // else 4 MiB (ranks must agree: the descriptor check says so).
  std::optional<uint64_t> segment_bytes;
  // All-reduces of at most this many input bytes take the one-hop algorithm: every rank sends
  // its (encoded) tensor to every other and reduces the P contributions itself, in rank order.
  // One one-way delay instead of two, (P-1)·n·w bytes sent instead of 2(P-1)/P·n·w, one
  // quantization instead of two (uncompressed: the same bits as the owner reduction). For
  // small tensors on long links, e.g. a trainer that all-reduces each parameter synchronously.
  // 0: never; unset: LOWCOMM_DIRECT_BYTES, else 0. Ranks must agree (the descriptor check says
  // so).
  std::optional<uint64_t> direct_bytes;
  int codec_threads = 0;  // CpuOptions::threads for encode/decode
  // SO_SNDBUF/SO_RCVBUF per stream, at most 1 GiB; 0: the kernel's autotuning (a default TCP
  // socket); unset: LOWCOMM_SOCKET_BUFFER, else 32 MiB.
  std::optional<int> socket_buffer_bytes;
  // Every payload byte carries a check either way (XXH3-128 per chunk; a corrupted chunk fails
  // its operation with kCorruptData naming the peer). 1: also encrypt and authenticate every
  // stream with AES-256-GCM (keys derived from the id's secret in each stream's handshake;
  // docs/transport.md); false: integrity only; unset: LOWCOMM_ENCRYPT (0 or 1), else false. All
  // ranks must agree: a rank that differs fails init naming the mismatch.
  std::optional<bool> encrypt;
  // A collective of at most this many input bytes may run on the thread that waits for it
  // (Work::wait, lowcommWait, torch's wait) when it is next in line and the communicator's
  // thread has not started it: the hand-off to that thread and back leaves the critical path.
  // Calls still return at once; wait_for and test never run anything. 0: never; unset:
  // LOWCOMM_INLINE_BYTES, else 64 KiB.
  std::optional<uint64_t> inline_bytes;
};

// Where an operation's buffers live. kCuda: device pointers of one CUDA device, the work
// stream-ordered on a cudaStream_t (docs/collectives.md, "CUDA buffers"):
//   - the operation reads its input after the work queued on that stream before the call
//     (an event recorded on it at the call, waited for by the communicator's own stream);
//   - when the Work completes, its results are in place on the device (the communicator's
//     stream has been synchronised), so Work::wait() / lowcommWait / Work::wait_on_stream, all
//     on the host, order later work (no device-side wait: see wait_on_stream);
//   - compressed dense all-reduce and reduce-scatter on the flat schedule encode on the GPU
//     (error-feedback residuals in GPU memory), only the encoded bytes cross to pinned host
//     memory, and the results are decoded on the GPU; every other operation stages its
//     buffers through a pinned host pool that is reused across calls. OpStats counts both
//     directions (device_to_host_bytes, host_to_device_bytes).
// The bytes every rank ends with are those of the same call on host buffers: a group may mix
// host and device ranks. A build without CUDA, or a process without a device, refuses kCuda
// with kUnsupported before anything is sent.
enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

// Where the device memory of operations on CUDA buffers comes from: their scratch (codes on
// the device, a preload's test buffers) and the error-feedback residuals kept on the device.
// By default cudaMallocAsync / cudaFreeAsync on the communicator's stream. A framework with a
// caching allocator of its own installs it (the torch backend installs torch's), so that its
// memory accounting sees lowcomm's memory and a shortage first frees its cache. `alloc` is
// called with the memory's device current and the stream (a cudaStream_t) whose work uses it,
// and returns nullptr when it cannot (the operation then fails with kSystem, "out of
// memory"); `release` gets the same stream, after the work queued on it that reads the memory.
// Either may be called from any thread. Process-wide: a communicator keeps the allocator it
// found at its first CUDA-buffer call for its whole life (what it took, it gives back there).
// Both null: the default again.
struct DeviceAllocator {
  void* (*alloc)(uint64_t bytes, void* stream, void* ctx) = nullptr;
  void (*release)(void* p, void* stream, void* ctx) = nullptr;
  void* ctx = nullptr;
};
LOWCOMM_API void set_device_allocator(const DeviceAllocator& allocator);

// Where the buffers of an operation without other options live (all_gather, broadcast).
struct BufferOptions {
  MemoryKind memory = MemoryKind::kHost;
  void* cuda_stream = nullptr;  // a cudaStream_t; null: the legacy default stream
};

struct AllReduceOptions {
  // Unset: CommOptions::codec. A passthrough spec whose wire dtype is the tensor's dtype is the
  // uncompressed algorithm.
  std::optional<CodecSpec> codec;
  // Non-empty: error feedback on each rank's quantization of its contributions, in residual state
  // kept under this key across calls (save_error_feedback / restore_error_feedback).
  std::string error_feedback_key;
  bool owner_error_feedback = false;  // also on the owner's re-quantization (same key)
  // Stochastic rounding seeds derive from (seed, step, rank, element offset); step unset: the
  // operation sequence number. A randk codec's positions derive from (seed, step) alone, so
  // every rank must pass the same seed and step (the descriptor check refuses ranks that differ).
  uint64_t seed = 0;
  std::optional<uint64_t> step;
  // Where send/recv live (MemoryKind): kCuda takes device pointers, ordered on `cuda_stream`
  // (a cudaStream_t; null: the legacy default stream).
  MemoryKind memory = MemoryKind::kHost;
  void* cuda_stream = nullptr;
  // Which schedule runs when the communicator has sites (CommOptions::sites). kAuto: where the
  // sites and the size allow two levels, whichever of flat and two levels has run faster for
  // calls of this size (both are tried first; docs/sites.md), else flat; kFlat: the flat full mesh
  // always; kTwoLevel: two levels, or kInvalidArgument when the call cannot take them (no sites, or
  // not an fp32 sum or average). Every rank must pass the same (the descriptor check enforces it).
  enum class Schedule : uint8_t { kAuto = 0, kFlat = 1, kTwoLevel = 2 };
  Schedule schedule = Schedule::kAuto;
  // A randk codec's schedule (CommOptions::sparse_schedule): kAuto takes the communicator's;
  // kOwner needs an fp32 sum or average (else kInvalidArgument); a topk codec refuses kOwner.
  enum class SparseSchedule : uint8_t { kAuto = 0, kGatherAll = 1, kOwner = 2 };
  SparseSchedule sparse_schedule = SparseSchedule::kAuto;
  // Set: called as parts of recv take their final value, before the operation completes, with
  // the part's byte offset in recv and its length; each byte is reported at most once, and a part
  // never reported is final when the operation completes. For a caller that copies the result on
  // while the rest of it arrives (the elastic all-reduce does); a reported part must not be
  // written before the operation completes (it may still be on its way to other ranks). Called
  // on the communicator's thread while the operation runs: it must be quick and must not call
  // into the communicator. Host buffers, the flat dense schedule; other schedules do not call it.
  std::function<void(uint64_t offset, uint64_t bytes)> on_result = nullptr;
};

// How a reduction is compressed, decided in one place for every entry point (this API, the C
// API, the torch backend, which all call decide_compression):
//   1. A codec the call names is used as named (a passthrough spec of the tensor's own dtype
//      means exact). Whether it can take the call (dtype, op, count) is the argument check's
//      to say: a codec on an integer or MAX reduction is refused, not ignored.
//   2. Otherwise the default codec (CommOptions::codec, LOWCOMM_CODEC, the torch group's
//      Options.codec) applies to floating-point (fp32, bf16, fp16) SUM and AVG reductions of at
//      least `min_bytes` input bytes; every other call is exact ("bypassed").
//   3. Error feedback (a residual key) rides on the codec decided: kept when the call is
//      compressed; dropped when the default was bypassed (nothing was quantized: nothing to feed
//      back, e.g. a small or integer tensor under the torch backend's per-tensor keys); kept
//      otherwise, so a key with an exact codec the caller chose is refused by the argument check
//      ("needs a codec that loses precision"). owner_error_feedback needs a key.
struct CompressionPolicy {
  std::optional<CodecSpec> codec;  // the default for calls that name none
  uint64_t min_bytes = 0;          // the default applies to calls of at least this many bytes
};
struct Compression {
  std::optional<CodecSpec> codec;  // unset or plain: exact
  std::string error_feedback_key;
  bool owner_error_feedback = false;
  bool bypassed = false;  // a default codec existed but rule 2 left this call exact
};
LOWCOMM_API Compression decide_compression(const CompressionPolicy& policy,
                                           const std::optional<CodecSpec>& call_codec, DType dtype,
                                           ReduceOp op, uint64_t bytes,
                                           std::string error_feedback_key,
                                           bool owner_error_feedback);

// reduce_scatter's options are all_reduce's; owner_error_feedback does not apply (the owner's
// sum is rounded to the dtype, never re-quantized) and is refused.
using ReduceScatterOptions = AllReduceOptions;

// What one operation did, as this rank saw it (docs/collectives.md, "Statistics"). Bytes are
// counted where the operation hands them to the transport: on the wire is payload plus the
// transport's 48-byte header per chunk (at least one chunk per message) plus the operation's
// descriptors. Times are the executor's, on the steady clock.
struct OpStats {
  std::string kind;       // "all_reduce", "reduce_scatter", "all_gather", "broadcast",
                          // "barrier", "send", "recv"; "" for a refused call
  uint64_t sequence = 0;  // Work::sequence()
  uint64_t count = 0;     // the call's element count
  std::string codec;      // the codec spec on the wire ("q4"); "" uncompressed
  // From when the executor started the operation to its completion (not the time queued).
  std::chrono::nanoseconds wall{0};
  uint64_t bytes_sent = 0;          // on the wire, to all peers
  uint64_t bytes_received = 0;      // on the wire, from all peers
  uint64_t payload_bytes_sent = 0;  // bytes_sent less chunk headers and descriptors
  // Of payload_bytes_sent, what went to ranks of this site over UCX (CommOptions::intra_site;
  // a UCX message is counted in bytes_sent by its length, without chunk headers).
  uint64_t ucx_bytes_sent = 0;
  // The payload the same operation sends uncompressed (its dtype's bytes, same schedule).
  uint64_t uncompressed_bytes_sent = 0;
  // uncompressed_bytes_sent / payload_bytes_sent: 1 for uncompressed operations and for
  // operations that ran but sent no payload.
  double compression_ratio = 0.0;
  std::chrono::nanoseconds encode{0};        // in the codec's encodes (0 uncompressed)
  std::chrono::nanoseconds decode{0};        // in the codec's decodes (0 uncompressed)
  std::chrono::nanoseconds network_wait{0};  // blocked waiting for sends and receives
  // On an emulated link (CommOptions::wan, LOWCOMM_WAN): the least time the link allows for
  // these bytes, max(sent * 8 / uplink, received * 8 / downlink) + one one-way delay, and
  // link_limit / wall. Both 0 on an unshaped link.
  std::chrono::nanoseconds link_limit{0};
  double link_efficiency = 0.0;
  // A flat all-reduce: the owner shares it ran with, by rank (empty: equal shares), and this
  // rank's downlink rate as it stood when the operation started (bytes/s; 0: not measured yet;
  // CommOptions::shares).
  std::vector<double> shares;
  double rate_estimate = 0.0;
  // An all-reduce: the schedule it ran, "flat", "two-level" or "one-hop" (AllReduceOptions::
  // schedule kAuto leaves flat or two levels to the communicator: docs/sites.md); for a sparse
  // codec "gather-all" or "owner" (AllReduceOptions::sparse_schedule); "" otherwise.
  std::string schedule;
  // A sparse codec (topk, randk): the fraction of elements its messages kept, and of
  // payload_bytes_sent the bytes of positions (offsets or bitmaps; 0 for randk) and of value
  // codes (the rest are per-chunk scales and randk's seed). 0 for dense codecs.
  double density = 0.0;
  uint64_t index_bytes_sent = 0;
  uint64_t value_bytes_sent = 0;
  // CUDA buffers (MemoryKind::kCuda): bytes copied between the device and host memory for
  // this operation, each way (encoded bytes only for a GPU-encoded all-reduce or
  // reduce-scatter; the whole buffers for a staged operation). 0 for host buffers.
  uint64_t device_to_host_bytes = 0;
  uint64_t host_to_device_bytes = 0;
  // "gpu-codec" (encoded and decoded on the GPU), "staged" (buffers through pinned host
  // memory), "" for host buffers.
  std::string device_path;
  // Chunks of this operation's received messages that failed their payload check and were sent
  // again (docs/transport.md, "Re-sends"), in all and by the rank that sent them (empty when
  // none was).
  uint64_t chunks_resent = 0;
  std::vector<uint64_t> chunks_resent_by_rank;
};

class WorkState;

// The completion of one operation. Cheap to copy (shared state).
class LOWCOMM_API Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> s) : state_(std::move(s)) {}
  bool valid() const { return state_ != nullptr; }
  bool test() const;    // complete (successfully or not)
  Status wait() const;  // until complete; the operation's own deadline bounds it
  // kTimeout when not complete within `d`; the operation keeps running (buffers still lent).
  Status wait_for(std::chrono::milliseconds d) const;
  Status status() const;      // the final status; kInternal "in flight" before completion
  uint64_t sequence() const;  // the collective's operation number (p2p: per peer and tag;
                              // any-source receives: per communicator)
  // A receive, once complete: the rank its message came from (recv_any: the sender it matched;
  // set on failure too, once the sender was known); -1 before, or for other operations.
  int source() const;
  // What the operation did, once it is complete (failed operations count what they issued
  // before failing); before: kInternal "in flight", as status(). An operation that never ran
  // (refused, dropped by abort(), or failed at once because the communicator had failed) has
  // zero counters and ratio; a refused one has no kind either.
  Result<OpStats> stats() const;
  // Refused before it was queued, for arguments that are wrong on this rank alone (a peer or
  // root outside the group, a null buffer with a non-zero count, an invalid codec, a count too
  // large): already complete with that error (kInvalidArgument; kUnsupported for CUDA memory).
  // Nothing was sent and no sequence number taken, so the communicator stays usable.
  bool refused() const;
  // Runs fn(final status) once the operation completes: at once on this thread when it already
  // has, else on the thread that ran it (the communicator's executor, or a thread that ran a
  // small collective inline in its wait()), after wait() and status() see the result and after
  // that thread has left the operation. For futures (torch's Work::getFuture); fn must not
  // throw. fn may call the library: issue a collective and wait for it, or wait for a later
  // operation (on the executor's thread such a wait runs the queue itself, in call order, so the
  // operations it waits for cannot be stuck behind it); later operations' callbacks run after fn
  // returns.
  void on_complete(std::function<void(const Status&)> fn) const;
  // Makes the work queued on `cuda_stream` (a cudaStream_t; null: the legacy default stream)
  // after this call see the operation's device results: the host waits for the operation (as
  // wait(); its own result is then in wait()/status(): a failed operation leaves its outputs
  // untouched, except that a CUDA error during the GPU-codec path's final decode leaves them
  // partly written). Not a device-side wait: one released by the operation's completion would hold
  // the stream on the executor's progress, while the executor makes CUDA calls that any thread
  // blocked on that stream inside the driver (a pageable copy) can hold up, a deadlock.
  // kUnsupported in a build without CUDA or without a device (a refused call is complete).
  Status wait_on_stream(void* cuda_stream) const;

 private:
  std::shared_ptr<WorkState> state_;
};

class CommImpl;

class LOWCOMM_API Communicator {
 public:
  // Joins the group: every rank of [0, nranks) must call it with the same id within the timeout.
  // Fails naming the ranks that never showed up, or the reason a connection was refused.
  static Result<std::unique_ptr<Communicator>> init(const UniqueId& id, int rank, int nranks,
                                                    const CommOptions& options = {});
  // Finishes queued operations, says goodbye to every peer and waits for theirs (so no rank
  // closes a connection another still reads), then closes. After abort(): closes at once.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;

  // recv[i] = op over ranks of send[i], count elements. send == recv is in place. Every rank
  // ends with the same bits, for every codec.
  Work all_reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op,
                  const AllReduceOptions& options = {});
  // send holds recv_count * size() elements; recv gets this rank's reduced slice. With a codec,
  // as all_reduce: each contribution is quantized once (error feedback under error_feedback_key),
  // the owner of a slice decode-accumulates them in rank order in fp32 and rounds once to the
  // dtype, so the result is deterministic; bytes sent per rank are (P-1)/P of the encoded tensor.
  Work reduce_scatter(const void* send, void* recv, uint64_t recv_count, DType dtype, ReduceOp op,
                      const ReduceScatterOptions& options = {});
  // recv (on root) = op over ranks of send, as all_reduce's (options too, owner_error_feedback
  // included), the result sent to root only; other ranks' recv is not used (may be null).
  Work reduce(const void* send, void* recv, uint64_t count, DType dtype, ReduceOp op, int root,
              const AllReduceOptions& options = {});
  // root's recv holds send_count * size() elements, rank r's at r * send_count (in place
  // allowed); other ranks' recv is not used.
  Work gather(const void* send, void* recv, uint64_t send_count, DType dtype, int root);
  // root's send holds recv_count * size() elements; rank r receives the r-th block. Other
  // ranks' send is not used.
  Work scatter(const void* send, void* recv, uint64_t recv_count, DType dtype, int root);
  // Rank r sends send_counts[j] elements from send + send_offsets[j] to rank j, and receives
  // recv_counts[j] from rank j at recv + recv_offsets[j] (offsets in elements; one entry per
  // rank each). Both ranks of a pair must agree on the count between them: a message of
  // another length fails the receive naming the peer. send_counts[rank] == recv_counts[rank].
  Work all_to_all(const void* send, std::vector<uint64_t> send_counts,
                  std::vector<uint64_t> send_offsets, void* recv, std::vector<uint64_t> recv_counts,
                  std::vector<uint64_t> recv_offsets, DType dtype);
  // recv holds send_count * size() elements, rank r's at r * send_count (in place allowed).
  Work all_gather(const void* send, void* recv, uint64_t send_count, DType dtype,
                  const BufferOptions& where = {});
  // recv = root's send (root: send == recv allowed; other ranks ignore send).
  Work broadcast(const void* send, void* recv, uint64_t count, DType dtype, int root,
                 const BufferOptions& where = {});
  // Tagged point-to-point; the k-th send to a peer on a tag meets that peer's k-th recv on it.
  // tag < 2^60. A send completes once its bytes are handed to the kernel.
  Work send(const void* buf, uint64_t count, DType dtype, int peer, uint64_t tag = 0);
  Work recv(void* buf, uint64_t count, DType dtype, int peer, uint64_t tag = 0);
  // Receives the first message on `tag` from any rank (MPI_ANY_SOURCE): the peer whose next send
  // on the tag begins to arrive first, or one already waiting; Work::source() names it. Then as
  // recv from that peer (it counts as that peer's next receive on the tag, in the order receives
  // run). A peer's failure fails it; peers that leave do not (the deadline bounds the wait).
  Work recv_any(void* buf, uint64_t count, DType dtype, uint64_t tag = 0);
  Work barrier();

  // Fails everything in flight and queued with kAborted, tells the peers (best effort), closes
  // every connection. Idempotent; returns once no user buffer is referenced. The residual calls
  // below (save, restore, keys, reset) still work after it: they touch no peer.
  void abort();
  // ok, or the failure that broke the communicator.
  Status status() const;
  // The statistics of the operation the executor completed last (collective or point-to-point,
  // succeeded or failed; not refused calls); all zero before the first.
  OpStats last_op_stats() const;

  // Error-feedback residuals, all keys, as bytes (docs/collectives.md) / back. Waits for the
  // operations queued before the call.
  Result<std::vector<uint8_t>> save_error_feedback();
  Status restore_error_feedback(const void* bytes, size_t len);
  // The residual names kept, sorted. Waits for the operations queued before the call.
  Result<std::vector<std::string>> error_feedback_keys();
  // Drops the residual `name` and every name under it ("layer3" drops "layer3/w", not
  // "layer30"; "" drops all), in call order with the operations; returns how many were dropped.
  // A dropped name starts again from a zero residual at its next use. Local to this rank: all
  // ranks should drop alike, as they keep alike.
  Result<size_t> reset_error_feedback(const std::string& name);

 private:
  explicit Communicator(std::unique_ptr<CommImpl> impl);
  std::unique_ptr<CommImpl> impl_;
};

}  // namespace lowcomm
