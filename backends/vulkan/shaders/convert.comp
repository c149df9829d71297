#version 450
// f32 -> f16 / bf16, rounded to nearest even exactly as the host does (attnops/dtype.h), for
// outputs that stay on the device. src: n floats; dst: n 16-bit values, two per uint (element e
// in the low half when e is even). One invocation per output word.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint DTYPE = 1u;  // 1 f16, 2 bf16

layout(std430, set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer Dst { uint dst[]; };

layout(push_constant) uniform PushConstants {
  uint n;  // elements
}
pc;

uint to_bf16(float f) {
  uint u = floatBitsToUint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;  // NaN stays NaN
  return ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) & 0xffffu;
}

uint to_f16(float f) {
  const uint x = floatBitsToUint(f);
  const uint sign = (x >> 16) & 0x8000u;
  const uint ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                       // subnormal or zero in binary16
    if (ax < 0x33000000u) return sign;
    const uint e = ax >> 23;
    const uint m = (ax & 0x7fffffu) | 0x800000u;
    const uint shift = 126u - e;
    uint q = m >> shift;
    const uint rem = m & ((1u << shift) - 1u);
    const uint half_ = 1u << (shift - 1u);
    if (rem > half_ || (rem == half_ && (q & 1u) != 0u)) ++q;
    return sign | q;
  }
  uint r = ax - 0x38000000u;
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | (r >> 13);
}

uint convert(uint e) {
  if (e >= pc.n) return 0u;
  return DTYPE == 1u ? to_f16(src[e]) : to_bf16(src[e]);
}

void main() {
  const uint w = gl_GlobalInvocationID.x;
  if (2u * w >= pc.n) return;
  dst[w] = convert(2u * w) | (convert(2u * w + 1u) << 16);
}
