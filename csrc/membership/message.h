#pragma once
// Membership messages: what members say to each other on the membership connections
// (docs/membership.md lists each type, who sends it and when).
//
// Layout, little-endian: a 32-byte header
//   [0,4) magic "LCMB"  [4,6) version (kVersion)  [6,8) type  [8,12) sender member id  [12,16) 0
//   [16,24) view id     [24,32) sequence (the collective it concerns; 0 when none)
// then a body whose layout the type fixes (message.cc). Every field is checked by decode()
// before use: a message that is short, long, of unknown type or with a count that does not fit
// its length is kCorruptData naming the sender, and is dropped.

#include <cstdint>
#include <string>
#include <vector>

#include "lowcomm/status.h"

namespace lowcomm::membership {

inline constexpr uint32_t kMagic = 0x424d434c;  // "LCMB"
inline constexpr uint16_t kVersion = 5;  // 2: kFetch names the stripe's tag; 3: kStart, holders;
                                         // 4: kAdmit; an admitting kStart names the next view;
                                         // 5: kReady
inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kMaxMessageBytes = 64 << 10;
inline constexpr uint64_t kTag = 0x4d454d42ull;       // the transport tag of membership messages
inline constexpr uint64_t kStateTag = 0x4d454d53ull;  // state stripes to a joiner: the high half
// The transport tag of one batch of state stripes (a joiner's requests to one member at a time):
// a batch the joiner gave up on is cancelled, and nothing sent for it can reach a later one.
inline constexpr uint64_t state_tag(uint32_t batch) {
  return (kStateTag << 32) | batch;
}
inline constexpr bool is_state_tag(uint64_t tag) {
  return (tag >> 32) == kStateTag;
}
inline constexpr uint64_t kNone = ~0ull;

enum class MsgType : uint16_t {
  kPing = 1,  // t: the sender's clock; answered with kPong carrying the same t
  kPong = 2,
  kChange = 3,    // the view must change: the members the sender knows to have failed
  kReport = 4,    // to the coordinator during a change: what this member committed and staged
  kNewView = 5,   // from the coordinator: the next view, what commits, the data root
  kDone = 6,      // to every member: this member holds the result of collective `seq`
  kCommit = 7,    // from the coordinator, after an admitting done: `seq` commits; the next view
  kNoQuorum = 8,  // from a would-be coordinator: too few members reachable to go on
  kLeave = 9,     // the sender leaves; seq: what it committed, hashes: of its last commit
  kJoin = 10,     // a joiner asks to enter (to any member; forwarded to the coordinator)
  kFetch = 11,    // a stripe of the registered state (a joiner) or of a result (text "result")
  kStart = 12,    // to every member: collective `seq` began here; hash: the registered state's
  kAdmit = 13,    // from the coordinator: the view it will admit pending joiners into
  kReady = 14,    // to the coordinator (a joiner's through its seed): the sender's communicator
                  // of the view a kAdmit named (data_root) is built; next_id: its id there
};
const char* msg_type_name(MsgType t);

struct MemberAddress {
  uint32_t id = 0;
  std::string address;
};

struct Message {
  MsgType type = MsgType::kPing;
  uint32_t from = 0;
  uint64_t view = 0;
  uint64_t seq = 0;
  // Bodies (only the fields of `type` are encoded):
  uint64_t time_ns = 0;          // kPing, kPong
  std::vector<uint32_t> failed;  // kChange, kReport: members the sender cannot reach;
                                 // kNewView, kCommit, kStart, kAdmit: fresh joiners
  std::string text;              // kChange, kNoQuorum: why; kJoin: the joiner's address;
                                 // kStart, kDone from the coordinator: "admit" (wait for
                                 // kCommit); kFetch: "result" (else the registered state)
  uint64_t committed = 0;        // kReport: collectives committed; kNewView: decision
  uint64_t staged = kNone;       // kReport: collective whose result is held, or kNone
  uint64_t hash = 0;             // kStart, kDone: registered state hash; kFetch: offset;
                                 // kAdmit, kReady: the plan's nonce
  uint64_t length = 0;           // kFetch: bytes
  uint64_t tag = 0;              // kFetch: the transport tag to send it on (state_tag)
  // kNewView, kCommit, kStart (admission), kAdmit: the next joiner's member id, the view's
  // members, its data root address; kReady: the sender's id in that view, its data root
  uint32_t next_id = 0;
  std::vector<MemberAddress> members;
  std::string data_root;
  // kCommit, kLeave: each member's state hash; kReport: the dones the sender saw (member, hash);
  // kNewView: the hashes of the collective it commits, as far as the coordinator knows them
  std::vector<std::pair<uint32_t, uint64_t>> hashes;
  // kNewView: the members of the new view that hold the result of the collective it commits
  // (a member without it fetches it from them: docs/membership.md, "Rolling forward")
  std::vector<uint32_t> holders;
};

std::vector<uint8_t> encode(const Message& m);
Result<Message> decode(const uint8_t* p, size_t n, const std::string& who);

}  // namespace lowcomm::membership
