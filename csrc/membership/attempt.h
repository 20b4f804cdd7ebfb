#pragma once
// One try of an elastic collective, and what each kind of collective does in it: shared by the
// commit protocol (elastic_collectives.cc) and the joiner's state fetch (state_transfer.cc).

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "membership/elastic_impl.h"

namespace lowcomm {

struct ElasticImpl::Attempt {
  uint64_t view = 0;
  uint64_t seq = 0;
  std::shared_ptr<Communicator> comm;
  std::vector<uint32_t> members;  // of the view, ascending: rank = index
  bool fresh_me = false;          // this member is fresh: contributes nothing, fetches the state
  uint64_t contributors = 0;      // members contributing (the view less its fresh members)
  std::vector<uint32_t> sources;
  uint64_t state_bytes = 0;
  bool any_fresh = false;
  std::set<uint32_t> fresh;
  size_t size = 0;
  int number = 0;  // 0 for the first try of the call
  // Set when a ResultMover takes the result into recv as it arrives: the data collective's
  // AllReduceOptions::on_result.
  std::function<void(uint64_t, uint64_t)> on_result;
};

// One kind of collective, as run_collective drives it: the protocol around it (views, the
// commit, staging, retries, the state of fresh members, the replica check) is the same for all.
struct ElasticImpl::Op {
  std::string name;  // "all_reduce", in messages
  const void* send = nullptr;
  void* recv = nullptr;
  // Before the attempt's data collective: refuse the call for good (a non-ok status is returned
  // as it is), or prepare per-attempt state (error feedback). The result's size in recv.
  std::function<Status(const Attempt&)> prepare;
  std::function<uint64_t(const Attempt&)> result_bytes;
  // The attempt's data collective on a.comm, into `out` (the staged result; recv once committed).
  std::function<Status(const Attempt&, void* out)> run;
  // After the commit, on recv (an average over fewer contributors than members).
  std::function<void(const Attempt&)> finish;
  // Its data collective reports the parts of its result that are final (Attempt::on_result).
  bool reports_results = false;
};

}  // namespace lowcomm
