// One attention head's operands at the image's row 0, each with its own row stride: Q and K rows dk wide (the score
// product's reduction), V rows dv wide (the output's).  The attention kernels' strided entries (attention_int8.h,
// attention.h) read them; `xwx_heads_int8` / `xwx_heads_bf16` pass a non-deep projection's columns ([A_h | B'_h | V_h]
// per head, dk = R + 1 ≠ dv), the packed-qkv entries q | k | v slices of one row (dk = dv).
#pragma once

#include <cstdint>

namespace vitfast {

struct HeadOperands {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  // Or the same operands already rounded to bf16 (the bf16 head only; a bf16 qkv's slices): used instead of q / k /
  // v when set, with the same strides counted in bf16 elements.  Q's rows are then the score GEMM's A operand as
  // they are, read as whole pairs: dk even.
  const uint16_t* q16 = nullptr;
  const uint16_t* k16 = nullptr;
  const uint16_t* v16 = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0, dk = 0, dv = 0;
};

}  // namespace vitfast
