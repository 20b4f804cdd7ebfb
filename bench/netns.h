#pragma once
// Network namespaces for the elastic benches (elastic_partition.cc, elastic_chaos.cc): enter
// one from a forked member, and cut or heal the network between namespaces with nftables rules
// (the kernel on these machines has no netem; dropping packets is how a partition is made).
// The namespaces themselves come from scripts/wan_netns.sh: <prefix>k at <subnet>.(k+1).
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace lowcomm::bench {

struct Netns {
  std::string prefix;  // "": no namespaces (loopback)
  std::string subnet = "10.78.0";

  bool enabled() const { return !prefix.empty(); }
  std::string name(int k) const { return prefix + std::to_string(k); }
  std::string ip(int k) const { return subnet + "." + std::to_string(k + 1); }
  std::string root_ip() const { return subnet + ".254"; }  // the bridge, in the root namespace
  bool exists(int k) const { return ::access(("/run/netns/" + name(k)).c_str(), R_OK) == 0; }

  // In a forked child before it starts any thread.
  bool enter(int k) const {
    int fd = ::open(("/run/netns/" + name(k)).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = ::setns(fd, CLONE_NEWNET) == 0;
    ::close(fd);
    return ok;
  }

  // Drops every packet between namespace k and the addresses of `others`, both directions.
  bool cut(int k, const std::vector<int>& others) const {
    std::string set;
    for (int o : others) set += (set.empty() ? "" : ", ") + ip(o);
    std::string x = "ip netns exec " + name(k) + " nft ";
    bool ok = run(x + "add table inet lcpart");
    ok = run(x + "'add chain inet lcpart in { type filter hook input priority 0; }'") && ok;
    ok = run(x + "'add chain inet lcpart out { type filter hook output priority 0; }'") && ok;
    ok = run(x + "'add rule inet lcpart in ip saddr { " + set + " } drop'") && ok;
    ok = run(x + "'add rule inet lcpart out ip daddr { " + set + " } drop'") && ok;
    return ok;
  }
  void heal(int k) const {
    (void)std::system(
        ("ip netns exec " + name(k) + " nft delete table inet lcpart 2>/dev/null").c_str());
  }

 private:
  static bool run(const std::string& cmd) {
    int rc = std::system(cmd.c_str());
    if (rc != 0) std::fprintf(stderr, "command failed (%d): %s\n", rc, cmd.c_str());
    return rc == 0;
  }
};

}  // namespace lowcomm::bench
