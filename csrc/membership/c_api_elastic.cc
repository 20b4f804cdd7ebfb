// The elastic communicator's C API (lowcomm.h, "elastic communicators").
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>

#include "collectives/c_conversions.h"
#include "lowcomm/elastic.h"
#include "lowcomm/lowcomm.h"

struct lowcommElasticComm {
  std::unique_ptr<lowcomm::ElasticCommunicator> comm;
  std::mutex mu;  // guards last_error, shown
  std::string last_error;
  std::string shown;
};

namespace {

using lowcomm::Status;

thread_local std::string t_last_error;

lowcommResult_t record(lowcommElasticComm* c, const Status& s) {
  if (s.is_ok()) return lowcommSuccess;
  if (c) {
    std::lock_guard<std::mutex> lk(c->mu);
    c->last_error = s.to_string();
  } else {
    t_last_error = s.to_string();
  }
  return lowcomm::to_result(s.code());
}

// No exception crosses the C boundary.
template <typename F>
lowcommResult_t guarded(lowcommElasticComm* c, F&& f) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return record(c, Status(lowcomm::StatusCode::kSystem, "out of memory"));
  } catch (const std::exception& e) {
    return record(c, lowcomm::internal_error(e.what()));
  }
}

lowcomm::Result<lowcomm::ElasticOptions> options_of(const lowcommElasticConfig_t* cfg) {
  lowcomm::ElasticOptions o;
  if (!cfg) return o;
  if (cfg->structSize < sizeof(size_t) + sizeof(int))
    return lowcomm::invalid_argument("lowcommElasticConfig_t.structSize too small (" +
                                     std::to_string(cfg->structSize) + ")");
  auto has = [&](size_t off, size_t len) { return off + len <= cfg->structSize; };
  if (cfg->retries < 0) return lowcomm::invalid_argument("retries must be >= 0");
  o.retries = cfg->retries;
  if (has(offsetof(lowcommElasticConfig_t, heartbeatMs), sizeof(int)) && cfg->heartbeatMs > 0)
    o.heartbeat_interval = std::chrono::milliseconds(cfg->heartbeatMs);
  if (has(offsetof(lowcommElasticConfig_t, failureTimeoutMs), sizeof(int)) &&
      cfg->failureTimeoutMs > 0)
    o.failure_timeout = std::chrono::milliseconds(cfg->failureTimeoutMs);
  if (has(offsetof(lowcommElasticConfig_t, viewChangeTimeoutMs), sizeof(int)) &&
      cfg->viewChangeTimeoutMs > 0)
    o.view_change_timeout = std::chrono::milliseconds(cfg->viewChangeTimeoutMs);
  return o;
}

#define LOWCOMM_ELASTIC_CHECK(comm)                                                      \
  do {                                                                                   \
    if (!(comm)) return record(nullptr, lowcomm::invalid_argument("NULL elastic comm")); \
  } while (0)

}  // namespace

