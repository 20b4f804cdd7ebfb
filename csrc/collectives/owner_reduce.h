#pragma once
// The owner reduction's pieces, shared by its phases (owner_reduce.cc has the schedule and runs
// them in order):
//   owner_reduce_contributions.cc  step 1: every segment of every chunk encoded and sent to its
//                                  owner (and the receives of the contributions to this rank's)
//   owner_reduce_chunk.cc          step 2: this rank's chunk reduced segment by segment as the
//                                  contributions arrive, each result handed to step 3 at once
//   owner_reduce_results.cc        step 3: the owners' results sent to every rank (or the root)
//                                  and decoded as they arrive
// Internal to the collectives layer; the entry points are in algorithms.h.

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/ef_store.h"
#include "topology/partition.h"

namespace lowcomm::collectives {

class DeviceCodes;

// Where the owners' results go after step 2.
struct Finish {
  enum Kind { kScatter, kAllGather, kToRoot } kind = kAllGather;
  int root = -1;  // kToRoot
};

// What every phase reads: the call, how the tensor is cut, and this rank's part in it. Built
// once (prepare_owner_reduce) before anything is posted; the phases never change it.
struct OwnerReduce {
  OpRun& run;
  const ReduceArgs& a;
  Finish finish;
  // The ranks taking part, by index in the reduction (empty: every rank, index = rank): a
  // two-level all-reduce (two_level.cc) reduces inside a site and across one column of sites.
  // P, me, chunks, the root of kToRoot and the rounding seeds are by index; peer() maps to ranks.
  std::vector<int> group;
  int P = 0, me = 0;
  CodecSpec wire;      // what crosses the network (a non-codec dtype's plain bytes: unused)
  bool plain = false;  // the input dtype itself: send input bytes, no encode
  std::vector<std::vector<Range>> segs;  // pipeline segments, by owner
  uint64_t es = 0;                       // bytes per element of the dtype
  Range mine;                            // this rank's owner chunk
  const uint8_t* in = nullptr;
  uint8_t* out = nullptr;
  CpuOptions cpu;
  bool gets_results = false;         // receives the other owners' results
  bool sends_results = false;        // sends its own (to every rank, or to the root)
  ErrorFeedbackEntry* ef = nullptr;  // the sender residual, under a.error_feedback_key
  float* owner_residual = nullptr;   // this chunk's owner residual (owner error feedback)
  uint64_t reduce_tag = 0;           // contributions
  uint64_t gather_tag = 0;           // results
  // The GPU-codec path (a.device set; owner_reduce_device.cc): in and out are device buffers,
  // never read or written here; contributions come encoded from the device, results go to it.
  DeviceCodes* dev = nullptr;
  // Set (StagedOwnerReduce::report_results): told each part of `out` as it becomes final.
  const std::function<void(uint64_t, uint64_t)>* on_result = nullptr;
  void result_final(Range s) const {
    if (on_result) (*on_result)(s.begin * es, s.count * es);
  }

  OwnerReduce(OpRun& r, const ReduceArgs& args, Finish f) : run(r), a(args), finish(f) {}
  // Bytes of `count` elements on the wire.
  uint64_t bytes(uint64_t count) const { return plain ? count * es : encoded_size(wire, count); }
  const std::vector<Range>& my_segs() const { return segs[static_cast<size_t>(me)]; }
  int peer(int index) const { return group.empty() ? index : group[static_cast<size_t>(index)]; }
  // The most segments any owner's chunk has: the rounds of the segment-major schedule.
  size_t max_segs() const;
};

// The whole owner reduction (owner_reduce.cc) among `group` (empty: every rank), chunk i owned
// by the group's i-th member. The descriptors must have been posted.
Status owner_reduce(OpRun& run, const ReduceArgs& a, const std::vector<Range>& chunks,
                    Finish finish, std::vector<int> group = {});

// Fills `o` for owner chunks `chunks` (segment length from the descriptor) and looks up the
// error-feedback residuals; fails only on an error-feedback key of another tensor.
Status prepare_owner_reduce(OwnerReduce& o, const std::vector<Range>& chunks);

// Step 1: the contributions to this rank's chunk (other ranks', received into scratch) and its
// own, kept here instead of sent.
struct Contributions {
  std::vector<std::vector<uint8_t*>> codes;               // [rank][segment]
  std::vector<std::vector<transport::Request>> requests;  // [rank][segment]
  std::vector<const uint8_t*> own;                        // [segment]
};
// Posts the receives of every other rank's contribution to this rank's chunk.
Contributions post_contribution_receives(const OwnerReduce& o);
// Encodes every segment (segment-major, each rank starting with the next owner) and sends it to
// its owner; this rank's own segments go to c.own.
Status send_contributions(const OwnerReduce& o, Contributions& c);

// Step 3: the other owners' results, received and decoded in the order they are expected, and
// this owner's sent.
class Results {
 public:
  // Posts the receives of every other owner's result segments (where this rank gets results).
  void post_receives(const OwnerReduce& o);
  // Sends this owner's result segment `s` (codes `res`) where results go, and decodes it into
  // `dst` as every other rank does (a reduce: on the root only).
  Status send_own(const OwnerReduce& o, Range s, const uint8_t* res, uint8_t* dst);
  // Decodes the results not yet decoded, in order: those already here (block false), or all of
  // them, waiting for each (block true).
  Status take(const OwnerReduce& o, bool block);

