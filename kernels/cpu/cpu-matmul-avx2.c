/*
 * CPU backend: the AVX2 + FMA + F16C kernels of the typed-weight matmul (cpu-matmul.c).
 * CMake compiles this one file with -mavx2 -mfma -mf16c on x86-64; the rest of the
 * binary stays baseline x86-64, and cpu-matmul.c calls in here only when
 * gang__cpu_avx2_usable() says the CPU has the three extensions. Built for another
 * architecture (or without the flags) the file defines the same symbols as stubs that
 * report "not usable".
 *
 * Algorithm, m < 4 (decode). Within a chunk of W rows, W is walked in blocks of
 * GANG__AVX_WBLOCK rows; each x row meets four W rows at a time (a 1 x 4 dot-product
 * tile: four 8-lane f32 accumulators, the W vectors converted as they are loaded --
 * bf16: a 16-bit shift; f16: vcvtph2ps; int8: sign extension and vcvtdq2ps). A k that is
 * not a multiple of 8 ends with a scalar tail; the eight lanes are summed at the end and
 * an int8 row's scale multiplies the finished sum. m >= 4: packed panels (below). The
 * 4 x 2 dot tiles of wblock remain the fallback when the panel buffer cannot be had.
 */
#include "cpu.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>

#include "cpu-avx2.h"

#define GANG__AVX_WBLOCK 8
#define AVX_INLINE static inline __attribute__((always_inline))
/* The tile loops must be unrolled completely for the accumulators to stay in registers
 * (-O2 alone leaves them in memory). */
#define AVX_UNROLL _Pragma("GCC unroll 4")
/* The 8 x 8 transpose's loops: "unroll 4" left them as loops over arrays on the stack
 * (perf annotate: the panel pack stored and reloaded its 8 rows through memory). */
#define AVX_UNROLL8 _Pragma("GCC unroll 8")

int gang__cpu_avx2_usable(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
}

/* Eight elements of a W row from element i, as f32. */
AVX_INLINE __m256 ld8(gang_kernels_wtype t, const void *row, size_t i)
{
    switch (t) {
    case GANG_KW_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case GANG_KW_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + i)));
    case GANG_KW_I8:
        return _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + i))));
    default: /* f32 (block types never come here: cpu-qmatmul.c) */
        break;
    }
    return _mm256_loadu_ps((const float *)row + i);
}

/*
 * One MR x NR tile: y[a, b] = sum_i x[a, i] W[b, i] (times scales[b] for int8) for a < MR
 * rows of x (stride kdim) and b < NR rows of W starting at w0 (stride wstride bytes).
 * MR and NR are constants at every call, so the accumulators live in registers.
 */
AVX_INLINE void tile(gang_kernels_wtype t, const int MR, const int NR, size_t kdim, const float *x,
                     const char *w0, size_t wstride, const float *scales, float *y, size_t ldy)
{
    __m256 acc[4][4];
    size_t i = 0;

    AVX_UNROLL
    for (int a = 0; a < MR; a++)
        AVX_UNROLL
    for (int b = 0; b < NR; b++)
        acc[a][b] = _mm256_setzero_ps();
    for (; i + 8 <= kdim; i += 8) {
        __m256 wv[4];

        /* Decode streams W from memory once: ask for the bytes two tiles ahead. Without it
         * the loads waited on memory (perf annotate: ~85% of the kernel's samples on the W
         * loads): SmolLM2's LM head at batch 1 on 2 threads went from 6.7 to 11.8 GB/s,
         * bf16 decode from 26.5 to 34.9 tokens/s (distance one tile: 10.1 GB/s; four: no
         * better than two). A tile's NR rows are contiguous, so the tile two ahead is one
         * run of NR x kdim elements, asked for linearly: one line per step (bf16, NR 4)
         * instead of one per row each step, which asked for every line four times. That
         * made one decode step's matmuls 5-14% faster in an A/B of the two kernels in one
         * process (SmolLM2 bf16, 30 layers + LM head, 2 threads, medians of 15; the short
         * rows of k = 576 gained most). Distances 3 and 4 tiles were no better. */
        if (MR == 1) {
            const size_t es = gang_kernels_wtype_size(t);
            const char *pf = w0 + (size_t)2 * NR * wstride + i * NR * es;

            _mm_prefetch(pf, _MM_HINT_T0);
            if (NR * 8 * es > 64)
                _mm_prefetch(pf + 64, _MM_HINT_T0);
        }
        AVX_UNROLL
        for (int b = 0; b < NR; b++)
            wv[b] = ld8(t, w0 + (size_t)b * wstride, i);
        AVX_UNROLL
        for (int a = 0; a < MR; a++) {
            __m256 xv = _mm256_loadu_ps(x + (size_t)a * kdim + i);

            AVX_UNROLL
            for (int b = 0; b < NR; b++)
                acc[a][b] = _mm256_fmadd_ps(xv, wv[b], acc[a][b]);
        }
    }
    for (int a = 0; a < MR; a++) {
        for (int b = 0; b < NR; b++) {
            float s = gang__avx2_hsum(acc[a][b]);

            for (size_t j = i; j < kdim; j++)
                s += x[(size_t)a * kdim + j] * gang__cpu_welem(t, w0 + (size_t)b * wstride, j);
            y[(size_t)a * ldy + (size_t)b] = scales != NULL ? s * scales[b] : s;
        }
    }
}