extern "C" {

lowcommResult_t lowcommElasticCommInitRank(lowcommElasticComm_t* comm, int nranks,
                                           lowcommUniqueId commId, int rank,
                                           const lowcommElasticConfig_t* config) {
  return guarded(nullptr, [&] {
    if (!comm) return record(nullptr, lowcomm::invalid_argument("NULL comm out-parameter"));
    auto id = lowcomm::UniqueId::from_bytes(commId.internal, sizeof(commId.internal));
    if (!id) return record(nullptr, id.status());
    auto o = options_of(config);
    if (!o) return record(nullptr, o.status());
    auto c = lowcomm::ElasticCommunicator::init(*id, rank, nranks, *o);
    if (!c) return record(nullptr, c.status());
    auto* h = new lowcommElasticComm();
    h->comm = std::move(c).value();
    *comm = h;
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommElasticCommJoin(lowcommElasticComm_t* comm, lowcommUniqueId commId,
                                       const char* const* seeds, int nseeds,
                                       const lowcommElasticConfig_t* config) {
  return guarded(nullptr, [&] {
    if (!comm) return record(nullptr, lowcomm::invalid_argument("NULL comm out-parameter"));
    if (!seeds || nseeds <= 0) return record(nullptr, lowcomm::invalid_argument("no seeds"));
    std::vector<std::string> s;
    for (int i = 0; i < nseeds; ++i) {
      if (!seeds[i]) return record(nullptr, lowcomm::invalid_argument("NULL seed"));
      s.emplace_back(seeds[i]);
    }
    auto id = lowcomm::UniqueId::from_bytes(commId.internal, sizeof(commId.internal));
    if (!id) return record(nullptr, id.status());
    auto o = options_of(config);
    if (!o) return record(nullptr, o.status());
    auto c = lowcomm::ElasticCommunicator::join(*id, s, *o);
    if (!c) return record(nullptr, c.status());
    auto* h = new lowcommElasticComm();
    h->comm = std::move(c).value();
    *comm = h;
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommElasticCommDestroy(lowcommElasticComm_t comm) {
  return guarded(nullptr, [&] {
    LOWCOMM_ELASTIC_CHECK(comm);
    delete comm;
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommElasticCommView(lowcommElasticComm_t comm, uint64_t* viewId, int* members,
                                       int capacity, int* nmembers) {
  return guarded(comm, [&] {
    LOWCOMM_ELASTIC_CHECK(comm);
    if (!nmembers) return record(comm, lowcomm::invalid_argument("NULL nmembers"));
    auto v = comm->comm->view();
    if (members && capacity < static_cast<int>(v.members.size()))
      return record(comm, lowcomm::invalid_argument("capacity " + std::to_string(capacity) + " < " +
                                                    std::to_string(v.members.size()) + " members"));
    if (viewId) *viewId = v.id;
    *nmembers = static_cast<int>(v.members.size());
    if (members)
      for (size_t i = 0; i < v.members.size(); ++i) members[i] = static_cast<int>(v.members[i]);
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommElasticCommState(lowcommElasticComm_t comm, lowcommElasticState_t* state) {
  LOWCOMM_ELASTIC_CHECK(comm);
  if (!state) return record(comm, lowcomm::invalid_argument("NULL state"));
  switch (comm->comm->state()) {
    case lowcomm::ElasticState::kLive:
      *state = lowcommElasticLive;
      break;
    case lowcomm::ElasticState::kChanging:
      *state = lowcommElasticChanging;
      break;
    case lowcomm::ElasticState::kFenced:
      *state = lowcommElasticFenced;
      break;
  }
  return lowcommSuccess;
}

lowcommResult_t lowcommElasticCommUserRank(lowcommElasticComm_t comm, int* rank) {
  LOWCOMM_ELASTIC_CHECK(comm);
  if (!rank) return record(comm, lowcomm::invalid_argument("NULL rank"));
  *rank = comm->comm->rank();
  return lowcommSuccess;
}

lowcommResult_t lowcommElasticCommCount(lowcommElasticComm_t comm, int* count) {
  LOWCOMM_ELASTIC_CHECK(comm);
  if (!count) return record(comm, lowcomm::invalid_argument("NULL count"));
  *count = comm->comm->size();
  return lowcommSuccess;
}

lowcommResult_t lowcommElasticCommMemberId(lowcommElasticComm_t comm, int* memberId) {
  LOWCOMM_ELASTIC_CHECK(comm);
  if (!memberId) return record(comm, lowcomm::invalid_argument("NULL memberId"));
  *memberId = static_cast<int>(comm->comm->member_id());
  return lowcommSuccess;
}

lowcommResult_t lowcommElasticCommMemberAddress(lowcommElasticComm_t comm, char* buf, size_t len) {
  return guarded(comm, [&] {
    LOWCOMM_ELASTIC_CHECK(comm);
    std::string a = comm->comm->member_address();
    if (!buf || len < a.size() + 1)
      return record(comm, lowcomm::invalid_argument("buffer of " + std::to_string(len) +
                                                    " bytes cannot hold '" + a + "'"));
    std::memcpy(buf, a.c_str(), a.size() + 1);
    return lowcommSuccess;
  });
}

lowcommResult_t lowcommElasticRegisterState(lowcommElasticComm_t comm, const char* name, void* data,
                                            size_t bytes) {
  return guarded(comm, [&] {
    LOWCOMM_ELASTIC_CHECK(comm);
    if (!name) return record(comm, lowcomm::invalid_argument("NULL state name"));
    return record(comm, comm->comm->register_state(name, data, bytes));
  });
}

lowcommResult_t lowcommElasticAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                        lowcommDataType_t datatype, lowcommRedOp_t op,
                                        const char* codec, const char* errorFeedbackKey,
                                        lowcommElasticComm_t comm) {
  return guarded(comm, [&] {
    LOWCOMM_ELASTIC_CHECK(comm);
    auto dt = lowcomm::to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    auto rop = lowcomm::to_op(op);
    if (!rop) return record(comm, rop.status());
    if ((!sendbuff || !recvbuff) && count)
      return record(comm, lowcomm::invalid_argument("NULL buffer with a non-zero count"));
    lowcomm::AllReduceOptions o;
    if (codec) {
      auto spec = lowcomm::parse_codec_spec(codec);
      if (!spec) return record(comm, spec.status());
      o.codec = *spec;
    }
    if (errorFeedbackKey) o.error_feedback_key = errorFeedbackKey;
    return record(comm, comm->comm->all_reduce(sendbuff, recvbuff, count, *dt, *rop, o));
  });
}

lowcommResult_t lowcommElasticBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                        lowcommDataType_t datatype, int rootMemberId,
                                        lowcommElasticComm_t comm) {
  return guarded(comm, [&] {
    LOWCOMM_ELASTIC_CHECK(comm);
    auto dt = lowcomm::to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    if (!recvbuff && count) return record(comm, lowcomm::invalid_argument("NULL recvbuff"));
    if (rootMemberId < 0)
      return record(comm, lowcomm::invalid_argument("negative root member id " +
                                                    std::to_string(rootMemberId)));
    return record(comm, comm->comm->broadcast(sendbuff, recvbuff, count, *dt,
                                              static_cast<uint32_t>(rootMemberId)));
  });
}

lowcommResult_t lowcommElasticAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        lowcommDataType_t datatype, lowcommElasticComm_t comm,
                                        uint64_t* viewId, int* members, int capacity,
                                        int* nmembers) {
  return guarded(comm, [&] {
    LOWCOMM_ELASTIC_CHECK(comm);
    auto dt = lowcomm::to_dtype(datatype);
    if (!dt) return record(comm, dt.status());
    if ((!sendbuff || !recvbuff) && sendcount)
      return record(comm, lowcomm::invalid_argument("NULL buffer with a non-zero count"));
    if (members && capacity < comm->comm->size())
      return record(comm,
                    lowcomm::invalid_argument("capacity " + std::to_string(capacity) + " < " +
                                              std::to_string(comm->comm->size()) + " members"));
    lowcomm::ElasticView layout;
    lowcomm::Status s = comm->comm->all_gather(sendbuff, recvbuff, sendcount, *dt, &layout);
    if (!s.is_ok()) return record(comm, s);
    if (viewId) *viewId = layout.id;
    if (nmembers) *nmembers = static_cast<int>(layout.members.size());
    if (members)
      for (size_t i = 0; i < layout.members.size(); ++i)
        members[i] = static_cast<int>(layout.members[i]);
    return lowcommSuccess;
  });
}

const char* lowcommElasticGetLastError(lowcommElasticComm_t comm) {
  if (!comm) return t_last_error.c_str();
  std::lock_guard<std::mutex> lk(comm->mu);
  comm->shown = comm->last_error;
  return comm->shown.c_str();
}

}  // extern "C"
