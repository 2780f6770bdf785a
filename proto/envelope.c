/* SPDX-License-Identifier: MIT */
/*
 * envelope.c - the outer message of a packet (odpd.Request, odpd.Reply)
 * and its body, when that is flat, without protobuf-c's walk over every
 * field of their descriptors.
 *
 * protobuf-c's generic code visits each of a message's fields when it
 * unpacks, sizes or packs one: for Request and Reply, whose bodies are a
 * oneof of a dozen and more messages, that walk cost more than everything
 * else odpd does for a small request (issue 26). An envelope is a few
 * optional scalars and one message of a oneof, and these functions handle
 * just that shape, reading each field's place and type from the generated
 * descriptor. A body of optional scalars, enums, bools and strings (RegMr,
 * MrReply and most others, since 1.4.6) goes the same way; any other body
 * is protobuf-c's. Whatever else they meet (a
 * field of another kind, an unknown or repeated field, a wire type that
 * does not fit, a varint of unusual length) they hand to protobuf-c's
 * generic functions, which stay the reference: the result is the same.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "odpd-envelope.h"

/* A varint of at most @max bytes at @p (before @end): its length, 0 if
 * longer or cut short. */
static inline size_t varint_get(const uint8_t *p, const uint8_t *end, size_t max, uint64_t *ret)
{
	uint64_t v = 0;

	if (p < end && p[0] < 0x80) {        /* a key, a small value */
		*ret = p[0];
		return 1;
	}
	if ((size_t)(end - p) < max)
		max = (size_t)(end - p);
	for (size_t i = 0; i < max; i++) {
		v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
		if (p[i] < 0x80) {
			*ret = v;
			return i + 1;
		}
	}
	return 0;
}

