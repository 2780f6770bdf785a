/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The outer message of a packet, unpacked and packed without protobuf-c's
 * walk over all of its fields (envelope.c); the same result as protobuf-c's
 * functions, which they call for anything but the usual shape.
 */
#include <stddef.h>
#include <stdint.h>

#include "odpd.pb-c.h"

/* As odpd__request__unpack(@a, @len, @data). */
Odpd__Request *odpd_request_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data);
/* As odpd__reply__unpack(@a, @len, @data). */
Odpd__Reply *odpd_reply_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data);
/* Pack @m (any message) into @buf of @cap bytes. Returns its packed length;
 * when that is larger than @cap, @buf holds nothing of use. */
size_t odpd_envelope_pack(const ProtobufCMessage *m, uint8_t *buf, size_t cap);
/* Pack @reply into @buf of @cap bytes. Returns its packed length; when that
 * is larger than @cap, @buf holds nothing of use. */
size_t odpd_reply_pack_bounded(const Odpd__Reply *reply, uint8_t *buf, size_t cap);
