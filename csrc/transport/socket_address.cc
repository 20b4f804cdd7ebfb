#include "transport/socket_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/params.h"

namespace lowcomm::transport {

Result<SocketAddress> SocketAddress::parse(std::string_view text) {
  std::string host;
  std::string port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return invalid_argument("address '" + std::string(text) + "': expected [ipv6]:port");
    host = std::string(text.substr(1, close - 1));
    port_text = std::string(text.substr(close + 2));
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos)
      return invalid_argument("address '" + std::string(text) + "': expected host:port");
    host = std::string(text.substr(0, colon));
    port_text = std::string(text.substr(colon + 1));
  }
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port < 0 || port > 65535)
    return invalid_argument("address '" + std::string(text) + "': bad port '" + port_text + "'");
  SocketAddress a;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a.storage_);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a.storage_);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    a.len_ = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    a.len_ = sizeof(sockaddr_in6);
  } else {
    return invalid_argument("address '" + std::string(text) + "': '" + host +
                            "' is not a numeric IPv4 or IPv6 address");
  }
  a.set_port(static_cast<int>(port));
  return a;
}

Result<SocketAddress> SocketAddress::from_sockaddr(const sockaddr* sa, socklen_t len) {
  if (sa == nullptr || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) ||
      len > static_cast<socklen_t>(sizeof(sockaddr_storage)))
    return invalid_argument("not an IPv4 or IPv6 socket address");
  SocketAddress a;
  std::memcpy(&a.storage_, sa, len);
  a.len_ = len;
  return a;
}

int SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

void SocketAddress::set_port(int port) {
  auto p = htons(static_cast<uint16_t>(port));
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage_)->sin_port = p;
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage_)->sin6_port = p;
}

std::string SocketAddress::to_string() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, host,
              sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, host,
              sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "?";
}

namespace {

struct Candidate {
  std::string name;
  SocketAddress addr;
  bool loopback;
};

bool name_matches(const std::string& name, const std::vector<std::string>& patterns, bool exact) {
  for (const auto& p : patterns) {
    if (exact ? name == p : name.compare(0, p.size(), p) == 0) return true;
  }
  return false;
}

}  // namespace

Result<SocketAddress> select_listen_address(std::string_view filter) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return Status(StatusCode::kSystem, "getifaddrs failed");
  std::vector<Candidate> candidates;
  for (ifaddrs* ifa = list; ifa; ifa = ifa->ifa_next) {
    if (!ifa->ifa_addr || !(ifa->ifa_flags & IFF_UP)) continue;
    int fam = ifa->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (fam == AF_INET6) {
      // Link-local IPv6 needs a scope id a remote cannot use from a printed address.
      auto* v6 = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&v6->sin6_addr)) continue;
    }
    socklen_t len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    auto addr = SocketAddress::from_sockaddr(ifa->ifa_addr, len);
    if (!addr) continue;
    candidates.push_back({ifa->ifa_name, *addr, (ifa->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  // IPv4 first, keeping interface order otherwise.
  std::stable_partition(candidates.begin(), candidates.end(),
                        [](const Candidate& c) { return c.addr.family() == AF_INET; });

  std::string f(filter);
  bool exclude = false, exact = false;
  if (!f.empty() && f[0] == '^') exclude = true, f.erase(0, 1);
  if (!f.empty() && f[0] == '=') exact = true, f.erase(0, 1);
  std::vector<std::string> patterns;
  for (size_t start = 0; start <= f.size();) {
    size_t comma = f.find(',', start);
    if (comma == std::string::npos) comma = f.size();
    if (comma > start) patterns.push_back(f.substr(start, comma - start));
    start = comma + 1;
  }

  const Candidate* chosen = nullptr;
  if (patterns.empty()) {
    for (const auto& c : candidates)
      if (!c.loopback) {
        chosen = &c;
        break;
      }
    if (!chosen)
      for (const auto& c : candidates)
        if (c.loopback) {
          chosen = &c;
          break;
        }
  } else {
    for (const auto& c : candidates) {
      if (name_matches(c.name, patterns, exact) != exclude) {
        chosen = &c;
        break;
      }
    }
  }
  if (!chosen) {
    std::string seen;
    for (const auto& c : candidates) seen += (seen.empty() ? "" : ", ") + c.name;
    return invalid_argument(
        "LOWCOMM_SOCKET_IFNAME='" + std::string(filter) +
        "' matches no interface that is up (seen: " + (seen.empty() ? "none" : seen) + ")");
  }
  SocketAddress a = chosen->addr;
  a.set_port(0);
  return a;
}

Result<SocketAddress> select_listen_address() {
  return select_listen_address(params::text("LOWCOMM_SOCKET_IFNAME").value_or(""));
}

}  // namespace lowcomm::transport
