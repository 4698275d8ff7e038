/* The CPU runner's native kernels (float32, x86-64 with AVX2 and FMA):
 *
 * - skinny GEMM: y[M, N] = x[M, K] @ w[N, K]^T, the weight streamed from memory once for every
 *   M up to a block of rows (many rows on AVX-512 where the CPU has it); and its gated form
 *   for SwiGLU MLPs, y = silu(x @ g^T) * (x @ u^T), without the [M, 2N] intermediate
 *   (skinny.py);
 * - RMSNorm, with the residual add before it fused (rmsnorm.py): one call where torch's CPU
 *   rms_norm runs a handful of ops (~16 us at one row of 256 on this machine, ~3 us here);
 * - decode attention (attention.py): rotary on q and k, the chunk's K/V written to the cache,
 *   then every query over its slot's keys (causal, optionally windowed, grouped-query heads),
 *   one call per layer where the torch path takes ~20 ops.
 *
 * Why (daemon/runtime/model/skinny.py has the figures): a decode or verify pass multiplies a
 * few rows (1 to ~16) by weights far larger than the last-level cache, so its cost is reading
 * the weights. oneDNN's and MKL's kernels for so few rows reach about half of one core's
 * memory bandwidth on an AVX2 CPU and read the weights again past a handful of rows.
 *
 * Weight layout ("panels"): the N output columns in panels of NR = 16; panel p holds columns
 * 16p..16p+15 as [K][16] (w_packed[p][k][j] = w[16p + j][k]), zero-padded past N. One k step
 * of a panel is two 8-float vectors (one 64-byte line), multiplied into up to MR = 6 rows kept
 * in 12 registers. Gated: the gate's and the up projection's panels alternate (g0 u0 g1 u1 ..),
 * so the weights stay one stream and panel pair q gives output columns 16q..16q+15.
 *
 * Loops: rows in blocks of MB (the weights are read once per block), then panels, then K in
 * blocks of KB (a panel's block stays in L1 while every MR-row chunk of the row block uses it),
 * then the row chunks. Partial sums live in the output between K blocks. With one row chunk
 * the whole K is one block: the sums never leave the registers. Where the CPU has AVX-512VL a
 * chunk holds up to TR = 14 rows (32 registers), else MR = 6. Software prefetch: several
 * chunks each prefetch a share of the next block, so that memory stays busy while a block's
 * later chunks compute from L1. One chunk (single_prefetch): 1 row leaves it to the
 * hardware; 2 to NTA_MAX_ROWS rows where a panel fills 5/8 of L2 (a down projection, K >=
 * 10240 with 1 MB of L2; and 2 or 3 rows whose x leaves L1) prefetch NTA_DIST lines ahead
 * non-temporally, so that the weights stream past L2 and x stays there (else they evict it
 * and x comes from L3); else 5 rows or more, and 3 or 4 where a panel is longer than FAR_DIST
 * lines, prefetch FAR_DIST lines (16 KB) ahead into L2, 3 to 5 rows in a block of six
 * (micro5_as6 and its kin: the extra rows repeat the last, their sums dropped).
 *
 * Measured on a Zen 4 EPYC, one thread. The wide bench target's MLPs (302 MB; a plain read of
 * them: 10.3 ms), ms per pass at 1 / 4 / 7 / 9 rows: 16 lines ahead for every chunk 12.9 /
 * 14.0 / 15.6 / 20.4 (9 rows: 5 + 4), no prefetch 10.6 / 13.7 / 18.0 / 21.9, far only
 * 10.1-11.2 / 12.8-13.7 / 12.0-13.5 / 14.0-14.3 (9 rows: one chunk); interleaved in one
 * process, far only / with the non-temporal stream at 2 / 3 / 4 / 5 rows: 11.6-11.8 /
 * 12.1-12.3 / 12.8-13.4 / 13.2-13.4 against 10.4-10.5 / 10.6-10.7 / 11.2-11.5 / 12.5-12.6
 * (the down projections alone, 200 MB: 9.5-10.7 against 7.1-7.9 at 2-5 rows). 200 MB of
 * weights (12 x 16 MB) with K from 256 to 16384, interleaved: the non-temporal stream wins for
 * 2 rows whose x leaves L1 (7.5-7.7 ms) and for 2-5 rows from K = 10240 (7.5-9.2 against
 * 8.8-9.4 far), but loses for 4-6 rows at K = 512-8192 (8.2-10.8 against 7.5-8.6 far in a
 * block of six); far in blocks of their own height, 3 / 4 / 5 rows at K = 512-1024 took
 * 10.0-10.4 / 10.5-11.4 / 11.1-12.2 ms (a block of six: 7.5-9.0). Before and after these
 * rules, interleaved: one decoder layer of Llama 3 8B's shapes (872 MB) at 3 / 4 / 5 / 6 rows
 * 36.9 / 39.5 / 42.2 / 44.4 -> 36.1 / 35.5 / 36.3 / 36.1 ms (1 row: 29.4-29.8); the narrow
 * bench target's pass at 3 / 4 / 5 tokens 5.0 / 5.6 / 5.2 -> 4.6 / 4.9 / 4.7 ms (1: 3.9); the
 * wide one's at 5 tokens 14.3 -> 13.1 (1: 11.1-11.2). Weights that stay in L2 pay for a block
 * of six's extra FMAs (3-4 rows over 768 KB: 32-33 -> 38 us); the demo drafter's step did not
 * slow (its GEMMs are a fraction of it). Why a block of six is faster is not known (no
 * performance counters there): it costs 6 cycles of FMAs a 64-byte line against the memory's
 * ~7.6, so it may pace its loads near the memory's rate; a CPU whose core streams a line
 * every 4 cycles would find it FMA-bound. Past ~8 rows a pass is bound by the FMAs, not the
 * memory: 9 rows take 9 cycles a 64-byte line.
 *
 * 512-bit register blocks (the caller's zmm: AMD Zen 5, which runs AVX-512 at full width; not
 * Zen 4): the blocks above in zmm registers, one FMA a row and k step where two ymm FMAs were,
 * and their own prefetch (zmm_prefetch): non-temporal for up to ZMM_NTA_MAX_ROWS rows on any
 * shape, far past them. Measured on a Zen 5 EPYC (family 26, 1 MB L2, 32 MB L3), one thread,
 * a plain read of the wide target's MLPs (302 MB) 7.5-7.9 ms, ymm blocks with the rules above
 * / zmm blocks, interleaved in one process, ms per pass at 1 / 2 / 4 / 6 / 8 / 9 / 10 / 12
 * rows: 7.8 / 8.1 / 8.7 / 8.2 / 10.2 / 11.4 / 12.2 / 14.7 -> 7.2 / 7.2 / 7.3 / 7.6 / 7.7 /
 * 8.1 / 8.4 / 10.8; one Llama 3 8B layer (872 MB; read: 22.8 ms) 23.8 / 24.9 / 23.0 / 26.9 /
 * 28.3 / 31.8 / 34.8 / 40.8 -> 23.0 / 22.5 / 21.9 / 26.3 / 23.9 / 24.2 / 24.5 / 29.7. There the
 * non-temporal stream won at 1-9 rows over far and hardware prefetch at every shape (zmm
 * blocks, 9 rows of Llama's layer: 23.2 against 23.4 far, 44.0 hardware; ymm blocks, 2 rows:
 * 22.5 against 24.1 far), unlike on Zen 4; from 10 rows far wins by 1-6%. Past ~10 rows a
 * pass is bound by the FMAs again (12 rows: 6 cycles of 512-bit FMAs a line).
 *
 * Many rows on AVX-512 (a block of at least the caller's wide_min rows, where the CPU has
 * AVX-512F): the block's x packed once, then two panels at a time in zmm registers (the
 * WIDE_MICRO kernels below). The same sums in the same order as the AVX2 path: the same bits.
 *
 * Threads: the panels (pairs) are split into contiguous ranges, one per thread (pthreads
 * created per call; only worth it for large weights, which the caller decides). The GIL is
 * released.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#define NATIVE_X86 1
#include <immintrin.h>
#include <pthread.h>
#endif

#define NR 16         /* output columns per panel: two AVX2 vectors */
#define MR 6          /* rows per register block: 12 accumulators */
#define TR 14         /* ... with AVX-512VL's 32 registers: 28 accumulators */
#define KB 64         /* K per block when several row chunks share a panel block (4 KB) */
#define KB_MANY 256   /* ... and when 8 or more do (a prefill: compute-bound, fewer passes) */
#define MB 96         /* rows per block: the weights are streamed once per block */
#define FAR_DIST 256  /* lines (16 KB) a single chunk prefetches ahead (single_prefetch) */
#define NTA_DIST 128  /* lines (8 KB) ... non-temporally */
#define NTA_MAX_ROWS 6
#define NTA_L2_EIGHTHS 5 /* ... where a panel takes 5/8 of L2 or more */
#define ZMM_NTA_MAX_ROWS 9 /* ... every panel, in 512-bit registers (zmm_prefetch) */
#define X_L1_BYTES (32 << 10)
#define MAX_THREADS 64
#define WR 12         /* rows per register block of the AVX-512 path: 2 x 12 accumulators */
#define WKB 128       /* its K per block: a panel pair's block (16 KB), a chunk's x (6 KB) in L1 */
#define BMAX_PANELS 4 /* panels per block of the block maxima: 64 columns (gumbel_field.BLOCK) */
#define ABI_VERSION 20 /* native.py checks it: a stale build is not used */

typedef struct {
    const float *x;   /* [M, ldx] */
    int64_t ldx;
    const float *w;   /* [P, K, NR] (gated: P = 2 x the output's panels) */
    float *y;         /* [M, ldy] */
    int64_t ldy;
    int64_t m, n, k;  /* n: output columns */
    int64_t p0, p1;   /* this thread's output panels [p0, p1) */
    int gated;
    float *bmax;      /* NULL, or [M, ceil(n / 64)]: each row's max over every 64 columns */
    int64_t wide_min; /* a row block of at least this many rows takes the AVX-512 path (0: never) */
    int64_t chunk_max; /* rows per register block of the AVX2-width path: MR, or TR (AVX-512VL) */
    int big_panels;    /* a panel takes NTA_L2_EIGHTHS / 8 of L2 or more */
    int zmm;           /* register blocks in 512-bit registers (ZMICROS; the caller's zmm) */
} Job;

#ifdef NATIVE_X86

/* One register block: rows x[0..mr) times a panel's kn k steps, added to c (load) or into a
 * fresh sum (!load); c[i * ldc + j] for j < 16. Written out per row count with named
 * accumulators: GCC keeps an array of vectors in memory, storing it at every k step. */
#define ROW_INIT(i)                                                                         \
    __m256 s##i##a = _mm256_setzero_ps(), s##i##b = _mm256_setzero_ps();                    \
    if (load) {                                                                             \
        s##i##a = _mm256_loadu_ps(c + (i) * ldc);                                           \
        s##i##b = _mm256_loadu_ps(c + (i) * ldc + 8);                                       \
    }
#define ROW_FMA(i)                                                                          \
    {                                                                                       \
        const __m256 b = _mm256_broadcast_ss(x + (i) * ldx + k);                            \
        s##i##a = _mm256_fmadd_ps(b, w0, s##i##a);                                          \
        s##i##b = _mm256_fmadd_ps(b, w1, s##i##b);                                          \
    }
