#pragma once
// TamperProxy: a TCP relay on loopback between a connecting peer and a listening one that
// parses the client-to-server data stream into chunk records (chunk_header.h) after the
// handshake and lets a test alter them: flip a payload or header bit, drop, repeat, swap with
// the next record, or cut the stream mid-record. The server-to-client direction is relayed
// unchanged. One relay thread per proxied stream; blocking sockets.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/little_endian.h"
#include "transport/chunk_header.h"
#include "transport/handshake.h"
#include "transport/socket_address.h"

namespace lowcomm::transport::testing {

class TamperProxy {
 public:
  // kRewrite: the record is replaced by what the rewriter gives (rewriter()).
  enum class Action {
    kPass,
    kFlipPayloadBit,
    kFlipHeaderBit,
    kDrop,
    kRepeat,
    kSwapWithNext,
    kCut,
    kRewrite
  };
  struct Record {
    int connection = 0;  // which proxied stream (accept order)
    uint64_t index = 0;  // record number on that stream
    uint64_t tag = 0, seq = 0, offset = 0;
    uint32_t len = 0;
    uint32_t flags = 0;  // chunk_header.h: kChunkFlagControl marks an ACK or NACK
    bool control() const { return (flags & kChunkFlagControl) != 0; }
  };
  using Policy = std::function<Action(const Record&)>;
  using Rewriter = std::function<std::vector<uint8_t>(const Record&, std::vector<uint8_t> rec)>;

  TamperProxy(SocketAddress target, Policy policy) : target_(target), policy_(std::move(policy)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(listen_fd_, 64);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    address_ = *SocketAddress::from_sockaddr(reinterpret_cast<sockaddr*>(&a), len);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~TamperProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard<std::mutex> g(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    for (auto& t : relays_) t.join();
    for (int fd : fds_) ::close(fd);
    ::close(listen_fd_);
  }

  const SocketAddress& address() const { return address_; }
  // What kRewrite records become (before the first record arrives).
  void set_rewriter(Rewriter r) { rewriter_ = std::move(r); }
  // Records the policy altered (any action but kPass), in the order it saw them.
  std::vector<Record> tampered() const {
    std::lock_guard<std::mutex> g(mu_);
    return tampered_;
  }

 private:
  void accept_loop() {
    int connection = 0;
    while (!stop_) {
      int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c < 0) return;
      int s = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(s, target_.sockaddr_ptr(), target_.length()) != 0) {
        ::close(c);
        ::close(s);
        continue;
      }
      std::lock_guard<std::mutex> g(mu_);
      fds_.push_back(c);
      fds_.push_back(s);
      const int id = connection++;
      relays_.emplace_back([this, c, s, id] { relay(c, s, id); });
    }
  }

  static bool write_all(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
      long w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  void relay(int client, int server, int id) {
    std::mt19937_64 rng(0x7a3b + static_cast<uint64_t>(id));
    std::vector<uint8_t> pending;  // client bytes not yet forwarded
    size_t skip = kHelloBytes + kProofBytes;
    uint64_t index = 0;
    std::vector<uint8_t> held;  // kSwapWithNext: the record waiting for its successor
    uint8_t buf[1 << 16];
    bool client_open = true, server_open = true;
    while (client_open || server_open) {
      pollfd p[2] = {{client, static_cast<short>(client_open ? POLLIN : 0), 0},
                     {server, static_cast<short>(server_open ? POLLIN : 0), 0}};
      if (::poll(p, 2, 200) < 0) return;
      if (stop_) return;
      if (server_open && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
        long n = ::recv(server, buf, sizeof(buf), 0);
        if (n <= 0 || !write_all(client, buf, static_cast<size_t>(n))) {
          server_open = false;
          ::shutdown(client, SHUT_WR);
        }
      }
      if (client_open && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        long n = ::recv(client, buf, sizeof(buf), 0);
        if (n <= 0) {
          client_open = false;
          if (!held.empty()) write_all(server, held.data(), held.size());
          ::shutdown(server, SHUT_WR);
          continue;
        }
        pending.insert(pending.end(), buf, buf + n);
        size_t at = 0;
        if (skip > 0) {
          size_t k = std::min(skip, pending.size());
          write_all(server, pending.data(), k);
          skip -= k;
          at = k;
        }
        while (pending.size() - at >= kChunkHeaderBytes) {
          const uint8_t* h = pending.data() + at;
          const uint32_t len = load_le32(h + 4);
          if (pending.size() - at < kChunkHeaderBytes + len) break;
          std::vector<uint8_t> rec(h, h + kChunkHeaderBytes + len);
          at += rec.size();
          Record r{id,  index++,          load_le64(h + 8), load_le64(h + 16), load_le64(h + 32),
                   len, load_le32(h + 40)};
          Action act = policy_(r);
          if (act != Action::kPass) {
            std::lock_guard<std::mutex> g(mu_);
            tampered_.push_back(r);
          }
          switch (act) {
            case Action::kPass:
              break;
            case Action::kFlipPayloadBit:
              if (len > 0)
                rec[kChunkHeaderBytes + rng() % len] ^= static_cast<uint8_t>(1u << (rng() % 8));
              break;
            case Action::kFlipHeaderBit:
              rec[rng() % kChunkHeaderBytes] ^= static_cast<uint8_t>(1u << (rng() % 8));
              break;
            case Action::kDrop:
              rec.clear();
              break;
            case Action::kRepeat:
              rec.insert(rec.end(), rec.begin(), rec.end());
              break;
            case Action::kSwapWithNext:
              held = std::move(rec);
              rec.clear();
              continue;
            case Action::kRewrite:
              rec = rewriter_(r, std::move(rec));
              break;
            case Action::kCut:
              write_all(server, rec.data(), rec.size() / 2);
              ::shutdown(server, SHUT_RDWR);
              ::shutdown(client, SHUT_RDWR);
              return;
          }
          if (!write_all(server, rec.data(), rec.size())) return;
          if (!held.empty()) {
            if (!write_all(server, held.data(), held.size())) return;
            held.clear();
          }
        }
        pending.erase(pending.begin(), pending.begin() + static_cast<long>(at));
      }
    }
  }

  SocketAddress target_;
  Policy policy_;
  Rewriter rewriter_;
  SocketAddress address_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::vector<int> fds_;
  std::vector<std::thread> relays_;
  std::vector<Record> tampered_;
};

}  // namespace lowcomm::transport::testing
