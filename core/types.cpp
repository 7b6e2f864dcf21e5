#include "hmc/types.h"

#include <array>

namespace hmc {
namespace {
constexpr std::array<const char*, kNumDataTypes> kTypeNames = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"};
constexpr std::array<std::size_t, kNumDataTypes> kTypeSizes = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
constexpr std::array<const char*, kNumReduceOps> kOpNames = {"sum", "prod", "min", "max", "avg"};
}  // namespace

// Out of range (a cast from an integer): 0 bytes and "?", which every argument check refuses.
std::size_t dtype_size(DataType t) {
  const auto i = static_cast<std::size_t>(t);
  return i < kTypeSizes.size() ? kTypeSizes[i] : 0;
}
const char* dtype_name(DataType t) {
  const auto i = static_cast<std::size_t>(t);
  return i < kTypeNames.size() ? kTypeNames[i] : "?";
}
const char* op_name(ReduceOp op) {
  const auto i = static_cast<std::size_t>(op);
  return i < kOpNames.size() ? kOpNames[i] : "?";
}

std::optional<DataType> parse_dtype(std::string_view s) {
  for (int i = 0; i < kNumDataTypes; ++i)
    if (s == kTypeNames[i]) return static_cast<DataType>(i);
  static const std::pair<std::string_view, DataType> kAliases[] = {
      {"char", DataType::kInt8},     {"int", DataType::kInt32},      {"half", DataType::kFloat16},
      {"fp16", DataType::kFloat16},  {"bf16", DataType::kBFloat16},  {"float", DataType::kFloat32},
      {"fp32", DataType::kFloat32},  {"double", DataType::kFloat64}, {"fp64", DataType::kFloat64},
      {"uint", DataType::kUint32}};
  for (auto& [name, t] : kAliases)
    if (s == name) return t;
  return std::nullopt;
}

std::optional<ReduceOp> parse_op(std::string_view s) {
  for (int i = 0; i < kNumReduceOps; ++i)
    if (s == kOpNames[i]) return static_cast<ReduceOp>(i);
  return std::nullopt;
}

}  // namespace hmc