#define ROW_STORE(i)                                                                        \
    _mm256_storeu_ps(c + (i) * ldc, s##i##a);                                               \
    _mm256_storeu_ps(c + (i) * ldc + 8, s##i##b);
#define ROWS1(F) F(0)
#define ROWS2(F) ROWS1(F) F(1)
#define ROWS3(F) ROWS2(F) F(2)
#define ROWS4(F) ROWS3(F) F(3)
#define ROWS5(F) ROWS4(F) F(4)
#define ROWS6(F) ROWS5(F) F(5)
#define YMM_W                                                                               \
    const __m256 w0 = _mm256_loadu_ps(w + k * NR);                                          \
    const __m256 w1 = _mm256_loadu_ps(w + k * NR + 8);
/* A register block's kernel: ROWS of x times kn k steps of a panel, with the registers' INIT,
 * W (the k step's weights), FMA and STORE (the ymm ones above, the zmm ones below). */
#define BLOCK_FOR(TARGET, NAME, ROWS, INIT, W, FMA, STORE)                                  \
    __attribute__((target(TARGET))) static void NAME(                                       \
        const float *x, int64_t ldx, const float *w, int64_t kn, float *c, int64_t ldc,     \
        int load, const float *pf, int pf_shift, const float *far, const float *nta)        \
    {                                                                                       \
        ROWS(INIT)                                                                          \
        for (int64_t k = 0; k < kn; k++) {                                                  \
            if (pf) _mm_prefetch((const char *)(pf + (k >> pf_shift) * NR), _MM_HINT_T0);   \
            if (far) _mm_prefetch((const char *)(far + k * NR), _MM_HINT_T1);               \
            if (nta) _mm_prefetch((const char *)(nta + k * NR), _MM_HINT_NTA);              \
            W                                                                               \
            ROWS(FMA)                                                                       \
        }                                                                                   \
        ROWS(STORE)                                                                         \
    }
#define MICRO_FOR(TARGET, NAME, ROWS)                                                       \
    BLOCK_FOR(TARGET, NAME, ROWS, ROW_INIT, YMM_W, ROW_FMA, ROW_STORE)
#define MICRO(NAME, ROWS) MICRO_FOR("avx2,fma", NAME, ROWS)
MICRO(micro1, ROWS1)
MICRO(micro2, ROWS2)
MICRO(micro3, ROWS3)
MICRO(micro4, ROWS4)
MICRO(micro5, ROWS5)
MICRO(micro6, ROWS6)

/* Taller blocks where the CPU has AVX-512VL: the same 256-bit FMAs in the same order, but 32
 * vector registers hold up to TR = 14 rows' 28 accumulators, so 7 to 14 rows (a batch-1
 * verify of 6 to 13 drafts) take one pass over a panel where 16 registers take two. */
#define ROWS7(F) ROWS6(F) F(6)
#define ROWS8(F) ROWS7(F) F(7)
#define ROWS9(F) ROWS8(F) F(8)
#define ROWS10(F) ROWS9(F) F(9)
#define ROWS11(F) ROWS10(F) F(10)
#define ROWS12(F) ROWS11(F) F(11)
#define ROWS13(F) ROWS12(F) F(12)
#define ROWS14(F) ROWS13(F) F(13)
#define TALL(NAME, ROWS) MICRO_FOR("avx512f,avx512vl,avx2,fma", NAME, ROWS)
TALL(tall7, ROWS7)
TALL(tall8, ROWS8)
TALL(tall9, ROWS9)
TALL(tall10, ROWS10)
TALL(tall11, ROWS11)
TALL(tall12, ROWS12)
TALL(tall13, ROWS13)
TALL(tall14, ROWS14)

/* The same blocks in 512-bit registers, for a CPU that runs AVX-512 at full width (AMD Zen 5;
 * not Zen 4, which splits a 512-bit FMA in two): a panel's 16 columns are one zmm register, so
 * a k step costs a row one FMA where the blocks above cost two. Each lane's sum takes the same
 * FMAs in the same order: the same bits. On Zen 5 a batch-1 pass of 7 to 10 rows is then
 * bound by the memory, not the FMAs (the header comment has the figures). */
#define Z_INIT(i) __m512 z##i = load ? _mm512_loadu_ps(c + (i) * ldc) : _mm512_setzero_ps();
#define Z_FMA(i) z##i = _mm512_fmadd_ps(_mm512_set1_ps(x[(i) * ldx + k]), w0, z##i);
#define Z_STORE(i) _mm512_storeu_ps(c + (i) * ldc, z##i);
#define ZMM_W const __m512 w0 = _mm512_loadu_ps(w + k * NR);
#define ZMICRO(NAME, ROWS)                                                                  \
    BLOCK_FOR("avx512f,avx2,fma", NAME, ROWS, Z_INIT, ZMM_W, Z_FMA, Z_STORE)
ZMICRO(zmicro1, ROWS1)
ZMICRO(zmicro2, ROWS2)
ZMICRO(zmicro3, ROWS3)
ZMICRO(zmicro4, ROWS4)
ZMICRO(zmicro5, ROWS5)
ZMICRO(zmicro6, ROWS6)
ZMICRO(zmicro7, ROWS7)
ZMICRO(zmicro8, ROWS8)
ZMICRO(zmicro9, ROWS9)
ZMICRO(zmicro10, ROWS10)
ZMICRO(zmicro11, ROWS11)
ZMICRO(zmicro12, ROWS12)
ZMICRO(zmicro13, ROWS13)
ZMICRO(zmicro14, ROWS14)

/* 3 to 5 rows in a block of six, the rows past the last repeating it and their sums dropped:
 * the same bits for the rows kept. A single chunk that prefetches far runs faster so (the
 * header comment has the figures); only that path uses these. */
#define ROW_FMA_REPEAT(i, FROM)                                                             \
    {                                                                                       \
        const __m256 b = _mm256_broadcast_ss(x + (FROM) * ldx + k);                         \
        s##i##a = _mm256_fmadd_ps(b, w0, s##i##a);                                          \
        s##i##b = _mm256_fmadd_ps(b, w1, s##i##b);                                          \
    }
#define ROW_ZERO(i) __m256 s##i##a = _mm256_setzero_ps(), s##i##b = _mm256_setzero_ps();
#define ROW_KEEP(i) __asm__ volatile("" : : "x"(s##i##a), "x"(s##i##b)); /* not stored */
#define AS_SIX(NAME, ROWS, EXTRA_ZERO, EXTRA_FMA, EXTRA_KEEP)                               \
    __attribute__((target("avx2,fma"))) static void NAME(                                   \
        const float *x, int64_t ldx, const float *w, int64_t kn, float *c, int64_t ldc,     \
        int load, const float *far)                                                         \
    {                                                                                       \
        ROWS(ROW_INIT)                                                                      \
        EXTRA_ZERO                                                                          \
        for (int64_t k = 0; k < kn; k++) {                                                  \
            _mm_prefetch((const char *)(far + k * NR), _MM_HINT_T1);                        \
            const __m256 w0 = _mm256_loadu_ps(w + k * NR);                                  \
            const __m256 w1 = _mm256_loadu_ps(w + k * NR + 8);                              \
            ROWS(ROW_FMA)                                                                   \
            EXTRA_FMA                                                                       \
        }                                                                                   \
        ROWS(ROW_STORE)                                                                     \
        EXTRA_KEEP                                                                          \
    }
AS_SIX(micro5_as6, ROWS5, ROW_ZERO(5), ROW_FMA_REPEAT(5, 4), ROW_KEEP(5))
AS_SIX(micro4_as6, ROWS4, ROW_ZERO(4) ROW_ZERO(5), ROW_FMA_REPEAT(4, 3) ROW_FMA_REPEAT(5, 3),
       ROW_KEEP(4) ROW_KEEP(5))
AS_SIX(micro3_as6, ROWS3, ROW_ZERO(3) ROW_ZERO(4) ROW_ZERO(5),
       ROW_FMA_REPEAT(3, 2) ROW_FMA_REPEAT(4, 2) ROW_FMA_REPEAT(5, 2),
       ROW_KEEP(3) ROW_KEEP(4) ROW_KEEP(5))
typedef void (*AsSixFn)(const float *, int64_t, const float *, int64_t, float *, int64_t, int,
                        const float *);
static const AsSixFn AS_SIXES[6] = {NULL, NULL, NULL, micro3_as6, micro4_as6, micro5_as6};

typedef void (*MicroFn)(const float *, int64_t, const float *, int64_t, float *, int64_t, int,
                        const float *, int, const float *, const float *);
static const MicroFn MICROS[TR + 1] = {NULL,   micro1, micro2, micro3, micro4, micro5,
                                       micro6, tall7,  tall8,  tall9,  tall10, tall11,
                                       tall12, tall13, tall14};
static const MicroFn ZMICROS[TR + 1] = {NULL,     zmicro1,  zmicro2,  zmicro3,  zmicro4,
                                        zmicro5,  zmicro6,  zmicro7,  zmicro8,  zmicro9,
                                        zmicro10, zmicro11, zmicro12, zmicro13, zmicro14};

/* exp(x) lane by lane: Cephes' expf (range reduction by ln 2 in two parts, degree-5
 * polynomial), within 2 ulp of expf; inputs clamped to +-88.38 (no inf, no NaN from it).
 * One body for both widths (V: _mm256 or _mm512), so that they give the same bits. */
#define EXP_BODY(V, FLOOR, CAST)                                                            \
    x = V##_min_ps(V##_max_ps(x, V##_set1_ps(-88.3762626647949f)),                          \
                   V##_set1_ps(88.3762626647949f));                                         \
    fx = FLOOR(V##_fmadd_ps(x, V##_set1_ps(1.44269504088896341f), V##_set1_ps(0.5f)));       \
    x = V##_fnmadd_ps(fx, V##_set1_ps(0.693359375f), x);                                    \
    x = V##_fnmadd_ps(fx, V##_set1_ps(-2.12194440e-4f), x);                                 \
    y = V##_set1_ps(1.9875691500e-4f);                                                      \
    y = V##_fmadd_ps(y, x, V##_set1_ps(1.3981999507e-3f));                                  \
    y = V##_fmadd_ps(y, x, V##_set1_ps(8.3334519073e-3f));                                  \
    y = V##_fmadd_ps(y, x, V##_set1_ps(4.1665795894e-2f));                                  \
    y = V##_fmadd_ps(y, x, V##_set1_ps(1.6666665459e-1f));                                  \
    y = V##_fmadd_ps(y, x, V##_set1_ps(5.0000001201e-1f));                                  \
    y = V##_fmadd_ps(y, V##_mul_ps(x, x), V##_add_ps(x, V##_set1_ps(1.0f)));                \
    return V##_mul_ps(                                                                      \
        y, CAST(V##_slli_epi32(V##_add_epi32(V##_cvttps_epi32(fx), V##_set1_epi32(127)), 23)));

/* 8 floats (AVX2) */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x)
{
    __m256 fx, y;
    EXP_BODY(_mm256, _mm256_floor_ps, _mm256_castsi256_ps)
}

/* silu(g) * u = g / (1 + exp(-g)) * u, 8 floats. */
__attribute__((target("avx2,fma"))) static inline __m256 swiglu8(__m256 g, __m256 u)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
}

/* dst[i][0..width) = silu(gate) * up of the tiles' row i (NR floats a row), i < rows */
__attribute__((target("avx2,fma"))) static void swiglu_tiles(const float *tile_a,
                                                            const float *tile_b, int64_t rows,
                                                            float *dst, int64_t ldy, int64_t width)
{
    for (int64_t i = 0; i < rows; i++) {
        float out[NR];
        _mm256_storeu_ps(out, swiglu8(_mm256_loadu_ps(tile_a + i * NR),
                                      _mm256_loadu_ps(tile_b + i * NR)));
        _mm256_storeu_ps(out + 8, swiglu8(_mm256_loadu_ps(tile_a + i * NR + 8),
                                          _mm256_loadu_ps(tile_b + i * NR + 8)));
        memcpy(dst + i * ldy, out, (size_t)width * sizeof(float));
    }
}

/* dst[i][0..width) = the tile's row i (NR floats a row): a partial last panel, i < rows */
static void copy_tile(const float *tile, int64_t rows, float *dst, int64_t ldy, int64_t width)
{
    for (int64_t i = 0; i < rows; i++) memcpy(dst + i * ldy, tile + i * NR, (size_t)width * 4);
}

/* The last-level-but-one cache (L2) in bytes; 1 MB where the C library cannot tell. */
static int64_t l2_bytes(void)
{
    static int64_t cached = 0; /* a race writes the same value */
    if (cached == 0) {
        const long got = sysconf(_SC_LEVEL2_CACHE_SIZE);
        cached = got > 0 ? got : 1 << 20;
    }
    return cached;
}

typedef enum { PF_HARDWARE, PF_FAR, PF_NTA } Prefetch;

/* The software prefetch of a single chunk of mr rows (the header comment has the figures):
 * none for 1 row; non-temporal for 2 to NTA_MAX_ROWS rows where a panel takes
 * NTA_L2_EIGHTHS / 8 of L2 or more (a down projection: K >= 10240 with 1 MB of L2; x then
 * stays in L2), and for 2 or 3 rows whose x leaves L1; far for 5 rows or more, and for 3 or 4
 * where a panel is longer than FAR_DIST lines; else none. Whether the weights come from
 * memory is not asked: a GEMM's own weights may fit in L2 while the model's do not (the
 * narrow bench target: 30 layers of 0.3-1.4 MB GEMMs). */
static Prefetch single_prefetch(const Job *job, int64_t mr)
{
    if (mr < 2) return PF_HARDWARE;
    if (mr <= NTA_MAX_ROWS && (job->big_panels || (mr <= 3 && mr * job->k * 4 > X_L1_BYTES))) {
        return PF_NTA;
    }
    if (mr >= 5 || (mr >= 3 && job->k > FAR_DIST)) return PF_FAR;
    return PF_HARDWARE;
}

/* The software prefetch of a single chunk of mr rows in 512-bit registers (measured on Zen 5,
 * the header comment has the figures): non-temporal for up to ZMM_NTA_MAX_ROWS rows, whatever
 * the shape; far past them. */
static Prefetch zmm_prefetch(int64_t mr) { return mr <= ZMM_NTA_MAX_ROWS ? PF_NTA : PF_FAR; }

/* The rows [m0, m0 + rows) times one panel wp, into c (ldc floats a row). */
__attribute__((target("avx2,fma"))) static void panel_product(const Job *job, const float *wp,
                                                             int64_t m0, int64_t rows, float *c,
                                                             int64_t ldc)
{
    const int64_t K = job->k;
    const int64_t num_chunks = (rows + job->chunk_max - 1) / job->chunk_max;
    const int64_t kb = num_chunks == 1 ? K : num_chunks >= 8 ? KB_MANY : KB;
    int shift = 0; /* chunks share a block's prefetches: 2^shift >= num_chunks */
    while (((int64_t)1 << shift) < num_chunks) shift++;
    /* chunks of near-equal size (7 rows: 4 + 3, not 6 + 1): a chunk of r rows keeps 2 r
     * accumulators, and fewer than 4 wait on the FMA's latency, so 6 + 1 costs a k step
     * 6 + 4 cycles where 4 + 3 costs 4 + 4 */
    const int64_t base = rows / num_chunks, extra = rows % num_chunks;
    for (int64_t k0 = 0; k0 < K; k0 += kb) {
        const int64_t kn = K - k0 < kb ? K - k0 : kb;
        const float *wb = wp + k0 * NR;
        for (int64_t chunk = 0, i = 0; chunk < num_chunks; chunk++) {
            const int mr = (int)(base + (chunk < extra));
            /* the weights are one contiguous stream: several chunks each prefetch their
             * share of the next block (pf); one chunk as single_prefetch says */
            const float *pf = num_chunks == 1 ? NULL : wb + (kn + chunk * (kn >> shift)) * NR;
            const Prefetch how = num_chunks > 1 ? PF_HARDWARE
                                 : job->zmm     ? zmm_prefetch(mr)
                                                : single_prefetch(job, mr);
            const float *x = job->x + (m0 + i) * job->ldx + k0;
            if (!job->zmm && how == PF_FAR && mr >= 3 && mr < 6) {
                AS_SIXES[mr](x, job->ldx, wb, kn, c + i * ldc, ldc, k0 > 0, wb + FAR_DIST * NR);
            } else {
                const MicroFn micro = (job->zmm ? ZMICROS : MICROS)[mr];
                micro(x, job->ldx, wb, kn, c + i * ldc, ldc, k0 > 0, pf, shift,
                      how == PF_FAR ? wb + FAR_DIST * NR : NULL,
                      how == PF_NTA ? wb + NTA_DIST * NR : NULL);
            }
            i += mr;
        }
    }
}

/* The max of n floats; NaN where one is (amax's rule); -inf for none. */
__attribute__((target("avx2,fma"))) static float max_of(const float *x, int64_t n)
{
    __m256 top8 = _mm256_set1_ps(-INFINITY), nan8 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        top8 = _mm256_max_ps(top8, v);
        nan8 = _mm256_or_ps(nan8, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, top8);
    for (int l = 0; l < 8; l++) top = lanes[l] > top ? lanes[l] : top;
    int has_nan = _mm256_movemask_ps(nan8) != 0;
    for (; j < n; j++) {
        has_nan |= x[j] != x[j];
        top = x[j] > top ? x[j] : top;
    }
    return has_nan ? NAN : top;
}

/* bmax[i][b] = max of y[i][64 b .. 64 b + width) for the rows [m0, m0 + rows), read right
 * after the block's panels were written (in cache). NaN where the block holds one (amax's
 * rule). */
__attribute__((target("avx2,fma"))) static void block_maxima(const Job *job, int64_t m0,
                                                             int64_t rows, int64_t b)
{
    const int64_t col = b * BMAX_PANELS * NR;
    const int64_t width = job->n - col < BMAX_PANELS * NR ? job->n - col : BMAX_PANELS * NR;
    const int64_t nb = (job->n + BMAX_PANELS * NR - 1) / (BMAX_PANELS * NR);
    for (int64_t i = 0; i < rows; i++) {
        job->bmax[(m0 + i) * nb + b] = max_of(job->y + (m0 + i) * job->ldy + col, width);
    }
}

/* ---- Many rows (a prefill, a verify pass of many sequences) on AVX-512 ----
 * Past a few dozen rows a pass is bound by the multiply-adds, not by reading the weights, and
 * the AVX2 register block above (6 rows x 16 columns) tops out near 20 flops a cycle where
 * oneDNN's AVX-512 kernels reach 30-40. This path packs the row block's x once as
 * [chunk][K][WR] (a k step of a chunk's rows is one run of at most 48 bytes, so the broadcasts
 * read L1 in order), then runs two panels at a time: up to 12 rows x 2 panels = 24 zmm
 * accumulators, per k step 2 weight loads and 12 broadcasts for 24 FMAs. The pair is a gated
 * weight's gate and up panels of the same columns (silu(gate) * up as the epilogue, as
 * above), else two neighbouring panels. Chunks have near-equal sizes, as above. */
#define W_INIT(i)                                                                           \
    __m512 a##i = _mm512_setzero_ps(), b##i = _mm512_setzero_ps();                          \
    if (load) {                                                                             \
        a##i = _mm512_loadu_ps(ca + (i) * lda);                                             \
        if (two) b##i = _mm512_loadu_ps(cb + (i) * ldb);                                    \
    }
#define W_FMA(i)                                                                            \
    {                                                                                       \
        const __m512 xb = _mm512_set1_ps(xk[i]);                                            \
        a##i = _mm512_fmadd_ps(xb, wa_k, a##i);                                             \
        b##i = _mm512_fmadd_ps(xb, wb_k, b##i);                                             \
    }
#define W_STORE(i)                                                                          \
    _mm512_storeu_ps(ca + (i) * lda, a##i);                                                 \
    if (two) _mm512_storeu_ps(cb + (i) * ldb, b##i);

/* The chunk's rows xp [kn][WR] (its first ROWS of each WR) times panels wa and wb (wb = wa
 * for one panel: two = 0) over kn k steps, into ca / cb (rows lda / ldb floats apart), added
 * to them (load) or fresh. pfa / pfb: this chunk's share of the next block to prefetch. */
#define WIDE_MICRO(NAME, ROWS)                                                              \
    __attribute__((target("avx512f,avx2,fma"))) static void NAME(                           \
        const float *xp, const float *wa, const float *wb, int64_t kn, float *ca,           \
        int64_t lda, float *cb, int64_t ldb, int two, int load, const float *pfa,           \
        const float *pfb, int pf_shift)                                                     \
    {                                                                                       \
        ROWS(W_INIT)                                                                        \
        for (int64_t k = 0; k < kn; k++) {                                                  \
            _mm_prefetch((const char *)(pfa + (k >> pf_shift) * NR), _MM_HINT_T0);           \
            _mm_prefetch((const char *)(pfb + (k >> pf_shift) * NR), _MM_HINT_T0);           \
            const __m512 wa_k = _mm512_loadu_ps(wa + k * NR);                               \
            const __m512 wb_k = _mm512_loadu_ps(wb + k * NR);                               \
            const float *xk = xp + k * WR;                                                  \
            ROWS(W_FMA)                                                                     \
        }                                                                                   \
        ROWS(W_STORE)                                                                       \
    }
WIDE_MICRO(wide1, ROWS1)
WIDE_MICRO(wide2, ROWS2)
WIDE_MICRO(wide3, ROWS3)
WIDE_MICRO(wide4, ROWS4)
WIDE_MICRO(wide5, ROWS5)
WIDE_MICRO(wide6, ROWS6)
WIDE_MICRO(wide7, ROWS7)
WIDE_MICRO(wide8, ROWS8)
WIDE_MICRO(wide9, ROWS9)
WIDE_MICRO(wide10, ROWS10)
WIDE_MICRO(wide11, ROWS11)
WIDE_MICRO(wide12, ROWS12)

typedef void (*WideFn)(const float *, const float *, const float *, int64_t, float *, int64_t,
                       float *, int64_t, int, int, const float *, const float *, int);
static const WideFn WIDES[WR + 1] = {NULL,   wide1, wide2, wide3, wide4,  wide5, wide6,
                                     wide7,  wide8, wide9, wide10, wide11, wide12};

/* A row block's chunks: near-equal sizes of at most WR rows (16 rows: 8 + 8, not 12 + 4). */
static inline int64_t wide_chunks(int64_t rows) { return (rows + WR - 1) / WR; }
static inline int64_t wide_chunk_start(int64_t rows, int64_t c)
{
    const int64_t n = wide_chunks(rows);
    return rows / n * c + (c < rows % n ? c : rows % n);
}

/* x rows [m0, m0 + rows) packed as [chunk][K][WR]: chunk c's rows in the first lanes of each
 * k step (its size: wide_chunk_start(c + 1) - wide_chunk_start(c)). */
static void wide_pack(const Job *job, int64_t m0, int64_t rows, float *xp)
{
    const int64_t K = job->k, chunks = wide_chunks(rows);
    for (int64_t c = 0; c < chunks; c++) {
        float *dst = xp + c * K * WR;
        const int64_t r0 = wide_chunk_start(rows, c), r1 = wide_chunk_start(rows, c + 1);
        for (int64_t row = r0; row < r1; row++) {
            const float *src = job->x + (m0 + row) * job->ldx;
            for (int64_t k = 0; k < K; k++) dst[k * WR + row - r0] = src[k];
        }
    }
}

/* Panels wa (and wb where two) times the packed rows, into ca / cb: K in blocks of WKB, the
 * row chunks inside (a block of the panels stays in L1 while every chunk uses it). */
__attribute__((target("avx512f,avx2,fma"))) static void wide_pair(
    const Job *job, const float *xp, int64_t rows, const float *wa, const float *wb, int two,
    float *ca, int64_t lda, float *cb, int64_t ldb)
{
    const int64_t K = job->k, chunks = wide_chunks(rows);
    int shift = 0;
    while (((int64_t)1 << shift) < chunks) shift++;
    for (int64_t k0 = 0; k0 < K; k0 += WKB) {
        const int64_t kn = K - k0 < WKB ? K - k0 : WKB;
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t r0 = wide_chunk_start(rows, c);
            const int64_t ahead = (kn + c * (kn >> shift)) * NR; /* the next block's share */
            WIDES[wide_chunk_start(rows, c + 1) - r0](
                xp + c * K * WR + k0 * WR, wa + k0 * NR, wb + k0 * NR, kn, ca + r0 * lda, lda,
                cb + r0 * ldb, ldb, two, k0 > 0, wa + k0 * NR + ahead, wb + k0 * NR + ahead,
                shift);
        }
    }
}

/* run_block's work for a row block on the AVX-512 path (xp: the block's rows, packed). */
__attribute__((target("avx512f,avx2,fma"))) static void wide_block(
    const Job *job, int64_t m0, int64_t rows, const float *xp, float *tile_a, float *tile_b)
{
    const int64_t K = job->k;
    for (int64_t p = job->p0; p < job->p1;) {
        const int64_t col = p * NR;
        const int64_t width = job->n - col < NR ? job->n - col : NR;
        float *dst = job->y + m0 * job->ldy + col;
        int64_t done = 1;
        if (job->gated) {
            wide_pair(job, xp, rows, job->w + 2 * p * K * NR, job->w + (2 * p + 1) * K * NR, 1,
                      tile_a, NR, tile_b, NR);
            swiglu_tiles(tile_a, tile_b, rows, dst, job->ldy, width);
        } else if (width < NR) {
            const float *wp = job->w + p * K * NR;
            wide_pair(job, xp, rows, wp, wp, 0, tile_a, NR, tile_a, NR);
            copy_tile(tile_a, rows, dst, job->ldy, width);
        } else {
            /* two whole panels where the next one is whole and this thread's, and both fall in
             * one block of the block maxima (a block's maxima are taken once it is complete) */
            const int two = p + 1 < job->p1 && job->n - col >= 2 * NR &&
                            (!job->bmax || (p + 1) % BMAX_PANELS != 0);
            const float *wp = job->w + p * K * NR;
            wide_pair(job, xp, rows, wp, two ? wp + K * NR : wp, two, dst, job->ldy,
                      dst + NR, job->ldy);
            done = two ? 2 : 1;
        }
        for (int64_t q = p; q < p + done; q++) {
            if (job->bmax && ((q + 1) % BMAX_PANELS == 0 || (q + 1) * NR >= job->n)) {
                block_maxima(job, m0, rows, q / BMAX_PANELS);
            }
        }
        p += done;
    }
}

/* Output panels [p0, p1) for rows [m0, m0 + rows). Plain: full panels straight into y, the
 * last partial one through tile and copied out. Gated: each pair through two tiles, then
 * silu(gate) * up into y. Tiles hold MB x NR floats. */
__attribute__((target("avx2,fma"))) static void run_block(const Job *job, int64_t m0,
                                                         int64_t rows, float *tile_a,
                                                         float *tile_b)
{
    const int64_t K = job->k;
    for (int64_t p = job->p0; p < job->p1; p++) {
        const int64_t col = p * NR;
        const int64_t width = job->n - col < NR ? job->n - col : NR;
        float *dst = job->y + m0 * job->ldy + col;
        if (job->gated) {
            panel_product(job, job->w + 2 * p * K * NR, m0, rows, tile_a, NR);
            panel_product(job, job->w + (2 * p + 1) * K * NR, m0, rows, tile_b, NR);
            swiglu_tiles(tile_a, tile_b, rows, dst, job->ldy, width);
        } else if (width < NR) {
            panel_product(job, job->w + p * K * NR, m0, rows, tile_a, NR);
            copy_tile(tile_a, rows, dst, job->ldy, width);
        } else {
            panel_product(job, job->w + p * K * NR, m0, rows, dst, job->ldy);
        }
        if (job->bmax && ((p + 1) % BMAX_PANELS == 0 || col + NR >= job->n)) {
            block_maxima(job, m0, rows, p / BMAX_PANELS);
        }
    }
}

static void *run_job(void *arg)
{
    const Job *job = (const Job *)arg;
    float tile_a[MB * NR], tile_b[MB * NR];
    float *xp = NULL; /* the AVX-512 path's packed rows: [ceil(MB / WR)][K][WR] */
    if (job->wide_min > 0 && job->m >= job->wide_min && job->p0 < job->p1) {
        const size_t bytes = (size_t)((MB + WR - 1) / WR) * WR * job->k * sizeof(float);
        xp = aligned_alloc(64, (bytes + 63) / 64 * 64); /* NULL: the AVX2 path does it all */
    }
    for (int64_t m0 = 0; m0 < job->m; m0 += MB) {
        const int64_t rows = job->m - m0 < MB ? job->m - m0 : MB;
        if (xp && rows >= job->wide_min) {
            wide_pack(job, m0, rows, xp);
            wide_block(job, m0, rows, xp, tile_a, tile_b);
        } else {
            run_block(job, m0, rows, tile_a, tile_b);
        }
    }
    free(xp);
    return NULL;
}

/* One row: h = x (+ r); optionally s = h; y = h * rsqrt(mean(h^2) + eps) * w. */
__attribute__((target("avx2,fma"))) static void rmsnorm_row(const float *x, const float *r,
                                                           const float *w, float *y, float *s,
                                                           int64_t dim, float eps)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= dim; j += 8) {
        __m256 h = _mm256_loadu_ps(x + j);
        if (r) h = _mm256_add_ps(h, _mm256_loadu_ps(r + j));
        if (s) _mm256_storeu_ps(s + j, h);
        acc = _mm256_fmadd_ps(h, h, acc);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    double sum = 0.0;
    for (int i = 0; i < 8; i++) sum += lanes[i];
    for (; j < dim; j++) {
        const float h = r ? x[j] + r[j] : x[j];
        if (s) s[j] = h;
        sum += (double)h * h;
    }
    const float scale = (float)(1.0 / sqrt(sum / (double)dim + (double)eps));
    const __m256 vscale = _mm256_set1_ps(scale);
    for (j = 0; j + 8 <= dim; j += 8) {
        __m256 h = _mm256_loadu_ps(x + j);
        if (r) h = _mm256_add_ps(h, _mm256_loadu_ps(r + j));
        _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_mul_ps(h, vscale), _mm256_loadu_ps(w + j)));
    }
    for (; j < dim; j++) {
        const float h = r ? x[j] + r[j] : x[j];
        y[j] = (h * scale) * w[j];
    }
}


/* x (D floats) rotated at one position: x * cos + swap(x) * ssin, swap(x) = [x2, x1] and ssin
 * the sine with its first half negated (rotary.py's table), into out. */
__attribute__((target("avx2,fma"))) static void rotate(const float *x, const float *cos_p,
                                                      const float *ssin_p, int64_t dim,
                                                      float *out)
{
    const int64_t half = dim / 2;
    for (int64_t j = 0; j < dim; j++) {
        const float swapped = j < half ? x[j + half] : x[j - half];
        out[j] = x[j] * cos_p[j] + swapped * ssin_p[j];
    }
}

__attribute__((target("avx2,fma"))) static inline float dot(const float *a, const float *b,
                                                           int64_t n)
{
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
                ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; j < n; j++) sum += a[j] * b[j];
    return sum;
}

/* acc[0..n) += w * v[0..n) */
__attribute__((target("avx2,fma"))) static inline void axpy(float w, const float *v, float *acc,
                                                           int64_t n)
{
    const __m256 vw = _mm256_set1_ps(w);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        _mm256_storeu_ps(acc + j,
                         _mm256_fmadd_ps(vw, _mm256_loadu_ps(v + j), _mm256_loadu_ps(acc + j)));
    }
    for (; j < n; j++) acc[j] += w * v[j];
}

/* s[i] = exp(s[i] - top) in place; returns their sum. */
__attribute__((target("avx2,fma"))) static float exp_shifted(float *s, int64_t n, float top)
{
    const __m256 vtop = _mm256_set1_ps(top);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), vtop));
        _mm256_storeu_ps(s + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, acc);
    float total = 0.0f;
    for (int j = 0; j < 8; j++) total += lanes[j];
    for (; i < n; i++) {
        s[i] = expf(s[i] - top);
        total += s[i];
    }
    return total;
}

typedef struct {
    const float *qkv;     /* [B, T, (H + 2 Hkv) D] */
    const int64_t *rows;  /* [B, 3]: slot, start position, chunk length */
    const float *cos, *ssin; /* [max_len, D] */
    float *kc, *vc;       /* [S, Hkv, max_len, D] this layer's cache */
    float *out;           /* [B, T, H D] */
    int64_t B, T, H, Hkv, D, max_len, window;
    float scale;
} AttnJob;

/* Every real token's K (rotated) and V into its slot, at its position. */
__attribute__((target("avx2,fma"))) static void attn_write(const AttnJob *a)
{
    const int64_t width = (a->H + 2 * a->Hkv) * a->D;
    for (int64_t b = 0; b < a->B; b++) {
        const int64_t slot = a->rows[3 * b], start = a->rows[3 * b + 1];
        const int64_t len = a->rows[3 * b + 2];
        for (int64_t t = 0; t < len; t++) {
            const int64_t p = start + t;
            const float *tok = a->qkv + (b * a->T + t) * width;
            for (int64_t h = 0; h < a->Hkv; h++) {
                const int64_t at = ((slot * a->Hkv + h) * a->max_len + p) * a->D;
                rotate(tok + (a->H + h) * a->D, a->cos + p * a->D, a->ssin + p * a->D, a->D,
                       a->kc + at);
                memcpy(a->vc + at, tok + (a->H + a->Hkv + h) * a->D, (size_t)a->D * sizeof(float));
            }
        }
    }
}

/* Every real query (rotated) over keys [lo, p] of its slot: softmax(q k * scale) v. Pads of
 * a shorter chunk get zeros (the caller drops them). scores: max_len floats of scratch. */
__attribute__((target("avx2,fma"))) static void attn_queries(const AttnJob *a, float *scores,
                                                            float *q)
{
    const int64_t width = (a->H + 2 * a->Hkv) * a->D, group = a->H / a->Hkv, D = a->D;
    for (int64_t b = 0; b < a->B; b++) {
        const int64_t slot = a->rows[3 * b], start = a->rows[3 * b + 1];
        const int64_t len = a->rows[3 * b + 2];
        for (int64_t t = 0; t < a->T; t++) {
            float *dst = a->out + (b * a->T + t) * a->H * D;
            if (t >= len) {
                memset(dst, 0, (size_t)(a->H * D) * sizeof(float));
                continue;
            }
            const int64_t p = start + t;
            const int64_t lo = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
            const float *tok = a->qkv + (b * a->T + t) * width;
            for (int64_t h = 0; h < a->H; h++) {
                rotate(tok + h * D, a->cos + p * D, a->ssin + p * D, D, q);
                const int64_t base = (slot * a->Hkv + h / group) * a->max_len * D;
                const float *keys = a->kc + base, *values = a->vc + base;
                float top = -INFINITY;
                for (int64_t l = lo; l <= p; l++) {
                    scores[l] = dot(q, keys + l * D, D) * a->scale;
                    if (scores[l] > top) top = scores[l];
                }
                const float total = exp_shifted(scores + lo, p - lo + 1, top);
                float *acc = dst + h * D;
                memset(acc, 0, (size_t)D * sizeof(float));
                for (int64_t l = lo; l <= p; l++) axpy(scores[l], values + l * D, acc, D);
                const float inv = 1.0f / total;
                for (int64_t j = 0; j < D; j++) acc[j] *= inv;
            }
        }
    }
}

/* The first index in x[0..n) holding `top` (NaN: the first NaN); n when none does. */
__attribute__((target("avx2,fma"))) static int64_t first_at(const float *x, int64_t n, float top)
{
    const int want_nan = top != top;
    const __m256 t8 = _mm256_set1_ps(top);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 v = _mm256_loadu_ps(x + j);
        const __m256 hit = want_nan ? _mm256_cmp_ps(v, v, _CMP_UNORD_Q)
                                    : _mm256_cmp_ps(v, t8, _CMP_EQ_OQ);
        const int mask = _mm256_movemask_ps(hit);
        if (mask) return j + __builtin_ctz((unsigned)mask);
    }
    for (; j < n; j++) {
        if (want_nan ? x[j] != x[j] : x[j] == top) return j;
    }
    return n;
}

/* ---- The keyed Gumbel field's argmax (sampling/gumbel_field.py has the definition) ---- */

#define G_BLOCK 64
static const uint64_t G_GAMMA = 0x9E3779B97F4A7C15ULL;
static const uint64_t G_ARGMAX_SALT = 0x6A09E667F3BCC909ULL;
static const uint64_t G_ENTRY_SALT = 0xBB67AE8584CAA73BULL;

static inline uint64_t g_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* the top 53 bits as a double in (0, 1) */
static inline double g_uniform(uint64_t w) { return ((double)(w >> 11) + 0.5) * 0x1p-53; }

/* entry j of block word w whose largest noise is bmax (at index a): a Gumbel truncated below
 * it, bmax itself at a */
static inline double g_entry(uint64_t w, double bmax, int64_t a, int64_t j)
{
    if (j == a) return bmax;
    const double e = -log(g_uniform(g_mix64((w ^ G_ENTRY_SALT) + (uint64_t)(j + 1) * G_GAMMA)));
    return -log(exp(-bmax) + e);
}

/* 4 lanes of 64-bit a times a constant, modulo 2^64 (AVX2 has no 64-bit multiply) */
__attribute__((target("avx2,fma"))) static inline __m256i g_mul64(__m256i a, uint64_t c)
{
    const __m256i lo = _mm256_set1_epi64x((int64_t)(c & 0xFFFFFFFFULL));
    const __m256i hi = _mm256_set1_epi64x((int64_t)(c >> 32));
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), lo),
                                           _mm256_mul_epu32(a, hi));
    return _mm256_add_epi64(_mm256_mul_epu32(a, lo), _mm256_slli_epi64(cross, 32));
}

