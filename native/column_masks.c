/*
 * Column masks of the row encoder (capture/column_policy.py is the Python twin): the hash mask
 * as Debezium's column.mask.hash computes it, the lowercase hex SHA-256 of the salt's bytes
 * followed by the value's bytes: its UTF-8 text (version 2, column.mask.hash.v2) or Java's
 * serialization of the String (version 1: ObjectOutputStream's stream header, TC_STRING with a
 * 2-byte length or TC_LONGSTRING with an 8-byte one, then the text in Java's modified UTF-8:
 * NUL as C0 80, characters beyond U+FFFF as two 3-byte surrogates).
 *
 * SHA-256 is FIPS 180-4, written out here so the extension needs no crypto library; blocks go
 * through the CPU's SHA extensions where it has them (x86-64 SHA-NI), else the portable rounds.
 */
#include "speedups.h"

#include <string.h>

typedef struct {
    uint32_t h[8];
    uint64_t bytes;
    unsigned char block[64];
    size_t used;
} Sha256;

static const uint32_t sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_init(Sha256 *c) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, h0, sizeof h0);
    c->bytes = 0;
    c->used = 0;
}

static void sha256_block(Sha256 *c, const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4], f = c->h[5], g = c->h[6], h = c->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + sha256_k[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & cc) ^ (b & cc));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = cc;
        cc = b;
        b = a;
        a = t1 + t2;
    }
    c->h[0] += a;
    c->h[1] += b;
    c->h[2] += cc;
    c->h[3] += d;
    c->h[4] += e;
    c->h[5] += f;
    c->h[6] += g;
    c->h[7] += h;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_NI 1

/* One block with the CPU's SHA extensions (Intel's SHA-NI sequence: state as ABEF/CDGH, four
 * rounds per message group, the schedule by sha256msg1/msg2). */
__attribute__((target("sha,sse4.1,ssse3"))) static void sha256_block_ni(uint32_t h[8], const unsigned char *p) {
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1);  /* CDAB */
    __m128i state1 = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B); /* EFGH */
    __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);                                  /* ABEF */
    state1 = _mm_blend_epi16(state1, tmp, 0xF0);                                       /* CDGH */
    const __m128i abef = state0, cdgh = state1;
    __m128i w[4];
    for (int i = 0; i < 4; i++) w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), mask);
    for (int g = 0; g < 16; g++) {
        __m128i m = _mm_add_epi32(w[g & 3], _mm_loadu_si128((const __m128i *)&sha256_k[4 * g]));
        state1 = _mm_sha256rnds2_epu32(state1, state0, m);
        state0 = _mm_sha256rnds2_epu32(state0, state1, _mm_shuffle_epi32(m, 0x0E));
        if (g < 12) { /* W[g+4] from W[g..g+3], into the slot W[g] held */
            __m128i next = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
            next = _mm_add_epi32(next, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
            w[g & 3] = _mm_sha256msg2_epu32(next, w[(g + 3) & 3]);
        }
    }
    state0 = _mm_add_epi32(state0, abef);
    state1 = _mm_add_epi32(state1, cdgh);
    tmp = _mm_shuffle_epi32(state0, 0x1B);                         /* FEBA */
    state1 = _mm_shuffle_epi32(state1, 0xB1);                      /* DCHG */
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(tmp, state1, 0xF0)); /* DCBA */
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(state1, tmp, 8));    /* HGFE */
}

static int sha_extensions(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3)) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b & (1u << 29)) != 0; /* CPUID.7.0:EBX.SHA */
}
#endif

/* 1: the CPU's SHA extensions hash the blocks; 0: the portable rounds (-1: not checked yet). */
static int sha_hardware = -1;
static _Thread_local int sha_portable_only; /* tests compare both paths */

static inline void sha256_compress(Sha256 *c, const unsigned char *p) {
#ifdef HAVE_SHA_NI
    if (sha_hardware < 0) sha_hardware = sha_extensions();
    if (sha_hardware && !sha_portable_only) {
        sha256_block_ni(c->h, p);
        return;
    }
#endif
    sha256_block(c, p);
}

static void sha256_update(Sha256 *c, const void *data, size_t n) {
    const unsigned char *p = data;
    c->bytes += n;
    if (c->used) {
        size_t take = 64 - c->used < n ? 64 - c->used : n;
        memcpy(c->block + c->used, p, take);
        c->used += take;
        p += take;
        n -= take;
        if (c->used < 64) return;
        sha256_compress(c, c->block);
        c->used = 0;
    }
    for (; n >= 64; p += 64, n -= 64) sha256_compress(c, p);
    memcpy(c->block, p, n);
    c->used = n;
}

