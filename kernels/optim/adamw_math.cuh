// The AdamW update of one element, in FP32 with explicit IEEE intrinsics (no FMA contraction):
// the twin of adamw.rs `moments` and `param_update`.
#pragma once
#include "args.cuh"

// adamw.rs `moments`: g = grad * grad_scale; m = b1 * m_old + (1 - b1) * g;
// v = b2 * v_old + (1 - b2) * g^2.
__device__ __forceinline__ void adamw_moments(float grad, float m_old, float v_old, const StepArgs& a, float& m, float& v) {
    const float g = __fmul_rn(grad, a.grad_scale);
    m = __fadd_rn(__fmul_rn(a.beta1, m_old), __fmul_rn(a.one_minus_beta1, g));
    v = __fadd_rn(__fmul_rn(a.beta2, v_old), __fmul_rn(a.one_minus_beta2, __fmul_rn(g, g)));
}

// adamw.rs `param_update`: p * (1 - lr * wd) - lr * (m * (1/bc1)) / (sqrt(v * (1/bc2)) + eps).
__device__ __forceinline__ float param_update(float p, float m, float v, float decay, const StepArgs& a) {
    const float m_hat = __fmul_rn(m, a.inv_bias_correction1);
    const float v_hat = __fmul_rn(v, a.inv_bias_correction2);
    const float denom = __fadd_rn(__fsqrt_rn(v_hat), a.eps);
    return __fsub_rn(__fmul_rn(p, decay), __fmul_rn(a.lr, __fdiv_rn(m_hat, denom)));
}

// Whether the gradient `grad` enters the moments as exactly 0 (stalls.rs `zero_grad`).
__device__ __forceinline__ bool zero_gradient(float grad, const StepArgs& a) {
    return __fmul_rn(grad, a.grad_scale) == 0.0f;
}
