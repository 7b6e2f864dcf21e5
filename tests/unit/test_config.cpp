// The configuration table: parsing, validation, precedence.
#include <catch2/catch.hpp>
#include <clocale>
#include <cstdlib>
#include <filesystem>

#include "common/port_range.h"
#include "core/config.h"

using namespace hmc::core;
using hmc::Status;
using namespace std::chrono_literals;

TEST_CASE("sizes, durations and flags parse strictly", "[config]") {
  CHECK(parse_size("4096") == 4096u);
  CHECK(parse_size("64K") == 65536u);
  CHECK(parse_size("4M") == 4u << 20);
  CHECK(parse_size("4MiB") == 4u << 20);
  CHECK(parse_size("1g") == 1u << 30);
  CHECK_FALSE(parse_size("lots"));
  CHECK_FALSE(parse_size("4Q"));
  CHECK_FALSE(parse_size("-1"));
  CHECK(parse_size("1.5M") == 3u << 19);
  CHECK(parse_size("16777215T") == 16777215ull << 40);  // the largest whole-T size that fits
  CHECK_FALSE(parse_size("-4K"));
  CHECK_FALSE(parse_size("-0"));
  CHECK_FALSE(parse_size("nan"));
  CHECK_FALSE(parse_size("NaN"));
  CHECK_FALSE(parse_size("nanK"));
  CHECK_FALSE(parse_size("-nan"));
  CHECK_FALSE(parse_size("inf"));
  CHECK_FALSE(parse_size("infinity"));
  CHECK_FALSE(parse_size("-inf"));
  CHECK_FALSE(parse_size("1e30"));       // finite, but past 2^64
  CHECK_FALSE(parse_size("16777216T"));  // exactly 2^64
  CHECK(parse_size("8b") == 8u);
  CHECK(parse_size("2KiB") == 2048u);
  CHECK(parse_size("2ki") == 2048u);
  CHECK(parse_size("0.5K") == 512u);
  CHECK(parse_size("1e3") == 1000u);
  CHECK_FALSE(parse_size("1.5"));   // no half bytes
  CHECK_FALSE(parse_size("0.1K"));  // 102.4
  CHECK_FALSE(parse_size("8i"));    // a unit of "i" alone
  CHECK_FALSE(parse_size("8ib"));
  CHECK_FALSE(parse_size("4kbb"));
  CHECK_FALSE(parse_size("0x10"));  // strtod reads hexadecimal
  CHECK_FALSE(parse_size("+4K"));
  CHECK(parse_duration("30") == 30000ms);
  CHECK(parse_duration("500ms") == 500ms);
  CHECK(parse_duration("2m") == 120000ms);
  CHECK(parse_duration("250us") == 250us);
  CHECK(parse_duration("1.5ms") == 1500us);
  for (const char* bad : {"nan", "inf", "-1s", "-0", "1e300s", "infms"}) CHECK_FALSE(parse_duration(bad).has_value());
  CHECK_FALSE(parse_duration("soon"));
  CHECK(parse_bool("yes") == true);
  CHECK(parse_bool("0") == false);
  CHECK_FALSE(parse_bool("maybe"));
}

// A locale with a decimal comma, or nullptr: an installed one, else one built with localedef
// into a folder of its own, `dir` (Debian's `locales` has the sources), that LOCPATH names.
static const char* comma_locale(std::string& made_in) {
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8"})
    if (std::setlocale(LC_NUMERIC, name)) return name;
  char dir[] = "/tmp/hmc-locale-XXXXXX";
  if (!mkdtemp(dir)) return nullptr;
  made_in = dir;
  const std::string made = std::string(dir) + "/de_DE.UTF-8";
  if (std::system(("localedef -i de_DE -f UTF-8 " + made + " >/dev/null 2>&1").c_str()) != 0) return nullptr;
  setenv("LOCPATH", dir, 1);
  return std::setlocale(LC_NUMERIC, "de_DE.UTF-8") ? "de_DE.UTF-8" : nullptr;
}