 private:
  std::vector<std::vector<uint8_t*>> codes_;               // [owner][segment]
  std::vector<std::vector<transport::Request>> requests_;  // [owner][segment]
  std::vector<std::pair<int, size_t>> order_;              // (owner, segment), as expected
  std::vector<bool> done_;                                 // by order_ index
  size_t left_ = 0;
};

// Step 2: reduces this rank's chunk segment by segment as the contributions arrive (decoding
// results that are in while one is not), and hands each finished segment to results.send_own.
Status reduce_own_chunk(const OwnerReduce& o, Contributions& c, Results& results);

// The GPU-codec path of the owner reduction (owner_reduce_device.cc), for an all-reduce or
// reduce-scatter of device buffers with a dense lossy codec. Before step 1 every contribution
// segment is encoded on the device (with the sender residual in device memory) and the codes
// copied to pinned memory in one piece; steps 1-2 run on the host as for host buffers, reading
// those codes instead of encoding; step 3's result codes (received, or this owner's own) are
// gathered into pinned slots in tensor order, copied to the device in one piece after the last
// and decoded there into the output; a reduce-scatter's rounded slice is copied up as it is.
// Only encoded bytes (each segment's padded to 16 bytes, for the kernels' alignment, and a
// reduce-scatter's output) cross PCIe; the bytes on the wire are the host path's.
class DeviceCodes {
 public:
  DeviceCodes(const OwnerReduce& o, DeviceOp& d) : o_(o), d_(d) {}
  // Encodes every contribution segment on the device; waits for the codes to be in pinned
  // memory.
  Status encode_contributions();
  const uint8_t* contribution(int owner, size_t k) const;
  // Where owner's result segment k goes (pinned); its codes are received or copied there.
  uint8_t* result_slot(int owner, size_t k) const;
  // A reduce-scatter's output slice on the host (pinned), copied to the device by finish().
  uint8_t* scatter_out() const { return scatter_out_; }
  // Copies the results (or the slice) to the device, decodes them there, waits.
  Status finish();

 private:
  const OwnerReduce& o_;
  DeviceOp& d_;
  std::vector<std::vector<uint64_t>> offset_;  // [owner][segment]: bytes into the codes
  uint64_t total_ = 0;                // the codes of every segment, each padded to 16 bytes
  uint8_t* contributions_ = nullptr;  // pinned, total_
  uint8_t* results_ = nullptr;        // pinned, total_ (all-reduce)
  uint8_t* scatter_out_ = nullptr;    // pinned, this owner's slice (reduce-scatter)
};

// The owner reduction in two halves, for a schedule that interleaves several of them
// (two_level.cc pipelines its pieces): start() prepares, posts every receive, sends this rank's
// contributions and checks the descriptors; finish() reduces this rank's chunk (sending its
// results) and takes the other owners'. Reductions started in the same order on every rank
// match message for message on their shared (peer, tag) streams. The descriptors must be
// posted before the first start().
class StagedOwnerReduce {
 public:
  StagedOwnerReduce(OpRun& run, const ReduceArgs& args, std::vector<Range> chunks, Finish finish,
                    std::vector<int> group);
  StagedOwnerReduce(const StagedOwnerReduce&) = delete;
  StagedOwnerReduce& operator=(const StagedOwnerReduce&) = delete;
  // The flat all-reduce's output is the caller's: each part is reported final (ReduceArgs::
  // on_result) as it is decoded or received. Before start().
  void report_results() { o_.on_result = args_.on_result ? &args_.on_result : nullptr; }
  Status start();
  Status finish();

 private:
  ReduceArgs args_;  // before o_, which refers to it
  std::vector<Range> chunks_;
  OwnerReduce o_;
  std::unique_ptr<DeviceCodes> dev_;  // the GPU-codec path (args.device)
  Contributions contributions_;
  Results results_;
};

}  // namespace lowcomm::collectives
