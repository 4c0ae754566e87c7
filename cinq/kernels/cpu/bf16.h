// bf16 <-> float conversions shared by the element-wise native kernels (rms_norm, rotary, int4_linear). They
// work on the raw uint16_t bits so a kernel's inner loop needs no c10 types, and they round as PyTorch's bf16
// tensor ops round, which the kernels' tests compare against bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace cinq_bf16 {

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// float -> bf16, round to nearest even (as c10::BFloat16 does for finite values); NaN stays NaN (a bit test:
// -ffast-math drops std::isnan)
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// f rounded to the nearest bf16, kept as float (what one bf16 tensor op does to its result)
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace cinq_bf16
