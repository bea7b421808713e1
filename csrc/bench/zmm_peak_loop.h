// The benchmarks' instruction peaks (bench_gemm_int8: vpdpbusd, bench_gemm_bf16: vdpbf16ps): a register-only loop of
// 16 independent zmm accumulators, in inline asm (in C++ GCC spilled an array of 16 accumulators to the stack every
// iteration, halving the figure, or merged identical chains into one).  zmm16 and zmm17 hold the 32-bit `operand`
// in every lane, zmm0-15 start at zero, and each of `n` iterations runs `insn zmm17, zmm16, zmm<r>` for r = 0..15:
// more independent chains than latency × throughput of the instructions measured (4-6 cycles, up to 2 a cycle),
// so the loop runs at their issue rate; the counter's dec/jnz is one fused op per 16.  `n` (int64_t) is counted
// down to zero.  The calling function carries the instruction's target attribute.
#pragma once

#if defined(__x86_64__)
#define VITFAST_ZMM_PEAK_LOOP(insn, n, operand)                                                             \
  asm volatile("vpbroadcastd %1, %%zmm16\n\t"                                                              \
               "vpbroadcastd %1, %%zmm17\n\t"                                                              \
               ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"                                          \
               "vpxord %%zmm\\r, %%zmm\\r, %%zmm\\r\n\t"                                                    \
               ".endr\n\t"                                                                                  \
               "1:\n\t"                                                                                     \
               ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15\n\t"                                          \
               insn " %%zmm17, %%zmm16, %%zmm\\r\n\t"                                                       \
               ".endr\n\t"                                                                                  \
               "dec %0\n\t"                                                                                 \
               "jnz 1b\n\t"                                                                                 \
               : "+r"(n)                                                                                    \
               : "m"(operand)                                                                               \
               : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",   \
                 "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc")
#endif