static void sha256_final(Sha256 *c, unsigned char out[32]) {
    uint64_t bits = c->bytes * 8;
    c->block[c->used++] = 0x80;
    if (c->used > 56) {
        memset(c->block + c->used, 0, 64 - c->used);
        sha256_compress(c, c->block);
        c->used = 0;
    }
    memset(c->block + c->used, 0, 56 - c->used);
    for (int i = 0; i < 8; i++) c->block[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    sha256_compress(c, c->block);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(c->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(c->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(c->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)c->h[i];
    }
}

/* Length of the UTF-8 sequence led by c (0: not a lead byte). */
static inline int utf8_width(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c < 0xE0) return 2;
    if (c >= 0xE0 && c < 0xF0) return 3;
    if (c >= 0xF0 && c < 0xF5) return 4;
    return 0;
}

/* Bytes of s[0:n] in Java's modified UTF-8, or -1 when s is not well-formed UTF-8. */
static long long modified_utf8_length(const unsigned char *s, Py_ssize_t n) {
    long long total = 0;
    for (Py_ssize_t i = 0; i < n;) {
        int w = utf8_width(s[i]);
        if (w == 0 || i + w > n) return -1;
        for (int j = 1; j < w; j++)
            if ((s[i + j] & 0xC0) != 0x80) return -1;
        total += w == 4 ? 6 : (w == 1 && s[i] == 0) ? 2 : w;
        i += w;
    }
    return total;
}

static void put_modified_utf8(Sha256 *c, const unsigned char *s, Py_ssize_t n) {
    unsigned char out[256];
    size_t used = 0;
    for (Py_ssize_t i = 0; i < n;) {
        int w = utf8_width(s[i]);
        if (used > sizeof out - 6) {
            sha256_update(c, out, used);
            used = 0;
        }
        if (w == 1 && s[i] == 0) {
            out[used++] = 0xC0;
            out[used++] = 0x80;
        } else if (w < 4) {
            memcpy(out + used, s + i, (size_t)w);
            used += (size_t)w;
        } else {
            uint32_t cp = (uint32_t)(s[i] & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
                          (uint32_t)(s[i + 2] & 0x3F) << 6 | (uint32_t)(s[i + 3] & 0x3F);
            cp -= 0x10000;
            uint32_t units[2] = {0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)};
            for (int k = 0; k < 2; k++) {
                out[used++] = (unsigned char)(0xE0 | units[k] >> 12);
                out[used++] = (unsigned char)(0x80 | ((units[k] >> 6) & 0x3F));
                out[used++] = (unsigned char)(0x80 | (units[k] & 0x3F));
            }
        }
        i += w;
    }
    sha256_update(c, out, used);
}

int hw_mask_sha256_hex(char hex[64], const char *salt, Py_ssize_t salt_len, const char *s, Py_ssize_t n,
                       int version) {
    static const char digits[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    Sha256 c;
    sha256_init(&c);
    sha256_update(&c, salt, (size_t)salt_len);
    if (version == 1) {
        long long m = modified_utf8_length(u, n);
        if (m < 0) return 0;
        unsigned char head[13] = {0xAC, 0xED, 0x00, 0x05};
        size_t used = 4;
        if (m <= 0xFFFF) {
            head[used++] = 0x74; /* TC_STRING */
            head[used++] = (unsigned char)(m >> 8);
            head[used++] = (unsigned char)m;
        } else {
            head[used++] = 0x7C; /* TC_LONGSTRING */
            for (int i = 7; i >= 0; i--) head[used++] = (unsigned char)((unsigned long long)m >> (8 * i));
        }
        sha256_update(&c, head, used);
        put_modified_utf8(&c, u, n);
    } else {
        sha256_update(&c, s, (size_t)n);
    }
    unsigned char digest[32];
    sha256_final(&c, digest);
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    return 1;
}

Py_ssize_t hw_utf8_prefix(const char *s, Py_ssize_t n, Py_ssize_t chars) {
    Py_ssize_t i = 0;
    for (Py_ssize_t seen = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) == 0x80) continue; /* a continuation byte */
        if (seen++ == chars) break;
    }
    return i;
}

/* mask_sha256(salt, value, version, portable=False) -> the hex digest (capture.column_policy's hash mask, for
 * tests; portable: without the CPU's SHA extensions). */
static PyObject *py_mask_sha256(PyObject *self, PyObject *args) {
    Py_buffer salt;
    const char *s;
    Py_ssize_t n;
    int version, portable = 0;
    if (!PyArg_ParseTuple(args, "y*s#i|p", &salt, &s, &n, &version, &portable)) return NULL;
    char hex[64];
    sha_portable_only = portable;
    int ok = hw_mask_sha256_hex(hex, salt.buf, salt.len, s, n, version);
    sha_portable_only = 0;
    PyBuffer_Release(&salt);
    if (!ok) Py_RETURN_NONE;
    return PyUnicode_FromStringAndSize(hex, 64);
}

PyMethodDef hw_column_masks_methods[] = {
    {"mask_sha256", py_mask_sha256, METH_VARARGS,
     "mask_sha256(salt, value, version, portable=False) -> lowercase hex SHA-256 of salt + the value's bytes."},
    {NULL, NULL, 0, NULL},
};
