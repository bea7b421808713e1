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

}  // namespace
}  // namespace gemm
}  // namespace vitfast
