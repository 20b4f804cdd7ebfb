// Rules of the code base that a reader relies on and a compiler cannot see, checked over the
// sources: the descriptor's fields are written only where the descriptor is made, and the
// environment is read only through the parameter table.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// "path:line: text" of every line of csrc/ (and the plugins' sources) matching `re`, outside
// the files named in `allowed` (paths relative to the source root).
std::vector<std::string> matches(const std::regex& re, const std::vector<std::string>& allowed) {
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
        if (std::regex_search(line, re)) out.push_back(rel + ":" + std::to_string(n) + ": " + line);
    }
  }
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::ostringstream o;
  for (const std::string& s : v) o << "\n  " << s;
  return o.str();
}

// descriptor.h: each field has one meaning, and the three that share the tag word on the wire
// are packed, unpacked and set only in descriptor.cc (p2p_descriptor, stamp_agreement, decode).
TEST(SourceRules, TheDescriptorsTagFieldsAreWrittenOnlyInDescriptorCc) {
  const std::regex write(R"(\.(user_tag|agree_hash|report)\s*(=[^=]|\+=|\|=|&=|\^=))");
  const auto found = matches(write, {"csrc/collectives/descriptor.cc"});
  EXPECT_TRUE(found.empty()) << "written outside descriptor.cc:" << joined(found);
  const std::regex tag_field(R"(\bdesc_?\.tag\b|\bd\.tag\b)");
  const auto old = matches(tag_field, {});
  EXPECT_TRUE(old.empty()) << "the descriptor has no tag field any more:" << joined(old);
}

// core/params.h: every LOWCOMM_* variable is read through the table (one parser per kind, one
// error policy); getenv appears nowhere else in the library, its plugins or its benchmarks but
// for other programs' variables (Open MPI's and PMIx's job ids, lowcomm-bench's token for its
// own children, LCBENCH_JOB_TOKEN).
TEST(SourceRules, LowcommVariablesAreReadOnlyThroughTheParameterTable) {
  const std::regex getenv_lowcomm(R"(getenv\(\s*"LOWCOMM_)");
  const auto found = matches(getenv_lowcomm, {"csrc/core/params.cc"});
  EXPECT_TRUE(found.empty()) << "LOWCOMM_* read outside core/params.cc:" << joined(found);
  const std::regex getenv_any(R"(getenv\()");
  const auto any = matches(getenv_any, {"csrc/core/params.cc"});
  for (const std::string& line : any)
    EXPECT_TRUE(line.find("OMPI_") != std::string::npos ||
                line.find("getenv(k)") != std::string::npos ||  // job_token()'s list
                line.find("BENCH_DEBUG") != std::string::npos)
        << "getenv of what? " << line;
}

}  // namespace
