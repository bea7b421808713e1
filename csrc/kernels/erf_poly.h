// Coefficients of the single-precision erf used by the vectorised GELU (AVX2 and NEON paths), and of the bf16 GEMMs'
// GELU (below).
// A plain header (constants only, internal linkage) so the ISA files can include it.
//
// GELU(x) = 0.5 · x · (1 + erf(x / √2))  -- the exact (erf) GELU, torch's default, not the tanh form.
//
// erf(z) for z = |x|/√2 is evaluated piecewise with polynomials only (no exp, no division):
//   z <= kErfSplit:           erf(z) = z · P(z²)                      degree 6 in z², 7 coefficients
//   kErfSplit < z < kErfMax:  erf(z) = Q(z − kErfCenter)              degree 12, 13 coefficients
//   z >= kErfMax:             erf(z) = 1   (1 − erf(3.92) = 3.7e-8 < half an ulp of 1.0f)
// and erf(−z) = −erf(z).  P and Q are Chebyshev fits (near-minimax) in double precision, rounded to float;
// measured in float arithmetic the absolute error of erf is about 1e-7 (2 ulp near 0.8), which the C++
// test `test_gelu` checks against std::erf in double on a dense grid.
#pragma once

namespace vitfast {
namespace gemm {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kErfSplit = 1.25f;
constexpr float kErfMax = 3.92f;
constexpr float kErfCenter = 2.585f;  // midpoint of [kErfSplit, kErfMax]: keeps Q well conditioned

// erf(z) / z as a polynomial in u = z², lowest degree first, on 0 <= z <= 1.25.
constexpr float kErfP[7] = {
    1.128379114e+00f, -3.761244681e-01f, 1.128210160e-01f, -2.680452846e-02f,
    5.111239137e-03f, -7.440517354e-04f, 6.245971171e-05f,
};

// erf(z) as a polynomial in t = z − 2.585, lowest degree first, on 1.25 <= z <= 3.92.
constexpr float kErfQ[13] = {
    9.997435625e-01f, 1.413684047e-03f,  -3.654879141e-03f, 5.829911287e-03f, -6.312481807e-03f,
    4.766074280e-03f, -2.437788939e-03f, 6.899134313e-04f,  9.900024387e-05f, -2.145754037e-04f,
    7.519585383e-05f, 1.073958096e-05f,  -8.736482225e-06f,
};

// The bf16 GEMMs' GELU (gelu_for_bf16: gemm_bf16.h's GELU epilogue on every path).  Its results are bf16 (or meet
// bf16 operands next), so the piecewise erf's ~1e-7 is more than they keep; written with a = |x|:
//   GELU(x) = x/2 + a · E(a),  E(a) = erf(a/√2) / 2  (x · erf(x/√2) is even in x),
//   E ≈ G(t),  t = min(a, kGeluBf16Max) · kGeluBf16Scale − 1 ∈ [−1, 1]  (one FMA),  G of degree 12 by Horner,
// G a near-minimax (Lawson-weighted Chebyshev) fit on a ∈ [0, kGeluBf16Max] = [0, 3.6·√2], its constant term set so
// that G(1) is exactly 0.5 in float: x >= kGeluBf16Max gives x and x <= −kGeluBf16Max gives 0 exactly (the true
// values are within 1.1e-7·|x| of them).  Measured in float arithmetic over 4·10^6 points (C++ test
// `test_gelu_for_bf16`): |E − erf(a/√2)/2| <= 1.1e-6, so relative error <= 2.2e-6 for x >= 0 (1/1800 of a bf16
// ulp) and <= 3.9e-6 for x >= −1, absolute <= 1.2e-6·|x| everywhere; the bf16 rounding of the result is the exact
// GELU's except at ~0.01% of values, one ulp off.  With the centred variable the coefficients stay below 0.5 (no
// cancellation).  17 vector operations for 16 values against the piecewise erf's ~33 when a vector straddles its
// split (most of a ViT's FFN activations do): the GELU-to-bf16 GEMM epilogue at DeiT-B's 197 × 768 × 768 515 → 484
// µs in alternating builds (benchmarks/bf16_kernel_parts.py; table bf16_kernel_parts of
// 2026-12-01-amd-epyc-avx512.json).  GELU(±0) = +0, GELU(NaN) = NaN, GELU(+inf) = +inf (the fp32 GELU's; torch's
// is NaN) and GELU(−inf) = NaN (as both).
constexpr float kGeluBf16Max = 5.091169f;    // 3.6 · √2: erf(3.6) = 1 − 3.6e-7
constexpr float kGeluBf16Scale = 0.3928371f;  // 2 / kGeluBf16Max
constexpr float kGeluBf16[13] = {
    4.9454426765e-01f, 3.9776571095e-02f, -1.2880460918e-01f, 2.3525092006e-01f, -2.4312391877e-01f,
    8.6470976472e-02f, 1.2334156781e-01f, -1.8098860979e-01f, 4.2117994279e-02f, 8.3795741200e-02f,
    -5.1181364805e-02f, -1.4305712655e-02f, 1.3106187806e-02f,
};

}  // namespace
}  // namespace gemm
}  // namespace vitfast
