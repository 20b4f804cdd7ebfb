#include "topology/sites.h"

#include <algorithm>
#include <map>

#include "core/fnv1a.h"
#include "topology/partition.h"

namespace lowcomm::topology {

std::vector<int> SitePlan::column(int rank) const {
  std::vector<int> out;
  const int j = local_index(rank);
  for (const auto& m : members) out.push_back(m[static_cast<size_t>(j)]);
  return out;
}

int SitePlan::local_index(int rank) const {
  const auto& m = members[static_cast<size_t>(site_of[static_cast<size_t>(rank)])];
  return static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
}

std::string SitePlan::to_string() const {
  if (members.empty()) return "flat";
  std::string s = std::to_string(sites()) + " sites";
  s += per_site ? " x " + std::to_string(per_site) + " ranks:" : " of unequal size:";
  for (const auto& m : members) {
    s += " {";
    for (size_t i = 0; i < m.size(); ++i) s += (i ? "," : "") + std::to_string(m[i]);
    s += "}";
  }
  return s;
}

bool can_two_level(const SitePlan& plan, uint64_t count, DType dtype, ReduceOp op,
                   const std::optional<CodecSpec>& codec) {
  if (!plan.two_level() || dtype != DType::kFloat32) return false;
  if (op != ReduceOp::kSum && op != ReduceOp::kAverage) return false;
  const uint64_t P = static_cast<uint64_t>(plan.sites()) * static_cast<uint64_t>(plan.per_site);
  return count >= P * granule(codec);
}

bool use_two_level(const SitePlan& plan, uint64_t count, DType dtype, ReduceOp op,
                   const std::optional<CodecSpec>& codec) {
  return can_two_level(plan, count, dtype, op, codec) && count * sizeof(float) >= kTwoLevelMinBytes;
}

SitePlan plan_from_groups(const std::vector<int>& labels) {
  SitePlan p = plan_from_labels(labels);
  return p.sites() == static_cast<int>(labels.size()) ? SitePlan{} : p;
}

bool use_two_level_gather(const SitePlan& plan, uint64_t gathered_bytes) {
  return plan.two_level() && gathered_bytes >= kTwoLevelMinBytes;
}

SitePlan plan_from_labels(const std::vector<int>& labels) {
  SitePlan p;
  std::map<int, int> index;
  for (int label : labels) {
    auto [it, fresh] = index.try_emplace(label, static_cast<int>(index.size()));
    if (fresh) p.members.emplace_back();
    p.site_of.push_back(it->second);
    p.members[static_cast<size_t>(it->second)].push_back(static_cast<int>(p.site_of.size()) - 1);
  }
  p.per_site = p.members.empty() ? 0 : static_cast<int>(p.members[0].size());
  for (const auto& m : p.members)
    if (static_cast<int>(m.size()) != p.per_site) p.per_site = 0;
  std::vector<uint8_t> bytes;
  for (int s : p.site_of)
    for (int b = 0; b < 4; ++b)
      bytes.push_back(static_cast<uint8_t>(static_cast<uint32_t>(s) >> (8 * b)));
  p.hash = p.members.size() > 1 ? fnv1a64(bytes.data(), bytes.size()) | 1 : 0;
  return p;
}

SitePlan plan_from_rtt(const std::vector<std::vector<double>>& rtt, double threshold_s) {
  const size_t P = rtt.size();
  std::vector<int> label(P);
  for (size_t i = 0; i < P; ++i) label[i] = static_cast<int>(i);
  // Union of linked ranks: each label the lowest rank of its group.
  auto find = [&](size_t i) {
    while (label[i] != static_cast<int>(i)) i = static_cast<size_t>(label[i]);
    return i;
  };
  for (size_t i = 0; i < P; ++i)
    for (size_t j = i + 1; j < P && j < rtt[i].size(); ++j)
      if (rtt[i][j] < threshold_s) {
        const size_t a = find(i), b = find(j);
        label[std::max(a, b)] = static_cast<int>(std::min(a, b));
      }
  std::vector<int> labels(P);
  for (size_t i = 0; i < P; ++i) labels[i] = static_cast<int>(find(i));
  SitePlan p = plan_from_labels(labels);
  return p.sites() <= 1 || p.sites() == static_cast<int>(P) ? SitePlan{} : p;
}

Result<SitePlan> parse_sites(std::string_view text, int nranks) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  if (text.empty() || text == "flat") return SitePlan{};
  std::vector<int> labels;
  size_t start = 0;
  for (;;) {
    size_t comma = text.find(',', start);
    std::string_view item =
        text.substr(start, comma == std::string_view::npos ? text.npos : comma - start);
    if (item.empty() || item.size() > 9 ||
        !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return invalid_argument("sites: '" + std::string(item) + "' in '" + std::string(text) +
                              "' is not a site label (a non-negative integer per rank, "
                              "comma-separated, or \"flat\")");
    labels.push_back(std::stoi(std::string(item)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (static_cast<int>(labels.size()) != nranks)
    return invalid_argument("sites: '" + std::string(text) + "' labels " +
                            std::to_string(labels.size()) + " ranks, the communicator has " +
                            std::to_string(nranks));
  return plan_from_labels(labels);
}

}  // namespace lowcomm::topology
