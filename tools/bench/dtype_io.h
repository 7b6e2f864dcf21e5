// Reading and writing one element of any HMC dtype as a double (fp16/bf16 by hand).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hmc/types.h"

namespace hmc::bench {

inline float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf, nan
  if (exp == 0) {  // zero or subnormal: man x 2^-24
    float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t float_to_half(float f) {  // round to nearest even
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = (x >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;
  if (a < 6.103515625e-05f) return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));  // subnormal
  uint32_t m = std::bit_cast<uint32_t>(a);
  m += 0xfffu + ((m >> 13) & 1u);
  return sign | static_cast<uint16_t>((m - (112u << 23)) >> 13);
}

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline double load_elem(DataType t, const void* base, std::size_t i) {
  auto at = [&](auto tag) {
    decltype(tag) v;
    std::memcpy(&v, static_cast<const char*>(base) + i * sizeof(v), sizeof(v));
    return v;
  };
  switch (t) {
    case DataType::kInt8: return at(int8_t{});
    case DataType::kUint8: return at(uint8_t{});
    case DataType::kInt32: return at(int32_t{});
    case DataType::kUint32: return at(uint32_t{});
    case DataType::kInt64: return static_cast<double>(at(int64_t{}));
    case DataType::kUint64: return static_cast<double>(at(uint64_t{}));
    case DataType::kFloat16: return half_to_float(at(uint16_t{}));
    case DataType::kBFloat16: return bf16_to_float(at(uint16_t{}));
    case DataType::kFloat32: return at(float{});
    case DataType::kFloat64: return at(double{});
  }
  return 0;
}

// `v` is a small integer (or, for avg, any value the type can round to).
inline void store_elem(DataType t, void* base, std::size_t i, double v) {
  auto put = [&](auto x) { std::memcpy(static_cast<char*>(base) + i * sizeof(x), &x, sizeof(x)); };
  switch (t) {
    case DataType::kInt8: put(static_cast<int8_t>(v)); break;
    case DataType::kUint8: put(static_cast<uint8_t>(v)); break;
    case DataType::kInt32: put(static_cast<int32_t>(v)); break;
    case DataType::kUint32: put(static_cast<uint32_t>(v)); break;
    case DataType::kInt64: put(static_cast<int64_t>(v)); break;
    case DataType::kUint64: put(static_cast<uint64_t>(v)); break;
    case DataType::kFloat16: put(float_to_half(static_cast<float>(v))); break;
    case DataType::kBFloat16: put(float_to_bf16(static_cast<float>(v))); break;
    case DataType::kFloat32: put(static_cast<float>(v)); break;
    case DataType::kFloat64: put(v); break;
  }
}

inline bool is_signed_or_float(DataType t) {
  return t != DataType::kUint8 && t != DataType::kUint32 && t != DataType::kUint64;
}

inline bool is_float(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16 || t == DataType::kFloat32 || t == DataType::kFloat64;
}

// Unit roundoff of a float type, 0 for integers.
inline double epsilon(DataType t) {
  switch (t) {
    case DataType::kFloat16: return 0x1p-11;
    case DataType::kBFloat16: return 0x1p-8;
    case DataType::kFloat32: return 0x1p-24;
    case DataType::kFloat64: return 0x1p-53;
    default: return 0;
  }
}

}  // namespace hmc::bench
