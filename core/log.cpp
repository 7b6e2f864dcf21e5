#include "core/log.h"

#include <map>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace hmc::core {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<spdlog::logger>> loggers;
  spdlog::level::level_enum level = spdlog::level::warn;
  std::shared_ptr<spdlog::sinks::sink> sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: providers may log during exit
  return *r;
}

}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& subsystem) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.loggers.find(subsystem);
  if (it != r.loggers.end()) return it->second;
  auto l = std::make_shared<spdlog::logger>("hmc." + subsystem, r.sink);
  l->set_pattern("[%H:%M:%S.%e] [%n] [pid %P] %l: %v");
  l->set_level(r.level);
  r.loggers.emplace(subsystem, l);
  return l;
}

bool set_log_level(const std::string& level) {
  auto lvl = spdlog::level::from_str(level);
  if (lvl == spdlog::level::off && level != "off") return false;
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.level = lvl;
  for (auto& [name, l] : r.loggers) l->set_level(lvl);
  return true;
}

}  // namespace hmc::core
