// Coefficients of the single-precision erf used by the vectorised GELU (AVX2 and NEON paths).
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

}  // namespace
}  // namespace gemm
}  // namespace vitfast
