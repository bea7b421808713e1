// Coefficients of the single-precision exp used by the vectorised softmax (AVX2 and NEON paths).
// A plain header (constants only, internal linkage) so the ISA files can include it.
//
// Cephes' expf: exp(x) = 2^n · exp(r) with n = round(x · log2(e)) and r = x − n·ln2 (ln2 split in a part
// exact in float and a correction, so r is accurate), exp(r) = 1 + r + r²·P(r) with P of degree 5 on
// |r| <= ln2/2; about 1 ulp.  Softmax only evaluates exp(t − max t) <= 1; below kExpMin the result is
// flushed to 0 (2^n would leave the normal range; e^-87 is 1.6e-38, far below anything a sum of terms
// that includes e^0 = 1 can notice).
#pragma once

namespace vitfast {
namespace gemm {
namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpMin = -87.0f;
// P(r), lowest degree first (for the Horner helpers of the ISA files).
constexpr float kExpP[6] = {5.0000001201e-1f, 1.6666665459e-1f, 4.1665795894e-2f,
                            8.3334519073e-3f, 1.3981999507e-3f, 1.9875691500e-4f};

// The exp of attention's bf16 P (exps rounded to bf16 as they are made): exp(x) = 2^n · 2^f with n = round(x · log2e)
// (the product rounded), f = x · log2e − n in one fused multiply-add (|f| <= 1/2), 2^f = 1 + f·Q(f), Q of degree 3
// fitted for the least maximum relative error (2.9e-6); with kLog2e's own rounding (|x|·1.3e-8, 1.2e-6 at kExpMin)
// and the steps' fp32 roundings, at most 4.2e-6 over [kExpMin, 0] (4.04e-6 the largest in sweeps of 10^7 points
// against a double exp): 1/1000 of a bf16 ulp, so P is the exact exp's bf16 rounding except at 0.03% of values, one
// ulp off.  exp(0) = 1 exactly; x < kExpMin gives 0, as the fp32 exp.  10 vector operations against the fp32 exp's
// 16: the bf16 softmax ran ~30% faster (table bf16_kernel_parts of 2026-12-01-amd-epyc-avx512.json).  The fp32
// softmaxes keep kExpP: their exps stay fp32, where 4.2e-6 would be ~35 ulps.
constexpr float kExp2Bf16P[5] = {1.0f, 6.9312411547e-01f, 2.4024105072e-01f, 5.5907212198e-02f,
                                 9.5827775076e-03f};

}  // namespace
}  // namespace gemm
}  // namespace vitfast
