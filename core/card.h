// Capability card: what a rank tells every other rank at communicator creation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hmc/communicator.h"
#include "hmc/status.h"

namespace hmc::core {

struct NetCard {
  std::string name;
  uint64_t caps = 0;
  std::vector<uint8_t> address;  // the provider's opaque listen address
  double latency_us = 0;
  double bandwidth_gbps = 0;
};

struct Card {
  int rank = -1;
  std::string host_id;
  std::string hostname;
  int pid = 0;
  std::vector<DeviceInfo> devices;
  std::vector<NetCard> nets;
  std::vector<std::string> ccls;  // available collective providers

  const NetCard* net(const std::string& name) const;
  PeerInfo peer_info() const;
};

std::vector<uint8_t> encode_card(const Card& card);
Result<Card> decode_card(const std::vector<uint8_t>& bytes);

}  // namespace hmc::core
