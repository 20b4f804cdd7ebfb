// Rules of the code base that a reader relies on and a compiler cannot see, checked over the
// sources: each layer includes only the layers below it, the descriptor's fields are written
// only where the descriptor is made, and the environment is read only through the parameter
// table.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;

// "path:line: text" of every line of csrc/ (and the plugins' sources and the benches) for which
// `hit` holds, outside the files named in `allowed` (paths relative to the source root). Plain
// string scans: std::regex trips GCC 12's -Wmaybe-uninitialized at -O1 and above.
std::vector<std::string> matches(const std::function<bool(const std::string&)>& hit,
                                 const std::vector<std::string>& allowed) {
  const fs::path root(LOWCOMM_SOURCE_DIR);
  std::vector<std::string> out;
  for (const char* dir : {"csrc", "plugins/nccl_net", "plugins/torch/csrc", "bench"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h" && ext != ".cu")) continue;
      const std::string rel = fs::relative(e.path(), root).string();
      if (rel.find("/tests/") != std::string::npos) continue;  // a test's own hooks
      bool skip = false;
      for (const std::string& a : allowed) skip = skip || rel == a;
      if (skip) continue;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n)
        if (hit(line)) out.push_back(rel + ":" + std::to_string(n) + ": " + line);
    }
  }
  return out;
}

bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}

// `line` assigns to a member named `field` (".field =", "+=", "|=", "&=", "^=", not "==").
bool assigns(const std::string& line, const std::string& field) {
  const std::string dotted = "." + field;
  for (size_t at = line.find(dotted); at != std::string::npos; at = line.find(dotted, at + 1)) {
    size_t i = at + dotted.size();
    if (i < line.size() && ident_char(line[i])) continue;  // a longer name
    while (i < line.size() && line[i] == ' ') ++i;
    if (i + 1 < line.size() && std::string("+|&^").find(line[i]) != std::string::npos &&
        line[i + 1] == '=')
      return true;
    if (i < line.size() && line[i] == '=' && (i + 1 >= line.size() || line[i + 1] != '='))
      return true;
  }
  return false;
}

// `line` names `word` whole (no identifier character either side).
bool has_word(const std::string& line, const std::string& word) {
  for (size_t at = line.find(word); at != std::string::npos; at = line.find(word, at + 1)) {
    const bool left = at == 0 || !ident_char(line[at - 1]);
    const size_t end = at + word.size();
    if (left && (end >= line.size() || !ident_char(line[end]))) return true;
  }
  return false;
}

std::string joined(const std::vector<std::string>& v) {
  std::ostringstream o;
  for (const std::string& s : v) o << "\n  " << s;
  return o.str();
}

// descriptor.h: each field has one meaning, and the three that share the tag word on the wire
// are packed, unpacked and set only in descriptor.cc (p2p_descriptor, stamp_agreement, decode).
TEST(SourceRules, TheDescriptorsTagFieldsAreWrittenOnlyInDescriptorCc) {
  const auto found = matches(
      [](const std::string& l) {
        return assigns(l, "user_tag") || assigns(l, "agree_hash") || assigns(l, "report");
      },
      {"csrc/collectives/descriptor.cc"});
  EXPECT_TRUE(found.empty()) << "written outside descriptor.cc:" << joined(found);
  const auto old = matches(
      [](const std::string& l) {
        return has_word(l, "desc.tag") || has_word(l, "desc_.tag") || has_word(l, "d.tag");
      },
      {});
  EXPECT_TRUE(old.empty()) << "the descriptor has no tag field any more:" << joined(old);
}

// core/params.h: every LOWCOMM_* variable is read through the table (one parser per kind, one
// error policy); getenv appears nowhere else in the library, its plugins or its benchmarks but
// for other programs' variables (Open MPI's and PMIx's job ids, lowcomm-bench's token for its
// own children, LCBENCH_JOB_TOKEN).
TEST(SourceRules, LowcommVariablesAreReadOnlyThroughTheParameterTable) {
  auto reads_lowcomm = [](const std::string& l) {
    for (size_t at = l.find("getenv("); at != std::string::npos; at = l.find("getenv(", at + 1)) {
      size_t i = at + 7;
      while (i < l.size() && l[i] == ' ') ++i;
      if (l.compare(i, 9, "\"LOWCOMM_") == 0) return true;
    }
    return false;
  };
  const auto found = matches(reads_lowcomm, {"csrc/core/params.cc"});
  EXPECT_TRUE(found.empty()) << "LOWCOMM_* read outside core/params.cc:" << joined(found);
  const auto any =
      matches([](const std::string& l) { return l.find("getenv(") != std::string::npos; },
              {"csrc/core/params.cc"});
  for (const std::string& line : any)
    EXPECT_TRUE(line.find("OMPI_") != std::string::npos ||
                line.find("getenv(k)") != std::string::npos ||  // job_token()'s list
                line.find("BENCH_DEBUG") != std::string::npos)
        << "getenv of what? " << line;
}

}  // namespace

// The layers (docs/architecture.md): each library's sources include only its own headers, those
// of the layers below it and the public ones (include/lowcomm/), so no layer reaches up (the
// planning layer, topology/, sees the transport but no collective).
TEST(SourceRules, EachLayerIncludesOnlyTheLayersBelowIt) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> below = {
      {"core", {}},
      {"codec", {"core"}},
      {"frame", {"codec", "core"}},
      {"transport", {"core"}},
      {"rendezvous", {"transport", "core"}},
      {"topology", {"transport", "codec", "core"}},
      {"device", {"codec", "core"}},
      {"collectives", {"topology", "rendezvous", "transport", "device", "frame", "codec", "core"}},
      {"membership",
       {"collectives", "topology", "rendezvous", "transport", "device", "frame", "codec", "core"}},
  };
  const fs::path root(LOWCOMM_SOURCE_DIR);
  std::vector<std::string> bad;
  size_t files = 0;
  for (const auto& [layer, allowed] : below) {
    for (const auto& e : fs::recursive_directory_iterator(root / "csrc" / layer)) {
      if (!e.is_regular_file()) continue;
      ++files;
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        const std::string inc = "#include \"";
        if (line.rfind(inc, 0) != 0) continue;
        const size_t slash = line.find('/', inc.size());
        if (slash == std::string::npos) continue;
        const std::string dir = line.substr(inc.size(), slash - inc.size());
        bool ok = dir == layer || dir == "lowcomm";
        for (const std::string& a : allowed) ok = ok || dir == a;
        if (!ok)
          bad.push_back(fs::relative(e.path(), root).string() + ":" + std::to_string(n) + ": " +
                        line);
      }
    }
  }
  EXPECT_GT(files, 100u);
  EXPECT_TRUE(bad.empty()) << "includes from a layer above:" << joined(bad);
}