__attribute__((target("avx2,fma"))) static inline __m256i g_mix64x4(__m256i z)
{
    z = g_mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), 0xBF58476D1CE4E5B9ULL);
    z = g_mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), 0x94D049BB133111EBULL);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

/* 4 unsigned integers below 2^52 as doubles (exactly) */
__attribute__((target("avx2,fma"))) static inline __m256d g_small_to_double(__m256i v)
{
    const __m256d magic = _mm256_set1_pd(0x1p52);
    return _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(v, _mm256_castpd_si256(magic))),
                         magic);
}

/* g_uniform on 4 words: the same doubles */
__attribute__((target("avx2,fma"))) static inline __m256d g_uniform4(__m256i w)
{
    const __m256i x = _mm256_srli_epi64(w, 11); /* 53 bits: two exact halves */
    const __m256d hi = g_small_to_double(_mm256_srli_epi64(x, 26));
    const __m256d lo = g_small_to_double(_mm256_and_si256(x, _mm256_set1_epi64x((1LL << 26) - 1)));
    const __m256d d = _mm256_add_pd(_mm256_mul_pd(hi, _mm256_set1_pd(0x1p26)), lo);
    return _mm256_mul_pd(_mm256_add_pd(d, _mm256_set1_pd(0.5)), _mm256_set1_pd(0x1p-53));
}

/* log of 4 positive normal doubles, fdlibm's method (x = 2^e m, m in [sqrt(1/2), sqrt(2)),
 * log m = 2 atanh(f / (2 + f)) by a degree-14 polynomial): within 1 ulp of the C library's */
__attribute__((target("avx2,fma"))) static inline __m256d g_log4(__m256d x)
{
    const __m256i bits = _mm256_castpd_si256(x);
    __m256d e = _mm256_sub_pd(g_small_to_double(_mm256_srli_epi64(bits, 52)),
                              _mm256_set1_pd(1023.0));
    __m256d m = _mm256_castsi256_pd(
        _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL)),
                        _mm256_set1_epi64x(0x3FF0000000000000LL)));
    const __m256d big = _mm256_cmp_pd(m, _mm256_set1_pd(1.4142135623730951), _CMP_GT_OQ);
    m = _mm256_blendv_pd(m, _mm256_mul_pd(m, _mm256_set1_pd(0.5)), big);
    e = _mm256_add_pd(e, _mm256_and_pd(big, _mm256_set1_pd(1.0)));
    const __m256d f = _mm256_sub_pd(m, _mm256_set1_pd(1.0));
    const __m256d s = _mm256_div_pd(f, _mm256_add_pd(f, _mm256_set1_pd(2.0)));
    const __m256d z = _mm256_mul_pd(s, s), w = _mm256_mul_pd(z, z);
    __m256d t1 = _mm256_fmadd_pd(w, _mm256_set1_pd(1.531383769920937332e-01),
                                 _mm256_set1_pd(2.222219843214978396e-01));
    t1 = _mm256_mul_pd(w, _mm256_fmadd_pd(w, t1, _mm256_set1_pd(3.999999999940941908e-01)));
    __m256d t2 = _mm256_fmadd_pd(w, _mm256_set1_pd(1.479819860511658591e-01),
                                 _mm256_set1_pd(1.818357216161805012e-01));
    t2 = _mm256_fmadd_pd(w, t2, _mm256_set1_pd(2.857142874366239149e-01));
    t2 = _mm256_mul_pd(z, _mm256_fmadd_pd(w, t2, _mm256_set1_pd(6.666666666666735130e-01)));
    const __m256d r = _mm256_add_pd(t2, t1);
    const __m256d hfsq = _mm256_mul_pd(_mm256_set1_pd(0.5), _mm256_mul_pd(f, f));
    /* e ln2_hi - ((hfsq - (s (hfsq + r) + e ln2_lo)) - f) */
    const __m256d ln2_lo = _mm256_set1_pd(1.90821492927058770002e-10);
    const __m256d inner = _mm256_fmadd_pd(s, _mm256_add_pd(hfsq, r), _mm256_mul_pd(e, ln2_lo));
    return _mm256_sub_pd(_mm256_mul_pd(e, _mm256_set1_pd(6.93147180369123816490e-01)),
                         _mm256_sub_pd(_mm256_sub_pd(hfsq, inner), f));
}

#define G_SUPER 32 /* blocks per superblock (gumbel_field.SUPER) */
static const uint64_t G_SUPER_SALT = 0x3C6EF372FE94F82BULL;

/* a place uniform in [0, n) from word w (gumbel_field._uniform_index) */
static inline int64_t g_place(uint64_t w, int64_t n)
{
    const int64_t at = (int64_t)(g_uniform(g_mix64(w ^ G_ARGMAX_SALT)) * (double)n);
    return at > n - 1 ? n - 1 : at;
}

/* max_of, and whether it was a NaN */
__attribute__((target("avx2,fma"))) static inline float g_top(const float *x, int64_t n, int *nan)
{
    const float top = max_of(x, n);
    *nan |= top != top;
    return top;
}

/* A score as the value the noise is added to: log p for probabilities (log 0 = -inf) */
static inline double g_score(float raw, int are_probs)
{
    if (!are_probs) return (double)raw;
    return raw > 0.0f ? log((double)raw) : -INFINITY;
}

/* The search's state for one key: the best value and its token so far */
typedef struct {
    const float *scores; /* the row */
    int64_t V;
    uint64_t key;
    double scale;
    int are_probs;
    double value;
    int64_t token;
} GRace;

/* Offer one entry's value (ties: the lower token, the dense argmax's rule) */
static inline void g_offer(GRace *g, double v, int64_t token)
{
    if (v > g->value || (v == g->value && token < g->token)) {
        g->value = v;
        g->token = token;
    }
}

/* The values sc + scale * noise of entries j0 .. j0 + 3 of block word w (largest noise m,
 * em = exp(-m)) whose raw scores are sc, into v */
__attribute__((target("avx2,fma"))) static inline void g_values4(__m256d sc, uint64_t w,
                                                                double em, double scale,
                                                                int64_t j0, double *v)
{
    const __m256i index = _mm256_add_epi64(_mm256_set1_epi64x(j0 + 1),
                                           _mm256_set_epi64x(3, 2, 1, 0));
    const __m256i word = g_mix64x4(_mm256_add_epi64(
        _mm256_set1_epi64x((int64_t)(w ^ G_ENTRY_SALT)), g_mul64(index, G_GAMMA)));
    const __m256d e = _mm256_sub_pd(_mm256_setzero_pd(), g_log4(g_uniform4(word)));
    const __m256d noise =
        _mm256_sub_pd(_mm256_setzero_pd(), g_log4(_mm256_add_pd(_mm256_set1_pd(em), e)));
    _mm256_storeu_pd(v, _mm256_add_pd(sc, _mm256_mul_pd(_mm256_set1_pd(scale), noise)));
}

/* Bounds on exp(x) for the searches' tests of what could win, a few steps each where exp()
 * takes tens: with y = x log2(e) = k + f (k an integer, f in [0, 1)), 1 + f ln 2 + (f ln 2)^2
 * / 2 <= 2^f <= 1 + f (2^f is convex, and e^t >= 1 + t + t^2 / 2 for t >= 0). Within 7% above,
 * 4% below; y's rounding is covered by moving it 1e-12 (relative) the safe way. */
static inline double g_pow2(int64_t k) /* 2^k, k in [-1022, 1023] */
{
    const uint64_t bits = (uint64_t)(k + 1023) << 52;
    double out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline double g_exp_above(double x)
{
    if (!(x < 700.0)) return x != x ? x : INFINITY;
    if (x < -700.0) return 0x1p-1000; /* above exp(-700) */
    double y = x * 1.4426950408889634;
    y += 1e-12 * (fabs(y) + 1.0);
    const double k = floor(y);
    return g_pow2((int64_t)k) * (1.0 + (y - k));
}

static inline double g_exp_below(double x)
{
    if (!(x > -700.0)) return 0.0;
    if (x > 700.0) return 0x1p1000; /* below exp(700) */
    double y = x * 1.4426950408889634;
    y -= 1e-12 * (fabs(y) + 1.0);
    const double k = floor(y), t = (y - k) * 0.6931471805599453 * (1.0 - 1e-12);
    return g_pow2((int64_t)k) * (1.0 + t + 0.5 * t * t);
}

/* 1 + d + d^2 / 2 with d = (top - x) * inv (>= 0 for x <= top): a lower bound on exp(d),
 * the factor by which x's exp((x - value) / scale) is below top's (inv = 1 / scale) */
__attribute__((target("avx2,fma"))) static inline __m256d g_exp_gap4(__m256d top, __m256d x,
                                                                    __m256d inv)
{
    const __m256d d = _mm256_mul_pd(_mm256_sub_pd(top, x), inv);
    return _mm256_fmadd_pd(_mm256_mul_pd(_mm256_set1_pd(0.5), d), d,
                           _mm256_add_pd(_mm256_set1_pd(1.0), d));
}

/* Of a block's entries that pass its floor (bits of pass; raw scores row[0 .. n), the short
 * last block's last group in tail; block word w, em <= exp(-m)), those whose noise could still
 * lift them past the value: g_could_win's test an entry down. Entry j wins a place when
 * s_j + scale N_j > value, N_j = -log(em + E_j), E_j = -log u_j: when em + E_j <
 * exp((s_j - value) / scale). Since E_j >= 1 - u_j, and exp((s_j - value) / scale) <=
 * A / (1 + d_j + d_j^2 / 2) with A = exp((top - value) / scale) over the block's largest
 * score top and d_j = (top - s_j) / scale, only where (1 + em - u_j)(1 + d_j + d_j^2 / 2) < A.
 * The others' logs are never taken. */
__attribute__((target("avx2,fma"))) static uint64_t g_entries_could_win(const GRace *g,
                                                                       const float *row,
                                                                       int64_t n,
                                                                       const double *tail,
                                                                       uint64_t w, double em,
                                                                       uint64_t pass)
{
    if (!pass) return pass;
    double top = -INFINITY;
    for (uint64_t left = pass; left; left &= left - 1) {
        const double x = (double)row[__builtin_ctzll(left)];
        top = x > top ? x : top;
    }
    const double a = g_exp_above((top - g->value) / g->scale);
    if (!(a < INFINITY)) return pass;
    const __m256d one_em = _mm256_set1_pd(1.0 + em), inv = _mm256_set1_pd(1.0 / g->scale);
    const __m256d rhs = _mm256_set1_pd(a * (1.0 + 1e-9) + 1e-12), top4 = _mm256_set1_pd(top);
    const __m256i salted = _mm256_set1_epi64x((int64_t)(w ^ G_ENTRY_SALT));
    const uint64_t any = (pass | pass >> 1 | pass >> 2 | pass >> 3) & 0x1111111111111111ULL;
    for (uint64_t left = any; left; left &= left - 1) {
        const int64_t g4 = __builtin_ctzll(left) / 4;
        const __m256d x = 4 * g4 + 4 <= n ? _mm256_cvtps_pd(_mm_loadu_ps(row + 4 * g4))
                                          : _mm256_loadu_pd(tail);
        const __m256i index = _mm256_add_epi64(_mm256_set1_epi64x(4 * g4 + 1),
                                               _mm256_set_epi64x(3, 2, 1, 0));
        const __m256d u =
            g_uniform4(g_mix64x4(_mm256_add_epi64(salted, g_mul64(index, G_GAMMA))));
        const __m256d lhs = _mm256_mul_pd(_mm256_sub_pd(one_em, u), g_exp_gap4(top4, x, inv));
        const uint64_t keep = (uint64_t)_mm256_movemask_pd(_mm256_cmp_pd(lhs, rhs, _CMP_LT_OQ));
        pass &= ~(0xFULL << (4 * g4)) | keep << (4 * g4);
    }
    return pass;
}

/* Block b (its word w, largest noise m at a): the entry holding m first (no log to draw it),
 * whose value prunes the others, then those that can still win. Raw scores: which groups of 4
 * entries can win is decided against the value at that point, then their noise is drawn with
 * no step waiting on another's, then they are offered. Returns 0 on a NaN. */
__attribute__((target("avx2,fma"))) static int g_block(GRace *g, int64_t b, uint64_t w,
                                                      double m, int64_t a)
{
    const int64_t base = b * G_BLOCK;
    const int64_t n = g->V - base < G_BLOCK ? g->V - base : G_BLOCK;
    const float *row = g->scores + base;
    if (row[a] != row[a]) return 0;
    g_offer(g, g_score(row[a], g->are_probs) + g->scale * m, base + a);
    if (g->are_probs) { /* p past exp(value - scale m) (a little less, for rounding) can win */
        const double em = exp(-m);
        double floor_p = exp(g->value - g->scale * m) * (1.0 - 1e-9);
        for (int64_t j = 0; j < n; j++) {
            const double raw = (double)row[j];
            if (raw != raw) return 0;
            if (j == a || !(raw > floor_p)) continue;
            const double e =
                -log(g_uniform(g_mix64((w ^ G_ENTRY_SALT) + (uint64_t)(j + 1) * G_GAMMA)));
            g_offer(g, log(raw) + g->scale * -log(em + e), base + j);
            floor_p = exp(g->value - g->scale * m) * (1.0 - 1e-9);
        }
        return 1;
    }
    /* an entry's noise is at most m: only a score past value - scale * m can win. Which
     * entries can, as bits (entry j: bit j), with no branch per group of 4: whether one
     * passes is a coin toss */
    const __m256d floor4 = _mm256_set1_pd(g->value - g->scale * m);
    uint64_t pass = 0;
    int nan = 0;
    int64_t q = 0;
    for (; 4 * q + 4 <= n; q++) {
        const __m128 raw = _mm_loadu_ps(row + 4 * q);
        nan |= _mm_movemask_ps(_mm_cmpunord_ps(raw, raw));
        const __m256d x = _mm256_cvtps_pd(raw);
        pass |= (uint64_t)_mm256_movemask_pd(_mm256_cmp_pd(x, floor4, _CMP_GT_OQ)) << (4 * q);
    }
    double tail[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    if (4 * q < n) { /* the vocabulary's short last block */
        for (int64_t l = 0; 4 * q + l < n; l++) {
            nan |= row[4 * q + l] != row[4 * q + l];
            tail[l] = (double)row[4 * q + l];
        }
        const __m256d x = _mm256_loadu_pd(tail);
        pass |= (uint64_t)_mm256_movemask_pd(_mm256_cmp_pd(x, floor4, _CMP_GT_OQ)) << (4 * q);
    }
    if (nan) return 0;
    pass &= ~(1ULL << a); /* offered already */
    pass = g_entries_could_win(g, row, n, tail, w, g_exp_below(-m), pass);
    if (!pass) return 1;
    const double em = exp(-m);
    /* the groups of 4 holding one: their noise drawn with no step waiting on another's,
     * then their values offered */
    double v[G_BLOCK];
    const uint64_t any = (pass | pass >> 1 | pass >> 2 | pass >> 3) & 0x1111111111111111ULL;
    for (uint64_t left = any; left; left &= left - 1) {
        const int64_t g4 = __builtin_ctzll(left) / 4;
        const __m256d sc = 4 * g4 + 4 <= n ? _mm256_cvtps_pd(_mm_loadu_ps(row + 4 * g4))
                                           : _mm256_loadu_pd(tail);
        g_values4(sc, w, em, g->scale, 4 * g4, v + 4 * g4);
    }
    for (; pass; pass &= pass - 1) {
        const int64_t j = __builtin_ctzll(pass);
        g_offer(g, v[j], base + j);
    }
    return 1;
}

/* The value g_block gives entry j of block b (its word w, largest noise m at a), computed
 * the way g_block computes it (the same bits): the search offers a hinted token's value
 * first, and its block, looked at later, offers the same value again. NaN: a NaN score. */
__attribute__((target("avx2,fma"))) static double g_entry_value(const GRace *g, int64_t b,
                                                                uint64_t w, double m,
                                                                int64_t a, int64_t j)
{
    const float raw = g->scores[b * G_BLOCK + j];
    if (raw != raw) return NAN;
    if (j == a) return g_score(raw, g->are_probs) + g->scale * m;
    const double em = exp(-m);
    if (g->are_probs) {
        if (!(raw > 0.0f)) return -INFINITY;
        const double e =
            -log(g_uniform(g_mix64((w ^ G_ENTRY_SALT) + (uint64_t)(j + 1) * G_GAMMA)));
        return log((double)raw) + g->scale * -log(em + e);
    }
    /* its lane of the group of 4 holding it (the lanes do not mix) */
    double sc[4] = {0.0, 0.0, 0.0, 0.0}, v[4];
    sc[j % 4] = (double)raw;
    g_values4(_mm256_loadu_pd(sc), w, em, g->scale, j / 4 * 4, v);
    return v[j % 4];
}

/* Block b's scores on their way to the cache (a few of a row's 600 KB are read, far apart:
 * each one a trip to memory): asked for where it goes on the heap, read when it comes off.
 * Into L1 (T0): measured on a Zen 5 VM, a load after a T1 prefetch of a line on a page not
 * touched lately still took ~250 cycles (a page walk), after T0 ~5; a cold one ~1,100. */
static inline void g_prefetch_block(const GRace *g, int64_t b)
{
    const char *at = (const char *)(g->scores + b * G_BLOCK);
    for (int l = 0; l < G_BLOCK * (int)sizeof(float); l += 64) _mm_prefetch(at + l, _MM_HINT_T0);
}

/* The first reads of a row's search on their way to the cache while the row before is
 * searched: the block holding its largest score (looked at first; its block maxima show
 * it) and the hinted token */
__attribute__((target("avx2,fma"))) static void g_prefetch_row(const float *scores, int64_t V,
                                                               const float *maxima,
                                                               int64_t hint)
{
    if (hint >= 0 && hint < V) _mm_prefetch((const char *)(scores + hint), _MM_HINT_T0);
    if (!maxima) return;
    const int64_t nb = (V + G_BLOCK - 1) / G_BLOCK;
    const int64_t b = first_at(maxima, nb, max_of(maxima, nb));
    if (b >= nb) return; /* a NaN: the search gives up anyway */
    const GRace g = {scores, V, 0, 1.0, 0, -INFINITY, -1};
    g_prefetch_block(&g, b);
}

/* Whole blocks list[0..3] of a superblock whose largest noise is ms (c = exp(-ms)): each
 * one's largest noise log 64 - log(64 c + E_b), E_b = -log u(w_b), at most ms, into out */
__attribute__((target("avx2,fma"))) static inline void g_block_noise4(uint64_t key,
                                                                     const int64_t *list,
                                                                     double c, double ms,
                                                                     double *out)
{
    const __m256i index = _mm256_add_epi64(_mm256_loadu_si256((const __m256i *)list),
                                           _mm256_set1_epi64x(1));
    const __m256d u = g_uniform4(g_mix64x4(
        _mm256_add_epi64(_mm256_set1_epi64x((int64_t)key), g_mul64(index, G_GAMMA))));
    const __m256d n_c = _mm256_mul_pd(_mm256_set1_pd((double)G_BLOCK), _mm256_set1_pd(c));
    const __m256d x = _mm256_add_pd(n_c, _mm256_sub_pd(_mm256_setzero_pd(), g_log4(u)));
    const __m256d drawn = _mm256_sub_pd(_mm256_set1_pd(log((double)G_BLOCK)), g_log4(x));
    _mm256_storeu_pd(out, _mm256_min_pd(drawn, _mm256_set1_pd(ms)));
}

/* Of the listed whole blocks of a superblock (num, in order; c <= exp(-ms)), those whose largest
 * noise could still lift them past the value, kept in order: the others are dropped without
 * their noise drawn (two logs each; over flat scores most of a superblock's blocks can pass
 * its floor, and few of them the value). Block b wins a place when top_b + scale M_b > value,
 * M_b = log n - log(n c + E_b), E_b = -log u_b: that is when E_b < n (A_b - c), A_b =
 * exp((score_b - value) / scale). Since E_b >= 1 - u_b, only where 1 + n c - u_b < n A_b. Raw
 * scores: A_b = A exp(-d_b) <= A / (1 + d_b + d_b^2 / 2), with A = exp((top - value) / scale)
 * over the listed blocks' largest score top and d_b = (top - top_b) / scale >= 0, so a block
 * can pass only where (1 + n c - u_b)(1 + d_b + d_b^2 / 2) < n A. Probabilities at scale 1:
 * A_b = p_b exp(-value), one product. No transcendental function a block; the margins
 * (relative 1e-9, absolute 1e-12) are far above the rounding of these few steps, so every
 * block that can pass is kept. Where n A is not finite (no value yet) all are kept. */
__attribute__((target("avx2,fma"))) static int64_t g_could_win(const GRace *g, const float *top,
                                                              int64_t *list, int64_t num,
                                                              double c)
{
    if (!num || (g->are_probs && g->scale != 1.0)) return num;
    const double n = (double)G_BLOCK;
    float best = top[list[0]];
    for (int64_t i = 1; i < num; i++) best = top[list[i]] > best ? top[list[i]] : best;
    const double n_a =
        n * g_exp_above(g->are_probs ? -g->value : ((double)best - g->value) / g->scale);
    if (!(n_a < INFINITY)) return num;
    const __m256d one_nc = _mm256_set1_pd(1.0 + n * c), inv = _mm256_set1_pd(1.0 / g->scale);
    const __m256d rhs = _mm256_set1_pd(n_a * (1.0 + 1e-9) + 1e-12);
    const __m256d top4 = _mm256_set1_pd((double)best);
    for (int64_t l = num; l % 4; l++) list[l] = list[num - 1];
    int64_t kept = 0;
    for (int64_t i = 0; i < num; i += 4) {
        const __m256i index = _mm256_loadu_si256((const __m256i *)(list + i));
        const __m256d u = g_uniform4(g_mix64x4(_mm256_add_epi64(
            _mm256_set1_epi64x((int64_t)g->key),
            g_mul64(_mm256_add_epi64(index, _mm256_set1_epi64x(1)), G_GAMMA))));
        const __m256d tb = _mm256_set_pd((double)top[list[i + 3]], (double)top[list[i + 2]],
                                         (double)top[list[i + 1]], (double)top[list[i]]);
        __m256d lhs = _mm256_sub_pd(one_nc, u), bound = rhs;
        if (g->are_probs) {
            bound = _mm256_mul_pd(rhs, tb);
        } else {
            lhs = _mm256_mul_pd(lhs, g_exp_gap4(top4, tb, inv));
        }
        int bits = _mm256_movemask_pd(_mm256_cmp_pd(lhs, bound, _CMP_LT_OQ));
        const int64_t count = num - i < 4 ? num - i : 4;
        bits &= (1 << count) - 1;
        for (int64_t l = 0; l < count; l++) { /* kept in order, in place (kept <= i + l) */
            list[kept] = list[i + l];
            kept += bits >> l & 1;
        }
    }
    return kept;
}

/* gumbel_row's scratch in 8-byte words for nb blocks: 5 ns + 3 nb + G_SUPER, then nb
 * floats */
#define G_SCRATCH(nb) (5 * (((nb) + G_SUPER - 1) / G_SUPER) + 4 * (nb) + G_SUPER)

/* A max-heap of (bound, item) pairs: the search looks at the best bound first */
typedef struct {
    double *bound;
    int64_t *item;
    int64_t size;
} GHeap;

static void g_push(GHeap *h, double bound, int64_t item)
{
    int64_t i = h->size++;
    while (i > 0) {
        const int64_t parent = (i - 1) / 2;
        if (!(h->bound[parent] < bound)) break;
        h->bound[i] = h->bound[parent];
        h->item[i] = h->item[parent];
        i = parent;
    }
    h->bound[i] = bound;
    h->item[i] = item;
}

/* the pair (bound, item) sifted down from place i */
static void g_sift_down(GHeap *h, int64_t i, double bound, int64_t item)
{
    for (;;) {
        int64_t child = 2 * i + 1;
        if (child >= h->size) break;
        /* which child is larger is a coin toss: chosen with no branch */
        const double right = child + 1 < h->size ? h->bound[child + 1] : -INFINITY;
        child += right > h->bound[child];
        if (!(h->bound[child] > bound)) break;
        h->bound[i] = h->bound[child];
        h->item[i] = h->item[child];
        i = child;
    }
    h->bound[i] = bound;
    h->item[i] = item;
}

static void g_pop(GHeap *h)
{
    h->size--;
    g_sift_down(h, 0, h->bound[h->size], h->item[h->size]);
}

/* One block's largest noise below its superblock's ms (c = exp(-ms)), from its word w and its
 * n tokens: log n - log(n c + E_b), E_b = -log u(w), at most ms (g_block_noise4, one at a time) */
static inline double g_block_noise1(uint64_t w, double n, double c, double ms)
{
    const double drawn = log(n) - log(n * c - log(g_uniform(w)));
    return drawn < ms ? drawn : ms;
}

/* Superblock s (blocks b0 .. b1 - 1, largest noise ms): the blocks whose largest score could
 * still win with noise ms (the most any of them has) get their largest noise drawn below ms
 * into noise[b] (4 whole blocks at a time), the block holding the superblock's maximum
 * (top_block) given ms; those whose bound (largest score in top[b] + scale * noise) still
 * beats the best value go on the heap, but for block `done` (looked at already). The others'
 * noise is never drawn: it cannot matter. list: G_SUPER int64s of scratch. */
__attribute__((target("avx2,fma"))) static void g_super(GRace *g, GHeap *h, const float *top,
                                                       int64_t s, double ms,
                                                       int64_t top_block, int64_t done,
                                                       double *noise, int64_t *list)
{
    const int64_t b0 = s * G_SUPER, nb = (g->V + G_BLOCK - 1) / G_BLOCK, whole = g->V / G_BLOCK;
    const int64_t b1 = b0 + G_SUPER < nb ? b0 + G_SUPER : nb;
    /* a block's largest score must pass value - scale * ms (raw: a probability, a little less
     * for rounding) */
    const double floor_score = g->value - g->scale * ms;
    const double floor_raw =
        g->are_probs ? exp(floor_score) * (1.0 - 1e-9) : floor_score - 1e-9 * fabs(floor_score);
    /* which whole blocks pass, as bits (b0 + i: bit i), then listed in order */
    const int64_t last = b1 < whole ? b1 : whole; /* whole blocks end here */
    const __m256d floor4 = _mm256_set1_pd(floor_raw);
    uint64_t pass = 0;
    int64_t b = b0;
    for (; b + 4 <= last; b += 4) {
        const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(top + b));
        pass |= (uint64_t)_mm256_movemask_pd(_mm256_cmp_pd(x, floor4, _CMP_GT_OQ)) << (b - b0);
    }
    for (; b < last; b++) pass |= (uint64_t)((double)top[b] > floor_raw) << (b - b0);
    if (done >= b0 && done < b1) pass &= ~(1ULL << (done - b0));
    pass &= ~(1ULL << (top_block - b0));
    int64_t num = 0;
    for (; pass; pass &= pass - 1) list[num++] = b0 + __builtin_ctzll(pass);
    num = g_could_win(g, top, list, num, g_exp_below(-ms));
    const int last_short = b1 == nb && whole < nb && nb - 1 != top_block && nb - 1 != done &&
                           (double)top[nb - 1] > floor_raw;
    const double c = num || last_short ? exp(-ms) : 0.0; /* (used only where a noise is drawn) */
    /* one to three left over: the last one again, to fill a group of 4 (its noise drawn
     * twice, the same value) */
    for (int64_t l = num; l % 4; l++) list[l] = list[num - 1];
    const int64_t groups = (num + 3) / 4;
    double drawn[G_SUPER];
    int64_t i = 0;
    for (; i < groups; i++) g_block_noise4(g->key, list + 4 * i, c, ms, drawn + 4 * i);
    for (i = 0; i < num; i++) noise[list[i]] = drawn[i];
    /* the top block and the vocabulary's short last block, where they can win */
    if ((double)top[top_block] > floor_raw && top_block != done) {
        noise[top_block] = ms;
        list[num++] = top_block;
    }
    if (last_short) {
        const uint64_t w = g_mix64(g->key + (uint64_t)nb * G_GAMMA);
        noise[nb - 1] = g_block_noise1(w, (double)(g->V - whole * G_BLOCK), c, ms);
        list[num++] = nb - 1;
    }
    for (i = 0; i < num; i++) {
        const int64_t b = list[i];
        const double bound = g_score(top[b], g->are_probs) + g->scale * noise[b];
        if (bound > g->value) {
            g_push(h, bound, b);
            g_prefetch_block(g, b);
        }
    }
}

/* Superblock s's word, where its maximum sits (a token of it) and its size in tokens */
static inline uint64_t g_super_word(uint64_t key, int64_t s)
{
    return g_mix64((key ^ G_SUPER_SALT) + (uint64_t)(s + 1) * G_GAMMA);
}

static inline int64_t g_super_size(int64_t s, int64_t nb, int64_t V)
{
    const int64_t b1 = (s + 1) * G_SUPER < nb ? (s + 1) * G_SUPER : nb;
    return (b1 == nb ? V : b1 * G_BLOCK) - s * G_SUPER * G_BLOCK;
}

/* Block b of superblock s (largest noise ms, its maximum at token t of it): b's largest noise
 * and where it sits (g_super's and gumbel_field's rule) */
__attribute__((target("avx2,fma"))) static double g_one_block(uint64_t key, int64_t b,
                                                              int64_t V, double ms, int64_t t,
                                                              int64_t *a)
{
    const int64_t nb = (V + G_BLOCK - 1) / G_BLOCK, b0 = b / G_SUPER * G_SUPER;
    const int64_t n = b < nb - 1 ? G_BLOCK : V - b * G_BLOCK;
    const uint64_t w = g_mix64(key + (uint64_t)(b + 1) * G_GAMMA);
    if (b == b0 + t / G_BLOCK) {
        *a = t % G_BLOCK;
        return ms;
    }
    *a = g_place(w, n);
    if (n < G_BLOCK) return g_block_noise1(w, (double)n, exp(-ms), ms);
    const int64_t list[4] = {b, b, b, b}; /* g_super's arithmetic: the same bits */
    double drawn[4];
    g_block_noise4(key, list, exp(-ms), ms, drawn);
    return drawn[0];
}

/* argmax_i (scores_i + scale * G_i) over one row of V float32 scores for field key `key`
 * (gumbel_field.py), best first by bound (a largest score + scale * a largest noise). The
 * block with the largest score is looked at first: its value, usually near the answer's,
 * rules most of the rest out. Then a heap of what can still win, superblocks at first, the
 * best taken off while its bound beats the best value: a superblock draws its blocks' noise
 * and puts those that can win on the heap, a block has its entries that can win looked at.
 * Only what holds a bound past the answer is drawn, and of that, only what a cheap bound
 * (g_could_win, g_entries_could_win: no log) does not rule out. A hinted row opens every
 * superblock that can beat the hint's value first (below). maxima: the row's block maxima (or
 * NULL: computed here); scratch: G_SCRATCH(nb) 8-byte words. are_probs: the scores are
 * probabilities, log p races. hint: a token likely to win (< 0: none), its value offered
 * first: the same answer, with less drawn where it wins. Returns the token (-1: every score
 * -inf), or -2 where a NaN was seen (the caller's torch search decides then). */
__attribute__((target("avx2,fma"))) static int64_t gumbel_row(const float *scores, int64_t V,
                                                             const float *maxima, uint64_t key,
                                                             double scale, int are_probs,
                                                             int64_t hint, double *scratch)
{
    const int64_t nb = (V + G_BLOCK - 1) / G_BLOCK, ns = (nb + G_SUPER - 1) / G_SUPER;
    float *best = (float *)(scratch + G_SCRATCH(nb) - nb);
    int nan = 0;
    if (!maxima) {
        for (int64_t b = 0; b < nb; b++) {
            best[b] = g_top(scores + b * G_BLOCK, b < nb - 1 ? G_BLOCK : V - b * G_BLOCK, &nan);
        }
        maxima = best;
    }
    /* scratch: super_max, super_bound [ns] each, noise [nb], the heap's bounds and items
     * [ns + nb] each, top_block [ns], list [G_SUPER] */
    double *super_max = scratch, *super_bound = scratch + ns, *noise = scratch + 2 * ns;
    GHeap h = {noise + nb, (int64_t *)(noise + nb + ns + nb), 0};
    int64_t *top_block = h.item + ns + nb, *list = top_block + ns;
    GRace g = {scores, V, key, scale, are_probs, -INFINITY, -1};
    int64_t s = 0, top_super = 0;
    for (; s + 4 <= ns; s += 4) { /* log n_s - log(-log u(W_s)), 4 at a time */
        const __m256i index = _mm256_add_epi64(_mm256_set1_epi64x(s + 1),
                                               _mm256_set_epi64x(3, 2, 1, 0));
        const __m256i word = g_mix64x4(_mm256_add_epi64(
            _mm256_set1_epi64x((int64_t)(key ^ G_SUPER_SALT)), g_mul64(index, G_GAMMA)));
        const __m256d e = _mm256_sub_pd(_mm256_setzero_pd(), g_log4(g_uniform4(word)));
        const __m256d n = _mm256_set_pd(
            (double)g_super_size(s + 3, nb, V), (double)g_super_size(s + 2, nb, V),
            (double)g_super_size(s + 1, nb, V), (double)g_super_size(s, nb, V));
        _mm256_storeu_pd(super_max + s, _mm256_sub_pd(g_log4(n), g_log4(e)));
    }
    for (; s < ns; s++) {
        super_max[s] = log((double)g_super_size(s, nb, V)) -
                       log(-log(g_uniform(g_super_word(key, s))));
    }
    float top_score = -INFINITY;
    for (s = 0; s < ns; s++) { /* each superblock's largest score and bound */
        const int64_t b0 = s * G_SUPER, b1 = b0 + G_SUPER < nb ? b0 + G_SUPER : nb;
        const float top = g_top(maxima + b0, b1 - b0, &nan);
        if (top > top_score) {
            top_score = top;
            top_super = s;
        }
        super_bound[s] = g_score(top, are_probs) + scale * super_max[s];
    }
    if (nan) return -2;
    if (hint >= 0 && hint < V) { /* a token likely to win (the draft's): its value first */
        const int64_t b = hint / G_BLOCK, hs = b / G_SUPER;
        const int64_t t = g_place(g_super_word(key, hs), g_super_size(hs, nb, V));
        int64_t a;
        const double m = g_one_block(key, b, V, super_max[hs], t, &a);
        const uint64_t w = g_mix64(key + (uint64_t)(b + 1) * G_GAMMA);
        const double v = g_entry_value(&g, b, w, m, a, hint % G_BLOCK);
        if (v == v) g_offer(&g, v, hint);
    }
    { /* the token holding the field's largest noise (the superblock with the largest M_s,
       * where it sits): over flat scores it is often the answer, and its value, offered
       * first, prunes as a right hint does (unhinted searches 22 -> 18 us a row at logits of
       * spread 0.8 and T = 0.7). The same arithmetic as g_block's for it: the same bits. */
        int64_t s_max = 0;
        for (s = 1; s < ns; s++) s_max = super_max[s] > super_max[s_max] ? s : s_max;
        const int64_t token = s_max * G_SUPER * G_BLOCK +
                              g_place(g_super_word(key, s_max), g_super_size(s_max, nb, V));
        const float raw = scores[token];
        if (raw == raw) g_offer(&g, g_score(raw, are_probs) + scale * super_max[s_max], token);
    }
    int64_t done = -1;
    if (top_score > -INFINITY && !(are_probs && top_score <= 0.0f)) {
        /* the block with the largest score first */
        const int64_t b0 = top_super * G_SUPER, b1 = b0 + G_SUPER < nb ? b0 + G_SUPER : nb;
        done = b0;
        for (int64_t b = b0; b < b1; b++) done = maxima[b] > maxima[done] ? b : done;
        const int64_t t = g_place(g_super_word(key, top_super), g_super_size(top_super, nb, V));
        int64_t a;
        const double m = g_one_block(key, done, V, super_max[top_super], t, &a);
        if (!g_block(&g, done, g_mix64(key + (uint64_t)(done + 1) * G_GAMMA), m, a)) return -2;
    }
    if (hint >= 0 && hint < V) {
        /* A hint's value is usually the answer's (a draft coupled to this field): every
         * superblock that can beat it opens now, in order, its blocks that can win going on
         * the heap and on their way to the cache, then the blocks, best first, while one can
         * win. Taking the superblocks best first as well (below) spent more on a heap of them
         * than it kept closed where the value is already the answer's. */
        for (s = 0; s < ns; s++) {
            if (!(super_bound[s] > g.value)) continue;
            const int64_t t = g_place(g_super_word(key, s), g_super_size(s, nb, V));
            top_block[s] = t;
            g_super(&g, &h, maxima, s, super_max[s], s * G_SUPER + t / G_BLOCK, done, noise,
                    list);
        }
    }
    /* the superblocks that can still win on the heap (items -1 - s), heapified */
    for (s = 0; s < ns && !(hint >= 0 && hint < V); s++) {
        if (!(super_bound[s] > g.value)) continue;
        h.bound[h.size] = super_bound[s];
        h.item[h.size++] = -1 - s;
    }
    for (int64_t i = h.size / 2 - 1; i >= 0; i--) g_sift_down(&h, i, h.bound[i], h.item[i]);
    /* then the best of them while it can win: a superblock draws its blocks' noise and puts
     * those that can win on the heap, a block has its entries that can win looked at */
    while (h.size && h.bound[0] > g.value) {
        const int64_t item = h.item[0];
        g_pop(&h);
        if (item < 0) {
            s = -1 - item;
            const int64_t t = g_place(g_super_word(key, s), g_super_size(s, nb, V));
            top_block[s] = t;
            g_super(&g, &h, maxima, s, super_max[s], s * G_SUPER + t / G_BLOCK, done, noise,
                    list);
            continue;
        }
        const int64_t b = item, t = top_block[b / G_SUPER];
        const uint64_t w = g_mix64(key + (uint64_t)(b + 1) * G_GAMMA);
        const int64_t n = b < nb - 1 ? G_BLOCK : V - b * G_BLOCK;
        const int64_t a = b == b / G_SUPER * G_SUPER + t / G_BLOCK ? t % G_BLOCK : g_place(w, n);
        if (!g_block(&g, b, w, noise[b], a)) return -2;
    }
    return g.value > -INFINITY ? g.token : -1;
}

/* The tail [i, V) of exp_sum8 / exp_sum16 in double: each exp added as written to out (a
 * float), or unrounded where out is NULL. */
static double exp_tail(const float *x, float *out, int64_t i, int64_t V, float top, double inv_t)
{
    double total = 0.0;
    for (; i < V; i++) {
        const double e = exp(((double)x[i] - (double)top) * inv_t);
        if (out) {
            out[i] = (float)e;
            total += out[i];
        } else {
            total += e;
        }
    }
    return total;
}

/* sum exp((x_i - top) * inv_t) over a row, the exps also written to out (or not, NULL; out
 * may be x). The blocks of 64 entries are summed in 64 float32 lanes (lane l takes entry l of
 * every block), which go into a double every EXP_FLUSH blocks and after the last: lanes l,
 * l + 16, l + 32 and l + 48 paired as (l + (l + 16)) + ((l + 32) + (l + 48)), then those 16
 * added to the double in lane order. Independent lanes keep the additions off one chain of
 * latencies (one 8-lane sum a block made the pass ~1.3x the exps alone); a lane takes at
 * most EXP_FLUSH floats between flushes. The entries past the last block: exp_tail. Both
 * widths below compute exactly this: the same bits. */
#define EXP_FLUSH 16

/* 16 float lanes added to a double in lane order */
static inline double lanes_total(const float *lanes)
{
    double total = 0.0;
    for (int l = 0; l < 16; l++) total += lanes[l];
    return total;
}

/* AVX2: acc[q] holds lanes 8q .. 8q + 7 */
__attribute__((target("avx2,fma"))) static double flush8(__m256 *acc)
{
    float lanes[16];
    _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]),
                                          _mm256_add_ps(acc[4], acc[6])));
    _mm256_storeu_ps(lanes + 8, _mm256_add_ps(_mm256_add_ps(acc[1], acc[3]),
                                              _mm256_add_ps(acc[5], acc[7])));
    for (int q = 0; q < 8; q++) acc[q] = _mm256_setzero_ps();
    return lanes_total(lanes);
}