static uint8_t *varint_put(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* The field numbered @id of @d, or NULL: protobuf_c_message_descriptor_get_field
 * without the binary search, for the few number ranges of an envelope. */
static const ProtobufCFieldDescriptor *field_of(const ProtobufCMessageDescriptor *d, unsigned id)
{
	const ProtobufCIntRange *r = d->field_ranges;

	for (unsigned i = 0; i < d->n_field_ranges; i++, r++) {
		unsigned n = r[1].orig_index - r[0].orig_index;  /* r[n_field_ranges]: n_fields */

		if (id >= (unsigned)r->start_value && id - (unsigned)r->start_value < n)
			return &d->fields[r->orig_index + (id - (unsigned)r->start_value)];
	}
	return NULL;
}

#define MEMBER(msg, off, type) ((type *)((char *)(msg) + (off)))
#define CMEMBER(msg, off, type) ((const type *)((const char *)(msg) + (off)))

/*
 * Unpack the message described by @d from @data: optional uint64, uint32,
 * int32, enum, bool and string fields, each at most once, no other field;
 * an envelope (@body set) also a oneof of messages, each of which this
 * reads the same way if it can (a flat body: RegMr, MrReply, the most
 * frequent ones) and protobuf-c otherwise. NULL with *@generic set: not of
 * that shape, or not valid (protobuf-c decides); NULL without: out of
 * memory.
 */
static ProtobufCMessage *fast_unpack(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *a, size_t len,
				     const uint8_t *data, bool body, bool *generic)
{
	const uint8_t *p = data, *end = data + len;
	ProtobufCMessage *m = a->alloc(a->allocator_data, d->sizeof_message);
	const ProtobufCFieldDescriptor *f_prev = NULL;
	uint64_t seen = 0, key, v;
	size_t n;

	*generic = false;
	if (!m)
		return NULL;
	d->message_init(m);
	while (p < end) {
		const ProtobufCFieldDescriptor *f;
		unsigned id;
		/* protobuf-c writes fields in the descriptor's order: the
		 * next one is most often the one after the last */
		size_t next = f_prev ? (size_t)(f_prev - d->fields) + 1 : 0;

		n = varint_get(p, end, 2, &key);     /* field numbers below 2048 */
		if (!n)
			goto generic;
		p += n;
		id = (unsigned)(key >> 3);
		if (id >= 64 || (seen & (1ull << id)))
			goto generic;
		if (next < d->n_fields && d->fields[next].id == id)   /* (fields: NULL if none) */
			f = &d->fields[next];
		else if (!(f = field_of(d, id)))
			goto generic;
		f_prev = f;
		seen |= 1ull << id;
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t *which = MEMBER(m, f->quantifier_offset, uint32_t);
			ProtobufCMessage *sub;
			bool sub_generic;

			if (!body || f->type != PROTOBUF_C_TYPE_MESSAGE ||
			    (key & 7) != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
				goto generic;
			n = varint_get(p, end, 3, &v);  /* < 2 MiB */
			if (!n || *which || v > (uint64_t)(end - p - n))
				goto generic;
			p += n;
			sub = fast_unpack(f->descriptor, a, v, p, false, &sub_generic);
			if (!sub && !sub_generic)
				goto oom;
			if (!sub)
				sub = protobuf_c_message_unpack(f->descriptor, a, v, p);
			if (!sub)
				goto generic;
			p += v;
			*MEMBER(m, f->offset, ProtobufCMessage *) = sub;
			*which = f->id;
		} else if (f->label != PROTOBUF_C_LABEL_OPTIONAL) {
			goto generic;
		} else if (f->type == PROTOBUF_C_TYPE_STRING) {
			char **str = MEMBER(m, f->offset, char *);

			if ((key & 7) != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
				goto generic;
			n = varint_get(p, end, 3, &v);
			if (!n || v > (uint64_t)(end - p - n))
				goto generic;
			p += n;
			*str = a->alloc(a->allocator_data, v + 1);
			if (!*str)
				goto oom;
			memcpy(*str, p, v);
			(*str)[v] = 0;
			p += v;
		} else if ((key & 7) != PROTOBUF_C_WIRE_TYPE_VARINT) {
			goto generic;
		} else {
			switch (f->type) {
			case PROTOBUF_C_TYPE_UINT64:
				n = varint_get(p, end, 9, &v);  /* < 2^63 */
				if (!n)
					goto generic;
				*MEMBER(m, f->offset, uint64_t) = v;
				break;
			case PROTOBUF_C_TYPE_UINT32:
			case PROTOBUF_C_TYPE_INT32:     /* < 2^28: the same value for both */
			case PROTOBUF_C_TYPE_ENUM:      /* (an int32 as protobuf-c reads one) */
				n = varint_get(p, end, 4, &v);
				if (!n)
					goto generic;
				*MEMBER(m, f->offset, uint32_t) = (uint32_t)v;
				break;
			case PROTOBUF_C_TYPE_BOOL:      /* 0 or 1 in one byte, as protobuf-c writes them */
				if (p == end || *p > 1)
					goto generic;
				*MEMBER(m, f->offset, protobuf_c_boolean) = *p;
				n = 1;
				break;
			default:
				goto generic;
			}
			p += n;
			*MEMBER(m, f->quantifier_offset, protobuf_c_boolean) = 1;
		}
	}
	return m;
generic:
	protobuf_c_message_free_unpacked(m, a);
	*generic = true;
	return NULL;
oom:
	protobuf_c_message_free_unpacked(m, a);
	return NULL;
}

/* protobuf-c's default (NULL): malloc and free. */
static void *sys_alloc(void *data, size_t size)
{
	(void)data;
	return malloc(size);
}

static void sys_free(void *data, void *p)
{
	(void)data;
	free(p);
}

static ProtobufCAllocator sys_allocator = { .alloc = sys_alloc, .free = sys_free };

Odpd__Request *odpd_request_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data)
{
	bool generic;
	ProtobufCMessage *m = fast_unpack(&odpd__request__descriptor, a ? a : &sys_allocator, len, data, true, &generic);

	if (!m && generic)
		return odpd__request__unpack(a, len, data);
	return (Odpd__Request *)m;
}

Odpd__Reply *odpd_reply_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data)
{
	bool generic;
	ProtobufCMessage *m = fast_unpack(&odpd__reply__descriptor, a ? a : &sys_allocator, len, data, true, &generic);

	if (!m && generic)
		return odpd__reply__unpack(a, len, data);
	return (Odpd__Reply *)m;
}

static size_t varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/*
 * Pack @m: optional uint64, uint32, int32, enum, bool and string fields, no
 * unknown field, and for an envelope (@body set) a oneof of messages, each
 * packed the same way if it can (a flat body) and by protobuf-c otherwise;
 * into @buf of @cap bytes, in its fields' order as protobuf-c writes them.
 * Returns its length, or 0 if @m is not of that shape or might not fit
 * (protobuf-c decides then; an empty message also gets 0).
 */
