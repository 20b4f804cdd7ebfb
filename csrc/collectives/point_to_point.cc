// Tagged send/recv, and the any-source receive.
//
// send: the sender's descriptor (kind send, count, dtype, tag, per-(pair, tag) number) on the
// user tag's descriptor channel, then the data on its data channel; it completes when both are
// handed to the kernel (the receiver buffers data that arrives before its recv, as MPI's eager
// protocol does; a rendezvous would deadlock the common "both send, then both receive" pattern
// on the one executor per rank). recv: posts the descriptor's and the data's receives at once,
// so data that comes while the recv runs lands in the user's buffer with no copy and no
// unexpected-message allowance; it checks the descriptor against what this rank expects before
// it reports the data received, so a mismatch is an error naming both calls, never bytes
// reported as the wrong thing (a failed recv leaves its buffer unspecified). A sender's message
// of another length fails the connection with the transport's length mismatch, which names both
// lengths. The receiver detects a mismatch; the sender learns of it through the receiver's
// failure notice (its next operation fails).
//
// recv_any: waits for the first peer whose next unclaimed descriptor on the tag begins to arrive
// (transport/arrival_watch.h), then receives from it exactly as recv does; a message already
// buffered counts. The k-th receive from a peer on a tag, any-source or not, meets that peer's
// k-th send on it, in the order the receives run.

#include "collectives/algorithms.h"
#include "collectives/arg_checks.h"
#include "collectives/tags.h"

namespace lowcomm::collectives {
Status send(OpRun& run, const void* buf, uint64_t count, DType dtype, int peer, uint64_t tag) {
  LOWCOMM_CHECK(check_p2p("send", buf, count, dtype, peer, tag, run.rank(), run.size()));
  LOWCOMM_CHECK(run.send_descriptor(peer, tags::p2p_descriptor(tag)));
  run.isend(peer, tags::p2p_data(tag), buf, count * dtype_size(dtype));
  return Status::ok();
}

namespace {
Status recv_from(OpRun& run, void* buf, uint64_t count, DType dtype, int peer, uint64_t tag) {
  run.set_source(peer);
  OpDescriptor expected = run.desc();
  expected.kind = OpKind::kSend;
  expected.root = peer;
  expected.seq = run.take_recv_seq(peer, tag);
  uint8_t* desc = run.scratch(kDescriptorBytes);
  transport::Request d = run.irecv(peer, tags::p2p_descriptor(tag), desc, kDescriptorBytes);
  transport::Request data = run.irecv(peer, tags::p2p_data(tag), buf, count * dtype_size(dtype));
  LOWCOMM_CHECK(run.wait(d));
  LOWCOMM_CHECK(run.check_descriptor(peer, desc, expected));
  return run.wait(data);
}
}  // namespace

Status recv(OpRun& run, void* buf, uint64_t count, DType dtype, int peer, uint64_t tag) {
  LOWCOMM_CHECK(check_p2p("recv", buf, count, dtype, peer, tag, run.rank(), run.size()));
  return recv_from(run, buf, count, dtype, peer, tag);
}

Status recv_any(OpRun& run, void* buf, uint64_t count, DType dtype, uint64_t tag) {
  LOWCOMM_CHECK(check_recv_any(buf, count, dtype, tag, run.rank(), run.size()));
  auto from = run.wait_arrival(tags::p2p_descriptor(tag));
  if (!from) return from.status();
  return recv_from(run, buf, count, dtype, *from, tag);
}

}  // namespace lowcomm::collectives