/* The blocks' loop of both widths: STEP floats a vector, 64 / STEP accumulators (acc[q]
 * takes the vectors at offset STEP q of every block), FLUSH_FN pairing their lanes */
#define EXP_SUM_LANES(V, T, STEP, EXP, FLUSH_FN)                                            \
    const T vtop = V##_set1_ps(top), vinv = V##_set1_ps((float)inv_t);                      \
    T acc[64 / STEP];                                                                       \
    for (int q = 0; q < 64 / STEP; q++) acc[q] = V##_setzero_ps();                          \
    double total = 0.0;                                                                     \
    int64_t i = 0, blocks = 0;                                                              \
    for (; i + 64 <= V_LEN; i += 64) {                                                      \
        for (int q = 0; q < 64 / STEP; q++) {                                               \
            const T v = V##_loadu_ps(x + i + STEP * q);                                     \
            const T e = EXP(V##_mul_ps(V##_sub_ps(v, vtop), vinv));                         \
            if (out) V##_storeu_ps(out + i + STEP * q, e);                                  \
            acc[q] = V##_add_ps(acc[q], e);                                                 \
        }                                                                                   \
        if (++blocks == EXP_FLUSH) {                                                        \
            total += FLUSH_FN(acc);                                                         \
            blocks = 0;                                                                     \
        }                                                                                   \
    }                                                                                       \
    if (blocks) total += FLUSH_FN(acc);                                                     \
    return total + exp_tail(x, out, i, V_LEN, top, inv_t);

__attribute__((target("avx2,fma"))) static double exp_sum8(const float *x, float *out,
                                                          int64_t V_LEN, float top, double inv_t)
{
    EXP_SUM_LANES(_mm256, __m256, 8, exp8, flush8)
}

/* 16 floats (AVX-512F): exp8's body, the same bits lane by lane */
#define FLOOR16(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
__attribute__((target("avx512f,avx2,fma"))) static inline __m512 exp16(__m512 x)
{
    __m512 fx, y;
    EXP_BODY(_mm512, FLOOR16, _mm512_castsi512_ps)
}

/* AVX-512F: acc[q] holds lanes 16q .. 16q + 15 (flush8's pairs, 16 at once) */
__attribute__((target("avx512f,avx2,fma"))) static double flush16(__m512 *acc)
{
    float lanes[16];
    _mm512_storeu_ps(lanes, _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]),
                                          _mm512_add_ps(acc[2], acc[3])));
    for (int q = 0; q < 4; q++) acc[q] = _mm512_setzero_ps();
    return lanes_total(lanes);
}

/* exp_sum8 on AVX-512F, 16 floats a step: the same exps and sums */
__attribute__((target("avx512f,avx2,fma"))) static double exp_sum16(const float *x, float *out,
                                                                   int64_t V_LEN, float top,
                                                                   double inv_t)
{
    EXP_SUM_LANES(_mm512, __m512, 16, exp16, flush16)
}

/* log sum_i exp(x_i * inv_t) of one row of V floats whose max is top: top * inv_t +
 * log sum exp((x_i - top) * inv_t), summed as exp_sum8 sums */
__attribute__((target("avx2,fma"))) static double log_normalizer(const float *x, int64_t V,
                                                                float top, double inv_t,
                                                                int wide)
{
    if (top != top || top == INFINITY) return top != top ? NAN : INFINITY;
    if (top == -INFINITY) return -INFINITY;
    const double total =
        wide ? exp_sum16(x, NULL, V, top, inv_t) : exp_sum8(x, NULL, V, top, inv_t);
    return (double)top * inv_t + log(total);
}

/* In place: x[i] = exp((x[i] - top) * inv_t) / sum over the row (a softmax at temperature
 * 1 / inv_t whose row max is top), the exps written in one pass, then scaled. bmax (or NULL):
 * the max of every 64 probabilities as written, ceil(V / 64) floats. */
__attribute__((target("avx2,fma"))) static void softmax_row(float *x, int64_t V, float top,
                                                           double inv_t, float *bmax, int wide)
{
    /* the exps in place, and their sum (AVX-512F: the same bits 16 floats a step) */
    const double total = wide ? exp_sum16(x, x, V, top, inv_t) : exp_sum8(x, x, V, top, inv_t);
    int64_t i;
    const __m256 scale = _mm256_set1_ps((float)(1.0 / total));
    for (i = 0; i + 64 <= V; i += 64) { /* a block of 64 at a time, its max on the way */
        __m256 top8 = _mm256_setzero_ps();
        for (int j = 0; j < 64; j += 8) {
            const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + i + j), scale);
            _mm256_storeu_ps(x + i + j, p);
            top8 = _mm256_max_ps(top8, p);
        }
        if (bmax) {
            float lanes[8], m = 0.0f;
            _mm256_storeu_ps(lanes, top8);
            for (int l = 0; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
            bmax[i / 64] = m;
        }
    }
    const int64_t last = i;
    for (; i + 8 <= V; i += 8) {
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), scale));
    }
    for (; i < V; i++) x[i] = (float)(x[i] / total);
    if (bmax && last < V) bmax[last / 64] = max_of(x + last, V - last);
}

static int cpu_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int cpu_has_avx512(void)
{
    static int has = -1; /* asked once: a call's dispatch must not cost a CPUID */
    if (has < 0) {
        __builtin_cpu_init();
        has = cpu_ok() && __builtin_cpu_supports("avx512f");
    }
    return has;
}

static int cpu_has_avx512vl(void)
{
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = cpu_has_avx512() && __builtin_cpu_supports("avx512vl");
    }
    return has;
}

/* Whether the row kernels (softmax, log normalisers) take their AVX-512 loops: the CPU has
 * AVX-512F and SPECCTL_AVX512 is not "0" (skinny.py's switch, read per call: tests flip it). */
static int rows_avx512(void)
{
    const char *env = getenv("SPECCTL_AVX512");
    return cpu_has_avx512() && !(env && strcmp(env, "0") == 0);
}

/* The k largest of a stream of (value, index) pairs: a min-heap of at most k, its smallest
 * at 0, so each later pair costs one comparison unless it enters. */
typedef struct {
    float v;
    int64_t i;
} TopItem;

static void top_sift_down(TopItem *h, int64_t n, int64_t at)
{
    for (;;) {
        const int64_t l = 2 * at + 1, r = l + 1;
        int64_t m = at;
        if (l < n && h[l].v < h[m].v) m = l;
        if (r < n && h[r].v < h[m].v) m = r;
        if (m == at) return;
        const TopItem t = h[at];
        h[at] = h[m];
        h[m] = t;
        at = m;
    }
}

/* Offers (v, i) to the heap h of n items (at most k); returns its new size. */
static int64_t top_offer(TopItem *h, int64_t n, int64_t k, float v, int64_t i)
{
    if (n < k) {
        int64_t at = n;
        h[at] = (TopItem){v, i};
        while (at > 0 && h[(at - 1) / 2].v > h[at].v) {
            const TopItem t = h[at];
            h[at] = h[(at - 1) / 2];
            h[(at - 1) / 2] = t;
            at = (at - 1) / 2;
        }
        return n + 1;
    }
    if (v > h[0].v) {
        h[0] = (TopItem){v, i};
        top_sift_down(h, n, 0);
    }
    return n;
}

/* The k largest entries of one row of V floats, largest first, into out_v / out_i, from the
 * row's maxima of every 64 entries (nb = ceil(V / 64) floats): the k blocks with the largest
 * maxima hold them all (an entry among the k largest lies in a block whose max is at least
 * the k-th largest value, and at most k blocks have such a max). blocks, best: k items each.
 * Returns 0 (nothing written) where a NaN was seen. */
/* The ids of the entries of x[start, end) at or above thr into cand from n on (8 at a time);
 * returns the new count, or -1 where one of them is a NaN. */
__attribute__((target("avx2"))) static int64_t top_candidates(const float *x, int64_t start,
                                                              int64_t end, float thr,
                                                              int32_t *cand, int64_t n)
{
    const __m256 t8 = _mm256_set1_ps(thr);
    int64_t i = start;
    for (; i + 8 <= end; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) return -1;
        unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(v, t8, _CMP_GE_OQ));
        while (mask) {
            cand[n++] = (int32_t)(i + __builtin_ctz(mask));
            mask &= mask - 1;
        }
    }
    for (; i < end; i++) {
        if (x[i] != x[i]) return -1;
        if (x[i] >= thr) cand[n++] = (int32_t)i;
    }
    return n;
}

/* The k largest entries of the row x [V], largest first, into out_v, out_i; bmax: the max of
 * each block of 64 entries. The k largest block maxima bound the answer from below: k blocks
 * hold an entry at or above the k-th of them (thr), so the k largest entries are all at or
 * above it, and only those of the blocks whose max reaches thr are candidates (usually a few
 * more than k); a heap of k picks them. With fewer than k blocks every entry is a candidate.
 * cand: room for V ids. False where a block max or a candidate block's entry is a NaN. */
