#version 450
// Build-time feature test: does glslc compile GL_NV_cooperative_matrix (with f16 shared memory)?
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
shared float16_t a[256];
shared float c[256];
void main() {
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ma;
  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> mc = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);
  coopMatLoadNV(ma, a, 0, 16, false);
  mc = coopMatMulAddNV(ma, ma, mc);
  coopMatStoreNV(mc, c, 0, 16, false);
}