// An application that called setlocale(LC_ALL, "") in Germany read "1.5s" with strtod as
// 1 and ".5s" left over: HMC_TIMEOUT=1.5s failed the context as malformed.
TEST_CASE("sizes and durations parse alike whatever the locale", "[config]") {
  std::string made_in;
  const char* name = comma_locale(made_in);
  struct Cleanup {
    std::string& dir;
    ~Cleanup() {
      std::setlocale(LC_NUMERIC, "C");
      unsetenv("LOCPATH");
      if (!dir.empty()) std::filesystem::remove_all(dir);
    }
  } cleanup{made_in};
  if (!name) {
    WARN("no locale with a decimal comma here: skipped");
    return;
  }
  INFO("locale " << name);
  CHECK(parse_duration("1.5s") == 1500ms);
  CHECK(parse_size("0.5M") == (512u << 10));
  CHECK_FALSE(parse_duration("1,5s"));
}

// Deadlines are now plus a duration in int64_t nanoseconds: HMC_CREDIT_WAIT=1e10 (seconds,
// meant as never) wrapped into the past, and every held send went by rendezvous at once.
TEST_CASE("a duration longer than ten years is refused with the reason", "[config]") {
  CHECK(parse_duration("87600h") == kMostDuration);
  CHECK_FALSE(parse_duration("87601h"));
  CHECK_FALSE(parse_duration("1e10"));
  auto bad = Config::load({{"HMC_CREDIT_WAIT", "1e10"}});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("HMC_CREDIT_WAIT") && Catch::Contains("10 years"));
}

TEST_CASE("options override the environment and are validated", "[config]") {
  setenv("HMC_EAGER_LIMIT", "8K", 1);
  auto c = Config::load({{"HMC_TIMEOUT", "5s"}});
  REQUIRE(c.ok());
  CHECK(c->size("HMC_EAGER_LIMIT") == 8192u);
  CHECK(c->duration("HMC_TIMEOUT") == 5000ms);
  auto over = Config::load({{"HMC_EAGER_LIMIT", "1M"}});
  CHECK(over->size("HMC_EAGER_LIMIT") == 1u << 20);
  unsetenv("HMC_EAGER_LIMIT");

  auto bad = Config::load({{"HMC_TIMEOUT", "never"}});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("HMC_TIMEOUT") && Catch::Contains("duration"));
  auto unknown = Config::load({{"NOT_OURS", "1"}});
  CHECK_FALSE(unknown.ok());
}

// `HMC_TIMEOUT=` from a launcher's template means "not set": before, every context failed
// with "malformed HMC_TIMEOUT=''", and an empty HMC_RANK failed Context::create before
// from_env could fall back to RANK. A setting given as an option stays checked.
TEST_CASE("an empty environment variable counts as unset", "[config]") {
  setenv("HMC_TIMEOUT", "", 1);
  setenv("HMC_RANK", "", 1);
  setenv("HMC_EAGER_LIMIT", "8K", 1);
  auto c = Config::load({});
  unsetenv("HMC_TIMEOUT");
  unsetenv("HMC_RANK");
  unsetenv("HMC_EAGER_LIMIT");
  REQUIRE(c.ok());
  CHECK_FALSE(c->is_set("HMC_TIMEOUT"));
  CHECK_FALSE(c->is_set("HMC_RANK"));
  CHECK(c->duration("HMC_TIMEOUT") == 60s);
  CHECK(c->size("HMC_EAGER_LIMIT") == 8192u);
  CHECK_FALSE(Config::load({{"HMC_TIMEOUT", ""}}).ok());
}

// The table (hmc-probe config, --json) shows that the job secret is set, never the secret:
// such tables end up in bug reports, and the secret lets anyone join the job.
TEST_CASE("the configuration table does not show the job secret", "[config]") {
  const std::string secret = "00112233445566778899aabbccddeeff";
  auto c = Config::load({{"HMC_SECRET", secret}});
  REQUIRE(c.ok());
  CHECK(c->str("HMC_SECRET") == secret);  // what the library reads
  bool listed = false;
  for (const auto& e : c->entries()) {
    CHECK(e.value.find(secret) == std::string::npos);
    if (e.name == "HMC_SECRET") listed = e.value == "(set; not shown)" && e.source == "option";
  }
  CHECK(listed);
}

