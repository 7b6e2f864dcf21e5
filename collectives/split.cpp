// split: sub-communicators by color, ordered by (key, parent rank).
//
// Every rank all-gathers (color, key) over the parent; the lowest parent rank of each
// color creates the new communicator's unique id (its process hosts the bootstrap root)
// and sends it to the other members over the parent; then the members create it.
#include <algorithm>
#include <array>
#include <cstring>

#include "collectives/call.h"
#include "collectives/tags.h"
#include "core/comm_impl.h"
#include "core/context_impl.h"

namespace hmc {
namespace {

constexpr std::size_t kIdBytes = 256;  // UniqueId::to_string() is about 60 characters

Status split_error(const Status& s) { return {s.code(), "split: " + s.message()}; }

// What the exchanges read and write. On the heap: a wait that fails may leave them
// posted, and the communicator then keeps these until it is destroyed.
struct SplitBuffers {
  int32_t mine[2] = {0, 0};
  std::vector<int32_t> all;
  std::array<char, kIdBytes> text{};
};

}  // namespace

Result<Communicator> split(Context& ctx, Communicator& comm, int color, int key) {
  if (comm.size() == 0) return Status(ErrorCode::kInvalidArgument, "split: communicator is empty");
  if (!ctx.valid()) return core::empty_context("split");
  if (&ctx.impl() != &comm.impl().context())
    return Status(ErrorCode::kInvalidArgument, "split: the context is not the one the communicator was created with");
  const int n = comm.size(), r = comm.rank();
  auto bufs = std::make_shared<SplitBuffers>();
  bufs->mine[0] = color < 0 ? -1 : color;
  bufs->mine[1] = key;
  bufs->all.resize(2 * static_cast<std::size_t>(n));
  auto failed = [&](const Status& s) {
    comm.impl().keep_until_destroyed(bufs);
    return split_error(s);
  };
  const int32_t* mine = bufs->mine;
  const std::vector<int32_t>& all = bufs->all;
  if (Status s = all_gather(comm, mine, bufs->all.data(), 2, DataType::kInt32).wait(); !s.ok()) return failed(s);
  // Every rank takes the sequence number, also those that join no sub-communicator.
  const uint64_t seq = coll::next_sequence(comm.impl());
  if (color < 0) return Communicator();
  std::vector<std::pair<int32_t, int>> members;  // (key, parent rank)
  for (int j = 0; j < n; ++j)
    if (all[2 * j] == mine[0]) members.emplace_back(all[2 * j + 1], j);
  std::sort(members.begin(), members.end());
  int leader = n, new_rank = -1;
  for (std::size_t i = 0; i < members.size(); ++i) {
    leader = std::min(leader, members[i].second);
    if (members[i].second == r) new_rank = static_cast<int>(i);
  }
  const int new_size = static_cast<int>(members.size());
  const uint64_t tag = coll::tag_base(seq) | coll::subtag(0);
  std::array<char, kIdBytes>& text = bufs->text;
  if (r == leader) {
    // At the address this rank reaches the parent's root from, which the members reach too
    // (the host name's may be loopback, as Debian's 127.0.1.1, on a job across hosts).
    auto id = ctx.impl().create_unique_id(comm.impl().control_ip());
    // A failure still goes out, so that the members fail at once instead of timing out.
    std::string out = id ? id->to_string() : "!" + id.status().message();
    std::memcpy(text.data(), out.data(), std::min(out.size(), kIdBytes - 1));
    std::vector<Request> sends;
    for (auto& [k, j] : members)
      if (j != r) sends.emplace_back(comm.impl().isend(text.data(), kIdBytes, j, tag));
    Status sent = wait_all(sends.data(), sends.size());
    if (!sent.ok()) comm.impl().keep_until_destroyed(bufs);
    if (!id) return split_error(id.status());
    if (!sent.ok()) return split_error(sent);
    return Communicator::create(ctx, id.value(), new_rank, new_size);
  }
  if (Status s = Request(comm.impl().irecv(text.data(), kIdBytes, leader, tag)).wait(); !s.ok()) return failed(s);
  std::string got(text.data(), strnlen(text.data(), kIdBytes));
  if (!got.empty() && got[0] == '!')
    return Status(ErrorCode::kUnavailable, "split: rank " + std::to_string(leader) +
                                               " could not create the sub-communicator's id: " + got.substr(1));
  auto id = UniqueId::parse(got);
  if (!id) return split_error(id.status());
  return Communicator::create(ctx, id.value(), new_rank, new_size);
}

}  // namespace hmc