static int top_k_row(const float *x, int64_t V, int64_t k, const float *bmax, TopItem *blocks,
                     TopItem *best, int32_t *cand, float *out_v, int64_t *out_i)
{
    const int64_t nb = (V + 63) / 64;
    int64_t n = 0, m = 0, c = 0;
    for (int64_t b = 0; b < nb; b++) {
        if (bmax[b] != bmax[b]) return 0;
        if (k <= nb) n = top_offer(blocks, n, k, bmax[b], b);
    }
    const float thr = k <= nb ? blocks[0].v : -INFINITY; /* the k-th largest block max */
    for (int64_t b = 0; b < nb; b++) {
        if (bmax[b] < thr) continue;
        c = top_candidates(x, b * 64, b * 64 + 64 < V ? b * 64 + 64 : V, thr, cand, c);
        if (c < 0) return 0;
    }
    for (int64_t j = 0; j < c; j++) m = top_offer(best, m, k, x[cand[j]], cand[j]);
    for (int64_t j = m - 1; j >= 0; j--) { /* the smallest out first: fill from the end */
        out_v[j] = best[0].v;
        out_i[j] = best[0].i;
        best[0] = best[j];
        top_sift_down(best, j, 0);
    }
    return m == k;
}

#endif /* NATIVE_X86 */

/* The entry points' answer where the extension was built without the x86-64 kernels. */
__attribute__((unused)) static PyObject *not_built(const char *name)
{
    PyErr_Format(PyExc_RuntimeError, "%s: built without x86-64 AVX2 support", name);
    return NULL;
}

/* The first `count` of `total` arguments as integers into v; False (a Python error set) where
 * the number of arguments is wrong or one is not an integer. */
static int int_args(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t total, int count,
                    const char *name, long long *v)
{
    if (nargs != total) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, total, nargs);
        return 0;
    }
    for (int i = 0; i < count; i++) {
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return 0;
    }
    return 1;
}

static PyObject *has_avx512(PyObject *self, PyObject *noargs)
{
#ifdef NATIVE_X86
    return PyBool_FromLong(cpu_has_avx512());
#else
    Py_RETURN_FALSE;
#endif
}

static PyObject *available(PyObject *self, PyObject *noargs)
{
#ifdef NATIVE_X86
    return PyBool_FromLong(cpu_ok());
#else
    Py_RETURN_FALSE;
#endif
}

/* gemm(x_ptr, ldx, w_ptr, y_ptr, ldy, m, n, k, num_threads, gated, bmax_ptr, wide_min, zmm):
 * pointers as integers, strides in elements; bmax_ptr 0: no block maxima (else
 * [m, ceil(n / 64)], not gated, ldy = n); wide_min: row blocks of at least this many rows take
 * the AVX-512 path where the CPU has it (0: never); zmm: the register blocks of the others
 * in 512-bit registers where the CPU has AVX-512F (ZMICROS). The caller (skinny.py) checks
 * shapes, dtypes, layout and availability. */
#ifdef NATIVE_X86
/* gemm's work, v as gemm's arguments (the module doc); no Python calls (the caller may have
 * released the GIL). 0, or -1 where a worker thread could not be joined. */
static int gemm_core(const long long *v)
{
    const int64_t n = v[6], panels = (n + NR - 1) / NR;
    int threads = (int)v[8];
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    /* with block maxima a thread's panels are whole blocks: no block is split between two */
    const int64_t unit = v[10] ? BMAX_PANELS : 1, units = (panels + unit - 1) / unit;
    if (threads > units) threads = (int)(units > 0 ? units : 1);
    /* rows a multiple of 4 KB apart share their L1 sets at every k: more than a few rows in a
     * register block (an MLP's down projection: x is the [m, 16384] activation) evict each
     * other's lines. Copied 64 bytes further apart each, they fall in different sets. */
    const int64_t wide_min = cpu_has_avx512() && v[11] > 0 ? v[11] : 0;
    const float *x = (const float *)(intptr_t)v[0];
    int64_t ldx = v[1];
    float *x_copy = NULL;
    if (v[5] > MR && (wide_min == 0 || v[5] < wide_min) && ldx % 1024 == 0) {
        /* K rounded up to whole lines, then one line more where that is 4 KB-aligned again */
        const int64_t lines = (v[7] + 15) / 16 * 16;
        const int64_t stride = lines % 1024 == 0 ? lines + 16 : lines;
        x_copy = aligned_alloc(64, (size_t)(v[5] * stride * 4 + 63) / 64 * 64);
        if (x_copy) {
            for (int64_t i = 0; i < v[5]; i++) memcpy(x_copy + i * stride, x + i * ldx, v[7] * 4);
            x = x_copy;
            ldx = stride;
        }
    }
    Job jobs[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        const int64_t p0 = units * t / threads * unit, p1 = units * (t + 1) / threads * unit;
        jobs[t] = (Job){
            .x = x, .ldx = ldx,
            .w = (const float *)(intptr_t)v[2],
            .y = (float *)(intptr_t)v[3], .ldy = v[4],
            .m = v[5], .n = n, .k = v[7],
            .p0 = p0, .p1 = p1 < panels ? p1 : panels,
            .gated = v[9] != 0,
            .bmax = (float *)(intptr_t)v[10],
            .wide_min = wide_min,
            .chunk_max = cpu_has_avx512vl() && v[11] > 0 ? TR : MR,
            .big_panels = v[7] * NR * 4 * 8 >= l2_bytes() * NTA_L2_EIGHTHS,
            .zmm = cpu_has_avx512() && v[12] != 0,
        };
    }
    int failed = 0;
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int t = 1; t < threads; t++) {
        started[t] = pthread_create(&ids[t], NULL, run_job, &jobs[t]) == 0;
        if (!started[t]) run_job(&jobs[t]); /* no thread to be had: this one does it */
    }
    run_job(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t] && pthread_join(ids[t], NULL) != 0) failed = 1;
    }
    free(x_copy);
    return failed ? -1 : 0;
}
#endif

static PyObject *gemm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[13];
    if (!int_args(args, nargs, 13, 13, "gemm", v)) return NULL;
#ifdef NATIVE_X86
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = gemm_core(v);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError, "skinny gemm: a worker thread could not be joined");
        return NULL;
    }
    Py_RETURN_NONE;
#else
    return not_built("gemm");
#endif
}

/* rmsnorm(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, rows, dim, eps): rows of `dim` contiguous floats
 * (x, r, y, s all [rows, dim]); r_ptr 0: no residual; s_ptr 0: the sum is not written. */
#ifdef NATIVE_X86
/* rmsnorm's work, v as its first 7 arguments */
static void rmsnorm_core(const long long *v, float eps)
{
    const float *x = (const float *)(intptr_t)v[0], *r = (const float *)(intptr_t)v[1];
    const float *w = (const float *)(intptr_t)v[2];
    float *y = (float *)(intptr_t)v[3], *s = (float *)(intptr_t)v[4];
    const int64_t rows = v[5], dim = v[6];
    for (int64_t i = 0; i < rows; i++) {
        rmsnorm_row(x + i * dim, r ? r + i * dim : NULL, w, y + i * dim, s ? s + i * dim : NULL,
                    dim, eps);
    }
}
#endif

static PyObject *rmsnorm(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[7];
    if (!int_args(args, nargs, 8, 7, "rmsnorm", v)) return NULL;
    const double eps = PyFloat_AsDouble(args[7]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
#ifdef NATIVE_X86
    rmsnorm_core(v, (float)eps);
    Py_RETURN_NONE;
#else
    return not_built("rmsnorm");
#endif
}

/* embed(table_ptr, vocab, hidden, tied, ids, out_ptr): out[i] = the embedding row of ids[i]
 * (a list of ints) into [len(ids), hidden] floats. tied: the table is the LM head's skinny
 * panels [ceil(vocab / NR), hidden, NR] (row v: column v % NR of panel v / NR); else a dense
 * [vocab, hidden] table. An id outside [0, vocab) raises ValueError before anything is written. */
static PyObject *embed(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[4];
    if (!int_args(args, nargs, 6, 4, "embed", v)) return NULL;
    PyObject *ids = args[4];
    const long long out_addr = PyLong_AsLongLong(args[5]);
    if (out_addr == -1 && PyErr_Occurred()) return NULL;
    if (!PyList_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "embed: token ids must be a list of ints");
        return NULL;
    }
    const int64_t vocab = v[1], hidden = v[2];
    const Py_ssize_t n = PyList_GET_SIZE(ids);
    for (Py_ssize_t i = 0; i < n; i++) {
        const long long id = PyLong_AsLongLong(PyList_GET_ITEM(ids, i));
        if (id == -1 && PyErr_Occurred()) return NULL;
        if (id < 0 || id >= vocab) {
            PyErr_Format(PyExc_ValueError, "token id %lld is outside the vocabulary [0, %lld)",
                         id, (long long)vocab);
            return NULL;
        }
    }
    const float *table = (const float *)(intptr_t)v[0];
    float *out = (float *)(intptr_t)out_addr;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t id = PyLong_AsLongLong(PyList_GET_ITEM(ids, i));
        float *row = out + i * hidden;
        if (v[3]) {
            const float *panel = table + (id / NR) * hidden * NR + id % NR;
            for (int64_t j = 0; j < hidden; j++) row[j] = panel[j * NR];
        } else {
            memcpy(row, table + id * hidden, (size_t)hidden * sizeof(float));
        }
    }
    Py_RETURN_NONE;
}

#ifdef NATIVE_X86
static int attn_sizes_ok(const AttnJob *a)
{
    return a->Hkv >= 1 && a->H % a->Hkv == 0 && a->D >= 2 && a->D % 2 == 0 && a->max_len >= 1;
}

/* Each row's slot, start and length fit the chunk and the cache (the work buffers are sized
 * by the chunk); else a Python ValueError set, and False. */
static int attn_rows_ok(const AttnJob *a)
{
    for (int64_t b = 0; b < a->B; b++) {
        const int64_t slot = a->rows[3 * b], start = a->rows[3 * b + 1];
        const int64_t len = a->rows[3 * b + 2];
        if (slot < 0 || start < 0 || len < 0 || len > a->T || start + len > a->max_len) {
            PyErr_Format(PyExc_ValueError,
                         "attention: row %lld (slot %lld, start %lld, length %lld) outside a "
                         "chunk of %lld tokens or a cache of %lld positions",
                         (long long)b, (long long)slot, (long long)start, (long long)len,
                         (long long)a->T, (long long)a->max_len);
            return 0;
        }
    }
    return 1;
}

/* ---- Blocked attention: attn_queries' answer, 3-4x faster (attn_blocked, below) ----
 * The queries that share a KV head go over its keys together, a block of keys at a time, each
 * folding the block into its running softmax (its largest score, the sum of exps and the
 * weighted values, rescaled when the largest score grows): a block's K and V are read from
 * beyond L1 once, not once per query. Within a block a query's scores are taken 8 and 4 keys
 * at a time (running sums of products in registers, reduced together) and its weighted values
 * summed in registers: with AVX-512 for head dims of 64 and 128 (attn_block512), else with
 * 256-bit registers for head dims that are multiples of 8 (attn_block256; other head dims:
 * attn_queries). Verify-shaped (16 sequences x 5 tokens, 4 query heads on 2 KV heads of 64,
 * 400 positions) on a Zen 5 core: 910 us a layer for attn_queries, 280 (AVX-512), 424 (AVX2);
 * at 1,500 positions 4,068, 1,166-1,227 and 2,057. The sums are taken in another order than
 * attn_queries', so the answers differ in the last bits (tests/model/test_native_attention.py
 * holds every path to a float64 reference). */

/* the largest of 4 lanes (the block kernels' running maximum of their scores) */
static inline float max4(__m128 v)
{
    float lanes[4];
    _mm_storeu_ps(lanes, v);
    return fmaxf(fmaxf(lanes[0], lanes[1]), fmaxf(lanes[2], lanes[3]));
}

/* the sums of 4 vectors' lanes: [sum a, sum b, sum c, sum d] */
__attribute__((target("avx512f,avx2,fma"))) static inline __m128 sum4_512(__m512 a, __m512 b,
                                                                        __m512 c, __m512 d)
{
    /* per 128-bit lane: [a0 + a2, b0 + b2, a1 + a3, b1 + b3], then the same for c, d */
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    /* per 128-bit lane: [sum a, sum b, sum c, sum d] over that lane's four */
    const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                      _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                        _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                            _mm512_castps_pd(abcd), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
}

/* exp_shifted 16 at a time (exp16: exp8's bits lane by lane; the sum in another order) */
__attribute__((target("avx512f,avx2,fma"))) static float exp_shifted16(float *s, int64_t n,
                                                                      float top)
{
    const __m512 vtop = _mm512_set1_ps(top);
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), vtop));
        _mm512_storeu_ps(s + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    float total = _mm512_reduce_add_ps(acc);
    for (; i < n; i++) {
        s[i] = expf(s[i] - top);
        total += s[i];
    }
    return total;
}

/* the per-128-bit-lane sums of sum4_512's first step for two sets of four -> the 8 sums */
__attribute__((target("avx512f,avx2,fma"))) static inline __m512 quad_sums(__m512 a, __m512 b,
                                                                         __m512 c, __m512 d)
{
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    return _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
}

__attribute__((target("avx512f,avx2,fma"))) static inline __m256 sum8_512(__m512 x, __m512 y)
{
    /* x, y: 4 lanes of 128 bits, each [s0..s3] partial; -> [sum x's, sum y's] */
    const __m512 lo = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)); /* x0 x1 y0 y1 */
    const __m512 hi = _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)); /* x2 x3 y2 y3 */
    const __m512 z = _mm512_add_ps(lo, hi); /* x02 x13 y02 y13 */
    const __m512 w = _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* x02 y02 x13 y13 */
    return _mm256_add_ps(_mm512_castps512_ps256(w),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
}

/* One query q [16 C] over keys [r0, r1) of one head (keys, values: D = 16 C floats a
 * position), folded into its running softmax: m the largest score so far, *sum the sum of
 * exp(score - m) so far, acc [D] the sum of exp(score - m) v so far (all rescaled when m
 * grows). sc: room for r1 - r0 floats. */
__attribute__((target("avx512f,avx2,fma"), always_inline)) static inline void
attn_block512(const float *q, const float *keys, const float *values, int64_t r0, int64_t r1,
              float scale, float *sc, float *m, float *sum, float *acc, const int C)
{
    const int64_t D = 16 * C, n = r1 - r0;
    __m512 qv[8];
    for (int c = 0; c < C; c++) qv[c] = _mm512_loadu_ps(q + 16 * c);
    const float *kb = keys + r0 * D;
    int64_t l = 0;
    const __m256 vscale8 = _mm256_set1_ps(scale);
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    for (; l + 8 <= n; l += 8) {
        const float *k = kb + l * D;
        __m512 a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k + j * D));
        for (int c = 1; c < C; c++) {
            for (int j = 0; j < 8; j++) {
                a[j] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + j * D + 16 * c), a[j]);
            }
        }
        const __m256 s = _mm256_mul_ps(
            sum8_512(quad_sums(a[0], a[1], a[2], a[3]), quad_sums(a[4], a[5], a[6], a[7])),
            vscale8);
        _mm256_storeu_ps(sc + l, s);
        top8 = _mm256_max_ps(top8, s);
    }
    __m128 top4 = _mm_max_ps(_mm256_castps256_ps128(top8), _mm256_extractf128_ps(top8, 1));
    const __m128 vscale = _mm_set1_ps(scale);
    for (; l + 4 <= n; l += 4) {
        const float *k = kb + l * D;
        __m512 a0 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
        __m512 a1 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k + D));
        __m512 a2 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k + 2 * D));
        __m512 a3 = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k + 3 * D));
        for (int c = 1; c < C; c++) {
            a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), a0);
            a1 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + D + 16 * c), a1);
            a2 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 2 * D + 16 * c), a2);
            a3 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 3 * D + 16 * c), a3);
        }
        const __m128 s = _mm_mul_ps(sum4_512(a0, a1, a2, a3), vscale);
        _mm_storeu_ps(sc + l, s);
        top4 = _mm_max_ps(top4, s);
    }
    float top = max4(top4);
    for (; l < n; l++) { /* the last 1-3 keys */
        const float *k = kb + l * D;
        __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(k));
        for (int c = 1; c < C; c++) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), a);
        sc[l] = _mm512_reduce_add_ps(a) * scale;
        top = sc[l] > top ? sc[l] : top;
    }
    __m512 even[8], odd[8];
    if (top > *m) { /* a new largest score: what was summed so far shrinks by exp(m - top) */
        const float shrink = *m == -INFINITY ? 0.0f : expf(*m - top);
        const __m512 f = _mm512_set1_ps(shrink);
        for (int c = 0; c < C; c++) even[c] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * c), f);
        *sum *= shrink;
        *m = top;
    } else {
        for (int c = 0; c < C; c++) even[c] = _mm512_loadu_ps(acc + 16 * c);
    }
    *sum += exp_shifted16(sc, n, *m);
    for (int c = 0; c < C; c++) odd[c] = _mm512_setzero_ps();
    const float *vb = values + r0 * D;
    for (l = 0; l + 2 <= n; l += 2) {
        const float *v = vb + l * D;
        const __m512 w0 = _mm512_set1_ps(sc[l]), w1 = _mm512_set1_ps(sc[l + 1]);
        for (int c = 0; c < C; c++) {
            even[c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(v + 16 * c), even[c]);
            odd[c] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(v + D + 16 * c), odd[c]);
        }
    }
    if (l < n) {
        const __m512 w0 = _mm512_set1_ps(sc[l]);
        for (int c = 0; c < C; c++) {
            even[c] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(vb + l * D + 16 * c), even[c]);
        }
    }
    for (int c = 0; c < C; c++) _mm512_storeu_ps(acc + 16 * c, _mm512_add_ps(even[c], odd[c]));
}

/* attn_block512 for head dims of 64 and 128 (the register arrays sized at compile time) */
typedef void (*AttnBlockFn)(const float *q, const float *keys, const float *values, int64_t r0,
                            int64_t r1, int64_t D, float scale, float *sc, float *m, float *sum,
                            float *acc);

__attribute__((target("avx512f,avx2,fma"))) static void
attn_block512_d64(const float *q, const float *keys, const float *values, int64_t r0,
                  int64_t r1, int64_t D, float scale, float *sc, float *m, float *sum, float *acc)
{
    (void)D;
    attn_block512(q, keys, values, r0, r1, scale, sc, m, sum, acc, 4);
}

__attribute__((target("avx512f,avx2,fma"))) static void
attn_block512_d128(const float *q, const float *keys, const float *values, int64_t r0,
                   int64_t r1, int64_t D, float scale, float *sc, float *m, float *sum,
                   float *acc)
{
    (void)D;
    attn_block512(q, keys, values, r0, r1, scale, sc, m, sum, acc, 8);
}

/* the sums of 4 vectors' lanes (256-bit): [sum a, sum b, sum c, sum d] */
__attribute__((target("avx2,fma"))) static inline __m128 sum4_256(__m256 a, __m256 b, __m256 c,
                                                                 __m256 d)
{
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* attn_block512 with 256-bit registers, for D a multiple of 8: q and the sums read from
 * memory (L1), the weighted values summed 64 columns at a time (the rest 8 at a time). */
__attribute__((target("avx2,fma"))) static void attn_block256(const float *q, const float *keys,
                                                             const float *values, int64_t r0,
                                                             int64_t r1, int64_t D, float scale,
                                                             float *sc, float *m, float *sum,
                                                             float *acc)
{
    const int64_t n = r1 - r0;
    const float *kb = keys + r0 * D;
    const __m128 vscale = _mm_set1_ps(scale);
    __m128 top4 = _mm_set1_ps(-INFINITY);
    int64_t l = 0;
    for (; l + 4 <= n; l += 4) {
        const float *k = kb + l * D;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < D; c += 8) {
            const __m256 qc = _mm256_loadu_ps(q + c);
            a0 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + c), a0);
            a1 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + D + c), a1);
            a2 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 2 * D + c), a2);
            a3 = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k + 3 * D + c), a3);
        }
        const __m128 s = _mm_mul_ps(sum4_256(a0, a1, a2, a3), vscale);
        _mm_storeu_ps(sc + l, s);
        top4 = _mm_max_ps(top4, s);
    }
    float top = max4(top4);
    for (; l < n; l++) { /* the last 1-3 keys */
        sc[l] = dot(q, kb + l * D, D) * scale;
        top = sc[l] > top ? sc[l] : top;
    }
    float shrink = 1.0f;
    if (top > *m) { /* a new largest score: what was summed so far shrinks by exp(m - top) */
        shrink = *m == -INFINITY ? 0.0f : expf(*m - top);
        *sum *= shrink;
        *m = top;
    }
    *sum += exp_shifted(sc, n, *m);
    const __m256 f = _mm256_set1_ps(shrink);
    const float *vb = values + r0 * D;
    int64_t col = 0;
    for (; col + 64 <= D; col += 64) { /* 64 columns: 8 registers of sums */
        __m256 sums[8];
        for (int i = 0; i < 8; i++) {
            sums[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + col + 8 * i), f);
        }
        for (l = 0; l < n; l++) {
            const float *v = vb + l * D + col;
            const __m256 w = _mm256_set1_ps(sc[l]);
            for (int i = 0; i < 8; i++) {
                sums[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * i), sums[i]);
            }
        }
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(acc + col + 8 * i, sums[i]);
    }
    for (; col < D; col += 8) { /* the last columns (D a multiple of 8): 8 at a time */
        __m256 sums = _mm256_mul_ps(_mm256_loadu_ps(acc + col), f);
        for (l = 0; l < n; l++) {
            sums = _mm256_fmadd_ps(_mm256_set1_ps(sc[l]), _mm256_loadu_ps(vb + l * D + col), sums);
        }
        _mm256_storeu_ps(acc + col, sums);
    }
}

/* Every real query of the job, KV head by KV head: the queries that share a KV head (the
 * group's heads at every position of the chunk) go over its keys together, a block of keys
 * at a time (a block's K and V, 32 KB, stay in the L1 cache while each query folds it into its
 * running softmax: `block`), so each key and value is read from beyond L1 once per block, not
 * once per query. work: 2 Q D + 2 Q + 64 floats, Q = T * H / Hkv queries a KV head. */
__attribute__((target("avx2,fma"))) static void attn_blocked(const AttnJob *a, float *work,
                                                            AttnBlockFn block)
{
    const int64_t width = (a->H + 2 * a->Hkv) * a->D, group = a->H / a->Hkv, D = a->D;
    const int64_t BK = 4096 / D < 64 ? 4096 / D : 64; /* K and V: 32 KB */
    for (int64_t b = 0; b < a->B; b++) {
        const int64_t slot = a->rows[3 * b], start = a->rows[3 * b + 1];
        const int64_t len = a->rows[3 * b + 2];
        for (int64_t t = len; t < a->T; t++) { /* the pads of a shorter chunk */
            memset(a->out + (b * a->T + t) * a->H * D, 0, (size_t)(a->H * D) * sizeof(float));
        }
        if (len <= 0) continue;
        const int64_t nq = len * group;
        float *qs = work, *acc = work + nq * D, *ms = acc + nq * D, *sums = ms + nq;
        float *sc = sums + nq;
        const int64_t p_last = start + len - 1;
        const int64_t lo_first =
            a->window > 0 && start - a->window + 1 > 0 ? start - a->window + 1 : 0;
        for (int64_t g = 0; g < a->Hkv; g++) {
            for (int64_t t = 0; t < len; t++) {
                const int64_t p = start + t;
                const float *tok = a->qkv + (b * a->T + t) * width;
                for (int64_t j = 0; j < group; j++) {
                    const int64_t i = t * group + j;
                    rotate(tok + (g * group + j) * D, a->cos + p * D, a->ssin + p * D, D,
                           qs + i * D);
                    ms[i] = -INFINITY;
                    sums[i] = 0.0f;
                    memset(acc + i * D, 0, (size_t)D * sizeof(float));
                }
            }
            const int64_t base = (slot * a->Hkv + g) * a->max_len * D;
            const float *keys = a->kc + base, *values = a->vc + base;
            for (int64_t k0 = lo_first; k0 <= p_last; k0 += BK) {
                const int64_t k1 = k0 + BK < p_last + 1 ? k0 + BK : p_last + 1;
                for (int64_t i = 0; i < nq; i++) {
                    const int64_t p = start + i / group;
                    const int64_t lo =
                        a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
                    const int64_t r0 = k0 > lo ? k0 : lo, r1 = k1 < p + 1 ? k1 : p + 1;
                    if (r0 >= r1) continue;
                    block(qs + i * D, keys, values, r0, r1, D, a->scale, sc, ms + i, sums + i,
                          acc + i * D);
                }
            }
            for (int64_t i = 0; i < nq; i++) {
                const int64_t t = i / group, h = g * group + i % group;
                float *dst = a->out + (b * a->T + t) * a->H * D + h * D;
                const __m256 inv = _mm256_set1_ps(1.0f / sums[i]);
                for (int64_t c = 0; c < D; c += 8) {
                    const __m256 sums_c = _mm256_loadu_ps(acc + i * D + c);
                    _mm256_storeu_ps(dst + c, _mm256_mul_ps(sums_c, inv));
                }
            }
        }
    }
}

