// Payload integrity and sealing (payload_guard.h) over real TCP on loopback, through a proxy
// that alters the live stream (tamper_proxy.h): every flipped payload bit fails its message and
// nothing else; sealed streams reject flipped, dropped, repeated, reordered and cut records;
// both ends must agree on sealing.

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "tamper_proxy.h"
#include "transport/chunk_header.h"
#include "transport/payload_guard.h"
#include "transport/peer_core.h"
#include "transport/wan_link.h"
#include "transport_test_util.h"

namespace lowcomm::transport::testing {
namespace {

using Action = TamperProxy::Action;

struct ProxiedPair : PeerPair {  // a: the accepting side, receives what b sends via the proxy
  std::unique_ptr<TamperProxy> proxy;
};

ProxiedPair connect_through_proxy(const PeerConfig& accept_cfg, const PeerConfig& connect_cfg,
                                  TamperProxy::Policy policy) {
  ProxiedPair p;
  static_cast<PeerPair&>(p) = connect_pair(accept_cfg, connect_cfg, [&](SocketAddress target) {
    p.proxy = std::make_unique<TamperProxy>(target, std::move(policy));
    return p.proxy->address();
  });
  return p;
}

PeerConfig small_chunks(int rank, bool seal, int streams) {
  PeerConfig c = test_config(rank, "test-secret", streams);
  c.chunk_bytes = 4096;
  c.seal = seal;
  return c;
}

// Keys of a stream whose two directions are the same (a guard's sealer and opener then pair).
StreamKeys looped_keys(bool sealed) {
  StreamKeys k;
  k.sealed = sealed;
  for (size_t i = 0; i < k.send.size(); ++i) k.send[i] = k.recv[i] = static_cast<uint8_t>(i);
  return k;
}

TEST(TransportIntegrity, PayloadGuardRoundTripsAndCatchesEveryFlipInBothModes) {
  for (bool sealed : {false, true}) {
    const StreamKeys k = looped_keys(sealed);
    PayloadSealer tx;
    PayloadOpener rx;
    ASSERT_TRUE(tx.init(k).is_ok());
    ASSERT_TRUE(rx.init(k).is_ok());
    for (size_t len : {size_t{0}, size_t{1}, size_t{15}, size_t{4096}, size_t{100003}}) {
      auto data = random_bytes(len, static_cast<uint32_t>(len));
      std::vector<uint8_t> wire(len);
      uint8_t header[kChunkHeaderBytes];
      write_chunk_header({static_cast<uint32_t>(len), 1, 2, len, 0, sealed ? kChunkFlagSealed : 0u},
                         header);
      ASSERT_TRUE(tx.protect(header, data.data(), wire.data(), len).is_ok());
      if (!sealed) wire = data;
      if (sealed && len > 16) {
        EXPECT_NE(wire, data) << "sealed payloads are not plaintext";
      }
      ASSERT_TRUE(rx.begin(header).is_ok());
      // Arbitrary read boundaries, as TCP delivers them.
      for (size_t at = 0; at < len;) {
        size_t n = std::min(len - at, size_t{1} + (at * 7919) % 5000);
        ASSERT_TRUE(rx.update(wire.data() + at, n).is_ok());
        at += n;
      }
      auto ok = rx.finish();
      ASSERT_TRUE(ok.is_ok());
      EXPECT_TRUE(*ok) << "sealed=" << sealed << " len=" << len;
      EXPECT_EQ(wire, data);
    }
  }
}

// Sealed control frames (the liveness PING and PONG) are records of their own: authenticated,
// counted apart from the chunks (so they may be written between chunks sealed earlier), and a
// flipped bit, a replay or a frame from another key fails.
TEST(TransportIntegrity, SealedControlFramesAuthenticateInTheirOwnOrder) {
  const StreamKeys k = looped_keys(true);
  PayloadSealer tx;
  PayloadOpener rx;
  ASSERT_TRUE(tx.init(k).is_ok());
  ASSERT_TRUE(rx.init(k).is_ok());
  // A chunk sealed first, then two control frames written (and read) before it.
  auto data = random_bytes(1000, 7);
  std::vector<uint8_t> wire(data.size());
  uint8_t chunk[kChunkHeaderBytes];
  write_chunk_header({1000, 1, 0, 1000, 0, kChunkFlagSealed}, chunk);
  ASSERT_TRUE(tx.protect(chunk, data.data(), wire.data(), data.size()).is_ok());
  uint8_t ping[kChunkHeaderBytes], pong[kChunkHeaderBytes];
  write_control_frame(kControlPing, 111, ping);
  write_control_frame(kControlPong, 222, pong);
  ASSERT_TRUE(tx.protect_control(ping).is_ok());
  ASSERT_TRUE(tx.protect_control(pong).is_ok());
  EXPECT_NE(std::vector<uint8_t>(ping + kChunkCheckOffset, ping + kChunkHeaderBytes),
            std::vector<uint8_t>(kChunkCheckBytes, 0));
  auto bad = [](Result<bool> r) { return r.is_ok() && !*r; };
  uint8_t flipped[kChunkHeaderBytes];
  std::memcpy(flipped, ping, sizeof(ping));
  flipped[20] ^= 1;  // its argument
  {
    PayloadOpener other;  // the same frame checked on a fresh opener, altered: refused
    ASSERT_TRUE(other.init(k).is_ok());
    EXPECT_TRUE(bad(other.open_control(flipped)));
  }
  {
    PayloadOpener other;  // the second frame first (the first dropped): refused
    ASSERT_TRUE(other.init(k).is_ok());
    EXPECT_TRUE(bad(other.open_control(pong)));
  }
  auto a = rx.open_control(ping);
  ASSERT_TRUE(a.is_ok() && *a);
  EXPECT_TRUE(bad(rx.open_control(ping)));  // replayed: the next nonce does not fit it
  // The chunk still opens after the control frames, under its own nonce.
  ASSERT_TRUE(rx.begin(chunk).is_ok());
  ASSERT_TRUE(rx.update(wire.data(), wire.size()).is_ok());
  auto c = rx.finish();
  ASSERT_TRUE(c.is_ok() && *c);
  EXPECT_EQ(wire, data);
  StreamKeys other_key = k;
  other_key.recv[0] ^= 1;
  PayloadOpener stranger;
  ASSERT_TRUE(stranger.init(other_key).is_ok());
  EXPECT_TRUE(bad(stranger.open_control(ping)));
}

// A policy that flips one payload bit in the first transmission of about `permille` of the data
// chunks (by a hash of connection and record index) and passes every re-sent chunk (a
// (seq, offset) seen before) and every control frame.
TamperProxy::Policy flip_first_transmissions(int permille) {
  struct Seen {  // the proxy's relays are threads of their own
    std::mutex mu;
    std::set<std::tuple<int, uint64_t, uint64_t, uint64_t>> chunks;
  };
  auto seen = std::make_shared<Seen>();
  return [seen, permille](const TamperProxy::Record& r) {
    if (r.control()) return Action::kPass;
    {
      std::lock_guard<std::mutex> g(seen->mu);
      if (!seen->chunks.insert({r.connection, r.tag, r.seq, r.offset}).second) return Action::kPass;
    }
    uint64_t h = (r.index + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(r.connection) << 56;
    h ^= h >> 29;
    return static_cast<int>(h % 1000) < permille ? Action::kFlipPayloadBit : Action::kPass;
  };
}

uint64_t resent_in(const std::vector<Request>& rs) {
  uint64_t n = 0;
  for (const auto& r : rs) n += r.resent_chunks();
  return n;
}

// 10,000 chunks with one payload bit flipped in transit: each is caught by its check, asked for
// again and re-sent; every message arrives byte-exact, none fails, and the counts agree on both
// ends and in the receives.
// Control frames: ACK, NACK, PING and PONG parse (kind in `tag`, argument in `seq`); any other
// kind is a malformed frame, refused before it is acted on.
TEST(TransportIntegrity, ControlFramesOfTheFourKindsParseAndNoOther) {
  uint8_t f[kChunkHeaderBytes];
  for (uint64_t kind : {kControlAck, kControlNack, kControlPing, kControlPong}) {
    write_control_frame(kind, 12345, f);
    auto h = parse_chunk_header(f, "stream");
    ASSERT_TRUE(h.is_ok()) << kind << ": " << h.status().to_string();
    EXPECT_EQ(h->tag, kind);
    EXPECT_EQ(h->seq, 12345u);
    EXPECT_TRUE(h->flags & kChunkFlagControl);
  }
  for (uint64_t kind : {uint64_t{0}, uint64_t{5}, ~uint64_t{0}}) {
    write_control_frame(kind, 1, f);
    auto h = parse_chunk_header(f, "stream");
    ASSERT_FALSE(h.is_ok()) << kind;
    EXPECT_EQ(h.status().code(), StatusCode::kCorruptData);
    EXPECT_NE(h.status().message().find("malformed control frame"), std::string::npos);
  }
}

TEST(TransportIntegrity, TenThousandFlippedChunksAreEachSentAgainAndEveryMessageArrivesExact) {
  constexpr int kMessages = 7500;
  constexpr uint64_t kLen = 3 * 4096 - 100;  // three chunks, the last short
  constexpr uint64_t kTag = 77;
  auto p = connect_through_proxy(small_chunks(0, false, 2), small_chunks(1, false, 2),
                                 flip_first_transmissions(480));
  ASSERT_TRUE(p.a && p.b);
  std::vector<std::vector<uint8_t>> sent(kMessages), got(kMessages);
  uint64_t resent = 0;
  constexpr int kBatch = 500;
  for (int base = 0; base < kMessages; base += kBatch) {
    std::vector<Request> recvs, sends;
    for (int i = base; i < base + kBatch; ++i) {
      sent[i] = random_bytes(kLen, static_cast<uint32_t>(i));
      got[i].assign(kLen, 0);
      recvs.push_back(p.a->irecv(kTag, got[i].data(), kLen));
    }
    for (int i = base; i < base + kBatch; ++i)
      sends.push_back(p.b->isend(kTag, sent[i].data(), kLen));
    for (auto& s : sends) ASSERT_TRUE(s.wait(Deadline::after_seconds(30)).is_ok());
    for (auto& r : recvs) {
      Status st = r.wait(Deadline::after_seconds(30));
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    resent += resent_in(recvs);
  }
  for (int i = 0; i < kMessages; ++i)
    ASSERT_EQ(got[i], sent[i]) << "message " << i << " arrived altered but was accepted";
  const auto tampered = p.proxy->tampered();
  for (const auto& r : tampered) EXPECT_EQ(r.tag, kTag);
  EXPECT_GE(tampered.size(), 10000u) << "the run should flip at least 10,000 chunks";
  // Every flipped chunk was caught, asked for once and sent once more; none else.
  EXPECT_EQ(p.a->payload_failures(), tampered.size());
  EXPECT_EQ(p.a->resend_requests(), tampered.size());
  EXPECT_EQ(p.b->resent_chunks(), tampered.size());
  EXPECT_EQ(resent, tampered.size());
  EXPECT_EQ(p.b->payload_failures(), 0u);
  std::printf("flipped chunks %zu, re-sent %llu, messages %d all exact\n", tampered.size(),
              static_cast<unsigned long long>(resent), kMessages);
}

// A chunk corrupted every time it is sent: asked for again kMaxChunkResends times, then its
// message fails with kCorruptData naming the peer, the checksum and the re-sends; the connection
// carries on and the next message arrives exact.
TEST(TransportIntegrity, AChunkCorruptedEveryTimeFailsItsMessageAfterTheBound) {
  auto policy = [](const TamperProxy::Record& r) {
    return !r.control() && r.seq == 0 && r.offset == 4096 ? Action::kFlipPayloadBit : Action::kPass;
  };
  auto p = connect_through_proxy(small_chunks(0, false, 2), small_chunks(1, false, 2), policy);
  ASSERT_TRUE(p.a && p.b);
  auto data = random_bytes(3 * 4096, 21);
  std::vector<uint8_t> out(data.size());
  auto r = p.a->irecv(9, out.data(), out.size());
  ASSERT_TRUE(p.b->send(9, data.data(), data.size(), Deadline::after_seconds(5)).is_ok());
  Status s = r.wait(Deadline::after_seconds(5));
  EXPECT_EQ(s.code(), StatusCode::kCorruptData) << s.to_string();
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("peer rank 1"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("sent again 3 times"), std::string::npos) << s.to_string();
  constexpr uint64_t kTries = PeerCore::kMaxChunkResends + 1;
  EXPECT_EQ(p.proxy->tampered().size(), kTries);
  EXPECT_EQ(p.a->payload_failures(), kTries);
  EXPECT_EQ(p.a->resend_requests(), kTries - 1);
  EXPECT_EQ(r.resent_chunks(), kTries - 1);
  ASSERT_TRUE(p.b->send(9, data.data(), data.size(), Deadline::after_seconds(5)).is_ok());
  ASSERT_TRUE(p.a->recv(9, out.data(), out.size(), Deadline::after_seconds(5)).is_ok());
  EXPECT_EQ(out, data);
}

TEST(TransportIntegrity, ACorruptUnexpectedMessageNeverReachesTheUserBuffer) {
  auto policy = [](const TamperProxy::Record& r) {
    return !r.control() && r.seq == 0 ? Action::kFlipPayloadBit : Action::kPass;
  };
  auto p = connect_through_proxy(small_chunks(0, false, 1), small_chunks(1, false, 1), policy);
  ASSERT_TRUE(p.a && p.b);
  auto data = random_bytes(1000, 5);
  ASSERT_TRUE(p.b->send(3, data.data(), data.size(), Deadline::after_seconds(5)).is_ok());
  ASSERT_TRUE(p.b->send(3, data.data(), data.size(), Deadline::after_seconds(5)).is_ok());
  // Both arrive unclaimed, the first after its re-sends failed too.
  for (int i = 0; i < 500 && p.a->payload_failures() <= PeerCore::kMaxChunkResends; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::vector<uint8_t> out(1000, 0xAB);
  Status s = p.a->recv(3, out.data(), out.size(), Deadline::after_seconds(5));
  EXPECT_EQ(s.code(), StatusCode::kCorruptData) << s.to_string();
  EXPECT_EQ(out, std::vector<uint8_t>(1000, 0xAB));
  ASSERT_TRUE(p.a->recv(3, out.data(), out.size(), Deadline::after_seconds(5)).is_ok());
  EXPECT_EQ(out, data);
}

// A re-send after the isend completed comes from the transport's own copy: the sender may
// overwrite its buffer the moment the send completes. Over a real link and the emulated one
// (whose copies are made at departure).
TEST(TransportIntegrity, ReSentChunksNeverReadTheSendersBufferAfterItsSendCompleted) {
  for (const char* wan : {"", "bw=2gbit,rtt=4ms"}) {
    SCOPED_TRACE(wan);
    PeerConfig a = small_chunks(0, false, 2), b = small_chunks(1, false, 2);
    if (*wan) a.wan = b.wan = *parse_wan(wan);
    auto p = connect_through_proxy(a, b, flip_first_transmissions(300));
    ASSERT_TRUE(p.a && p.b);
    constexpr int kMessages = 200;
    constexpr uint64_t kLen = 8 * 4096;
    std::vector<std::vector<uint8_t>> sent(kMessages), got(kMessages, std::vector<uint8_t>(kLen));
    std::vector<Request> recvs;
    for (int i = 0; i < kMessages; ++i) recvs.push_back(p.a->irecv(5, got[i].data(), kLen));
    std::vector<uint8_t> buf(kLen);
    for (int i = 0; i < kMessages; ++i) {
      sent[i] = random_bytes(kLen, static_cast<uint32_t>(1000 + i));
      buf = sent[i];
      ASSERT_TRUE(p.b->send(5, buf.data(), kLen, Deadline::after_seconds(10)).is_ok());
      std::fill(buf.begin(), buf.end(), uint8_t{0xEE});  // the caller's again
    }
    for (int i = 0; i < kMessages; ++i) {
      Status st = recvs[i].wait(Deadline::after_seconds(10));
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      ASSERT_EQ(got[i], sent[i]) << "message " << i;
    }
    EXPECT_GT(p.b->resent_chunks(), 0u);
    EXPECT_EQ(resent_in(recvs), p.b->resent_chunks());
  }
}

TEST(TransportIntegrity, SealedStreamsCarryEveryShapeOfMessage) {
  PeerConfig a = test_config(0), b = test_config(1);
  a.seal = b.seal = true;
  auto p = connect_pair(a, b);
  ASSERT_TRUE(p.a && p.b);
  for (uint64_t len : {uint64_t{0}, uint64_t{1}, uint64_t{512 << 10}, uint64_t{(3 << 20) + 7}}) {
    auto data = random_bytes(len, 9);
    std::vector<uint8_t> out(len);
    auto r = p.a->irecv(1, out.data(), len);
    auto s = p.b->isend(1, data.data(), len);
    ASSERT_TRUE(s.wait(Deadline::after_seconds(10)).is_ok());
    ASSERT_TRUE(r.wait(Deadline::after_seconds(10)).is_ok());
    EXPECT_EQ(out, data);
  }
  // The other direction, and the sender's buffer is never written (sealing copies).
  auto data = random_bytes(2 << 20, 11);
  const auto before = data;
  std::vector<uint8_t> out(data.size());
  auto r = p.b->irecv(2, out.data(), out.size());
  ASSERT_TRUE(p.a->send(2, data.data(), data.size(), Deadline::after_seconds(10)).is_ok());
  ASSERT_TRUE(r.wait(Deadline::after_seconds(10)).is_ok());
  EXPECT_EQ(out, before);
  EXPECT_EQ(data, before);
}

TEST(TransportIntegrity, SealedStreamsOverTheEmulatedLink) {
  PeerConfig a = test_config(0), b = test_config(1);
  a.seal = b.seal = true;
  a.wan = b.wan = *parse_wan("bw=2gbit,rtt=2ms");
  auto p = connect_pair(a, b);
  ASSERT_TRUE(p.a && p.b);
  auto data = random_bytes(3 << 20, 12);
  std::vector<uint8_t> out(data.size());
  auto r = p.a->irecv(1, out.data(), out.size());
  ASSERT_TRUE(p.b->send(1, data.data(), data.size(), Deadline::after_seconds(10)).is_ok());
  ASSERT_TRUE(r.wait(Deadline::after_seconds(10)).is_ok());
  EXPECT_EQ(out, data);
}

TEST(TransportIntegrity, EncryptionOnOneSideOnlyFailsTheHandshakeOnBothNamingIt) {
  for (bool server_seals : {true, false}) {
    PeerConfig a = test_config(0), b = test_config(1);
    a.seal = server_seals;
    b.seal = !server_seals;
    auto engine_a = *ProgressEngine::create("lc-test-a");
    auto engine_b = *ProgressEngine::create("lc-test-b");
    auto l = std::move(Listener::create(engine_a, a, loopback())).value();
    auto addr = l->address();
    auto connecting = std::async(std::launch::async, [&] {
      return connect_peer(engine_b, addr, b, Deadline::after_seconds(5));
    });
    // Drive the server's handshakes until the client has its answer.
    while (connecting.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready)
      (void)l->test_accept();
    auto c = connecting.get();
    ASSERT_FALSE(c.is_ok());
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << c.status().to_string();
    EXPECT_NE(c.status().message().find("LOWCOMM_ENCRYPT"), std::string::npos)
        << c.status().to_string();
    EXPECT_NE(c.status().message().find(server_seals ? "peer has encryption on"
                                                     : "peer has encryption off"),
              std::string::npos)
        << c.status().to_string();
    // The server dropped it too, and counted it.
    for (int i = 0; i < 100 && l->rejected_connections() == 0; ++i) {
      (void)l->test_accept();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GE(l->rejected_connections(), 1u);
  }
}

// Each attack on a sealed stream: the receiver fails the connection with kCorruptData (or the
// cut's remote error); no message completes with bytes other than those sent.
TEST(TransportIntegrity, SealedStreamsRejectFlippedDroppedRepeatedReorderedAndCutRecords) {
  const std::vector<std::pair<Action, const char*>> attacks = {
      {Action::kFlipPayloadBit, "payload bit"},
      {Action::kFlipHeaderBit, "header bit"},
      {Action::kDrop, "drop"},
      {Action::kRepeat, "repeat"},
      {Action::kSwapWithNext, "reorder"},
      {Action::kCut, "cut"}};
  for (const auto& [attack, name] : attacks) {
    SCOPED_TRACE(name);
    constexpr uint64_t kVictim = 5;  // record index on the stream
    auto policy = [attack = attack](const TamperProxy::Record& r) {
      return r.index == kVictim ? attack : Action::kPass;
    };
    auto p = connect_through_proxy(small_chunks(0, true, 1), small_chunks(1, true, 1), policy);
    ASSERT_TRUE(p.a && p.b);
    constexpr int kMessages = 12;
    constexpr uint64_t kLen = 3000;  // one chunk each
    std::vector<std::vector<uint8_t>> sent(kMessages), got(kMessages);
    std::vector<Request> recvs;
    for (int i = 0; i < kMessages; ++i) {
      sent[i] = random_bytes(kLen, static_cast<uint32_t>(100 + i));
      got[i].assign(kLen, 0);
      recvs.push_back(p.a->irecv(4, got[i].data(), kLen));
    }
    for (int i = 0; i < kMessages; ++i) (void)p.b->isend(4, sent[i].data(), kLen);
    // A repeated record is the original once: that message completes, the repeat fails.
    const uint64_t good = kVictim + (attack == Action::kRepeat ? 1 : 0);
    int ok = 0, failed = 0;
    Status first_failure;
    for (int i = 0; i < kMessages; ++i) {
      Status s = recvs[static_cast<size_t>(i)].wait(Deadline::after_seconds(10));
      ASSERT_NE(s.code(), StatusCode::kTimeout) << "message " << i << " hung";
      if (s) {
        EXPECT_EQ(got[i], sent[i]) << "message " << i << " accepted altered";
        EXPECT_LT(static_cast<uint64_t>(i), good) << "a message after the attack completed";
        ++ok;
      } else {
        if (first_failure.is_ok()) first_failure = s;
        ++failed;
      }
    }
    EXPECT_EQ(ok, static_cast<int>(good));
    EXPECT_EQ(failed, kMessages - static_cast<int>(good));
    if (attack != Action::kCut) {
      EXPECT_EQ(first_failure.code(), StatusCode::kCorruptData) << first_failure.to_string();
    }
    EXPECT_NE(first_failure.message().find("peer rank 1"), std::string::npos)
        << first_failure.to_string();
  }
}

// A copy kept of a small chunk (a small message whose send completed before the peer's ACK:
// kept for a re-send) is its own size, not a chunk-sized buffer: 200 messages of 64 bytes
// allocate at most their own 12,800 bytes of copies (a 512 KiB buffer each before).
TEST(TransportIntegrity, CopiesOfSmallChunksAreTheirOwnSize) {
  auto p = connect_pair(test_config(0, "test-secret", 1), test_config(1, "test-secret", 1));
  ASSERT_TRUE(p.a && p.b);
  constexpr int kMessages = 200;
  std::vector<std::array<uint8_t, 64>> sent(kMessages), got(kMessages);
  std::vector<Request> recvs, sends;
  for (int i = 0; i < kMessages; ++i) {
    sent[i].fill(static_cast<uint8_t>(i));
    recvs.push_back(p.a->irecv(3, got[i].data(), 64));
  }
  for (int i = 0; i < kMessages; ++i) sends.push_back(p.b->isend(3, sent[i].data(), 64));
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(sends[i].wait(Deadline::after_seconds(10)).is_ok());
    ASSERT_TRUE(recvs[i].wait(Deadline::after_seconds(10)).is_ok());
    EXPECT_EQ(got[i], sent[i]);
  }
  EXPECT_GT(p.b->copy_bytes_allocated(), 0u) << "no copy was kept: the test shows nothing";
  EXPECT_LE(p.b->copy_bytes_allocated(), uint64_t{kMessages} * 64);
}

// A sender re-sends a chunk at most as often as a receiver asks for it (kMaxChunkResends): NACKs
// beyond that are not a receiver's (an on-path injector's: unsealed control frames carry no
// authentication), and fail the connection instead of buying a chunk-sized re-send each. Here
// the proxy replaces the receiver's first ACK with five NACKs of the chunk before it.
TEST(TransportIntegrity, ASenderResendsAChunkNoMoreOftenThanAReceiverAsks) {
  constexpr int kForged = 5;
  auto policy = [done = std::make_shared<std::atomic<bool>>(false)](const TamperProxy::Record& r) {
    return r.control() && r.tag == kControlAck && r.seq >= 1 && !done->exchange(true)
               ? Action::kRewrite
               : Action::kPass;
  };
  // b connects through the proxy, so what b sends (its ACKs and NACKs, as the receiver) is what
  // the proxy can alter; a sends the data.
  auto p = connect_through_proxy(small_chunks(0, false, 1), small_chunks(1, false, 1), policy);
  ASSERT_TRUE(p.a && p.b);
  p.proxy->set_rewriter([](const TamperProxy::Record& r, std::vector<uint8_t> ack) {
    std::vector<uint8_t> out;
    for (int i = 0; i < kForged; ++i) {
      uint8_t h[kChunkHeaderBytes];
      write_control_frame(kControlNack, r.seq - 1, h);
      out.insert(out.end(), h, h + kChunkHeaderBytes);
    }
    out.insert(out.end(), ack.begin(), ack.end());
    return out;
  });
  constexpr uint64_t kLen = 3000;
  std::vector<std::vector<uint8_t>> sent, got;
  Status failed;
  for (int i = 0; i < 200 && failed.is_ok(); ++i) {
    sent.push_back(random_bytes(kLen, static_cast<uint32_t>(i)));
    got.emplace_back(kLen, 0);
    Request rr = p.b->irecv(7, got.back().data(), kLen);
    Status s = p.a->isend(7, sent.back().data(), kLen).wait(Deadline::after_seconds(10));
    ASSERT_NE(s.code(), StatusCode::kTimeout);
    if (!s) failed = s;
    (void)rr.wait(Deadline::after_seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the ACK timer fire
  }
  ASSERT_EQ(p.proxy->tampered().size(), 1u) << "no ACK was rewritten";
  EXPECT_EQ(p.a->resent_chunks(), static_cast<uint64_t>(PeerCore::kMaxChunkResends));
  ASSERT_FALSE(failed.is_ok()) << "the sender took every forged NACK";
  EXPECT_EQ(failed.code(), StatusCode::kCorruptData) << failed.to_string();
  EXPECT_NE(failed.message().find("asked for again"), std::string::npos) << failed.to_string();
}

}  // namespace
}  // namespace lowcomm::transport::testing