/* Rows [o0, o1) of W (at most GANG__AVX_WBLOCK) against every row of x. */
AVX_INLINE void wblock(gang_kernels_wtype t, size_t m, size_t kdim, const float *x,
                       const gang_kernels_weight *w, size_t o0, size_t o1, float *y, size_t ldy)
{
    size_t es = gang_kernels_wtype_size(t), ws = kdim * es;
    const char *base = w->data;
    size_t r = 0, o;

#define AVX_SC(o) (w->scales != NULL ? w->scales + (o) : NULL)
    for (; r + 4 <= m; r += 4) {
        const float *xr = x + r * kdim;

        for (o = o0; o + 2 <= o1; o += 2)
            tile(t, 4, 2, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
        if (o < o1)
            tile(t, 4, 1, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
    }
    for (; r < m; r++) {
        const float *xr = x + r * kdim;

        for (o = o0; o + 4 <= o1; o += 4)
            tile(t, 1, 4, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
        for (; o < o1; o++)
            tile(t, 1, 1, kdim, xr, base + o * ws, ws, AVX_SC(o), y + r * ldy + o, ldy);
    }
#undef AVX_SC
}

/* ---------------------------------------------------------------------------------
 * Batches of 4 rows and more: W packed into f32 panels, broadcast x.
 *
 * The dot-product tiles above load each x vector once per W row they meet; from m = 4 on
 * the kernel instead converts a panel of GANG__AVX_PANEL (16) W rows once into an f32
 * buffer laid out [k][16] (an 8 x 8 register transpose per block), and a 6 x 16 tile
 * then does 12 FMAs per k for two panel loads and six broadcasts of x: no conversion and
 * no horizontal sum in the inner loop, and the conversion is paid once per panel, not
 * once per row of x.
 * --------------------------------------------------------------------------------- */
#define GANG__AVX_PANEL 16
#define GANG__AVX_MR 6

AVX_INLINE void transpose8(__m256 r[8])
{
    __m256 t[8], u[8];

    t[0] = _mm256_unpacklo_ps(r[0], r[1]), t[1] = _mm256_unpackhi_ps(r[0], r[1]);
    t[2] = _mm256_unpacklo_ps(r[2], r[3]), t[3] = _mm256_unpackhi_ps(r[2], r[3]);
    t[4] = _mm256_unpacklo_ps(r[4], r[5]), t[5] = _mm256_unpackhi_ps(r[4], r[5]);
    t[6] = _mm256_unpacklo_ps(r[6], r[7]), t[7] = _mm256_unpackhi_ps(r[6], r[7]);
    u[0] = _mm256_shuffle_ps(t[0], t[2], _MM_SHUFFLE(1, 0, 1, 0));
    u[1] = _mm256_shuffle_ps(t[0], t[2], _MM_SHUFFLE(3, 2, 3, 2));
    u[2] = _mm256_shuffle_ps(t[1], t[3], _MM_SHUFFLE(1, 0, 1, 0));
    u[3] = _mm256_shuffle_ps(t[1], t[3], _MM_SHUFFLE(3, 2, 3, 2));
    u[4] = _mm256_shuffle_ps(t[4], t[6], _MM_SHUFFLE(1, 0, 1, 0));
    u[5] = _mm256_shuffle_ps(t[4], t[6], _MM_SHUFFLE(3, 2, 3, 2));
    u[6] = _mm256_shuffle_ps(t[5], t[7], _MM_SHUFFLE(1, 0, 1, 0));
    u[7] = _mm256_shuffle_ps(t[5], t[7], _MM_SHUFFLE(3, 2, 3, 2));
    AVX_UNROLL8
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
        r[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
    }
}

/* wt[i * 16 + j] = W[o0 + j, i] as f32 for j < nb (<= 16), 0 for nb <= j < 16. */
AVX_INLINE void pack_panel(gang_kernels_wtype t, const char *base, size_t ws, size_t kdim,
                           size_t o0, size_t nb, float *wt)
{
    for (size_t h = 0; h < 2; h++) {
        size_t j0 = h * 8, i = 0;

        if (j0 + 8 <= nb) {
            for (; i + 8 <= kdim; i += 8) {
                __m256 r[8];

                AVX_UNROLL8
                for (int j = 0; j < 8; j++)
                    r[j] = ld8(t, base + (o0 + j0 + (size_t)j) * ws, i);
                transpose8(r);
                AVX_UNROLL8
                for (int l = 0; l < 8; l++)
                    _mm256_storeu_ps(wt + (i + (size_t)l) * GANG__AVX_PANEL + j0, r[l]);
            }
        }
        for (; i < kdim; i++)
            for (size_t j = j0; j < j0 + 8; j++)
                wt[i * GANG__AVX_PANEL + j] =
                    j < nb ? gang__cpu_welem(t, base + (o0 + j) * ws, i) : 0.0f;
    }
}

/* Stores one row of a panel tile: y[0 .. nb) = (c0 | c1) (times the scales sc). */
AVX_INLINE void panel_store(__m256 c0, __m256 c1, const float *sc, size_t nb, float *y)
{
    float out[GANG__AVX_PANEL];

    if (sc != NULL) {
        c0 = _mm256_mul_ps(c0, _mm256_loadu_ps(sc));
        c1 = _mm256_mul_ps(c1, _mm256_loadu_ps(sc + 8));
    }
    if (nb == GANG__AVX_PANEL) {
        _mm256_storeu_ps(y, c0);
        _mm256_storeu_ps(y + 8, c1);
        return;
    }
    _mm256_storeu_ps(out, c0);
    _mm256_storeu_ps(out + 8, c1);
    for (size_t j = 0; j < nb; j++)
        y[j] = out[j];
}

/*
 * MR (1..6) rows of x against one packed panel: y[a, 0 .. nb). The accumulators are
 * named variables, not an array, so that they stay in registers whatever MR is (GCC
 * keeps part of an array in memory when a tile uses only some of its rows).
 */
#define PT_INIT(a) __m256 c##a##0 = _mm256_setzero_ps(), c##a##1 = _mm256_setzero_ps();
#define PT_FMA(a)                                                                                  \
    if (MR > a) {                                                                                  \
        __m256 xv = _mm256_broadcast_ss(x + (size_t)(a)*kdim + i);                                 \
        c##a##0 = _mm256_fmadd_ps(xv, w0, c##a##0);                                                \
        c##a##1 = _mm256_fmadd_ps(xv, w1, c##a##1);                                                \
    }
#define PT_STORE(a)                                                                                \
    if (MR > a)                                                                                    \
        panel_store(c##a##0, c##a##1, sc, nb, y + (size_t)(a)*ldy);

AVX_INLINE void panel_tile(const int MR, size_t kdim, const float *x, const float *wt,
                           const float *sc, size_t nb, float *y, size_t ldy, const char *pf,
                           size_t pf_lines)
{
    PT_INIT(0)
    PT_INIT(1) PT_INIT(2) PT_INIT(3) PT_INIT(4) PT_INIT(5) for (size_t i = 0; i < kdim; i++)
    {
        __m256 w0 = _mm256_load_ps(wt + i * GANG__AVX_PANEL);
        __m256 w1 = _mm256_load_ps(wt + i * GANG__AVX_PANEL + 8);

        if (i < pf_lines)
            _mm_prefetch(pf + i * 64, _MM_HINT_T0);
        PT_FMA(0) PT_FMA(1) PT_FMA(2) PT_FMA(3) PT_FMA(4) PT_FMA(5)
    }
    PT_STORE(0) PT_STORE(1) PT_STORE(2) PT_STORE(3) PT_STORE(4) PT_STORE(5)
}
#undef PT_INIT
#undef PT_FMA
#undef PT_STORE

/* One panel tile of mr (1..GANG__AVX_MR) rows: a constant MR at each call. */
AVX_INLINE void panel_tile_n(size_t mr, size_t kdim, const float *x, const float *wt,
                             const float *sc, size_t nb, float *y, size_t ldy, const char *pf,
                             size_t pf_lines)
{
    switch (mr) {
    case 6:
        panel_tile(6, kdim, x, wt, sc, nb, y, ldy, pf, pf_lines);
        break;
    case 5:
        panel_tile(5, kdim, x, wt, sc, nb, y, ldy, pf, pf_lines);
        break;
    case 4:
        panel_tile(4, kdim, x, wt, sc, nb, y, ldy, pf, pf_lines);
        break;
    case 3:
        panel_tile(3, kdim, x, wt, sc, nb, y, ldy, pf, pf_lines);
        break;
    case 2:
        panel_tile(2, kdim, x, wt, sc, nb, y, ldy, pf, pf_lines);
        break;
    default:
        panel_tile(1, kdim, x, wt, sc, nb, y, ldy, pf, pf_lines);
        break;
    }
}

/*
 * Rows [o0, o1) of W against m >= 4 rows of x through packed panels (wt: the buffer).
 *
 * Memory. Packing a panel reads its 16 W rows (16 x kdim x esize contiguous bytes) from
 * DRAM; without help the pack stalled on them (perf: ~30% of an m = 32 LM head in
 * pack_panel). The first tile of each panel therefore prefetches the next panel's bytes,
 * one cache line per k step, so they arrive while the remaining tiles compute.
 *
 * Rows. The m rows of x are cut into ceil(m / 6) tiles of balanced height (32 = 6, 6, 5,
 * 5, 5, 5, not 5 x 6 + 2): a tile of 1 or 2 rows has too few accumulators to hide the
 * FMA latency and pays a whole pass over the panel for little work.
 */
AVX_INLINE void panels(gang_kernels_wtype t, size_t m, size_t kdim, const float *x,
                       const gang_kernels_weight *w, size_t o0, size_t o1, float *y, size_t ldy,
                       float *wt)
{
    size_t es = gang_kernels_wtype_size(t), ws = kdim * es;
    size_t tiles = (m + GANG__AVX_MR - 1) / GANG__AVX_MR;

    for (size_t o = o0; o < o1; o += GANG__AVX_PANEL) {
        size_t nb = o1 - o < GANG__AVX_PANEL ? o1 - o : GANG__AVX_PANEL, r = 0;
        size_t next =
            o + nb < o1 ? (o1 - o - nb < GANG__AVX_PANEL ? o1 - o - nb : GANG__AVX_PANEL) : 0;
        size_t pf_lines = (next * ws + 63) / 64;
        const char *pf = (const char *)w->data + (o + nb) * ws;
        float sc[GANG__AVX_PANEL] = {0};
        const float *scp = w->scales != NULL ? sc : NULL;

        if (pf_lines > kdim)
            pf_lines = kdim;
        pack_panel(t, w->data, ws, kdim, o, nb, wt);
        for (size_t j = 0; w->scales != NULL && j < nb; j++)
            sc[j] = w->scales[o + j];
        for (size_t ti = 0; ti < tiles; ti++) {
            size_t mr = (m - r + (tiles - ti) - 1) / (tiles - ti);

            panel_tile_n(mr, kdim, x + r * kdim, wt, scp, nb, y + r * ldy + o, ldy, pf,
                         ti == 0 ? pf_lines : 0);
            r += mr;
        }
    }
}

/*
 * The panel buffer of the calling thread (kdim x 16 floats, 64-byte aligned), kept from
 * call to call: an aligned_alloc per call cost a malloc round trip per chunk. It grows to
 * the largest kdim seen and is freed when the thread exits (a pthread key's destructor).
 * NULL when it cannot be had: the caller falls back to the dot-product tiles.
 */
static pthread_once_t panel_once = PTHREAD_ONCE_INIT;
static pthread_key_t panel_key;
static int panel_key_ok;
static _Thread_local float *panel_buf;
static _Thread_local size_t panel_cap;

static void panel_key_make(void)
{
    panel_key_ok = pthread_key_create(&panel_key, free) == 0;
}

static float *panel_buffer(size_t kdim)
{
    size_t bytes = (kdim * GANG__AVX_PANEL * sizeof(float) + 63) / 64 * 64;
    float *p;

    if (bytes <= panel_cap)
        return panel_buf;
    pthread_once(&panel_once, panel_key_make);
    if (!panel_key_ok || (p = aligned_alloc(64, bytes)) == NULL)
        return NULL;
    if (pthread_setspecific(panel_key, p) != 0) {
        free(p);
        return NULL;
    }
    free(panel_buf);
    panel_buf = p;
    panel_cap = bytes;
    return p;
}

/* One instance per storage type, so that the element loads are resolved at compile time. */
#define AVX_ROWS(T, NAME)                                                                          \
    static void NAME(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,          \
                     size_t o0, size_t o1, float *y, size_t ldy)                                   \
    {                                                                                              \
        float *wt = m >= 4 ? panel_buffer(kdim) : NULL;                                            \
        if (wt != NULL) {                                                                          \
            panels(T, m, kdim, x, w, o0, o1, y, ldy, wt);                                          \
            return;                                                                                \
        }                                                                                          \
        for (size_t o = o0; o < o1; o += GANG__AVX_WBLOCK)                                         \
            wblock(T, m, kdim, x, w, o, o + GANG__AVX_WBLOCK < o1 ? o + GANG__AVX_WBLOCK : o1, y,  \
                   ldy);                                                                           \
    }
AVX_ROWS(GANG_KW_BF16, rows_bf16)
AVX_ROWS(GANG_KW_F16, rows_f16)
AVX_ROWS(GANG_KW_I8, rows_i8)
AVX_ROWS(GANG_KW_F32, rows_f32)
#undef AVX_ROWS

void gang__cpu_matmul_rows_avx2(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,
                                size_t o0, size_t o1, float *y, size_t ldy)
{
    switch (w->type) {
    case GANG_KW_BF16:
        rows_bf16(m, kdim, x, w, o0, o1, y, ldy);
        return;
    case GANG_KW_F16:
        rows_f16(m, kdim, x, w, o0, o1, y, ldy);
        return;
    case GANG_KW_I8:
        rows_i8(m, kdim, x, w, o0, o1, y, ldy);
        return;
    case GANG_KW_F32:
        rows_f32(m, kdim, x, w, o0, o1, y, ldy);
        return;
    default: /* block types go to gang__cpu_qmatmul */
        gang__cpu_matmul_rows_ref(m, kdim, x, w, o0, o1, y, ldy);
        return;
    }
}

#else /* no AVX2 build: the portable kernel does everything */

int gang__cpu_avx2_usable(void)
{
    return 0;
}

void gang__cpu_matmul_rows_avx2(size_t m, size_t kdim, const float *x, const gang_kernels_weight *w,
                                size_t o0, size_t o1, float *y, size_t ldy)
{
    gang__cpu_matmul_rows_ref(m, kdim, x, w, o0, o1, y, ldy);
}

#endif