/* attention's work (sizes and rows checked); no Python calls. 0, or -1 where memory ran
 * out. */
static int attention_core(const AttnJob *a)
{
    /* the blocked path's work: 2 Q D + 2 Q + 64 floats at most (attn_blocked) */
    const int64_t queries = a->T * (a->H / a->Hkv);
    const int64_t blocked = 2 * queries * a->D + 2 * queries + 64;
    const int64_t room = a->max_len + a->D > blocked ? a->max_len + a->D : blocked;
    float *scratch = (float *)malloc((size_t)room * sizeof(float));
    if (scratch == NULL) return -1;
    attn_write(a);
    if ((a->D == 64 || a->D == 128) && rows_avx512()) {
        attn_blocked(a, scratch, a->D == 64 ? attn_block512_d64 : attn_block512_d128);
    } else if (a->D % 8 == 0) {
        attn_blocked(a, scratch, attn_block256);
    } else {
        attn_queries(a, scratch, scratch + a->max_len);
    }
    free(scratch);
    return 0;
}
#endif

/* attention(qkv, rows, cos, ssin, kc, vc, out, B, T, H, Hkv, D, max_len, window, scale):
 * pointers as integers (module doc; float32, contiguous); window 0: none. */
static PyObject *attention(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[14];
    if (!int_args(args, nargs, 15, 14, "attention", v)) return NULL;
    const double scale = PyFloat_AsDouble(args[14]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
#ifdef NATIVE_X86
    AttnJob a = {
        .qkv = (const float *)(intptr_t)v[0], .rows = (const int64_t *)(intptr_t)v[1],
        .cos = (const float *)(intptr_t)v[2], .ssin = (const float *)(intptr_t)v[3],
        .kc = (float *)(intptr_t)v[4], .vc = (float *)(intptr_t)v[5],
        .out = (float *)(intptr_t)v[6],
        .B = v[7], .T = v[8], .H = v[9], .Hkv = v[10], .D = v[11], .max_len = v[12],
        .window = v[13], .scale = (float)scale,
    };
    if (!attn_sizes_ok(&a)) {
        PyErr_SetString(PyExc_ValueError, "attention: bad head counts or sizes");
        return NULL;
    }
    if (!attn_rows_ok(&a)) return NULL;
    int failed;
    Py_BEGIN_ALLOW_THREADS
    failed = attention_core(&a);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
#else
    return not_built("attention");
#endif
}

/* layers(table, num_layers, normed, qkv, attn, o, gated, mlp, res_a, res_b, embedded, rows,
 * cos, ssin, num_seqs, chunk, heads, kv_heads, head_dim, max_len, hidden, qkv_width,
 * attn_width, intermediate, threads, wide_min, zmm, eps, scale): a native pass's decoder
 * layers (native_pass.py) in one call: per layer the norm, q/k/v GEMM, attention, output GEMM,
 * norm, gate/up and down GEMMs, in native_pass.py's order (the same bits as the module path).
 * table: int64 [num_layers][LAYER_FIELDS] (native_pass.LayerPointers' fields in order); every
 * other pointer as an integer. Returns (residual, pending): the residual stream's buffer and
 * the last MLP's output, which the final norm adds. */
#define LAYER_FIELDS 13
static PyObject *layers_native(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[27];
    if (!int_args(args, nargs, 29, 27, "layers", v)) return NULL;
    const double eps = PyFloat_AsDouble(args[27]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    const double scale = PyFloat_AsDouble(args[28]);
    if (scale == -1.0 && PyErr_Occurred()) return NULL;
#ifdef NATIVE_X86
    const int64_t *table = (const int64_t *)(intptr_t)v[0];
    const int64_t num_layers = v[1];
    const long long normed = v[2], qkv = v[3], attn = v[4], o = v[5], gated = v[6], mlp = v[7];
    const long long res_a = v[8], res_b = v[9], embedded = v[10];
    const long long num_seqs = v[14], chunk = v[15], hidden = v[20], qkv_width = v[21];
    const long long attn_width = v[22], inter = v[23], threads = v[24], wide_min = v[25];
    const long long zmm = v[26];
    const long long rows = num_seqs * chunk;
    AttnJob a = {
        .qkv = (const float *)(intptr_t)qkv, .rows = (const int64_t *)(intptr_t)v[11],
        .cos = (const float *)(intptr_t)v[12], .ssin = (const float *)(intptr_t)v[13],
        .out = (float *)(intptr_t)attn,
        .B = num_seqs, .T = chunk, .H = v[16], .Hkv = v[17], .D = v[18], .max_len = v[19],
        .scale = (float)scale,
    };
    if (!attn_sizes_ok(&a)) {
        PyErr_SetString(PyExc_ValueError, "layers: bad head counts or sizes");
        return NULL;
    }
    if (!attn_rows_ok(&a)) return NULL;
    long long residual = embedded, pending = 0;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t l = 0; l < num_layers && !failed; l++) {
        const int64_t *f = table + l * LAYER_FIELDS;
        const long long in_norm = f[0], post_norm = f[1], w_qkv = f[2], w_o = f[4];
        const long long w_gate_up = f[6], w_down = f[8];
        long long nxt = residual == res_a ? res_b : res_a;
        if (pending) { /* residual + mlp -> the layer's input; its norm -> normed */
            const long long n[7] = {residual, pending, in_norm, normed, nxt, rows, hidden};
            rmsnorm_core(n, (float)eps);
            residual = nxt;
        } else {
            const long long n[7] = {residual, 0, in_norm, normed, 0, rows, hidden};
            rmsnorm_core(n, (float)eps);
        }
        const long long g_qkv[13] = {normed, hidden, w_qkv, qkv, qkv_width, rows, qkv_width,
                                     hidden, f[3] ? threads : 1, 0, 0, wide_min, zmm};
        failed |= gemm_core(g_qkv);
        a.kc = (float *)(intptr_t)f[10];
        a.vc = (float *)(intptr_t)f[11];
        a.window = f[12];
        failed |= attention_core(&a);
        const long long g_o[13] = {attn, attn_width, w_o, o, hidden, rows, hidden, attn_width,
                                   f[5] ? threads : 1, 0, 0, wide_min, zmm};
        failed |= gemm_core(g_o);
        /* residual + attention -> the MLP's residual; its norm -> normed */
        nxt = residual == res_a ? res_b : res_a;
        const long long n2[7] = {residual, o, post_norm, normed, nxt, rows, hidden};
        rmsnorm_core(n2, (float)eps);
        residual = nxt;
        const long long g_up[13] = {normed, hidden, w_gate_up, gated, inter, rows, inter, hidden,
                                    f[7] ? threads : 1, 1, 0, wide_min, zmm};
        failed |= gemm_core(g_up);
        const long long g_down[13] = {gated, inter, w_down, mlp, hidden, rows, hidden, inter,
                                      f[9] ? threads : 1, 0, 0, wide_min, zmm};
        failed |= gemm_core(g_down);
        pending = mlp;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError,
                        "layers: a worker thread could not be joined, or memory ran out");
        return NULL;
    }
    return Py_BuildValue("(LL)", residual, pending);
#else
    return not_built("layers");
#endif
}

/* field_key_runs(seeds, starts, counts, out_ptr): the Gumbel field's keys (gumbel_field.
 * field_key) of count[j] consecutive positions from starts[j] for draft seed seeds[j], run
 * after run, into int64 out (sum(counts) of them): mix64((seed ^ FIELD_SALT) + (position + 1)
 * * GAMMA) modulo 2^64, as gumbel_field.field_key_run computes them in Python (~0.7 us a key
 * there). Seeds are taken modulo 2^64 (as Python's masks do); ValueError for a negative
 * position or count, or lists of unequal lengths. */
static PyObject *field_key_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "field_key_runs takes 4 arguments, got %zd", nargs);
        return NULL;
    }
#ifdef NATIVE_X86
    int64_t *out = (int64_t *)PyLong_AsVoidPtr(args[3]);
    if (!out && PyErr_Occurred()) return NULL;
    PyObject *lists[3] = {NULL, NULL, NULL};
    PyObject *result = NULL;
    for (int l = 0; l < 3; l++) {
        lists[l] = PySequence_Fast(args[l], "field_key_runs takes lists of ints");
        if (!lists[l]) goto done;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(lists[0]);
    if (PySequence_Fast_GET_SIZE(lists[1]) != n || PySequence_Fast_GET_SIZE(lists[2]) != n) {
        PyErr_SetString(PyExc_ValueError,
                        "field_key_runs: seeds, starts and counts differ in length");
        goto done;
    }
    const uint64_t salt = 0x2545F4914F6CDD1DULL; /* gumbel_field.FIELD_SALT */
    int64_t k = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *item = PySequence_Fast_GET_ITEM(lists[0], j);
        const uint64_t seed = PyLong_AsUnsignedLongLongMask(item);
        if (seed == (uint64_t)-1 && PyErr_Occurred()) goto done;
        const long long start = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(lists[1], j));
        if (start == -1 && PyErr_Occurred()) goto done;
        const long long count = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(lists[2], j));
        if (count == -1 && PyErr_Occurred()) goto done;
        if (start < 0 || count < 0) {
            PyErr_Format(PyExc_ValueError, start < 0 ? "position must be >= 0, got %lld"
                                                     : "count must be >= 0, got %lld",
                         start < 0 ? start : count);
            goto done;
        }
        uint64_t word = (seed ^ salt) + ((uint64_t)start + 1) * G_GAMMA;
        for (long long c = 0; c < count; c++, word += G_GAMMA) out[k++] = (int64_t)g_mix64(word);
    }
    result = Py_NewRef(Py_None);
done:
    for (int l = 0; l < 3; l++) Py_XDECREF(lists[l]);
    return result;
#else
    return not_built("field_key_runs");
#endif
}

/* gumbel_argmax(scores_ptr, ld, vocab, num_rows, rows_ptr, keys_ptr, scales_ptr, maxima_ptr,
 * ldm, num_keys, out_ptr, are_probs, hints_ptr, scales_f32, runs_ptr, num_runs, excluded_ptr,
 * width): for key i
 * (int64 keys[i]) over float32 row rows[i] (rows_ptr 0: row i) of the num_rows rows of
 * scores (ld floats apart), with noise scale double scales[i] (scales_f32: float32
 * scales[i], as a double; scales_ptr 0: 1), the token into int64 out[i]. maxima_ptr 0: none
 * (computed); else float32 block maxima, row r at maxima + r * ldm. are_probs: the scores
 * are probabilities and log p races (a zero never wins). hints_ptr 0: none; else int64
 * hints[i], a token likely to win for key i (< 0: none): the same answer, found with less
 * drawn where it wins. runs_ptr (with hints; 0: none): int64 lengths of num_runs runs of
 * consecutive keys (a sequence's draft positions, then its bonus): after a key whose answer
 * is not its hint, the rest of its run is not searched (out -3): a verifier accepts drafts
 * up to the first that is not its choice and never reads the choices after it. excluded_ptr
 * (0: none): int64 [num_keys, width] token ids key i may not pick (entries < 0 unused): they
 * score -inf (probabilities: 0) for its search and get their values back after it, so the
 * scores are left as they were. IndexError for a row outside the scores or an excluded id past
 * the vocabulary; ValueError for runs that do not cover the keys. Returns False where a NaN
 * was seen (out is then not to be used). */
static PyObject *gumbel_argmax_native(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[18];
    if (!int_args(args, nargs, 18, 18, "gumbel_argmax", v)) return NULL;
#ifdef NATIVE_X86
    const float *scores = (const float *)(intptr_t)v[0];
    const int64_t *excluded = (const int64_t *)(intptr_t)v[16], width = excluded ? v[17] : 0;
    const int64_t ld = v[1], V = v[2], num_rows = v[3], ldm = v[8], num = v[9];
    const int64_t *rows = (const int64_t *)(intptr_t)v[4];
    const int64_t *keys = (const int64_t *)(intptr_t)v[5];
    const double *scales = v[13] ? NULL : (const double *)(intptr_t)v[6];
    const float *scales_f32 = v[13] ? (const float *)(intptr_t)v[6] : NULL;
    const float *maxima = (const float *)(intptr_t)v[7];
    int64_t *out = (int64_t *)(intptr_t)v[10];
    const int64_t *hints = (const int64_t *)(intptr_t)v[12];
    const int64_t *runs = hints ? (const int64_t *)(intptr_t)v[14] : NULL, num_runs = v[15];
    for (int64_t i = 0; i < num; i++) {
        const int64_t r = rows ? rows[i] : i;
        if (r < 0 || r >= num_rows) {
            PyErr_Format(PyExc_IndexError, "rows out of range for %lld rows of scores: %lld",
                         (long long)num_rows, (long long)r);
            return NULL;
        }
    }
    if (runs) {
        int64_t total = 0;
        for (int64_t j = 0; j < num_runs; j++) {
            if (runs[j] < 0) {
                PyErr_Format(PyExc_ValueError, "runs must be >= 0, got %lld", (long long)runs[j]);
                return NULL;
            }
            total += runs[j];
        }
        if (total != num) {
            PyErr_Format(PyExc_ValueError, "runs cover %lld keys of %lld", (long long)total,
                         (long long)num);
            return NULL;
        }
    }
    for (int64_t j = 0; j < num * width; j++) {
        if (excluded[j] >= V) {
            PyErr_Format(PyExc_IndexError, "excluded id %lld out of range for %lld tokens",
                         (long long)excluded[j], (long long)V);
            return NULL;
        }
    }
    const int64_t nb = (V + G_BLOCK - 1) / G_BLOCK;
    double *scratch = malloc((size_t)(G_SCRATCH(nb) + 1) * sizeof(double));
    float *saved = malloc((size_t)(width + 1) * sizeof(float));
    if (!scratch || !saved) {
        free(scratch);
        free(saved);
        return PyErr_NoMemory();
    }
    const float fill = v[11] ? 0.0f : -INFINITY; /* what an excluded token scores: never wins */
    int clean = 1;
    int64_t run = -1, run_end = 0, missed = 0; /* runs: the current one, where it ends */
    Py_BEGIN_ALLOW_THREADS
    for (int64_t i = 0; i < num && clean; i++) {
        const int64_t r = rows ? rows[i] : i;
        while (runs && i >= run_end) { /* the next run (one that holds keys) */
            run_end += runs[++run];
            missed = 0;
        }
        if (missed) { /* past a miss in its run: not needed */
            out[i] = -3;
            continue;
        }
        if (maxima && i + 2 < num) { /* the block maxima two rows on, read by the next row's
                                      * prefetch (9.5 KB a row at 151,936, mostly in memory) */
            const char *at = (const char *)(maxima + (rows ? rows[i + 2] : i + 2) * ldm);
            for (int64_t l = 0; l < nb * (int64_t)sizeof(float); l += 64) {
                _mm_prefetch(at + l, _MM_HINT_T0);
            }
        }
        if (i + 1 < num) {
            const int64_t next = rows ? rows[i + 1] : i + 1;
            g_prefetch_row(scores + next * ld, V, maxima ? maxima + next * ldm : NULL,
                           hints ? hints[i + 1] : -1);
        }
        /* the key's excluded tokens masked for its search, then restored (last first: a
         * repeated id gets its own value back); the row's block maxima still bound it */
        float *row = (float *)(scores + r * ld);
        const int64_t *ex = excluded ? excluded + i * width : NULL;
        for (int64_t j = 0; j < width; j++) {
            if (ex[j] >= 0) {
                saved[j] = row[ex[j]];
                row[ex[j]] = fill;
            }
        }
        out[i] = gumbel_row(row, V, maxima ? maxima + r * ldm : NULL, (uint64_t)keys[i],
                            scales ? scales[i] : scales_f32 ? (double)scales_f32[i] : 1.0,
                            v[11] != 0, hints ? hints[i] : -1, scratch);
        for (int64_t j = width - 1; j >= 0; j--) {
            if (ex[j] >= 0) row[ex[j]] = saved[j];
        }
        clean = out[i] != -2;
        missed = runs && hints[i] >= 0 && out[i] != hints[i];
    }
    Py_END_ALLOW_THREADS
    free(scratch);
    free(saved);
    return PyBool_FromLong(clean);
#else
    return not_built("gumbel_argmax");
#endif
}

/* argmax_rows(x_ptr, ld, rows, V, maxima_ptr, ldm, out_ptr): per row r of float32 x (ld floats
 * apart), out[r] = torch.argmax's index: the first maximum, or the first NaN where the row
 * holds one. maxima_ptr 0: two reads of the row (its max, then where it first is); else the
 * row's float32 block maxima of 64 (NaN where a block holds one), row r at maxima + r * ldm:
 * the first block holding the max is the only part of the row read. */
static PyObject *argmax_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[7];
    if (!int_args(args, nargs, 7, 7, "argmax_rows", v)) return NULL;
#ifdef NATIVE_X86
    const float *x = (const float *)(intptr_t)v[0];
    const int64_t ld = v[1], rows = v[2], V = v[3], ldm = v[5];
    const float *maxima = (const float *)(intptr_t)v[4];
    int64_t *out = (int64_t *)(intptr_t)v[6];
    const int64_t nb = (V + G_BLOCK - 1) / G_BLOCK;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        if (!maxima) {
            out[r] = first_at(row, V, max_of(row, V));
            continue;
        }
        const float *m = maxima + r * ldm;
        const int64_t b = first_at(m, nb, max_of(m, nb));
        const int64_t width = b < nb - 1 ? G_BLOCK : V - b * G_BLOCK;
        const float *block = row + b * G_BLOCK;
        /* the block's own max: m[b] is it, unless the maxima were taken for other values
         * (never: block_maxima.py keeps them in step with the logits) */
        out[r] = b * G_BLOCK + first_at(block, width, max_of(block, width));
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return not_built("argmax_rows");
#endif
}

/* log_normalizers(x_ptr, ld, rows, V, inv_temps_ptr, maxima_ptr, ldm, out_ptr): per row r
 * of float32 x (ld floats apart), out[r] = log sum_i exp(x[r, i] * inv_temps[r]) (doubles),
 * the log of a softmax's denominator at temperature 1 / inv_temps[r]. maxima_ptr 0: the rows'
 * maxima are found here; else float32 block maxima of 64, row r at maxima + r * ldm. */
static PyObject *log_normalizers(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[8];
    if (!int_args(args, nargs, 8, 8, "log_normalizers", v)) return NULL;
#ifdef NATIVE_X86
    const float *x = (const float *)(intptr_t)v[0];
    const int64_t ld = v[1], rows = v[2], V = v[3], ldm = v[6];
    const double *inv_t = (const double *)(intptr_t)v[4];
    const float *maxima = (const float *)(intptr_t)v[5];
    double *out = (double *)(intptr_t)v[7];
    const int64_t nb = (V + G_BLOCK - 1) / G_BLOCK;
    const int wide = rows_avx512();
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * ld;
        const float top = maxima ? max_of(maxima + r * ldm, nb) : max_of(row, V);
        out[r] = log_normalizer(row, V, top, inv_t[r], wide);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
#else
    return not_built("log_normalizers");
#endif
}

/* softmax_(x_ptr, ld, rows, V, inv_temps_ptr, maxima_ptr, ldm, out_maxima_ptr): each float32
 * row of x (ld floats apart) becomes softmax(x * inv_temps[r]) in place. maxima_ptr 0: the
 * rows' maxima are found here; else float32 block maxima of 64, row r at maxima + r * ldm.
 * out_maxima_ptr (or 0): the probabilities' block maxima, [rows, ceil(V / 64)] floats.
 * Returns False (nothing written) where a row's max is not finite (a NaN, +inf, or no finite
 * logit): the caller's torch softmax decides those. */
static PyObject *softmax_inplace(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[8];
    if (!int_args(args, nargs, 8, 8, "softmax_", v)) return NULL;
#ifdef NATIVE_X86
    float *x = (float *)(intptr_t)v[0];
    const int64_t ld = v[1], rows = v[2], V = v[3], ldm = v[6];
    const double *inv_t = (const double *)(intptr_t)v[4];
    const float *maxima = (const float *)(intptr_t)v[5];
    const int64_t nb = (V + G_BLOCK - 1) / G_BLOCK;
    int finite = 1;
    float *tops = malloc((size_t)(rows > 0 ? rows : 1) * sizeof(float));
    if (!tops) return PyErr_NoMemory();
    const int wide = rows_avx512();
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < rows && finite; r++) { /* every row's max first: all or nothing */
        const float top = maxima ? max_of(maxima + r * ldm, nb) : max_of(x + r * ld, V);
        finite = top > -INFINITY && top < INFINITY; /* false for a NaN too */
        tops[r] = top;
    }
    float *out_maxima = (float *)(intptr_t)v[7];
    for (int64_t r = 0; r < rows && finite; r++) {
        softmax_row(x + r * ld, V, tops[r], inv_t[r], out_maxima ? out_maxima + r * nb : NULL,
                    wide);
    }
    Py_END_ALLOW_THREADS
    free(tops);
    return PyBool_FromLong(finite);
#else
    return not_built("softmax_");
#endif
}

/* top_k(x_ptr, ld, rows, V, k, maxima_ptr, ldm, out_values_ptr, out_ids_ptr): the k largest
 * entries of each float32 row of x (ld floats apart), largest first, into out_values [rows, k]
 * floats and out_ids [rows, k] int64. maxima_ptr 0: the rows' maxima of every 64 entries are
 * found here; else float32 block maxima, row r at maxima + r * ldm. False (the outputs
 * incomplete) where a row holds a NaN: the caller's torch.topk decides those. */
static PyObject *top_k_native(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[9];
    if (!int_args(args, nargs, 9, 9, "top_k", v)) return NULL;
#ifdef NATIVE_X86
    const float *x = (const float *)(intptr_t)v[0];
    const int64_t ld = v[1], rows = v[2], V = v[3], k = v[4], ldm = v[6];
    const float *maxima = (const float *)(intptr_t)v[5];
    float *out_v = (float *)(intptr_t)v[7];
    int64_t *out_i = (int64_t *)(intptr_t)v[8];
    if (k < 1 || k > V) {
        PyErr_Format(PyExc_ValueError, "top_k: k = %lld out of [1, %lld]", v[4], v[3]);
        return NULL;
    }
    const int64_t nb = (V + 63) / 64;
    TopItem *heaps = malloc((size_t)(2 * k) * sizeof(TopItem));
    float *own = maxima ? NULL : malloc((size_t)nb * sizeof(float));
    int32_t *cand = malloc((size_t)V * sizeof(int32_t)); /* a row's candidates (top_k_row) */
    if (!heaps || (!maxima && !own) || !cand) {
        free(heaps);
        free(own);
        free(cand);
        return PyErr_NoMemory();
    }
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < rows && ok; r++) {
        const float *row = x + r * ld;
        const float *bmax = maxima + r * ldm;
        if (!maxima) { /* NaN where a block holds one: the row is refused */
            for (int64_t b = 0; b < nb; b++) {
                own[b] = max_of(row + b * 64, (b + 1) * 64 < V ? 64 : V - b * 64);
            }
            bmax = own;
        }
        ok = top_k_row(row, V, k, bmax, heaps, heaps + k, cand, out_v + r * k, out_i + r * k);
    }
    Py_END_ALLOW_THREADS
    free(heaps);
    free(own);
    free(cand);
    return PyBool_FromLong(ok);
#else
    return not_built("top_k");
#endif
}

/* One row's tokens into bins of log q counted down from its best, floor((best - log q_i) *
 * inv_width), log q_i = x_i * inv_t - ln in doubles (the last bin takes the rest), 4 at a
 * time; counts[b + 1] += the tokens in bin b. Each step rounds as the torch path's does (no
 * FMA: this function's target leaves it out). */