TEST_CASE("provider parameters join the table and are checked", "[config]") {
  auto c = Config::load({{"HMC_FAKE_CHUNK", "12Q"}, {"HMC_TYPO", "1"}});
  REQUIRE(c.ok());
  hmc_param_t params[] = {{"HMC_FAKE_CHUNK", "size", "1M", "chunk size"}};
  Status s = c->add_params("fake", params, 1);
  CHECK_FALSE(s.ok());
  auto good = Config::load({{"HMC_FAKE_CHUNK", "2M"}});
  REQUIRE(good->add_params("fake", params, 1).ok());
  CHECK(good->size("HMC_FAKE_CHUNK") == 2u << 20);
  bool listed = false;
  for (const auto& e : good->entries()) listed |= e.name == "HMC_FAKE_CHUNK" && e.source == "option";
  CHECK(listed);
  using Unclaimed = std::vector<std::pair<std::string, std::string>>;
  CHECK(c->unclaimed() == Unclaimed{{"HMC_FAKE_CHUNK", "option"}, {"HMC_TYPO", "option"}});
}

// A provider's names are its own: HMC_<NAME>_*, and not core's or another provider's even
// inside that prefix (shm's holds core's HMC_SHM_COLL). The loader refuses such a provider.
TEST_CASE("a provider's parameters keep to its own names", "[config]") {
  auto c = Config::load({});
  REQUIRE(c.ok());
  hmc_param_t outside[] = {{"HMC_EAGER_LIMIT", "size", "1M", "core's"}};
  CHECK(c->bad_params("fake", outside, 1) == "parameter HMC_EAGER_LIMIT is not named HMC_FAKE_*");
  // config_get hands the provider its default as if set: it must parse as its type.
  hmc_param_t bad_default[] = {{"HMC_FAKE_WAIT", "duration", "soon", "a default of no duration"}};
  CHECK(c->bad_params("fake", bad_default, 1) == "parameter HMC_FAKE_WAIT's default 'soon' is not a valid duration");
  hmc_param_t bare[] = {{"HMC_SHM_", "int", "1", "the prefix alone"}};
  CHECK(c->bad_params("shm", bare, 1) == "parameter HMC_SHM_ is not named HMC_SHM_*");
  hmc_param_t cores[] = {{"HMC_SHM_COLL", "bool", "0", "core's, in shm's prefix"}};
  CHECK(c->bad_params("shm", cores, 1) == "parameter HMC_SHM_COLL is core's already");
  CHECK_FALSE(c->add_params("shm", cores, 1).ok());
  CHECK(c->text("HMC_SHM_COLL") != "0");  // core's default stands
  hmc_param_t own[] = {{"HMC_SHM_RING", "bool", "1", "shm's"}, {"HMC_A_B_X", "int", "1", "a_b's"}};
  CHECK(c->bad_params("shm", own, 1).empty());
  REQUIRE(c->add_params("shm", own, 1).ok());
  REQUIRE(c->add_params("shm", own, 1).ok());  // again, by the same owner: no clash
  // Another provider whose prefix holds it ("a" against "a_b") cannot take it over.
  REQUIRE(c->add_params("a_b", own + 1, 1).ok());
  CHECK(c->bad_params("a", own + 1, 1) == "parameter HMC_A_B_X is a_b's already");
  hmc_param_t dashed[] = {{"HMC_MY_NET_X", "int", "1", "my-net's: a shell exports no '-'"}};
  CHECK(c->bad_params("my-net", dashed, 1).empty());
}

// HMC_TCP_PORT and HMC_UCX_PORT: 0, a port, or a range of ports (net-providers/common/port_range.h).
TEST_CASE("listener port settings take a port or a range, nothing else", "[config]") {
  hmc_net::PortRange r;
  std::string why;
  CHECK(hmc_net::parse_port_range("HMC_TCP_PORT", "0", r, why));
  CHECK((r.lo == 0 && r.hi == 0));
  CHECK(hmc_net::parse_port_range("HMC_TCP_PORT", "29500", r, why));
  CHECK((r.lo == 29500 && r.hi == 29500));
  CHECK(hmc_net::parse_port_range("HMC_TCP_PORT", "29500-29531", r, why));
  CHECK((r.lo == 29500 && r.hi == 29531));
  for (const char* bad : {"", "-", "65536", "9-5", "0-10", "10-", "-10", "1-2-3", " 80", "80 ", "0x50", "x"}) {
    INFO(bad);
    why.clear();
    CHECK_FALSE(hmc_net::parse_port_range("HMC_TCP_PORT", bad, r, why));
    CHECK(why.find("HMC_TCP_PORT='") == 0);
  }
}
