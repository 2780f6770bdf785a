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
 * just that shape. A body of optional scalars, enums, bools and strings
 * (RegMr, MrReply and most others, since 1.4.6) goes the same way; any
 * other body is protobuf-c's. Whatever else they meet (a field of another
 * kind, an unknown or repeated field, a wire type that does not fit, a
 * varint of unusual length) they hand to protobuf-c's generic functions,
 * which stay the reference: the result is the same.
 *
 * Since 1.4.9 they read each message's fields from a table built once
 * from the generated descriptors (struct fmsg: per field its kind, member
 * offsets and encoded key, and the field's place by number), and move
 * varints of up to 8 bytes as one 64-bit word on little-endian machines:
 * decoding an MrReply took about 95 instructions a field through the
 * descriptors, the bulk of it looking up what the table now holds.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "odpd-envelope.h"

#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define VARINT_WORD 1
#else
#define VARINT_WORD 0
#endif

/* The longest varint protobuf-c reads (64 bits in 7-bit groups); the bits
 * past 64 of a tenth byte are dropped, as protobuf-c drops them. */
#define VARINT_MAX 10

/* A varint of at most @max bytes at @p (before @end): its length, 0 if
 * longer or cut short. */
static inline size_t varint_get(const uint8_t *p, const uint8_t *end, size_t max, uint64_t *ret)
{
	uint64_t v = 0;

	if (p < end && p[0] < 0x80) {        /* a key, a small value */
		*ret = p[0];
		return 1;
	}
	if (end - p >= 2 && p[1] < 0x80 && max >= 2) {
		*ret = (p[0] & 0x7fu) | (uint64_t)p[1] << 7;
		return 2;
	}
#if VARINT_WORD
	if (end - p >= 8) {
		uint64_t w, stop;
		size_t len;

		memcpy(&w, p, 8);
		stop = ~w & 0x8080808080808080ull;   /* the bytes that end a varint */
		if (stop) {
			len = ((size_t)__builtin_ctzll(stop) >> 3) + 1;
			if (len > max)
				return 0;
			if (len < 8)
				w &= (1ull << (8 * len)) - 1;
			/* 7 bits of each byte, gathered: pairs, then fours, then eight */
			w &= 0x7f7f7f7f7f7f7f7full;
			w = (w & 0x007f007f007f007full) | ((w & 0x7f007f007f007f00ull) >> 1);
			w = (w & 0x00003fff00003fffull) | ((w & 0x3fff00003fff0000ull) >> 2);
			w = (w & 0x000000000fffffffull) | ((w & 0x0fffffff00000000ull) >> 4);
			*ret = w;
			return len;
		}
	}
#endif
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

/* @v as a varint at @p: exactly its bytes. */
static uint8_t *varint_put(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* The same, but it may write up to 10 bytes at @p whatever @v's length:
 * only where that much room is known and nothing after the varint is in
 * place yet. */
static inline uint8_t *varint_put_wide(uint8_t *p, uint64_t v)
{
	if (v < 0x80) {
		*p = (uint8_t)v;
		return p + 1;
	}
	if (v < 1u << 14) {
		p[0] = (uint8_t)(v | 0x80);
		p[1] = (uint8_t)(v >> 7);
		return p + 2;
	}
#if VARINT_WORD
	if (v < 1ull << 56) {
		size_t len = (size_t)(63 - __builtin_clzll(v)) / 7 + 1;    /* 3 to 8 */
		uint64_t w = v;

		/* 7 bits to each byte: halves, then fours, then pairs */
		w = (w & 0x000000000fffffffull) | ((w & 0x00fffffff0000000ull) << 4);
		w = (w & 0x00003fff00003fffull) | ((w & 0x0fffc0000fffc000ull) << 2);
		w = (w & 0x007f007f007f007full) | ((w & 0x3f803f803f803f80ull) << 1);
		w |= 0x8080808080808080ull & ((1ull << (8 * (len - 1))) - 1);
		memcpy(p, &w, 8);
		return p + len;
	}
#endif
	return varint_put(p, v);
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

/* What this file does with a field. */
enum kind {
	K_OTHER,         /* protobuf-c's: not optional, or a type not below */
	K_U64,
	K_U32,
	K_I32,           /* int32 and enum */
	K_BOOL,
	K_STR,
	K_BODY,          /* a message of an envelope's oneof */
	K_ONEOF_OTHER,   /* any other member of a oneof: protobuf-c's when set */
	K_GROUP,         /* (in fmsg.iter only) the oneof of f[group_first, group_end) */
};

struct ffield {
	uint16_t off, qoff;      /* the member's offset, its has_ (or the oneof's case) */
	uint8_t kind;
	uint8_t wire;            /* its wire type; 0xff: none that this file reads */
	uint8_t key_len;         /* its key, encoded: 1 or 2 bytes */
	uint8_t key[2];
	unsigned id;
	const struct fmsg *sub;  /* K_BODY: the body's table (NULL: protobuf-c's) */
	const ProtobufCFieldDescriptor *f;
};

/* A message's table, built once from its descriptor. */
struct fmsg {
	const ProtobufCMessageDescriptor *d;
	bool packable;           /* no field of kind K_OTHER, and at least one field */
	uint8_t by_id[64];       /* field number -> place in f[] + 1; 0: none */
	uint8_t by_key[128];     /* a key of one byte (numbers below 16) with the field's
				  * wire type -> place in f[] + 1; 0: none, or another wire type */
	/* What fast_pack visits, in order: the fields, except that a oneof
	 * whose members are next to each other (an envelope's bodies) is one
	 * K_GROUP entry, so that packing does not look at each member. */
	struct ffield *iter;
	unsigned n, n_iter;
	unsigned group_first, group_end;   /* the K_GROUP entry's members in f[] */
	bool mr_reply;           /* MrReply of the shape mr_reply_pack expects */
	struct ffield f[];       /* in the descriptor's order, as protobuf-c packs */
};

/*
 * MrReply, the answer to every registration, is packed and unpacked field
 * by field (about 20 instructions a field fewer than through the table),
 * when its descriptor is what this code was written for: fields 1 to 14
 * of these types, all optional (mr_reply_shape, checked once). Anything
 * else uses the table, and the unit tests hold both to protobuf-c's bytes.
 */
static const ProtobufCType mr_reply_types[] = {
	PROTOBUF_C_TYPE_UINT64, PROTOBUF_C_TYPE_UINT32, PROTOBUF_C_TYPE_UINT32,  /* handle lkey rkey */
	PROTOBUF_C_TYPE_UINT64, PROTOBUF_C_TYPE_UINT64, PROTOBUF_C_TYPE_UINT32,  /* iova length kernel_handle */
	PROTOBUF_C_TYPE_UINT32, PROTOBUF_C_TYPE_UINT64, PROTOBUF_C_TYPE_BOOL,    /* access generation cache_hit */
	PROTOBUF_C_TYPE_UINT64, PROTOBUF_C_TYPE_UINT64, PROTOBUF_C_TYPE_INT32,   /* mr_iova mr_length prefetch_errno */
	PROTOBUF_C_TYPE_UINT32, PROTOBUF_C_TYPE_UINT64,                          /* slot ticket */
};
#define MR_REPLY_FIELDS (sizeof(mr_reply_types) / sizeof(mr_reply_types[0]))

static bool mr_reply_shape(const ProtobufCMessageDescriptor *d)
{
	if (d != &odpd__mr_reply__descriptor || d->n_fields != MR_REPLY_FIELDS ||
	    d->sizeof_message != sizeof(Odpd__MrReply))
		return false;
	for (unsigned i = 0; i < MR_REPLY_FIELDS; i++)
		if (d->fields[i].id != i + 1 || d->fields[i].type != mr_reply_types[i] ||
		    d->fields[i].label != PROTOBUF_C_LABEL_OPTIONAL || (d->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			return false;
	return true;
}

/* One oneof whose members are next to each other in @t's fields: packed
 * as one K_GROUP entry of t->iter. Any other shape: t->iter is t->f. */
static void fmsg_group(struct fmsg *t)
{
	unsigned first = t->n, last = 0, k = 0;
	struct ffield *it;

	for (unsigned i = 0; i < t->n; i++) {
		if (!(t->f[i].f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			continue;
		if (first < t->n && t->f[i].qoff != t->f[first].qoff)
			return;                          /* two oneofs */
		if (first == t->n)
			first = i;
		last = i;
	}
	if (first == t->n || last - first + 1 < 2)
		return;
	for (unsigned i = first; i <= last; i++)
		if (!(t->f[i].f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
			return;                          /* not next to each other */
	it = calloc(t->n - (last - first), sizeof(*it));
	if (!it)
		return;
	for (unsigned i = 0; i < t->n; i++) {
		if (i == first) {
			it[k] = t->f[i];
			it[k].kind = K_GROUP;
			k++;
		} else if (i < first || i > last) {
			it[k++] = t->f[i];
		}
	}
	t->iter = it;
	t->n_iter = k;
	t->group_first = first;
	t->group_end = last + 1;
}

static struct fmsg *fmsg_build(const ProtobufCMessageDescriptor *d, bool envelope)
{
	struct fmsg *t = calloc(1, sizeof(*t) + d->n_fields * sizeof(t->f[0]));

	if (!t)
		return NULL;
	t->d = d;
	t->n = d->n_fields;
	t->packable = d->n_fields > 0;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		struct ffield *ff = &t->f[i];
		uint8_t *k;

		ff->f = f;
		ff->id = f->id;
		ff->off = (uint16_t)f->offset;
		ff->qoff = (uint16_t)f->quantifier_offset;
		ff->kind = K_OTHER;
		ff->wire = 0xff;
		if (f->offset > 0xffff || f->quantifier_offset > 0xffff || f->id >= 2048) {
			/* K_OTHER */
		} else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			ff->kind = K_ONEOF_OTHER;
			if (envelope && f->type == PROTOBUF_C_TYPE_MESSAGE) {
				ff->kind = K_BODY;
				ff->wire = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
				ff->sub = fmsg_build(f->descriptor, false);
			}
		} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL) {
			switch (f->type) {
			case PROTOBUF_C_TYPE_UINT64: ff->kind = K_U64; break;
			case PROTOBUF_C_TYPE_UINT32: ff->kind = K_U32; break;
			case PROTOBUF_C_TYPE_INT32:
			case PROTOBUF_C_TYPE_ENUM: ff->kind = K_I32; break;
			case PROTOBUF_C_TYPE_BOOL: ff->kind = K_BOOL; break;
			case PROTOBUF_C_TYPE_STRING:
				ff->kind = K_STR;
				ff->wire = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
				break;
			default: break;
			}
			if (ff->kind != K_OTHER && ff->kind != K_STR)
				ff->wire = PROTOBUF_C_WIRE_TYPE_VARINT;
		}
		if (ff->kind == K_OTHER)
			t->packable = false;
		if (ff->wire != 0xff) {
			k = varint_put(ff->key, f->id << 3 | ff->wire);
			ff->key_len = (uint8_t)(k - ff->key);
		}
		if (f->id < 64)
			t->by_id[f->id] = (uint8_t)(i + 1);
		if (ff->wire != 0xff && ff->key_len == 1)
			t->by_key[ff->key[0]] = (uint8_t)(i + 1);
	}
	t->iter = t->f;
	t->n_iter = t->n;
	fmsg_group(t);
	t->mr_reply = mr_reply_shape(d);
	return t;
}

static const struct fmsg *request_table, *reply_table;
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

/* Out of memory here leaves a table NULL: protobuf-c's functions then. */
static void tables_build(void)
{
	request_table = fmsg_build(&odpd__request__descriptor, true);
	reply_table = fmsg_build(&odpd__reply__descriptor, true);
}

static const struct fmsg *table_of(const ProtobufCMessageDescriptor *d)
{
	pthread_once(&tables_once, tables_build);
	if (d == &odpd__request__descriptor)
		return request_table;
	if (d == &odpd__reply__descriptor)
		return reply_table;
	return NULL;
}

#define MEMBER(msg, off, type) ((type *)((char *)(msg) + (off)))
#define CMEMBER(msg, off, type) ((const type *)((const char *)(msg) + (off)))

/* An MrReply's fields into @m (initialised): true, else not of the usual
 * shape (protobuf-c decides). */
static bool mr_reply_unpack(Odpd__MrReply *m, const uint8_t *p, const uint8_t *end)
{
	while (p < end) {
		unsigned key = *p++;
		uint64_t v;
		size_t n;

		if (key == (9 << 3 | PROTOBUF_C_WIRE_TYPE_VARINT)) {   /* cache_hit: 0 or 1 in one byte */
			if (p == end || *p > 1)
				return false;
			m->has_cache_hit = 1;
			m->cache_hit = *p++;
			continue;
		}
		/* a varint field 1 to 14; a scalar sent twice: the last, as protobuf-c */
		if ((key & 7) != PROTOBUF_C_WIRE_TYPE_VARINT || key < 1 << 3 || key > MR_REPLY_FIELDS << 3)
			return false;
		n = varint_get(p, end, VARINT_MAX, &v);   /* uint32, int32: the low 32 bits below */
		if (!n)
			return false;
		p += n;
		switch (key >> 3) {
		case 1: m->has_handle = 1; m->handle = v; break;
		case 2: m->has_lkey = 1; m->lkey = (uint32_t)v; break;
		case 3: m->has_rkey = 1; m->rkey = (uint32_t)v; break;
		case 4: m->has_iova = 1; m->iova = v; break;
		case 5: m->has_length = 1; m->length = v; break;
		case 6: m->has_kernel_handle = 1; m->kernel_handle = (uint32_t)v; break;
		case 7: m->has_access = 1; m->access = (uint32_t)v; break;
		case 8: m->has_generation = 1; m->generation = v; break;
		case 10: m->has_mr_iova = 1; m->mr_iova = v; break;
		case 11: m->has_mr_length = 1; m->mr_length = v; break;
		case 12: m->has_prefetch_errno = 1; m->prefetch_errno = (int32_t)(uint32_t)v; break;
		case 13: m->has_slot = 1; m->slot = (uint32_t)v; break;
		case 14: m->has_ticket = 1; m->ticket = v; break;
		default: return false;          /* (9 with another wire type: not reached) */
		}
	}
	return true;
}

/*
 * Unpack the message of table @t from @data: optional uint64, uint32,
 * int32, enum, bool and string fields, each at most once, no other field;
 * an envelope also a oneof of messages, each of which this reads the same
 * way if it can (a flat body: RegMr, MrReply, the most frequent ones) and
 * protobuf-c otherwise. NULL with *@generic set: not of that shape, or not
 * valid (protobuf-c decides); NULL without: out of memory.
 */
static ProtobufCMessage *fast_unpack(const struct fmsg *t, ProtobufCAllocator *a, size_t len,
				     const uint8_t *data, bool *generic)
{
	const ProtobufCMessageDescriptor *d = t->d;
	const uint8_t *p = data, *end = data + len;
	ProtobufCMessage *m = a->alloc(a->allocator_data, d->sizeof_message);
	uint64_t seen = 0, key, v;
	size_t n;

	*generic = false;
	if (!m)
		return NULL;
	d->message_init(m);
	if (t->mr_reply) {
		if (mr_reply_unpack((Odpd__MrReply *)m, p, end))
			return m;
		goto generic;
	}
	while (p < end) {
		const struct ffield *ff;
		unsigned id, i;

		if (*p < 0x80 && (i = t->by_key[*p])) {     /* the usual key: one lookup */
			id = *p++ >> 3;
			ff = &t->f[i - 1];
		} else {
			if (!(n = varint_get(p, end, 2, &key)))   /* field numbers below 2048 */
				goto generic;
			p += n;
			id = (unsigned)(key >> 3);
			if (id >= 64 || !t->by_id[id])
				goto generic;
			ff = &t->f[t->by_id[id] - 1];
			if ((key & 7) != ff->wire)
				goto generic;
		}
		if (seen & (1ull << id))
			goto generic;
		seen |= 1ull << id;
		switch (ff->kind) {
		case K_U64:
			if (!(n = varint_get(p, end, VARINT_MAX, &v)))
				goto generic;
			*MEMBER(m, ff->off, uint64_t) = v;
			break;
		case K_U32:
		case K_I32:
			/* the low 32 bits, as protobuf-c takes them for both (an enum:
			 * an int32 as protobuf-c reads one): an mlx5 key of 2^28 and
			 * more takes 5 bytes, a negative int32 (an errno in
			 * Reply.status) 10 */
			if (!(n = varint_get(p, end, VARINT_MAX, &v)))
				goto generic;
			*MEMBER(m, ff->off, uint32_t) = (uint32_t)v;
			break;
		case K_BOOL:     /* 0 or 1 in one byte, as protobuf-c writes them */
			if (p == end || *p > 1)
				goto generic;
			*MEMBER(m, ff->off, protobuf_c_boolean) = *p;
			n = 1;
			break;
		case K_STR: {
			char **str = MEMBER(m, ff->off, char *);

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
			continue;        /* no has_ */
		}
		case K_BODY: {
			uint32_t *which = MEMBER(m, ff->qoff, uint32_t);
			const ProtobufCMessageDescriptor *bd = ff->f->descriptor;
			ProtobufCMessage *sub = NULL;
			bool sub_generic = true;

			n = varint_get(p, end, 3, &v);  /* < 2 MiB */
			if (!n || *which || v > (uint64_t)(end - p - n))
				goto generic;
			p += n;
			if (ff->sub)
				sub = fast_unpack(ff->sub, a, v, p, &sub_generic);
			if (!sub && !sub_generic)
				goto oom;
			if (!sub)
				sub = protobuf_c_message_unpack(bd, a, v, p);
			if (!sub)
				goto generic;
			p += v;
			*MEMBER(m, ff->off, ProtobufCMessage *) = sub;
			*which = ff->id;
			continue;
		}
		default:
			goto generic;
		}
		p += n;
		*MEMBER(m, ff->qoff, protobuf_c_boolean) = 1;
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

static ProtobufCMessage *envelope_unpack(const ProtobufCMessageDescriptor *d, ProtobufCAllocator *a,
					 size_t len, const uint8_t *data)
{
	const struct fmsg *t = table_of(d);
	bool generic = true;
	ProtobufCMessage *m = NULL;

	if (t)
		m = fast_unpack(t, a ? a : &sys_allocator, len, data, &generic);
	if (!m && generic)
		return protobuf_c_message_unpack(d, a, len, data);
	return m;
}

Odpd__Request *odpd_request_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data)
{
	return (Odpd__Request *)envelope_unpack(&odpd__request__descriptor, a, len, data);
}

Odpd__Reply *odpd_reply_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data)
{
	return (Odpd__Reply *)envelope_unpack(&odpd__reply__descriptor, a, len, data);
}

static size_t mr_reply_pack(const Odpd__MrReply *m, uint8_t *buf, size_t cap)
{
	uint8_t *p = buf;

	/* at most 120 bytes (14 keys; 7 uint64 and a negative int32 of 10 bytes,
	 * 5 uint32 of 5, a bool), and 7 past them that a wide put may write */
	if (m->base.n_unknown_fields || cap < 120 + 7)
		return 0;
#define PUT(field, id, value) \
	if (m->has_##field) { \
		*p++ = (id) << 3; \
		p = varint_put_wide(p, value); \
	}
	PUT(handle, 1, m->handle)
	PUT(lkey, 2, m->lkey)
	PUT(rkey, 3, m->rkey)
	PUT(iova, 4, m->iova)
	PUT(length, 5, m->length)
	PUT(kernel_handle, 6, m->kernel_handle)
	PUT(access, 7, m->access)
	PUT(generation, 8, m->generation)
	PUT(cache_hit, 9, m->cache_hit ? 1 : 0)
	PUT(mr_iova, 10, m->mr_iova)
	PUT(mr_length, 11, m->mr_length)
	PUT(prefetch_errno, 12, (uint64_t)(int64_t)m->prefetch_errno)   /* negative: 10 bytes */
	PUT(slot, 13, m->slot)
	PUT(ticket, 14, m->ticket)
#undef PUT
	return (size_t)(p - buf);
}

/*
 * Pack @m, whose table is @t: optional uint64, uint32, int32, enum, bool
 * and string fields, no unknown field, and for an envelope a oneof of
 * messages, each packed the same way if it can (a flat body) and by
 * protobuf-c otherwise; into @buf of @cap bytes, in its fields' order as
 * protobuf-c writes them. Returns its length, or 0 if @m is not of that
 * shape or might not fit (protobuf-c decides then; an empty message also
 * gets 0).
 */
static size_t fast_pack(const struct fmsg *t, const ProtobufCMessage *m, uint8_t *buf, size_t cap)
{
	const struct ffield *it, *iend = t->iter + t->n_iter;
	uint8_t *p = buf, *end = buf + cap;

	if (t->mr_reply) {
		size_t n = mr_reply_pack((const Odpd__MrReply *)m, buf, cap);

		if (n || m->n_unknown_fields)
			return n;                /* (0 with none set: protobuf-c's, as below) */
	}
	if (!t->packable || m->n_unknown_fields)
		return 0;
	for (it = t->iter; it < iend; it++) {
		const struct ffield *ff = it;
		uint64_t v;

		if (ff->kind == K_GROUP) {
			uint32_t which = *CMEMBER(m, ff->qoff, uint32_t);
			unsigned i;

			if (!which)
				continue;
			/* the member it names, which the switch below packs */
			if (which >= 64 || !t->by_id[which])
				return 0;
			i = t->by_id[which] - 1u;
			if (i < t->group_first || i >= t->group_end)
				return 0;
			ff = &t->f[i];
		}
		switch (ff->kind) {
		case K_U64:
			v = *CMEMBER(m, ff->off, uint64_t);
			goto scalar;
		case K_U32:
			v = *CMEMBER(m, ff->off, uint32_t);
			goto scalar;
		case K_I32:      /* a negative one: 10 bytes, sign-extended */
			v = (uint64_t)(int64_t)*CMEMBER(m, ff->off, int32_t);
			goto scalar;
		case K_BOOL:
			v = *CMEMBER(m, ff->off, protobuf_c_boolean) ? 1 : 0;
scalar:
			if (!*CMEMBER(m, ff->qoff, protobuf_c_boolean))
				continue;
			if (end - p < 2 + 10)
				return 0;
			p[0] = ff->key[0];
			p[1] = ff->key[1];
			p = varint_put_wide(p + ff->key_len, v);
			continue;
		case K_STR: {
			const char *str = *CMEMBER(m, ff->off, const char *);
			size_t sl;

			if (!str || str == ff->f->default_value)
				continue;
			sl = strlen(str);
			if (end - p < 2 + 10 || sl > (size_t)(end - p) - (2 + 10))
				return 0;
			p[0] = ff->key[0];
			p[1] = ff->key[1];
			p = varint_put_wide(p + ff->key_len, sl);
			memcpy(p, str, sl);
			p += sl;
			continue;
		}
		case K_BODY: {
			const ProtobufCMessage *sub;
			size_t sub_len = 0;

			if (*CMEMBER(m, ff->qoff, uint32_t) != ff->id)
				continue;
			sub = *CMEMBER(m, ff->off, const ProtobufCMessage *);
			if (!sub || sub == ff->f->default_value)
				continue;
			if (end - p < 2 + 5)
				return 0;
			/* the body after its key and a length of one byte, moved
			 * along if its length needs more */
			p[0] = ff->key[0];
			p[1] = ff->key[1];
			p += ff->key_len;
			if (ff->sub && ff->sub->d == sub->descriptor)
				sub_len = fast_pack(ff->sub, sub, p + 1, (size_t)(end - p) - 1 - 4);
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
		case K_ONEOF_OTHER:
			if (*CMEMBER(m, ff->qoff, uint32_t) == ff->id)
				return 0;
			continue;
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
	const struct fmsg *t = table_of(m->descriptor);
	size_t len = t ? fast_pack(t, m, buf, cap) : 0;

	if (len)
		return len;
	return protobuf_c_message_pack_to_buffer(m, &b.base);
}

size_t odpd_reply_pack_bounded(const Odpd__Reply *reply, uint8_t *buf, size_t cap)
{
	return odpd_envelope_pack(&reply->base, buf, cap);
}