__attribute__((target("avx2"))) static void wide_bins(const float *row, int64_t V, double best,
                                                      double inv_t, double ln, double inv_width,
                                                      int64_t NB, int32_t *bin_of, int64_t *counts)
{
    const __m256d vbest = _mm256_set1_pd(best), vinv = _mm256_set1_pd(inv_t);
    const __m256d vln = _mm256_set1_pd(ln), vwidth = _mm256_set1_pd(inv_width);
    const __m256d vlast = _mm256_set1_pd((double)(NB - 1));
    int64_t i = 0;
    for (; i + 4 <= V; i += 4) { /* NaN rows never get here: min(NaN, last) would be last */
        const __m256d lq = _mm256_sub_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(row + i)),
                                                       vinv), vln);
        const __m256d below = _mm256_mul_pd(_mm256_sub_pd(vbest, lq), vwidth);
        /* below >= 0: truncation is the floor; +inf (a -inf logit) clamps to the last bin */
        _mm_storeu_si128((__m128i *)(bin_of + i),
                         _mm256_cvttpd_epi32(_mm256_min_pd(below, vlast)));
    }
    for (; i < V; i++) {
        const double below = (best - ((double)row[i] * inv_t - ln)) * inv_width;
        bin_of[i] = below < (double)(NB - 1) ? (int32_t)below : (int32_t)(NB - 1);
    }
    for (i = 0; i < V; i++) counts[bin_of[i] + 1]++;
}

/* q_i = exp(x_i * inv_t - ln) of n listed tokens (float32, within 2 ulp; exactly 0 for a -inf
 * logit: exp8's clamp at -88.38 builds the scale 2^-127 as the bits 0), 8 at a time. */
__attribute__((target("avx2,fma"))) static void wide_exps(const float *row, const int32_t *tokens,
                                                         int64_t n, double inv_t, double ln,
                                                         float *q)
{
    int64_t i = 0;
    float d[8];
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) d[j] = (float)((double)row[tokens[i + j]] * inv_t - ln);
        _mm256_storeu_ps(q + i, exp8(_mm256_loadu_ps(d))); /* -inf: clamped to 0 */
    }
    for (; i < n; i++) q[i] = expf((float)((double)row[tokens[i]] * inv_t - ln));
}

/* The ids i < V whose bin_of[i] < n_fit, in order, into out; returns how many. 8 at a time
 * with a mask per group (most groups hold both kinds at a flat row, and a branch per token
 * missed half the time: ~8 us a row of 4,096). */
__attribute__((target("avx2"))) static int64_t fitting_tokens(const int32_t *bin_of, int64_t V,
                                                              int32_t n_fit, int32_t *out)
{
    const __m256i limit = _mm256_set1_epi32(n_fit);
    int64_t n = 0, i = 0;
    for (; i + 8 <= V; i += 8) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(bin_of + i));
        unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(limit, b)));
        while (mask) {
            out[n++] = (int32_t)(i + __builtin_ctz(mask));
            mask &= mask - 1;
        }
    }
    for (; i < V; i++) {
        if (bin_of[i] < n_fit) out[n++] = (int32_t)i;
    }
    return n;
}

/* The same, 16 at a time, each group's ids packed with a compress (no branch per token). */
__attribute__((target("avx512f"))) static int64_t fitting_tokens512(const int32_t *bin_of,
                                                                    int64_t V, int32_t n_fit,
                                                                    int32_t *out)
{
    const __m512i limit = _mm512_set1_epi32(n_fit);
    const __m512i step = _mm512_set1_epi32(16);
    __m512i ids = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t n = 0, i = 0;
    for (; i + 16 <= V; i += 16) {
        const __mmask16 fit =
            _mm512_cmplt_epi32_mask(_mm512_loadu_si512((const void *)(bin_of + i)), limit);
        _mm512_storeu_si512((void *)(out + n), _mm512_maskz_compress_epi32(fit, ids));
        n += __builtin_popcount((unsigned)fit);
        ids = _mm512_add_epi32(ids, step);
    }
    for (; i < V; i++) {
        if (bin_of[i] < n_fit) out[n++] = (int32_t)i;
    }
    return n;
}

/* One row of wide_list (below): the row of V floats at inv_t, ln; its list into ids [M] int64
 * and q [M] float32 (padding: id 0, q 0); returns how many it lists (0: none). Scratch: bin_of
 * [V], order [M], fit [M + 16], start [NB + 1]. */
static int64_t wide_list_row(const float *row, int64_t V, double inv_t, double ln, double target,
                             int64_t M, int64_t NB, double inv_width, int wide, int32_t *bin_of,
                             int32_t *order, int32_t *fit, int64_t *start, int64_t *ids, float *q,
                             double *pre)
{
    memset(ids, 0, (size_t)M * sizeof(int64_t));
    memset(q, 0, (size_t)M * sizeof(float));
    const float top = max_of(row, V); /* NaN where the row holds one */
    if (top != top || isinf(top)) return 0;
    memset(start, 0, (size_t)(NB + 1) * sizeof(int64_t));
    wide_bins(row, V, (double)top * inv_t - ln, inv_t, ln, inv_width, NB, bin_of, start);
    for (int64_t b = 0; b < NB; b++) start[b + 1] += start[b];
    int64_t n_fit = 0; /* the whole bins that fit */
    while (n_fit < NB && start[n_fit + 1] <= M) n_fit++;
    if (n_fit == 0) return 0;
    /* the tokens of the bins that fit (cap <= M of them), then each to its place: start[b] is
     * the next free place of bin b */
    const int64_t cap = wide ? fitting_tokens512(bin_of, V, (int32_t)n_fit, fit)
                             : fitting_tokens(bin_of, V, (int32_t)n_fit, fit);
    for (int64_t j = 0; j < cap; j++) order[start[bin_of[fit[j]]]++] = fit[j];
    wide_exps(row, order, cap, inv_t, ln, q);
    /* start[b] now holds where bin b ends: the mass is checked at each bin's end */
    double mass = 0.0;
    int64_t n = 0;
    for (int64_t b = 0; b < n_fit; b++) {
        if (pre) {
            for (; n < start[b]; n++) pre[n] = mass += q[n];
        } else {
            for (; n < start[b]; n++) mass += q[n];
        }
        if (mass >= target) break;
    }
    for (int64_t i = 0; i < n; i++) ids[i] = order[i];
    memset(q + n, 0, (size_t)(M - n) * sizeof(float));
    return n;
}

/* wide_list(x_ptr, ld, V, rows, row_index_ptr, inv_temps_ptr, log_norms_ptr, targets_ptr,
 * max_listed, num_bins, bin_width_inv, out_ids_ptr, out_q_ptr, out_n_ptr, num_rows): for each
 * listed row r of float32 x (row row_index[r] of num_rows, ld floats apart; IndexError where
 * one is outside), log q_i = x_i * inv_temps[r] -
 * log_norms[r]. Tokens fall into bins of log q counted down from the row's best,
 * floor((best - log q_i) * bin_width_inv), the last of num_bins taking the rest. Whole bins
 * are listed best first, each bin's tokens in id order, while they fit in max_listed, down to
 * the bin whose tokens bring the listed mass to targets[r]: their ids into out_ids [rows,
 * max_listed] int64, q into out_q [rows, max_listed] float32 (padding: id 0, q 0), how many
 * into out_n [rows]. A counting sort: one pass bins the tokens, one places those of the bins
 * that fit; exps for those only. out_n 0: the best bin alone exceeds max_listed, or the row
 * holds a NaN or no finite maximum. */
static PyObject *wide_list(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[15];
    if (!int_args(args, nargs, 15, 15, "wide_list", v)) return NULL;
#ifdef NATIVE_X86
    const float *x = (const float *)(intptr_t)v[0];
    const int64_t ld = v[1], V = v[2], rows = v[3], M = v[8], NB = v[9];
    const int64_t *row_index = (const int64_t *)(intptr_t)v[4];
    const double *inv_temps = (const double *)(intptr_t)v[5];
    const double *log_norms = (const double *)(intptr_t)v[6];
    const double *targets = (const double *)(intptr_t)v[7];
    const double inv_width = (double)v[10];
    int64_t *out_ids = (int64_t *)(intptr_t)v[11];
    float *out_q = (float *)(intptr_t)v[12];
    int64_t *out_n = (int64_t *)(intptr_t)v[13];
    if (V < 1 || M < 1 || M > V || NB < 1 || inv_width < 1) {
        PyErr_Format(PyExc_ValueError, "wide_list: bad sizes V=%lld max_listed=%lld bins=%lld",
                     v[2], v[8], v[9]);
        return NULL;
    }
    const int64_t num_rows = v[14];
    for (int64_t r = 0; r < rows; r++) {
        if (row_index[r] < 0 || row_index[r] >= num_rows) {
            PyErr_Format(PyExc_IndexError, "rows out of range for %lld rows of logits: %lld",
                         (long long)num_rows, (long long)row_index[r]);
            return NULL;
        }
    }
    int32_t *bin_of = malloc((size_t)V * sizeof(int32_t));
    int32_t *order = malloc((size_t)M * sizeof(int32_t));
    int32_t *fit = malloc((size_t)(M + 16) * sizeof(int32_t)); /* + a compress's spill */
    int64_t *start = malloc((size_t)(NB + 1) * sizeof(int64_t));
    if (!bin_of || !order || !start || !fit) {
        free(bin_of);
        free(order);
        free(start);
        free(fit);
        return PyErr_NoMemory();
    }
    const int wide = rows_avx512();
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < rows; r++) {
        out_n[r] = wide_list_row(x + row_index[r] * ld, V, inv_temps[r], log_norms[r],
                                 targets[r], M, NB, inv_width, wide, bin_of, order, fit, start,
                                 out_ids + r * M, out_q + r * M, NULL);
    }
    Py_END_ALLOW_THREADS
    free(bin_of);
    free(order);
    free(start);
    free(fit);
    Py_RETURN_NONE;
#else
    return not_built("wide_list");
#endif
}

/* out[i] = floor(pre[i] / whole * n + 1/2) for i < S (the same steps and roundings as one at
 * a time: no FMA), 4 at a time: the divisions do not wait on each other. */
__attribute__((target("avx2"))) static void round_shares(const double *pre, int64_t S,
                                                         double whole, double n, int64_t *out)
{
    const __m256d vw = _mm256_set1_pd(whole), vn = _mm256_set1_pd(n);
    const __m256d half = _mm256_set1_pd(0.5);
    int64_t i = 0;
    for (; i + 4 <= S; i += 4) {
        const __m256d x =
            _mm256_add_pd(_mm256_mul_pd(_mm256_div_pd(_mm256_loadu_pd(pre + i), vw), vn), half);
        /* 0 <= floor(x) <= n: exact through int32 */
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm256_cvtepi32_epi64(_mm256_cvttpd_epi32(_mm256_floor_pd(x))));
    }
    for (; i < S; i++) out[i] = (int64_t)floor(pre[i] / whole * n + 0.5);
}

/* The steps of quantize_row after its sums: pre [S] the running sums of the entries at least 0
 * (running = pre[S - 1]), sum the sum of the entries as they are. */
static int quantize_sums(const double *pre, int64_t S, double sum, double running, int64_t total,
                         int64_t draw, const int64_t *row_ids, int64_t *c, int64_t *tail_out,
                         int64_t *token_out, int64_t *row_excluded)
{
    const double tail = 1.0 - sum > 0.0 ? 1.0 - sum : 0.0;
    const double whole = running + tail;
    if (!(sum == sum) || !(whole > 0.0) || isinf(whole)) return 0;
    round_shares(pre, S, whole, (double)total, c); /* the rounded running sums, then steps */
    int64_t below = 0, picked = 0; /* the rounded running sum before entry i */
    for (int64_t i = 0; i < S; i++) {
        const int64_t rounded = c[i];
        c[i] = rounded - below;
        row_excluded[i] = c[i] > 0 ? row_ids[i] : -1;
        below = rounded;
        picked += rounded <= draw; /* entries whose range ends at or before the draw */
    }
    *tail_out = total - below;
    *token_out = picked < S ? row_ids[picked] : -1; /* the tail's range ends past the draw */
    return 1;
}

/* One row of quantize_draw (below): S listed probabilities p and their tail as counts c [S]
 * and *tail summing to total, the token the draw picks (-1: the tail) and the excluded ids;
 * pre: room for S doubles. False where the row cannot be quantised. */
static int quantize_row(const float *p, int64_t S, int64_t total, int64_t draw,
                        const int64_t *row_ids, double *pre, int64_t *c, int64_t *tail_out,
                        int64_t *token_out, int64_t *row_excluded)
{
    /* the tail: 1 - the sum of the entries as they are, then the running sum of the entries
     * at least 0 and the tail (both sums left to right) */
    double sum = 0.0, running = 0.0;
    for (int64_t i = 0; i < S; i++) {
        const double x = (double)p[i];
        sum += x;
        running += x > 0.0 ? x : 0.0; /* a NaN: caught by the sum */
        pre[i] = running;
    }
    return quantize_sums(pre, S, sum, running, total, draw, row_ids, c, tail_out, token_out,
                         row_excluded);
}

/* quantize_draw(probs_ptr, ld, rows, S, total, draws_ptr, ids_ptr, ld_ids, counts_ptr,
 * tails_ptr, tokens_ptr, excluded_ptr): each float32 row of S listed probabilities (ld floats
 * apart) and its tail, max(1 - their sum, 0), as integer counts summing to `total`
 * (sampling/quantized.py): the differences of the running sums of the entries (negatives as
 * 0) and the tail, scaled to `total` and rounded halves up, in doubles in the order its torch
 * path takes them; into int64 counts [rows, S] and tails [rows]. The entry whose cumulative
 * range [c_{i-1}, c_i) holds int64 draws[r] (in [0, total)) gives tokens[r]: its id from
 * int64 ids [rows, ld_ids], or -1 for the tail. excluded [rows, S] int64: each entry's id
 * where its count is positive, else -1 (the ids a tail draw must avoid). False (the outputs
 * incomplete) where a row cannot be quantised: a NaN, an infinity, or nothing to share out. */
static PyObject *quantize_draw(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[12];
    if (!int_args(args, nargs, 12, 12, "quantize_draw", v)) return NULL;
#ifdef NATIVE_X86
    const float *probs = (const float *)(intptr_t)v[0];
    const int64_t ld = v[1], rows = v[2], S = v[3], total = v[4], ld_ids = v[7];
    const int64_t *draws = (const int64_t *)(intptr_t)v[5];
    const int64_t *ids = (const int64_t *)(intptr_t)v[6];
    int64_t *counts = (int64_t *)(intptr_t)v[8];
    int64_t *tails = (int64_t *)(intptr_t)v[9];
    int64_t *tokens = (int64_t *)(intptr_t)v[10];
    int64_t *excluded = (int64_t *)(intptr_t)v[11];
    if (S < 1 || rows < 0 || total < 1 || total > ((int64_t)1 << 30) || ld_ids < S) {
        PyErr_Format(PyExc_ValueError, "quantize_draw: bad sizes rows=%lld S=%lld total=%lld",
                     v[2], v[3], v[4]);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        if (draws[r] < 0 || draws[r] >= total) {
            PyErr_Format(PyExc_ValueError, "draws must be in [0, %lld), got %lld", v[4],
                         (long long)draws[r]);
            return NULL;
        }
    }
    double *pre = malloc((size_t)S * sizeof(double)); /* a row's running sums */
    if (!pre) return PyErr_NoMemory();
    int ok = 1;
    for (int64_t r = 0; r < rows && ok; r++) {
        ok = quantize_row(probs + r * ld, S, total, draws[r], ids + r * ld_ids, pre,
                          counts + r * S, tails + r, tokens + r, excluded + r * S);
    }
    free(pre);
    return PyBool_FromLong(ok);
#else
    return not_built("quantize_draw");
#endif
}

typedef enum { SEQ_DOUBLES, SEQ_INT64S, SEQ_WORDS } SeqKind;

/* The n items of a list (or tuple) of Python numbers into out: doubles, int64s, or ints of any
 * size taken modulo 2^64 (keyed_random's arithmetic) as int64s. False (a Python error set)
 * where it is not n numbers. */
static int seq_numbers(PyObject *seq, Py_ssize_t n, SeqKind kind, void *out, const char *what)
{
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return 0;
    int ok = PySequence_Fast_GET_SIZE(fast) == n;
    if (!ok) PyErr_Format(PyExc_ValueError, "%s: need %zd items", what, n);
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (kind == SEQ_DOUBLES) {
            const double x = PyFloat_AsDouble(item);
            ((double *)out)[i] = x;
            ok = !(x == -1.0 && PyErr_Occurred());
        } else {
            const long long x = kind == SEQ_INT64S
                                    ? PyLong_AsLongLong(item)
                                    : (long long)PyLong_AsUnsignedLongLongMask(item);
            ((int64_t *)out)[i] = (int64_t)x;
            ok = !(x == -1 && PyErr_Occurred());
        }
        if (!ok) { /* the item's error, saying where it is */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            PyErr_Format(type ? type : PyExc_TypeError, "%s: item %zd: %S", what, i,
                         value ? value : Py_None);
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
    }
    Py_DECREF(fast);
    return ok;
}

/* A list of n int64s as Python ints (NULL: an error set). */
static PyObject *int64_list(const int64_t *values, Py_ssize_t n)
{
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *item = PyLong_FromLongLong(values[i]);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, item);
    }
    return list;
}

/* draft_lists(x_ptr, ld, rows, V, maxima_ptr, ldm, temps, seeds, positions, targets, S, M,
 * max_listed, num_bins, bin_width_inv, total, draw_bits, out_ids_ptr, out_counts_ptr,
 * out_excluded_ptr): a draft step's listed proposals (proposers/draft_sampling.py), row by
 * row in one call, by the same steps as its separate calls: per float32 row r of x (ld floats
 * apart; maxima_ptr 0 or the rows' block maxima, ldm apart) at temperature temps[r] (a list of
 * numbers, each rounded to float32 as torch.tensor rounds it), its log normaliser ln
 * (log_normalizers), its best S logits (top_k) as q = (float)exp(x / T - ln), then, where
 * max_listed > S and those cover less than targets[r] (their doubles summed left to right),
 * the row's widened list (wide_list, at most max_listed), and the list quantised with its tail
 * to `total` and drawn from by the keyed draw of (seeds[r], positions[r]) (lists of ints;
 * keyed_random.keyed_draw, draw_bits bits) (quantize_draw). Into out_ids, out_counts,
 * out_excluded [rows, M] int64, rows M apart (past a row's list, up to the widest row's: id 0,
 * count 0, excluded -1; nothing written past that). Returns the lists (tails, tokens, widened)
 * of the rows' tail counts, the listed token each draw picked (-1: the tail) and the widened
 * lists' lengths (0: the base list of S); or False (the outputs incomplete) where a row holds a
 * NaN, has no finite max, or cannot be quantised: the caller's separate calls decide those. */
static PyObject *draft_lists(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 20) {
        PyErr_Format(PyExc_TypeError, "draft_lists takes 20 arguments, got %zd", nargs);
        return NULL;
    }
