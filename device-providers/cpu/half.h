// IEEE binary16 (fp16) and bfloat16 conversions to and from float.
//
// Written without branches (every case is computed, then selected) so that the
// reduce loops that call them vectorise. Rounding is to nearest, ties to even;
// subnormals are produced and consumed exactly; infinities keep their sign; a NaN
// stays a NaN of the same sign (fp16: the canonical quiet NaN, bf16: the upper
// payload bits with the quiet bit set). Assumes the default FP environment
// (round to nearest); flush-to-zero modes only affect inputs that round to zero.
#pragma once

#include <bit>
#include <cstdint>

namespace hmc::cpu {

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa
  const uint32_t exp = em & 0x0f800000u;
  const uint32_t normal = em + ((127u - 15u) << 23);
  const uint32_t inf_nan = em + ((255u - 31u) << 23);
  // A subnormal m * 2^-24: place m under the exponent of 2^-14, then subtract 2^-14.
  const float sub = std::bit_cast<float>(em + (113u << 23)) - std::bit_cast<float>(113u << 23);
  const uint32_t bits =
      exp == 0x0f800000u ? inf_nan : (exp == 0 ? std::bit_cast<uint32_t>(sub) : normal);
  return std::bit_cast<float>(bits | sign);
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t all = std::bit_cast<uint32_t>(f);
  const uint32_t sign = all & 0x80000000u;
  const uint32_t u = all ^ sign;
  // |f| >= 2^16 overflows (65520 and up round to inf in the normal path below).
  const uint32_t special = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // |f| < 2^-14 gives a subnormal or zero: adding 0.5 makes the FPU round the
  // mantissa at bit 2^-24, ties to even, and leaves it in the low bits.
  const uint32_t magic = 126u << 23;  // 0.5f
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(u) + std::bit_cast<float>(magic)) - magic;
  // Normal: rebias the exponent and round the 13 dropped bits to nearest even.
  const uint32_t odd = (u >> 13) & 1u;
  const uint32_t normal = (u + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
  const uint32_t bits = u >= (143u << 23) ? special : (u < (113u << 23) ? sub : normal);
  return static_cast<uint16_t>(bits | (sign >> 16));
}

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  // Round to nearest even; overflow carries into the exponent and gives inf.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  // A NaN must not round into inf: keep its top bits and force the quiet bit.
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

}  // namespace hmc::cpu
