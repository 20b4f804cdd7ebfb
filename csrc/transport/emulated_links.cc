#include "transport/emulated_links.h"

#include <cctype>
#include <utility>

#include "transport/shared_clocks.h"

namespace lowcomm::transport {
namespace {

// "/lowcomm-<kind>-<root address, alphanumerics kept>-<index>": the same on every rank of the
// communicator, unique on the host while it forms.
std::string shared_name(std::string_view kind, std::string_view root_address, int index) {
  std::string name = "/lowcomm-" + std::string(kind) + "-";
  for (char ch : root_address) name += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name + "-" + std::to_string(index);
}

}  // namespace

std::shared_ptr<LinkClocks> own_site_links(const WanLink& link) {
  if (!link.shaped() || link.model != WanModel::kSite) return nullptr;
  auto site = std::make_shared<LinkClocks>();
  site->down.bits_per_second = link.down_bits_per_second;
  return site;
}

EmulatedLinks::EmulatedLinks(EmulatedLinks&& other) noexcept
    : site_(std::move(other.site_)),
      paths_(std::move(other.paths_)),
      names_(std::exchange(other.names_, {})) {}

EmulatedLinks& EmulatedLinks::operator=(EmulatedLinks&& other) noexcept {
  if (this != &other) {
    release_names();
    site_ = std::move(other.site_);
    paths_ = std::move(other.paths_);
    names_ = std::exchange(other.names_, {});
  }
  return *this;
}

Result<EmulatedLinks> EmulatedLinks::open(const WanPlan& plan, const WanLink& own, int rank,
                                          int nranks, std::string_view root_address) {
  EmulatedLinks e;
  if (own.shaped() && own.model == WanModel::kSite) {
    if (plan.site_size(rank, nranks) > 1) {
      const std::string name = shared_name("site", root_address, plan.site_of(rank));
      auto site = open_shared_clocks(name, own.down_bits_per_second);
      if (!site) return site.status();
      e.names_.push_back(name);
      e.site_ = *site;
    } else {
      e.site_ = own_site_links(own);
    }
  }
  for (int id : plan.paths_from(rank)) {
    const std::string name = shared_name("path", root_address, id);
    auto clock = open_shared_clocks(name, 0);
    if (!clock) return clock.status();
    e.names_.push_back(name);
    e.paths_[id] = *clock;
  }
  return e;
}

Result<WanLink> EmulatedLinks::link_to(const WanPlan& plan, int rank, int peer) const {
  auto got = plan.link(rank, peer);
  if (!got) return got.status();
  WanLink l = *got;
  if (l.path >= 0) {
    auto it = paths_.find(l.path);
    if (it == paths_.end())
      return internal_error("wan: path " + std::to_string(l.path) + " was not opened");
    l.path_clock = std::shared_ptr<LinkClock>(it->second, &it->second->up);
  }
  return l;
}

void EmulatedLinks::release_names() {
  for (const std::string& n : names_) unlink_shared_clocks(n);
  names_.clear();
}

}  // namespace lowcomm::transport