#ifdef NATIVE_X86
    long long v[20];
    for (int i = 0; i < 20; i++) {
        if (i >= 6 && i <= 9) continue; /* the lists */
        v[i] = PyLong_AsLongLong(args[i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    const float *x = (const float *)(intptr_t)v[0];
    const int64_t ld = v[1], rows = v[2], V = v[3], ldm = v[5], S = v[10], M = v[11];
    const int64_t WM = v[12], NB = v[13], total = v[15], bits = v[16];
    const float *maxima = (const float *)(intptr_t)v[4];
    const double inv_width = (double)v[14];
    int64_t *out_ids = (int64_t *)(intptr_t)v[17];
    int64_t *out_counts = (int64_t *)(intptr_t)v[18];
    int64_t *out_excluded = (int64_t *)(intptr_t)v[19];
    const int widen = WM > S;
    if (V < 64 || S < 1 || S > V / 64 || M < S || (widen && (WM > V || M < WM)) || NB < 1 ||
        inv_width < 1 || bits < 1 || bits > 30 || total != ((int64_t)1 << bits) || rows < 1) {
        PyErr_Format(PyExc_ValueError,
                     "draft_lists: bad sizes rows=%lld V=%lld S=%lld M=%lld max_listed=%lld "
                     "bits=%lld", v[2], v[3], v[10], v[11], v[12], v[16]);
        return NULL;
    }
    const int64_t nb = (V + 63) / 64, W = widen ? WM : S;
    /* per row: temperature, target (doubles); seed, position, tail, token, widened (int64) */
    double *row_d = malloc((size_t)(2 * rows) * sizeof(double));
    int64_t *row_i = malloc((size_t)(5 * rows) * sizeof(int64_t));
    TopItem *heaps = malloc((size_t)(2 * S) * sizeof(TopItem));
    float *own = malloc((size_t)nb * sizeof(float));
    int32_t *cand = malloc((size_t)V * sizeof(int32_t)); /* top_k_row's, then wide bins' */
    float *vals = malloc((size_t)S * sizeof(float));
    float *base_q = malloc((size_t)S * sizeof(float));
    int64_t *base_ids = malloc((size_t)S * sizeof(int64_t));
    float *wide_q = malloc((size_t)W * sizeof(float));
    int64_t *wide_ids = malloc((size_t)W * sizeof(int64_t));
    double *pre = malloc((size_t)S * sizeof(double));
    double *wide_pre = malloc((size_t)W * sizeof(double));
    int32_t *order = malloc((size_t)W * sizeof(int32_t));
    int32_t *fit = malloc((size_t)(W + 16) * sizeof(int32_t));
    int64_t *start = malloc((size_t)(NB + 1) * sizeof(int64_t));
    PyObject *result = NULL;
    int ok = row_d && row_i && heaps && own && cand && vals && base_q && base_ids && wide_q &&
             wide_ids && pre && wide_pre && order && fit && start;
    if (!ok) {
        PyErr_NoMemory();
        goto done;
    }
    double *temps = row_d, *targets = row_d + rows;
    int64_t *seeds = row_i, *positions = row_i + rows, *tails = row_i + 2 * rows;
    int64_t *tokens = row_i + 3 * rows, *widened = row_i + 4 * rows;
    if (!seq_numbers(args[6], rows, SEQ_DOUBLES, temps, "draft_lists: temperatures") ||
        !seq_numbers(args[7], rows, SEQ_WORDS, seeds, "draft_lists: seeds") ||
        !seq_numbers(args[8], rows, SEQ_INT64S, positions, "draft_lists: positions") ||
        !seq_numbers(args[9], rows, SEQ_DOUBLES, targets, "draft_lists: targets")) {
        goto done;
    }
    for (int64_t r = 0; r < rows; r++) {
        temps[r] = (double)(float)temps[r]; /* as torch.tensor(list) holds it */
        if (!(temps[r] > 0.0)) {
            PyErr_Format(PyExc_ValueError, "draft_lists: row %lld: temperature must be > 0",
                         (long long)r);
            goto done;
        }
        if (positions[r] < 0) {
            PyErr_Format(PyExc_ValueError, "draft_lists: row %lld: position %lld < 0",
                         (long long)r, (long long)positions[r]);
            goto done;
        }
    }
    const int wide = rows_avx512();
    int64_t widest = S;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t r = 0; r < rows && ok; r++) {
        const float *row = x + r * ld;
        const double t = temps[r], inv_t = 1.0 / t;
        const float *bmax = maxima ? maxima + r * ldm : own;
        if (!maxima) { /* NaN where a block holds one (top_k's) */
            for (int64_t b = 0; b < nb; b++) {
                own[b] = max_of(row + b * 64, (b + 1) * 64 < V ? 64 : V - b * 64);
            }
        }
        const float top = max_of(bmax, nb);
        ok = top == top && !isinf(top);
        if (!ok) break;
        const double ln = log_normalizer(row, V, top, inv_t, wide);
        ok = top_k_row(row, V, S, bmax, heaps, heaps + S, cand, vals, base_ids);
        if (!ok) break;
        /* q >= 0 everywhere below (exps of a finite row), so quantize_row's two sums are the
         * one running sum taken here, left to right: kept in pre, not taken again */
        double mass = 0.0;
        for (int64_t i = 0; i < S; i++) { /* torch's double ops: x / T - ln, exp, to float */
            base_q[i] = (float)exp((double)vals[i] / t - ln);
            pre[i] = mass += (double)base_q[i];
        }
        int64_t n = 0, width = S;
        const int64_t *ids = base_ids;
        if (widen && mass < targets[r]) { /* 0: its best bin alone is over the budget */
            n = wide_list_row(row, V, inv_t, ln, targets[r], WM, NB, inv_width, wide, cand,
                              order, fit, start, wide_ids, wide_q, wide_pre);
            if (n > 0) ids = wide_ids, width = n;
        }
        const double *sums = n > 0 ? wide_pre : pre;
        const uint64_t word =
            g_mix64((uint64_t)seeds[r] + (uint64_t)(positions[r] + 1) * G_GAMMA);
        int64_t *c = out_counts + r * M, *ex = out_excluded + r * M;
        ok = quantize_sums(sums, width, sums[width - 1], sums[width - 1], total,
                           (int64_t)(word >> (64 - bits)), ids, c, tails + r, tokens + r, ex);
        if (!ok) break;
        memcpy(out_ids + r * M, ids, (size_t)width * sizeof(int64_t));
        widened[r] = n;
        widest = width > widest ? width : widest;
    }
    for (int64_t r = 0; r < rows && ok; r++) { /* padding up to the widest row's list only */
        const int64_t width = widened[r] > 0 ? widened[r] : S, pad = widest - width;
        memset(out_ids + r * M + width, 0, (size_t)pad * sizeof(int64_t));
        memset(out_counts + r * M + width, 0, (size_t)pad * sizeof(int64_t));
        for (int64_t i = width; i < widest; i++) out_excluded[r * M + i] = -1;
    }
    Py_END_ALLOW_THREADS
    if (!ok) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    PyObject *lists[3] = {int64_list(tails, rows), int64_list(tokens, rows),
                          int64_list(widened, rows)};
    if (lists[0] && lists[1] && lists[2]) result = PyTuple_Pack(3, lists[0], lists[1], lists[2]);
    for (int l = 0; l < 3; l++) Py_XDECREF(lists[l]);
done:
    free(row_d);
    free(row_i);
    free(heaps);
    free(own);
    free(cand);
    free(vals);
    free(base_q);
    free(base_ids);
    free(wide_q);
    free(wide_ids);
    free(pre);
    free(wide_pre);
    free(order);
    free(fit);
    free(start);
    return result;
#else
    return not_built("draft_lists");
#endif
}

/* listed_stats(ids_ptr, probs_ptr, tail_ptr, S, drafts_ptr, B, K, target_ptr, ld_b, ld_k,
 * greedy_ptr, q_ptr, p_ptr, is_tail_ptr, point_ptr, V): the verifier's view of B x K listed
 * proposals (sampling/rejection.py), one pass over each position's S entries: int64 ids
 * [B, K, S] and float32 probs [B, K, S] (a positive prob lists its id; ids unique among
 * those), float32 tails [B, K], int64 drafts [B, K] (>= 0), float32 target probabilities of
 * position (b, k) at target + b * ld_b + k * ld_k (V contiguous floats; ids and drafts are
 * below V), uint8 greedy [B]. Writes float32 q [B, K]: the draft's proposal probability (its
 * listed prob; unlisted: the tail; 1 where the probs and tail are all 0, a point mass);
 * float32 p [B, K]: the target's probability of the draft, or of its class U (1 - the target's
 * mass on the listed ids, at least 0; summed in doubles) where the draft is unlisted under a
 * positive tail in a sampled row; uint8 is_tail [B, K] there; uint8 point [B, K] for point
 * masses. IndexError for a draft (any of the B x K) or a listed id outside [0, V). */
static PyObject *listed_stats(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[16];
    if (!int_args(args, nargs, 16, 16, "listed_stats", v)) return NULL;
#ifdef NATIVE_X86
    const int64_t *ids = (const int64_t *)(intptr_t)v[0];
    const float *probs = (const float *)(intptr_t)v[1];
    const float *tails = (const float *)(intptr_t)v[2];
    const int64_t S = v[3], B = v[5], K = v[6], ld_b = v[8], ld_k = v[9];
    const int64_t *drafts = (const int64_t *)(intptr_t)v[4];
    const float *target = (const float *)(intptr_t)v[7];
    const uint8_t *greedy = (const uint8_t *)(intptr_t)v[10];
    float *q_out = (float *)(intptr_t)v[11];
    float *p_out = (float *)(intptr_t)v[12];
    uint8_t *tail_out = (uint8_t *)(intptr_t)v[13];
    uint8_t *point_out = (uint8_t *)(intptr_t)v[14];
    const int64_t V = v[15];
    if (S < 0 || B < 0 || K < 0 || V < 1) {
        PyErr_Format(PyExc_ValueError, "listed_stats: bad sizes S=%lld B=%lld K=%lld V=%lld",
                     v[3], v[5], v[6], v[15]);
        return NULL;
    }
    /* every id read is in range (a placeholder or garbage past a row's drafts too: torch's
     * gathers raise for those) */
    for (int64_t j = 0; j < B * K; j++) {
        if (drafts[j] < 0 || drafts[j] >= V) {
            PyErr_Format(PyExc_IndexError, "draft id %lld out of range for %lld tokens",
                         (long long)drafts[j], (long long)V);
            return NULL;
        }
    }
    int bad = 0; /* a listed id outside [0, V) (bad_id): the outputs are incomplete */
    int64_t bad_id = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int64_t b = 0; b < B; b++) {
        for (int64_t k = 0; k < K; k++) {
            const int64_t at = b * K + k, draft = drafts[at];
            const int64_t *id = ids + at * S;
            const float *pr = probs + at * S;
            const float *p = target + b * ld_b + k * ld_k;
            const float tail = tails[at];
            float listed = 0.0f;
            int hit = 0, all_zero = 1;
            double p_listed = 0.0;
            for (int64_t j = 0; j < S; j++) {
                const float x = pr[j];
                if (x > 0.0f) {
                    if ((uint64_t)id[j] >= (uint64_t)V) {
                        bad = 1;
                        bad_id = id[j];
                        continue;
                    }
                    p_listed += (double)p[id[j]];
                    if (id[j] == draft) {
                        listed += x;
                        hit = 1;
                    }
                }
                all_zero &= x == 0.0f; /* a negative or NaN prob is not a point mass */
            }
            const int point = all_zero && tail == 0.0f;
            const int is_tail = !hit && tail > 0.0f && !greedy[b];
            q_out[at] = point ? 1.0f : hit ? listed : tail;
            float unlisted = 1.0f - (float)p_listed;
            unlisted = unlisted < 0.0f ? 0.0f : unlisted; /* a NaN stays one */
            p_out[at] = is_tail ? unlisted : p[draft];
            tail_out[at] = (uint8_t)is_tail;
            point_out[at] = (uint8_t)point;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_Format(PyExc_IndexError, "listed id %lld out of range for %lld tokens",
                     (long long)bad_id, (long long)V);
        return NULL;
    }
    Py_RETURN_NONE;
#else
    return not_built("listed_stats");
#endif
}

/* The sum of n floats in doubles, 8 at a time in two accumulators of 4 (a fixed order). */
__attribute__((target("avx2"))) static double sum_as_doubles(const float *x, int64_t n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm_loadu_ps(x + i)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)));
    }
    double lanes[4], total = 0.0;
    _mm256_storeu_pd(lanes, _mm256_add_pd(a0, a1));
    for (int l = 0; l < 4; l++) total += lanes[l];
    for (; i < n; i++) total += (double)x[i];
    return total;
}

#define ICDF_BLOCK 1024 /* sampling/inverse_cdf.BLOCK */

/* sample_inverse_cdf for one row of V non-negative weights and a uniform u in [0, 1): block
 * sums (in doubles here), their running sum, the block whose end first passes u * total, then
 * the entry inside it whose running end first does; past the block's last entry (rounding):
 * its last positive one. ends: room for ceil(V / ICDF_BLOCK) doubles. */
static int64_t inverse_cdf_row(const float *w, int64_t V, double u, double *ends)
{
    const int64_t nb = (V + ICDF_BLOCK - 1) / ICDF_BLOCK;
    double acc = 0.0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t width = b < nb - 1 ? ICDF_BLOCK : V - b * ICDF_BLOCK;
        acc += sum_as_doubles(w + b * ICDF_BLOCK, width);
        ends[b] = acc;
    }
    const double point = u * ends[nb - 1];
    int64_t blk = 0;
    while (blk < nb - 1 && ends[blk] <= point) blk++;
    const float *local = w + blk * ICDF_BLOCK;
    const int64_t width = blk < nb - 1 ? ICDF_BLOCK : V - blk * ICDF_BLOCK;
    double end = blk > 0 ? ends[blk - 1] : 0.0;
    int64_t index = 0, last_positive = 0;
    for (; index < width; index++) {
        end += (double)local[index];
        if (end > point) break;
    }
    if (index >= width) {
        for (int64_t i = 0; i < width; i++) {
            if (local[i] > 0.0f) last_positive = i;
        }
        index = last_positive;
    }
    return blk * ICDF_BLOCK + index;
}

/* residual_sample(target_ptr, ld_b, ld_k, V, seqs_ptr, at_ptr, E, num_draft_ptr, drafts_ptr,
 * K, ids_ptr, probs_ptr, tails_ptr, S, uniform_ptr, out_ptr): the verifier's emitted token
 * where it is neither settled nor greedy (sampling/rejection.py's _emitted_token), for E rows:
 * sequence seqs[e] at position at[e] (int64), the target's float32 probabilities there at
 * target + seq * ld_b + at * ld_k (V contiguous floats). At a rejected draft (at < int64
 * num_draft[seq]) the residual max(0, p - q) of its proposal: ids_ptr 0, a point mass on
 * drafts[seq, at] (int64 [B, K], >= 0); else int64 ids and float32 probs [B, K, S] and float32
 * tails [B, K]: q the listed probs on their ids and tail * p / p(U) on the rest (p(U) the
 * target's mass off the listed ids, summed in doubles, at least MIN_MASS), or a point mass
 * where probs and tail are all 0. At the bonus (at == num_draft) p itself; p again where the
 * residual has nothing left. The token by sample_inverse_cdf with float64 uniform[seq]
 * (block sums in doubles here) into int64 out [E]. */
static PyObject *residual_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long v[16];
    if (!int_args(args, nargs, 16, 16, "residual_sample", v)) return NULL;
#ifdef NATIVE_X86
    const float *target = (const float *)(intptr_t)v[0];
    const int64_t ld_b = v[1], ld_k = v[2], V = v[3], E = v[6], K = v[9], S = v[13];
    const int64_t *seqs = (const int64_t *)(intptr_t)v[4];
    const int64_t *at = (const int64_t *)(intptr_t)v[5];
    const int64_t *num_draft = (const int64_t *)(intptr_t)v[7];
    const int64_t *drafts = (const int64_t *)(intptr_t)v[8];
    const int64_t *ids = (const int64_t *)(intptr_t)v[10];
    const float *probs = (const float *)(intptr_t)v[11];
    const float *tails = (const float *)(intptr_t)v[12];
    const double *uniform = (const double *)(intptr_t)v[14];
    int64_t *out = (int64_t *)(intptr_t)v[15];
    if (V < 1 || E < 0 || K < 0 || (ids && S < 0)) {
        PyErr_Format(PyExc_ValueError, "residual_sample: bad sizes V=%lld E=%lld K=%lld", v[3],
                     v[6], v[9]);
        return NULL;
    }
    for (int64_t e = 0; e < E; e++) { /* the rows' places, and every id they read, in range */
        const int64_t b = seqs[e];
        if (b < 0 || at[e] < 0 || at[e] > K) {
            PyErr_Format(PyExc_IndexError, "residual_sample: row %lld at %lld out of range",
                         (long long)b, (long long)at[e]);
            return NULL;
        }
        for (int64_t j = 0; j < K; j++) {
            if (drafts[b * K + j] < 0 || drafts[b * K + j] >= V) {
                PyErr_Format(PyExc_IndexError, "draft id %lld out of range for %lld tokens",
                             (long long)drafts[b * K + j], (long long)V);
                return NULL;
            }
        }
        if (!ids || at[e] >= num_draft[b] || at[e] >= K) continue; /* no list read */
        const int64_t *id = ids + (b * K + at[e]) * S;
        const float *pr = probs + (b * K + at[e]) * S;
        for (int64_t i = 0; i < S; i++) {
            if (pr[i] > 0.0f && (uint64_t)id[i] >= (uint64_t)V) {
                PyErr_Format(PyExc_IndexError, "listed id %lld out of range for %lld tokens",
                             (long long)id[i], (long long)V);
                return NULL;
            }
        }
    }
    float *w = malloc((size_t)V * sizeof(float));
    double *ends = malloc((size_t)((V + ICDF_BLOCK - 1) / ICDF_BLOCK) * sizeof(double));
    if (!w || !ends) {
        free(w);
        free(ends);
        return PyErr_NoMemory();
    }
    const float min_mass = (float)1e-30; /* rejection.MIN_MASS */
    Py_BEGIN_ALLOW_THREADS
    for (int64_t e = 0; e < E; e++) {
        const int64_t b = seqs[e], a = at[e];
        const float *p = target + b * ld_b + a * ld_k;
        if (K == 0) { /* no drafts: p itself */
            out[e] = inverse_cdf_row(p, V, uniform[b], ends);
            continue;
        }
        const int has_draft = a < num_draft[b];
        const int64_t ak = a < K ? a : K - 1, draft = drafts[b * K + ak];
        float keep = 1.0f, point = has_draft ? 1.0f : 0.0f;
        const int64_t *id = ids ? ids + (b * K + ak) * S : NULL;
        const float *pr = ids ? probs + (b * K + ak) * S : NULL;
        int64_t listed = 0; /* entries to fix up: the position's S where it has a draft */
        if (ids) {
            const float tail = has_draft ? tails[b * K + ak] : 0.0f;
            double p_listed = 0.0;
            int all_zero = 1;
            for (int64_t j = 0; j < S && has_draft; j++) {
                if (pr[j] > 0.0f) p_listed += (double)p[id[j]];
                all_zero &= pr[j] == 0.0f;
            }
            float unlisted = 1.0f - (float)p_listed;
            unlisted = unlisted < 0.0f ? 0.0f : unlisted;
            if (tail > 0.0f) {
                const float kept = 1.0f - tail / (unlisted < min_mass ? min_mass : unlisted);
                keep = kept < 0.0f ? 0.0f : kept;
            }
            if (!(all_zero && tail == 0.0f)) point = 0.0f;
            listed = has_draft ? S : 0;
        }
        /* w = p * keep; the listed entries max(0, p - q); the draft max(0, w - point) */
        for (int64_t i = 0; i < V; i++) w[i] = p[i] * keep;
        for (int64_t j = 0; j < listed; j++) {
            if (pr[j] > 0.0f) {
                const float r = p[id[j]] - pr[j];
                w[id[j]] = r < 0.0f ? 0.0f : r;
            }
        }
        const float rd = w[draft] - point;
        w[draft] = rd < 0.0f ? 0.0f : rd;
        float top = 0.0f;
        for (int64_t i = 0; i < V; i++) top = w[i] > top ? w[i] : top;
        out[e] = inverse_cdf_row(top > 0.0f ? w : p, V, uniform[b], ends);
    }
    Py_END_ALLOW_THREADS
    free(w);
    free(ends);
    Py_RETURN_NONE;
#else
    return not_built("residual_sample");
#endif
}

/* pack_draws(rows, positions, ids_ptrs, counts_ptrs, lengths, tails, B, K, S, total,
 * out_ids_ptr, out_probs_ptr, out_tail_ptr): a round's listed draws (proposers/drafts.py's
 * pack_records) laid out for the verifier. Draw j (Python lists of ints, one entry per draw)
 * sits at row rows[j], position positions[j]: lengths[j] int64 ids and int64 counts at the
 * addresses ids_ptrs[j], counts_ptrs[j], and its tail count tails[j]. Writes int64 out_ids
 * [B, K, S], float32 out_probs [B, K, S] (count / total: exact) and float32 out_tail [B, K]
 * (tail / total), every entry: zeros where no draw is, and past a draw's length. IndexError
 * for a draw outside [B, K] or longer than S. */
static PyObject *pack_draws(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_Format(PyExc_TypeError, "pack_draws takes 13 arguments, got %zd", nargs);
        return NULL;
    }
#ifdef NATIVE_X86
    long long v[7];
    for (int i = 0; i < 7; i++) {
        v[i] = PyLong_AsLongLong(args[6 + i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    const int64_t B = v[0], K = v[1], S = v[2];
    const double total = (double)v[3];
    int64_t *out_ids = (int64_t *)(intptr_t)v[4];
    float *out_probs = (float *)(intptr_t)v[5];
    float *out_tail = (float *)(intptr_t)v[6];
    PyObject *lists[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    PyObject *result = NULL;
    for (int l = 0; l < 6; l++) {
        lists[l] = PySequence_Fast(args[l], "pack_draws takes lists of ints");
        if (!lists[l]) goto done;
    }
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(lists[0]);
    for (int l = 1; l < 6; l++) {
        if (PySequence_Fast_GET_SIZE(lists[l]) != n) {
            PyErr_SetString(PyExc_ValueError, "pack_draws: lists of different lengths");
            goto done;
        }
    }
    memset(out_ids, 0, (size_t)(B * K * S) * sizeof(int64_t));
    memset(out_probs, 0, (size_t)(B * K * S) * sizeof(float));
    memset(out_tail, 0, (size_t)(B * K) * sizeof(float));
    for (Py_ssize_t j = 0; j < n; j++) {
        long long f[6];
        for (int l = 0; l < 6; l++) {
            f[l] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(lists[l], j));
            if (f[l] == -1 && PyErr_Occurred()) goto done;
        }
        const int64_t b = f[0], k = f[1], len = f[4];
        if (b < 0 || b >= B || k < 0 || k >= K || len < 0 || len > S) {
            PyErr_Format(PyExc_IndexError,
                         "pack_draws: draw %zd at (%lld, %lld) of length %lld outside [%lld, "
                         "%lld, %lld]", j, f[0], f[1], f[4], (long long)B, (long long)K,
                         (long long)S);
            goto done;
        }
        const int64_t *ids = (const int64_t *)(intptr_t)f[2];
        const int64_t *counts = (const int64_t *)(intptr_t)f[3];
        int64_t *dst_ids = out_ids + (b * K + k) * S;
        float *dst_probs = out_probs + (b * K + k) * S;
        memcpy(dst_ids, ids, (size_t)len * sizeof(int64_t));
        for (int64_t i = 0; i < len; i++) dst_probs[i] = (float)((double)counts[i] / total);
        out_tail[b * K + k] = (float)((double)f[5] / total);
    }
    result = Py_NewRef(Py_None);
done:
    for (int l = 0; l < 6; l++) Py_XDECREF(lists[l]);
    return result;
#else
    return not_built("pack_draws");
#endif
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS, "Whether this CPU runs the kernel (AVX2 and FMA)."},
    {"has_avx512", has_avx512, METH_NOARGS,
     "Whether this CPU runs the GEMM's many-row path (AVX-512F)."},
    {"gemm", (PyCFunction)(void (*)(void))gemm, METH_FASTCALL,
     "gemm(x_ptr, ldx, w_ptr, y_ptr, ldy, m, n, k, num_threads, gated, bmax_ptr, wide_min, "
     "zmm): y = x @ w^T over packed w; gated: y = silu(x @ g^T) * (x @ u^T) over alternating "
     "panels; bmax_ptr: also each row's max over every 64 columns; wide_min: the fewest rows of "
     "a block on the AVX-512 path (0: never); zmm: smaller blocks in 512-bit registers."},
    {"rmsnorm", (PyCFunction)(void (*)(void))rmsnorm, METH_FASTCALL,
     "rmsnorm(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, rows, dim, eps): y = rmsnorm(x + r) * w."},
    {"embed", (PyCFunction)(void (*)(void))embed, METH_FASTCALL,
     "embed(table_ptr, vocab, hidden, tied, ids, out_ptr): the embedding rows of a list of token "
     "ids (tied: from the LM head's skinny panels); ValueError for an id outside the vocabulary."},
    {"attention", (PyCFunction)(void (*)(void))attention, METH_FASTCALL,
     "attention(qkv, rows, cos, ssin, kc, vc, out, B, T, H, Hkv, D, max_len, window, scale): "
     "rotary, K/V written, causal grouped-query attention of a decode or verify chunk."},
    {"layers", (PyCFunction)(void (*)(void))layers_native, METH_FASTCALL,
     "layers(table, num_layers, normed, qkv, attn, o, gated, mlp, res_a, res_b, embedded, "
     "rows, cos, ssin, num_seqs, chunk, heads, kv_heads, head_dim, max_len, hidden, qkv_width, "
     "attn_width, intermediate, threads, wide_min, zmm, eps, scale): a native pass's decoder "
     "layers "
     "in one call; (residual, pending)."},
    {"field_key_runs", (PyCFunction)(void (*)(void))field_key_runs, METH_FASTCALL,
     "field_key_runs(seeds, starts, counts, out): the Gumbel field's keys of runs of positions "
     "(gumbel_field.field_key_run), into an int64 buffer."},
    {"gumbel_argmax", (PyCFunction)(void (*)(void))gumbel_argmax_native, METH_FASTCALL,
     "gumbel_argmax(scores, ld, vocab, num_rows, rows, keys, scales, maxima, ldm, num_keys, "
     "out, are_probs, hints, scales_f32, runs, num_runs): the keyed Gumbel field's argmax per "
     "key (gumbel_field.py); False where a NaN was seen."},
    {"argmax_rows", (PyCFunction)(void (*)(void))argmax_rows, METH_FASTCALL,
     "argmax_rows(x, ld, rows, vocab, maxima, ldm, out): torch.argmax of each row (the first "
     "maximum, or the first NaN), through the rows' block maxima where given."},
    {"log_normalizers", (PyCFunction)(void (*)(void))log_normalizers, METH_FASTCALL,
     "log_normalizers(x, ld, rows, vocab, inv_temps, maxima, ldm, out): per row, log sum "
     "exp(x * inv_t) (a softmax's log denominator) into doubles."},
    {"softmax_", (PyCFunction)(void (*)(void))softmax_inplace, METH_FASTCALL,
     "softmax_(x, ld, rows, vocab, inv_temps, maxima, ldm, out_maxima): rows of x become "
     "softmax(x * inv_t) in place, with their block maxima into out_maxima (or 0); False "
     "(nothing written) where a row's max is not finite."},
    {"top_k", (PyCFunction)(void (*)(void))top_k_native, METH_FASTCALL,
     "top_k(x, ld, rows, vocab, k, maxima, ldm, out_values, out_ids): the k largest entries "
     "of each row, largest first, through the rows' block maxima; False where a NaN was seen."},
    {"quantize_draw", (PyCFunction)(void (*)(void))quantize_draw, METH_FASTCALL,
     "quantize_draw(probs, ld, rows, S, total, draws, ids, ld_ids, counts, tails, tokens, "
     "excluded): listed probabilities and their tail as integer counts, and the token each "
     "draw picks."},
    {"listed_stats", (PyCFunction)(void (*)(void))listed_stats, METH_FASTCALL,
     "listed_stats(ids, probs, tails, S, drafts, B, K, target, ld_b, ld_k, greedy, q, p, "
     "is_tail, point, V): each draft's proposal and target probabilities under listed "
     "proposals."},
    {"residual_sample", (PyCFunction)(void (*)(void))residual_sample, METH_FASTCALL,
     "residual_sample(target, ld_b, ld_k, V, seqs, at, E, num_draft, drafts, K, ids, probs, "
     "tails, S, uniform, out): the verifier's correction or bonus token from the residual "
     "of each row's proposal."},
    {"pack_draws", (PyCFunction)(void (*)(void))pack_draws, METH_FASTCALL,
     "pack_draws(rows, positions, ids_ptrs, counts_ptrs, lengths, tails, B, K, S, total, ids, "
     "probs, tail): a round's listed draws laid out as [B, K, S] tensors."},
    {"draft_lists", (PyCFunction)(void (*)(void))draft_lists, METH_FASTCALL,
     "draft_lists(x, ld, rows, V, maxima, ldm, temps, seeds, positions, targets, S, M, "
     "max_listed, num_bins, bin_width_inv, total, draw_bits, ids, counts, excluded): a draft "
     "step's listed proposals, quantised and drawn, in one call; (tails, tokens, widened)."},
    {"wide_list", (PyCFunction)(void (*)(void))wide_list, METH_FASTCALL,
     "wide_list(x, ld, V, rows, row_index, temps, log_norms, targets, max_listed, num_bins, "
     "bin_width_inv, out_ids, out_q, out_n, num_rows): a sampled row's widened list, whole "
     "bins of log q "
     "best first down to a mass, within a budget."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu_kernels",
    "The CPU runner's float32 kernels: skinny GEMM (skinny.py), RMSNorm (rmsnorm.py), decode "
    "attention (attention.py).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__cpu_kernels(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
