/*
 * The message codec (common.h, "Message codec"): a cursor over a bounded buffer whose
 * field functions encode or decode depending on its direction.
 *
 * Every field goes through codec_move, the only place that touches the buffer: it
 * refuses a read past the end (decode) and only counts what does not fit (encode), so
 * the bounds are checked once for every message family that uses the codec. Values are
 * stored byte by byte, little-endian, so the bytes are the same on any host and at any
 * alignment; int32 and float arrays take a memcpy on little-endian hosts, where those
 * bytes are the values' own.
 */
#include <string.h>

#include "ganglion/common.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CODEC_HOST_LE 1
#else
#define CODEC_HOST_LE 0
#endif

void gang_codec_encoder(gang_codec *c, void *buf, size_t cap)
{
    *c = (gang_codec){.decoding = 0, .wbuf = buf, .cap = buf != NULL ? cap : 0};
}

void gang_codec_decoder(gang_codec *c, const void *buf, size_t len)
{
    *c = (gang_codec){.decoding = 1, .rbuf = buf, .cap = buf != NULL ? len : 0};
}

void gang_codec_fail(gang_codec *c, int err)
{
    if (c->err == 0)
        c->err = err < 0 ? err : GANG_EINVAL;
}

/* A field out of its bounds: the encoder was handed a message it cannot send, or the
 * decoder a message nobody may send. */
static void codec_bad(gang_codec *c)
{
    gang_codec_fail(c, c->decoding ? GANG_EPROTO : GANG_EINVAL);
}

int gang_codec_finish(const gang_codec *c, size_t *len)
{
    if (c->err != 0)
        return c->err;
    if (!c->decoding && c->off > c->cap)
        return GANG_EMSGSIZE;
    if (c->decoding && c->off != c->cap)
        return GANG_EPROTO; /* trailing bytes */
    if (len != NULL)
        *len = c->off;
    return 0;
}

/* The room for n more bytes to read: 1, or 0 after marking the message truncated. */
static int codec_can_read(gang_codec *c, size_t n)
{
    /* off <= cap always holds while decoding, so the subtraction cannot wrap. */
    if (n > c->cap - c->off) {
        codec_bad(c);
        return 0;
    }
    return 1;
}

/*
 * Moves n bytes between the buffer and p in the cursor's direction. Encoding past cap
 * only counts (the caller learns the size the message needs); decoding past the end
 * fails the message.
 */
static void codec_move(gang_codec *c, void *p, size_t n)
{
    if (c->err != 0 || n == 0)
        return;
    if (c->decoding) {
        if (!codec_can_read(c, n))
            return;
        memcpy(p, c->rbuf + c->off, n);
    } else {
        if (n > SIZE_MAX - c->off) {
            codec_bad(c);
            return;
        }
        if (c->off <= c->cap && n <= c->cap - c->off)
            memcpy(c->wbuf + c->off, p, n);
    }
    c->off += n;
}

/* An unsigned value of width bytes (1..8), little-endian. */
static void codec_le(gang_codec *c, uint64_t *v, unsigned width)
{
    uint8_t b[8] = {0};

    if (!c->decoding)
        for (unsigned i = 0; i < width; i++)
            b[i] = (uint8_t)(*v >> (8 * i));
    codec_move(c, b, width);
    if (c->decoding && c->err == 0) {
        uint64_t x = 0;
        for (unsigned i = width; i-- > 0;)
            x = (x << 8) | b[i];
        *v = x;
    }
}

void gang_codec_u8(gang_codec *c, uint8_t *v)
{
    codec_move(c, v, 1);
}

void gang_codec_u16(gang_codec *c, uint16_t *v)
{
    uint64_t x = *v;

    codec_le(c, &x, 2);
    *v = (uint16_t)x;
}

void gang_codec_u32(gang_codec *c, uint32_t *v)
{
    uint64_t x = *v;

    codec_le(c, &x, 4);
    *v = (uint32_t)x;
}

void gang_codec_u64(gang_codec *c, uint64_t *v)
{
    codec_le(c, v, 8);
}

void gang_codec_i32(gang_codec *c, int32_t *v)
{
    uint32_t u = (uint32_t)*v;

    gang_codec_u32(c, &u);
    *v = (int32_t)u;
}

void gang_codec_f32(gang_codec *c, float *v)
{
    uint32_t u;

    memcpy(&u, v, sizeof(u));
    gang_codec_u32(c, &u);
    memcpy(v, &u, sizeof(u));
}

/* The largest value a field of width bytes holds, or 0 for a width the codec refuses. */
static uint32_t width_max(unsigned width)
{
    return width == 1 ? 0xFFu : width == 2 ? 0xFFFFu : width == 4 ? 0xFFFFFFFFu : 0;
}

void gang_codec_uint(gang_codec *c, uint32_t *v, unsigned width, uint32_t max)
{
    uint64_t x = *v;

    if (width_max(width) == 0) {
        gang_codec_fail(c, GANG_EINVAL); /* a broken description */
        return;
    }
    if (!c->decoding && (*v > max || *v > width_max(width))) {
        codec_bad(c);
        return;
    }
    codec_le(c, &x, width);
    if (c->err != 0)
        return;
    if (x > max) {
        codec_bad(c);
        return;
    }
    *v = (uint32_t)x;
}

void gang_codec_bytes(gang_codec *c, void *p, size_t n)
{
    codec_move(c, p, n);
}

/* n values of 4 bytes each between a and the buffer. */
static void codec_words(gang_codec *c, uint32_t *a, size_t n)
{
    if (c->err != 0 || n == 0)
        return;
    if (n > SIZE_MAX / 4) {
        codec_bad(c);
        return;
    }
    if (CODEC_HOST_LE) {
        codec_move(c, a, n * 4);
        return;
    }
    if (c->decoding && !codec_can_read(c, n * 4))
        return; /* refused whole, before any element is written */
    for (size_t i = 0; i < n; i++)
        gang_codec_u32(c, &a[i]);
}

void gang_codec_i32_array(gang_codec *c, int32_t *a, size_t n)
{
    codec_words(c, (uint32_t *)a, n);
}

void gang_codec_f32_array(gang_codec *c, float *a, size_t n)
{
    _Static_assert(sizeof(float) == 4, "float is IEEE binary32");
    codec_words(c, (uint32_t *)(void *)a, n);
}

void gang_codec_i32_list(gang_codec *c, uint32_t *n, unsigned width, int32_t *a, uint32_t max)
{
    gang_codec_uint(c, n, width, max);
    if (c->err == 0)
        gang_codec_i32_array(c, a, *n);
}

void gang_codec_blob(gang_codec *c, uint32_t *len, unsigned width, void *p, uint32_t max)
{
    gang_codec_uint(c, len, width, max);
    if (c->err == 0)
        codec_move(c, p, *len);
}

void gang_codec_str(gang_codec *c, char *s, size_t cap, unsigned width)
{
    uint32_t n = 0;

    if (cap == 0) {
        gang_codec_fail(c, GANG_EINVAL);
        return;
    }
    if (!c->decoding) {
        size_t len = strnlen(s, cap);
        if (len >= cap || len > width_max(width)) {
            codec_bad(c);
            return;
        }
        n = (uint32_t)len;
    }
    gang_codec_uint(c, &n, width, cap - 1 < UINT32_MAX ? (uint32_t)(cap - 1) : UINT32_MAX);
    if (c->err != 0)
        return;
    codec_move(c, s, n);
    if (c->decoding && c->err == 0) {
        if (memchr(s, '\0', n) != NULL) {
            s[0] = '\0';
            codec_bad(c);
            return;
        }
        s[n] = '\0';
    }
}
