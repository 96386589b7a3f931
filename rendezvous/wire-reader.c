/*
 * Streaming frame reader: turns the arbitrary chunks a TCP stream delivers into whole
 * wire messages.
 *
 * The buffer holds exactly one maximum frame. Bytes that were taken by _next() are not
 * moved right away: the unread tail is slid to the front only when a feed would not fit
 * behind it ("compaction"), so a connection that delivers whole frames never copies
 * anything twice. Since the largest legal frame fits the buffer, a peer can never make
 * the reader need more room than it has; a frame that claims more is refused from its
 * header alone, before its payload is waited for.
 *
 * Once a tag check is set (gang_wire_reader_set_tag_check) each frame is followed by its
 * GANG_WIRE_TAG_SIZE-byte tag; the buffer (GANG_WIRE_MAX_FRAME) has room for a maximal
 * frame and its tag. The tag is checked over the raw header and payload bytes before the
 * payload is decoded, so nothing unauthenticated reaches the decoder's callers.
 */
#include <stdlib.h>
#include <string.h>

#include "ganglion/rendezvous.h"

struct gang_wire_reader {
    size_t start;                     /* offset of the first byte not yet taken */
    size_t end;                       /* offset one past the last byte fed */
    int err;                          /* sticky: a broken stream stays broken */
    gang_wire_tag_check_fn tag_check; /* non-NULL: each frame is followed by a tag */
    void *tag_ctx;
    uint8_t buf[GANG_WIRE_MAX_FRAME]; /* buf[start..end) holds the pending bytes */
};

/* Allocates an empty reader; NULL when out of memory. Free it with _free(). */
gang_wire_reader *gang_wire_reader_new(void)
{
    return calloc(1, sizeof(gang_wire_reader));
}

void gang_wire_reader_free(gang_wire_reader *r)
{
    free(r);
}

void gang_wire_reader_set_tag_check(gang_wire_reader *r, gang_wire_tag_check_fn fn, void *ctx)
{
    r->tag_check = fn;
    r->tag_ctx = ctx;
}

size_t gang_wire_reader_pending(const gang_wire_reader *r)
{
    return r->end - r->start;
}

/* Room left for feed(), counting the bytes compaction would win back. */
size_t gang_wire_reader_space(const gang_wire_reader *r)
{
    return sizeof r->buf - gang_wire_reader_pending(r);
}

/*
 * Appends data[0..len). All or nothing: GANG_EMSGSIZE when len exceeds _space() (nothing is
 * appended, so the caller may drain with _next() and feed again), or the stream's sticky
 * error once _next() has reported one.
 */
int gang_wire_reader_feed(gang_wire_reader *r, const uint8_t *data, size_t len)
{
    if (r->err)
        return r->err;
    if (len == 0)
        return 0;
    if (len > gang_wire_reader_space(r))
        return GANG_EMSGSIZE;
    if (len > sizeof r->buf - r->end) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    memcpy(r->buf + r->end, data, len);
    r->end += len;
    return 0;
}

/*
 * Takes the next complete message (see rendezvous.h). gang_wire_decode() validates the
 * header before it asks for the payload, which is what lets a bad header surface as soon
 * as its 20 bytes are buffered; with a session, a wrong tag is GANG_EAUTH. Any error is remembered
 * and returned again by every later call: after a framing error the stream position is meaningless.
 */
int gang_wire_reader_next(gang_wire_reader *r, gang_msg *m)
{
    size_t used = 0;
    int rc;

    if (r->err)
        return r->err;
    if (r->tag_check != NULL) {
        /* Header first (bad ones fail from 20 bytes), then the tag, then the payload. */
        gang_wire_header h;
        const uint8_t *f = r->buf + r->start;
        size_t avail = r->end - r->start;
        rc = gang_wire_decode_header(f, avail, &h);
        if (rc == GANG_EAGAIN)
            return 0;
        if (rc < 0)
            goto out_err;
        /* payload_len <= GANG_WIRE_MAX_PAYLOAD here, so this cannot overflow. */
        size_t flen = GANG_WIRE_HEADER_SIZE + (size_t)h.payload_len;
        if (avail < flen + GANG_WIRE_TAG_SIZE)
            return 0;
        rc = r->tag_check(r->tag_ctx, f, flen, f + flen);
        if (rc > 0)
            rc = GANG_EAUTH; /* only 0 accepts */
        if (rc < 0)
            goto out_err;
        rc = gang_wire_decode(f, flen, m, &used);
        if (rc == GANG_EAGAIN)
            rc = GANG_EPROTO; /* cannot happen: the whole frame is there */
        if (rc < 0)
            goto out_err;
        used += GANG_WIRE_TAG_SIZE;
    } else {
        rc = gang_wire_decode(r->buf + r->start, r->end - r->start, m, &used);
        if (rc == GANG_EAGAIN)
            return 0;
        if (rc < 0)
            goto out_err;
    }
    r->start += used;
    /* An empty buffer restarts at the front for free; no compaction is needed then. */
    if (r->start == r->end)
        r->start = r->end = 0;
    return 1;
out_err:
    r->err = rc;
    return rc;
}
