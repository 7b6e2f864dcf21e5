#include "core/card.h"

#include <nlohmann/json.hpp>

namespace hmc::core {

using nlohmann::json;

namespace {

// Reads a CBOR card without building it and stops past eight levels of nesting (a card
// has three): the reader recurses once per level, so a peer's deeply nested bytes would
// otherwise overflow this rank's stack.
class ShallowCbor : public json::json_sax_t {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth_ <= kMaxDepth; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth_ >= 0; }
  bool start_array(std::size_t) override { return ++depth_ <= kMaxDepth; }
  bool end_array() override { return --depth_ >= 0; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  static constexpr int kMaxDepth = 8;
  int depth_ = 0;
};

}  // namespace

const NetCard* Card::net(const std::string& name) const {
  for (const auto& n : nets)
    if (n.name == name) return &n;
  return nullptr;
}

PeerInfo Card::peer_info() const {
  PeerInfo p{rank, host_id, hostname, pid, {}, devices, ccls};
  for (const auto& n : nets) p.net_providers.push_back(n.name);
  return p;
}

std::vector<uint8_t> encode_card(const Card& c) {
  json j = {{"v", 1}, {"rank", c.rank}, {"host", c.host_id}, {"hostname", c.hostname}, {"pid", c.pid}};
  j["devices"] = json::array();
  for (const auto& d : c.devices)
    j["devices"].push_back({{"provider", d.id.provider}, {"index", d.id.index}, {"vendor", d.vendor},
                            {"model", d.model}, {"pci", d.pci_bus_id}, {"numa", d.numa_node},
                            {"kind", static_cast<int>(d.mem_kind)}, {"bytes", d.memory_bytes}});
  j["ccls"] = c.ccls;
  j["nets"] = json::array();
  for (const auto& n : c.nets)
    j["nets"].push_back({{"name", n.name}, {"caps", n.caps}, {"addr", json::binary(n.address)},
                         {"lat", n.latency_us}, {"bw", n.bandwidth_gbps}});
  return json::to_cbor(j);
}

Result<Card> decode_card(const std::vector<uint8_t>& bytes) {
  const Status unreadable(ErrorCode::kMismatch, "a peer sent an unreadable capability card (different HMC version?)");
  ShallowCbor shallow;
  if (!json::sax_parse(bytes, &shallow, json::input_format_t::cbor)) return unreadable;
  json j = json::from_cbor(bytes, true, false);
  try {
    if (j.is_discarded() || !j.is_object() || j.value("v", 0) != 1) return unreadable;
    Card c;
    c.rank = j.at("rank").get<int>();
    c.host_id = j.at("host").get<std::string>();
    c.hostname = j.at("hostname").get<std::string>();
    c.pid = j.at("pid").get<int>();
    for (const auto& d : j.at("devices"))
      c.devices.push_back({{d.at("provider").get<std::string>(), d.at("index").get<int>()},
                           d.at("vendor").get<std::string>(), d.at("model").get<std::string>(),
                           d.at("pci").get<std::string>(), d.at("numa").get<int>(),
                           static_cast<MemKind>(d.at("kind").get<int>()), d.at("bytes").get<uint64_t>()});
    c.ccls = j.value("ccls", std::vector<std::string>{});
    for (const auto& n : j.at("nets"))
      c.nets.push_back({n.at("name").get<std::string>(), n.at("caps").get<uint64_t>(),
                        n.at("addr").get_binary(), n.at("lat").get<double>(), n.at("bw").get<double>()});
    return c;
  } catch (const json::exception& e) {
    return Status(ErrorCode::kMismatch, std::string("a peer's capability card is malformed: ") + e.what());
  }
}

}  // namespace hmc::core