static size_t fast_pack(const ProtobufCMessage *m, uint8_t *buf, size_t cap, bool body)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const ProtobufCFieldDescriptor *f, *fend;
	uint8_t *p = buf, *end = buf + cap;

	if (m->n_unknown_fields || !d->n_fields)   /* (no fields: d->fields is NULL) */
		return 0;
	f = d->fields;
	fend = f + d->n_fields;
	for (; f < fend; f++) {
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			const ProtobufCMessage *sub;
			size_t sub_len;

			if (*CMEMBER(m, f->quantifier_offset, uint32_t) != f->id)
				continue;
			if (!body || f->type != PROTOBUF_C_TYPE_MESSAGE || f->id >= 2048)
				return 0;
			sub = *CMEMBER(m, f->offset, const ProtobufCMessage *);
			if (!sub || sub == f->default_value)
				continue;
			if ((size_t)(end - p) < 2 + 5)
				return 0;
			/* the body after its key and a length of one byte, moved
			 * along if its length needs more */
			p = varint_put(p, f->id << 3 | PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED);
			sub_len = fast_pack(sub, p + 1, (size_t)(end - p) - 1 - 4, false);
			if (sub_len) {
				size_t more = varint_len(sub_len) - 1;

				if (more)
					memmove(p + 1 + more, p + 1, sub_len);
				p = varint_put(p, sub_len);
				p += sub_len;
				continue;
			}
			sub_len = protobuf_c_message_get_packed_size(sub);
			if (sub_len > (size_t)(end - p) - 5)
				return 0;
			p = varint_put(p, sub_len);
			p += protobuf_c_message_pack(sub, p);
			continue;
		}
		if (f->label != PROTOBUF_C_LABEL_OPTIONAL || f->id >= 2048 || end - p < 2 + 10)
			return 0;
		switch (f->type) {
		case PROTOBUF_C_TYPE_UINT64:
			if (!*CMEMBER(m, f->quantifier_offset, protobuf_c_boolean))
				break;
			p = varint_put(p, f->id << 3 | PROTOBUF_C_WIRE_TYPE_VARINT);
			p = varint_put(p, *CMEMBER(m, f->offset, uint64_t));
			break;
		case PROTOBUF_C_TYPE_UINT32:
			if (!*CMEMBER(m, f->quantifier_offset, protobuf_c_boolean))
				break;
			p = varint_put(p, f->id << 3 | PROTOBUF_C_WIRE_TYPE_VARINT);
			p = varint_put(p, *CMEMBER(m, f->offset, uint32_t));
			break;
		case PROTOBUF_C_TYPE_BOOL:
			if (!*CMEMBER(m, f->quantifier_offset, protobuf_c_boolean))
				break;
			p = varint_put(p, f->id << 3 | PROTOBUF_C_WIRE_TYPE_VARINT);
			*p++ = *CMEMBER(m, f->offset, protobuf_c_boolean) ? 1 : 0;
			break;
		case PROTOBUF_C_TYPE_INT32:               /* a negative one: 10 bytes, sign-extended */
		case PROTOBUF_C_TYPE_ENUM:
			if (!*CMEMBER(m, f->quantifier_offset, protobuf_c_boolean))
				break;
			p = varint_put(p, f->id << 3 | PROTOBUF_C_WIRE_TYPE_VARINT);
			p = varint_put(p, (uint64_t)(int64_t)*CMEMBER(m, f->offset, int32_t));
			break;
		case PROTOBUF_C_TYPE_STRING: {
			const char *str = *CMEMBER(m, f->offset, const char *);
			size_t sl;

			if (!str || str == f->default_value)
				break;
			sl = strlen(str);
			if (sl > (size_t)(end - p) - (2 + 5))
				return 0;
			p = varint_put(p, f->id << 3 | PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED);
			p = varint_put(p, sl);
			memcpy(p, str, sl);
			p += sl;
			break;
		}
		default:
			return 0;
		}
	}
	return (size_t)(p - buf);
}

/* protobuf-c's output into a buffer of @cap bytes: counts what does not
 * fit, writes only what does. */
struct bounded {
	ProtobufCBuffer base;
	uint8_t *data;
	size_t len, cap;
};

static void bounded_append(ProtobufCBuffer *buf, size_t len, const uint8_t *data)
{
	struct bounded *b = (struct bounded *)buf;

	if (len <= b->cap && b->len <= b->cap - len)
		memcpy(b->data + b->len, data, len);
	b->len += len;
}

size_t odpd_envelope_pack(const ProtobufCMessage *m, uint8_t *buf, size_t cap)
{
	struct bounded b = { .base.append = bounded_append, .data = buf, .cap = cap };
	size_t len = fast_pack(m, buf, cap, true);

	if (len)
		return len;
	return protobuf_c_message_pack_to_buffer(m, &b.base);
}

size_t odpd_reply_pack_bounded(const Odpd__Reply *reply, uint8_t *buf, size_t cap)
{
	return odpd_envelope_pack(&reply->base, buf, cap);
}
