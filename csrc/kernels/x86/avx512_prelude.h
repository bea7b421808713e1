// What an AVX-512 kernel file includes right after its own `#pragma GCC target(...)`: the intrinsics, the vector
// math (avx512_math.h), and GCC 12's false positives switched off for the rest of the file — it reports the
// `_mm512_undefined_*()` pass-throughs inside its own avx512fintrin.h (_mm512_min_ps, _mm512_reduce_*, masked
// min/max, once inlined) as (maybe-)uninitialized, in the header and not in the including file.
#pragma once

#include <immintrin.h>
#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/x86/avx512_math.h"
