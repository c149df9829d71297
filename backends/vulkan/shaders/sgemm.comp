#version 450
// SGEMM C[M, N] = A[M, K] * B[K, N], f32, row-major: the bench's ceiling for what a plain
// compute shader reaches on the device (not used by attention). Each invocation computes a
// 4 x 4 block of C from 16-byte loads (4 rows of A x 4 rows of B per step of 4 in K); no shared
// memory. Requires M, N, K multiples of 4 (checked by the host).
layout(local_size_x = 8, local_size_y = 8) in;

layout(std430, set = 0, binding = 0) readonly buffer ABuf { vec4 a[]; };  // [M, K/4]
layout(std430, set = 0, binding = 1) readonly buffer BBuf { vec4 b[]; };  // [K, N/4]
layout(std430, set = 0, binding = 3) writeonly buffer CBuf { vec4 c[]; };  // [M, N/4]

layout(push_constant) uniform PushConstants {
  int M, N, K;
}
pc;

void main() {
  const int col4 = int(gl_GlobalInvocationID.x);  // block column: C[:, 4*col4 .. 4*col4+3]
  const int row = int(gl_GlobalInvocationID.y) * 4;
  const int n4 = pc.N / 4, k4 = pc.K / 4;
  if (col4 >= n4 || row >= pc.M) return;
  vec4 acc0 = vec4(0.0), acc1 = vec4(0.0), acc2 = vec4(0.0), acc3 = vec4(0.0);
  for (int k = 0; k < k4; ++k) {
    const vec4 a0 = a[(row + 0) * k4 + k], a1 = a[(row + 1) * k4 + k], a2 = a[(row + 2) * k4 + k],
               a3 = a[(row + 3) * k4 + k];
    const vec4 b0 = b[(4 * k + 0) * n4 + col4], b1 = b[(4 * k + 1) * n4 + col4], b2 = b[(4 * k + 2) * n4 + col4],
               b3 = b[(4 * k + 3) * n4 + col4];
    acc0 += a0.x * b0 + a0.y * b1 + a0.z * b2 + a0.w * b3;
    acc1 += a1.x * b0 + a1.y * b1 + a1.z * b2 + a1.w * b3;
    acc2 += a2.x * b0 + a2.y * b1 + a2.z * b2 + a2.w * b3;
    acc3 += a3.x * b0 + a3.y * b1 + a3.z * b2 + a3.w * b3;
  }
  c[(row + 0) * n4 + col4] = acc0;
  c[(row + 1) * n4 + col4] = acc1;
  c[(row + 2) * n4 + col4] = acc2;
  c[(row + 3) * n4 + col4] = acc3;
}
