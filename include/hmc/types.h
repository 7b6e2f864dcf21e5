// Data types, reduce operations and device identities shared by the whole API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "hmc/provider/common.h"

namespace hmc {

enum class DataType : int {
  kInt8 = HMC_DTYPE_INT8,
  kUint8 = HMC_DTYPE_UINT8,
  kInt32 = HMC_DTYPE_INT32,
  kUint32 = HMC_DTYPE_UINT32,
  kInt64 = HMC_DTYPE_INT64,
  kUint64 = HMC_DTYPE_UINT64,
  kFloat16 = HMC_DTYPE_FP16,
  kBFloat16 = HMC_DTYPE_BF16,
  kFloat32 = HMC_DTYPE_FP32,
  kFloat64 = HMC_DTYPE_FP64,
};
inline constexpr int kNumDataTypes = HMC_DTYPE_COUNT;

enum class ReduceOp : int {
  kSum = HMC_OP_SUM,
  kProd = HMC_OP_PROD,
  kMin = HMC_OP_MIN,
  kMax = HMC_OP_MAX,
  kAvg = HMC_OP_AVG,
};
inline constexpr int kNumReduceOps = HMC_OP_COUNT;

std::size_t dtype_size(DataType t);
const char* dtype_name(DataType t);   // "int8", ..., "float16", "bfloat16", "float32", "float64"
const char* op_name(ReduceOp op);     // "sum", "prod", "min", "max", "avg"
std::optional<DataType> parse_dtype(std::string_view s);  // also accepts "half", "fp16", "float", "double"
std::optional<ReduceOp> parse_op(std::string_view s);

enum class MemKind : int { kHost = HMC_MEM_HOST, kDevice = HMC_MEM_DEVICE };

// A device of a device provider: {"cpu", 0}, {"cuda", 1}.
struct DeviceId {
  std::string provider = "cpu";
  int index = 0;
  bool operator==(const DeviceId&) const = default;
  std::string to_string() const { return provider + ":" + std::to_string(index); }
};

}  // namespace hmc
