/*
 * The byte offsets of a repacked Q4_K / Q5_K / Q6_K column block's parts (the layout is
 * described in cpu-qrepack-k.c, which builds it; cpu-qrepack-k-avx512.c reads it).
 */
#ifndef GANGLION_CPU_QREPACK_K_H
#define GANGLION_CPU_QREPACK_K_H

#define RPK_SC 64    /* Q4_K / Q5_K: the sub-blocks' scales */
#define RPK_MN 192   /* Q4_K / Q5_K: the sub-blocks' minimums */
#define RPK_QH5 320  /* Q5_K: the fifth bits */
#define RPK_Q4 320   /* Q4_K: the codes */
#define RPK_Q5 832   /* Q5_K: the codes */
#define RPK6_SC 32   /* Q6_K: the sub-blocks' scales */
#define RPK6_QL 288  /* Q6_K: the low 4 bits */
#define RPK6_QH 2336 /* Q6_K: the high 2 bits */
#define RPKX_SC 32   /* IQ4_XS: the groups' scales s - 32 as int8 */
#define RPKX_Q 160   /* IQ4_XS: the codes */

#endif
