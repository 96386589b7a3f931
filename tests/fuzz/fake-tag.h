/*
 * A stand-in for the session tag (docs/protocol.md §5.3) shared by fuzz-wire and
 * gen-corpus. The fuzz build links no libsodium, and what it exercises is the reader's
 * tagged framing (header checks first, then waiting for payload and tag, then the check,
 * then the decoder), not HMAC: so the tag here is a cheap function of the frame bytes and
 * the frame's sequence number, which seeds can carry and mutations break.
 */
#ifndef GANG_FUZZ_FAKE_TAG_H
#define GANG_FUZZ_FAKE_TAG_H

#include <stddef.h>
#include <stdint.h>

#include "ganglion/rendezvous.h"

static inline void fake_tag(uint64_t seq, const uint8_t *frame, size_t len,
                            uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    uint32_t sum = (uint32_t)(seq * 31u);

    for (size_t i = 0; i < len; i++)
        sum = sum * 33u + frame[i];
    for (unsigned i = 0; i < GANG_WIRE_TAG_SIZE; i++)
        tag[i] = (uint8_t)((sum >> (8 * (i % 4))) + i);
}

/* 0 when tag is fake_tag(seq, frame), else GANG_EAUTH. */
static inline int fake_tag_verify(uint64_t seq, const uint8_t *frame, size_t len,
                                  const uint8_t tag[GANG_WIRE_TAG_SIZE])
{
    uint8_t want[GANG_WIRE_TAG_SIZE];
    unsigned diff = 0;

    fake_tag(seq, frame, len, want);
    for (unsigned i = 0; i < GANG_WIRE_TAG_SIZE; i++)
        diff |= (unsigned)(want[i] ^ tag[i]);
    return diff ? GANG_EAUTH : 0;
}

#endif
