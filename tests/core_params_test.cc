// core/params.h: every LOWCOMM_* variable declared once, one parser per kind, one error policy,
// and README's environment table in step with the declarations.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/params.h"

namespace {

using namespace lowcomm;

// Sets a variable for one scope.
struct Env {
  Env(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~Env() { ::unsetenv(name_); }
  const char* name_;
};

TEST(Params, BytesTakeSuffixesEverywhereAndRefuseWhatIsNotABytecount) {
  EXPECT_EQ(*params::parse_bytes("4096"), 4096u);
  EXPECT_EQ(*params::parse_bytes("4M"), 4u << 20);
  EXPECT_EQ(*params::parse_bytes("4m"), 4u << 20);
  EXPECT_EQ(*params::parse_bytes("4MiB"), 4u << 20);
  EXPECT_EQ(*params::parse_bytes("32K"), 32u << 10);
  EXPECT_EQ(*params::parse_bytes("1T"), uint64_t{1} << 40);
  EXPECT_EQ(*params::parse_bytes("7B"), 7u);
  for (const char* bad : {"", "M", "-4", "4X", "4 M", "4.5M", "99999999999999999999", "20000000T"})
    EXPECT_FALSE(params::parse_bytes(bad).is_ok()) << bad;

  // The segment size was a plain integer only; 4M now works as for the socket buffer.
  {
    Env e("LOWCOMM_SEGMENT_BYTES", "4M");
    auto v = params::bytes("LOWCOMM_SEGMENT_BYTES");
    ASSERT_TRUE(v.is_ok()) << v.status().to_string();
    EXPECT_EQ(v->value(), 4u << 20);
  }
  {
    Env e("LOWCOMM_SEGMENT_BYTES", "1000");  // below the table's least
    auto v = params::bytes("LOWCOMM_SEGMENT_BYTES");
    ASSERT_FALSE(v.is_ok());
    EXPECT_NE(v.status().message().find("LOWCOMM_SEGMENT_BYTES='1000'"), std::string::npos)
        << v.status().message();
  }
  {
    Env e("LOWCOMM_SOCKET_BUFFER", "2G");  // above the table's most
    EXPECT_FALSE(params::bytes("LOWCOMM_SOCKET_BUFFER").is_ok());
  }
}

TEST(Params, UnsetAndEmptyAreTheSameAndEveryKindRefusesMalformedValuesNamingTheVariable) {
  ::unsetenv("LOWCOMM_STREAMS");
  EXPECT_FALSE(params::integer("LOWCOMM_STREAMS")->has_value());
  {
    Env e("LOWCOMM_STREAMS", "");
    EXPECT_FALSE(params::integer("LOWCOMM_STREAMS")->has_value());
  }
  {
    Env e("LOWCOMM_STREAMS", "3");
    EXPECT_EQ(params::integer("LOWCOMM_STREAMS")->value(), 3);
  }
  for (const char* bad : {"0", "65", "3x", "three"}) {
    Env e("LOWCOMM_STREAMS", bad);
    auto v = params::integer("LOWCOMM_STREAMS");
    ASSERT_FALSE(v.is_ok()) << bad;
    EXPECT_NE(v.status().message().find("LOWCOMM_STREAMS"), std::string::npos);
  }
  {
    // Until the table, LOWCOMM_TIMEOUT_S=10s was taken as 10 (strtod stopped at the s).
    Env e("LOWCOMM_TIMEOUT_S", "10s");
    EXPECT_FALSE(params::number("LOWCOMM_TIMEOUT_S").is_ok());
    Status all = params::check_all();
    ASSERT_FALSE(all.is_ok());
    EXPECT_NE(all.message().find("LOWCOMM_TIMEOUT_S='10s'"), std::string::npos) << all.message();
  }
  {
    Env e("LOWCOMM_TIMEOUT_S", "2.5");
    EXPECT_DOUBLE_EQ(params::number("LOWCOMM_TIMEOUT_S")->value(), 2.5);
  }
  {
    Env e("LOWCOMM_SHARES", "EQUAL");  // choices ignore case and come back as declared
    EXPECT_EQ(params::choice("LOWCOMM_SHARES")->value(), "equal");
  }
  {
    Env e("LOWCOMM_SHARES", "even");
    auto v = params::choice("LOWCOMM_SHARES");
    ASSERT_FALSE(v.is_ok());
    EXPECT_NE(v.status().message().find("one of auto, equal"), std::string::npos)
        << v.status().message();
  }
  EXPECT_TRUE(params::check_all().is_ok()) << "nothing malformed is set any more";
}

TEST(Params, DescribeShowsEveryVariableWithItsValueButNotTheSecret) {
  Env a("LOWCOMM_STREAMS", "3");
  Env b("LOWCOMM_SECRET", "hunter2");
  const std::string d = params::describe();
  for (const params::Param& p : params::table())
    EXPECT_NE(d.find(p.name), std::string::npos) << p.name;
  EXPECT_NE(d.find("LOWCOMM_STREAMS                        3"), std::string::npos) << d;
  EXPECT_EQ(d.find("hunter2"), std::string::npos);
}

// README's environment table (rows whose first cell names LOWCOMM_* variables) and the
// declarations hold the same names: a variable added to one and not the other fails here.
TEST(Params, ReadmesEnvironmentTableListsExactlyTheDeclaredVariables) {
  std::ifstream in(std::string(LOWCOMM_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in.good());
  std::set<std::string> readme;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `LOWCOMM_", 0) != 0) continue;
    const std::string cell = line.substr(0, line.find('|', 1));
    // Every `LOWCOMM_...` in the first cell (no std::regex: GCC 12 warns inside it at -O1+).
    for (size_t at = cell.find("`LOWCOMM_"); at != std::string::npos;
         at = cell.find("`LOWCOMM_", at + 1)) {
      size_t end = at + 1;
      while (end < cell.size() &&
             (std::isupper(static_cast<unsigned char>(cell[end])) ||
              std::isdigit(static_cast<unsigned char>(cell[end])) || cell[end] == '_'))
        ++end;
      readme.insert(cell.substr(at + 1, end - at - 1));
    }
  }
  std::set<std::string> declared;
  for (const params::Param& p : params::table()) declared.insert(p.name);
  for (const std::string& n : declared) EXPECT_TRUE(readme.count(n)) << n << " is not in README";
  for (const std::string& n : readme)
    EXPECT_TRUE(declared.count(n)) << n << " is in README but not in core/params.cc";
}

}  // namespace
