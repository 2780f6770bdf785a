/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of proto/envelope.c: odpd_request_unpack, odpd_reply_unpack,
 * odpd_envelope_pack and odpd_reply_pack_bounded against protobuf-c's own
 * functions, which they must match byte for byte: every body type, the
 * fields around it, and (for unpacking) many packets damaged at random,
 * each decoded both ways.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "odpd-envelope.h"

#define BUF 4096

/* A small deterministic generator: the runs are the same every time. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* A value of any varint length. */
static uint64_t rnd_value(void)
{
	return rnd() >> (rnd() % 64);
}

/* Field @i of @d if it is a member of the oneof (a body), else NULL. */
static const ProtobufCFieldDescriptor *body_field(const ProtobufCMessageDescriptor *d, unsigned i)
{
	const ProtobufCFieldDescriptor *f = &d->fields[i];

	return (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) ? f : NULL;
}

/* Fill the optional scalars and strings of @m (a body) at random. */
static void fill(ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		char *base = (char *)m;

		if (f->label != PROTOBUF_C_LABEL_OPTIONAL || (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || rnd() % 3 == 0)
			continue;
		switch (f->type) {
		case PROTOBUF_C_TYPE_UINT64:
			*(uint64_t *)(base + f->offset) = rnd_value();
			break;
		case PROTOBUF_C_TYPE_UINT32:
		case PROTOBUF_C_TYPE_INT32:
		case PROTOBUF_C_TYPE_ENUM:
			*(uint32_t *)(base + f->offset) = (uint32_t)rnd_value();
			break;
		case PROTOBUF_C_TYPE_BOOL:
			*(protobuf_c_boolean *)(base + f->offset) = rnd() & 1;
			break;
		case PROTOBUF_C_TYPE_STRING:
			*(const char **)(base + f->offset) = rnd() & 1 ? "a name" : "";
			continue;                    /* no has_ */
		default:
			continue;
		}
		*(protobuf_c_boolean *)(base + f->quantifier_offset) = 1;
	}
}

/* A request with body @i of the descriptor (or none), in @req. */
static void request_fill(Odpd__Request *r, int i, void *body_mem)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	const ProtobufCFieldDescriptor *f = i >= 0 ? body_field(&odpd__request__descriptor, (unsigned)i) : NULL;

	if (rnd() % 4) {
		req.has_id = 1;
		req.id = rnd_value();
	}
	if (rnd() % 2) {
		req.has_local_hits = 1;
		req.local_hits = rnd_value();
	}
	if (rnd() % 2) {
		req.has_revocations_seen = 1;
		req.revocations_seen = rnd_value();
	}
	if (f) {
		const ProtobufCMessageDescriptor *bd = f->descriptor;
		ProtobufCMessage *b = body_mem;

		bd->message_init(b);
		fill(b);
		*(ProtobufCMessage **)((char *)&req + f->offset) = b;
		*(uint32_t *)((char *)&req + f->quantifier_offset) = f->id;
	}
	*r = req;
}

/* The same, packed into @buf by protobuf-c. */
static size_t request_packet(int i, uint8_t *buf, void *body_mem)
{
	Odpd__Request req;

	request_fill(&req, i, body_mem);
	assert_true(odpd__request__get_packed_size(&req) <= BUF);
	return odpd__request__pack(&req, buf);
}

/* Decode @len bytes both ways: the same answer, the same message. */
static void unpack_both(const uint8_t *buf, size_t len, unsigned *n_ok)
{
	static uint8_t a[BUF * 8], b[BUF * 8];
	Odpd__Request *fast = odpd_request_unpack(NULL, len, buf);
	Odpd__Request *ref = odpd__request__unpack(NULL, len, buf);

	if (!ref) {
		assert_null(fast);
		return;
	}
	assert_non_null(fast);
	assert_true(odpd__request__get_packed_size(ref) <= sizeof(a));
	assert_int_equal(odpd__request__get_packed_size(fast), odpd__request__get_packed_size(ref));
	size_t la = odpd__request__pack(fast, a), lb = odpd__request__pack(ref, b);
	assert_int_equal(la, lb);
	assert_memory_equal(a, b, la);
	assert_int_equal(fast->body_case, ref->body_case);
	assert_int_equal(fast->has_id, ref->has_id);
	assert_true(fast->id == ref->id);
	(*n_ok)++;
	odpd__request__free_unpacked(fast, NULL);
	odpd__request__free_unpacked(ref, NULL);
}

static _Alignas(16) uint8_t body_mem[1024];

static void test_request_every_body(void **state)
{
	uint8_t buf[BUF];
	unsigned ok = 0;

	(void)state;
	for (int round = 0; round < 20; round++)
		for (int i = -1; i < (int)odpd__request__descriptor.n_fields; i++) {
			if (i >= 0 && !body_field(&odpd__request__descriptor, (unsigned)i))
				continue;
			unpack_both(buf, request_packet(i, buf, body_mem), &ok);
		}
	assert_true(ok > 20 * 16);
}

static size_t damage(uint8_t *pkt, const uint8_t *buf, size_t len);

/* Damaged requests (damage()): both decoders must agree on each. */
static void test_request_damaged(void **state)
{
	uint8_t buf[BUF], pkt[BUF];
	unsigned ok = 0, total = 0;

	(void)state;
	for (int round = 0; round < 20000; round++) {
		unsigned nf = odpd__request__descriptor.n_fields, i = (unsigned)(rnd() % nf);
		size_t len = request_packet(body_field(&odpd__request__descriptor, i) ? (int)i : -1, buf, body_mem);

		len = damage(pkt, buf, len);
		unpack_both(pkt, len, &ok);
		total++;
	}
	print_message("%u of %u damaged requests decoded (both ways alike)\n", ok, total);
	assert_true(ok > 1000 && ok < total);
}

/* Copy @len bytes of @buf into @pkt, damaged at random: a byte changed, cut
 * short, a field repeated or added, bytes appended. Its new length. */
static size_t damage(uint8_t *pkt, const uint8_t *buf, size_t len)
{
	memcpy(pkt, buf, len);
	switch (rnd() % 6) {
	case 0:                              /* a byte changed */
		if (len)
			pkt[rnd() % len] = (uint8_t)rnd();
		break;
	case 1:                              /* cut short */
		len = len ? rnd() % len : 0;
		break;
	case 2:                              /* the whole packet twice: every field repeated */
		memcpy(pkt + len, buf, len);
		len *= 2;
		break;
	case 3:                              /* random bytes appended */
		for (int k = (int)(rnd() % 8); k >= 0; k--)
			pkt[len++] = (uint8_t)rnd();
		break;
	case 4:                              /* a field of any number and wire type appended */
		pkt[len++] = (uint8_t)rnd();
		pkt[len++] = (uint8_t)(rnd() & 0x7f);
		pkt[len++] = (uint8_t)(rnd() & 0x7f);
		break;
	default:                             /* two bytes changed */
		if (len) {
			pkt[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
			pkt[rnd() % len] ^= (uint8_t)(1u << (rnd() % 8));
		}
		break;
	}
	return len;
}

/* A reply with body @i of the descriptor (or none). */
static void reply_fill(Odpd__Reply *r, int i)
{
	const ProtobufCFieldDescriptor *f = i >= 0 ? body_field(&odpd__reply__descriptor, (unsigned)i) : NULL;
	static const char *const msgs[] = { NULL, "", "no such MR", "a longer message of the kind odpd writes " };

	odpd__reply__init(r);
	if (rnd() % 4) {
		r->has_id = 1;
		r->id = rnd_value();
	}
	if (rnd() % 4) {
		r->has_status = 1;
		r->status = rnd() % 4 == 0 ? -(int32_t)(rnd() % 1000) : (int32_t)(rnd() % 200);
	}
	r->message = (char *)msgs[rnd() % 4];
	if (f) {
		ProtobufCMessage *b = (ProtobufCMessage *)body_mem;

		((const ProtobufCMessageDescriptor *)f->descriptor)->message_init(b);
		fill(b);
		*(ProtobufCMessage **)((char *)r + f->offset) = rnd() % 8 ? b : NULL;
		*(uint32_t *)((char *)r + f->quantifier_offset) = f->id;
	} else if (rnd() % 8 == 0) {
		r->body_case = 99;                  /* no such member: nothing written */
	}
}

static void test_reply_pack(void **state)
{
	static uint8_t a[BUF + 64], b[BUF];
	Odpd__Reply r;
	unsigned n = 0;

	(void)state;
	for (int round = 0; round < 200; round++)
		for (int i = -1; i < (int)odpd__reply__descriptor.n_fields; i++) {
			size_t want, got;

			if (i >= 0 && !body_field(&odpd__reply__descriptor, (unsigned)i))
				continue;
			reply_fill(&r, i);
			want = odpd__reply__get_packed_size(&r);
			assert_true(want <= BUF);
			assert_int_equal(odpd__reply__pack(&r, b), want);
			memset(a, 0xa5, sizeof(a));
			got = odpd_reply_pack_bounded(&r, a, BUF);
			assert_int_equal(got, want);
			assert_memory_equal(a, b, want);
			/* too small a buffer: the length, and nothing written past it */
			if (want) {
				size_t cap = (size_t)(rnd() % want);

				memset(a, 0xa5, sizeof(a));
				assert_int_equal(odpd_reply_pack_bounded(&r, a, cap), want);
				for (size_t k = cap; k < sizeof(a); k++)
					if (a[k] != 0xa5)
						fail_msg("byte %zu written past a buffer of %zu", k, cap);
			}
			n++;
		}
	assert_true(n > 200 * 10);
}

/* odpd_envelope_pack of a request: protobuf-c's bytes. */
static void test_request_pack(void **state)
{
	static uint8_t a[BUF], b[BUF];
	Odpd__Request r;

	(void)state;
	for (int round = 0; round < 200; round++)
		for (int i = -1; i < (int)odpd__request__descriptor.n_fields; i++) {
			size_t want;

			if (i >= 0 && !body_field(&odpd__request__descriptor, (unsigned)i))
				continue;
			request_fill(&r, i, body_mem);
			want = odpd__request__pack(&r, b);
			assert_int_equal(odpd_envelope_pack(&r.base, a, sizeof(a)), want);
			assert_memory_equal(a, b, want);
		}
}

/* Decode a reply of @len bytes both ways: the same answer, the same message. */
/* Every member of two MrReplies, not only their bytes once packed again
 * (packing writes any bool that is not 0 as 1, and would hide a reader
 * that stored another value). */
static void mr_reply_equal(const Odpd__MrReply *a, const Odpd__MrReply *b)
{
	assert_non_null(a);
#define SAME(f) do { \
		assert_int_equal(a->has_##f, b->has_##f); \
		assert_true(a->f == b->f); \
	} while (0)
	SAME(handle);
	SAME(lkey);
	SAME(rkey);
	SAME(iova);
	SAME(length);
	SAME(kernel_handle);
	SAME(access);
	SAME(generation);
	SAME(cache_hit);
	SAME(mr_iova);
	SAME(mr_length);
	SAME(prefetch_errno);
	SAME(slot);
	SAME(ticket);
#undef SAME
}

static void reply_unpack_both(const uint8_t *buf, size_t len, unsigned *n_ok)
{
	static uint8_t a[BUF * 8], b[BUF * 8];
	Odpd__Reply *fast = odpd_reply_unpack(NULL, len, buf);
	Odpd__Reply *ref = odpd__reply__unpack(NULL, len, buf);
	size_t la, lb;

	if (!ref) {
		assert_null(fast);
		return;
	}
	assert_non_null(fast);
	assert_true(odpd__reply__get_packed_size(ref) <= sizeof(a));
	assert_int_equal(odpd__reply__get_packed_size(fast), odpd__reply__get_packed_size(ref));
	la = odpd__reply__pack(fast, a);
	lb = odpd__reply__pack(ref, b);
	assert_int_equal(la, lb);
	assert_memory_equal(a, b, la);
	assert_int_equal(fast->body_case, ref->body_case);
	assert_int_equal(fast->status, ref->status);
	if (ref->body_case == ODPD__REPLY__BODY_MR && ref->mr)
		mr_reply_equal(fast->mr, ref->mr);
	if (ref->message)
		assert_string_equal(fast->message, ref->message);
	else
		assert_null(fast->message);
	(*n_ok)++;
	odpd__reply__free_unpacked(fast, NULL);
	odpd__reply__free_unpacked(ref, NULL);
}

static void reply_fill(Odpd__Reply *r, int i);

/* Replies of every body, then damaged (damage()): both decoders agree. */
static void test_reply_unpack(void **state)
{
	uint8_t buf[BUF], pkt[BUF];
	unsigned ok = 0, total = 0, nf = odpd__reply__descriptor.n_fields;
	Odpd__Reply r;

	(void)state;
	for (int round = 0; round < 20; round++)
		for (int i = -1; i < (int)nf; i++) {
			if (i >= 0 && !body_field(&odpd__reply__descriptor, (unsigned)i))
				continue;
			reply_fill(&r, i);
			reply_unpack_both(buf, odpd__reply__pack(&r, buf), &ok);
		}
	assert_true(ok > 20 * 10);
	ok = 0;
	for (int round = 0; round < 20000; round++) {
		unsigned i = (unsigned)(rnd() % nf);
		size_t len;

		reply_fill(&r, body_field(&odpd__reply__descriptor, i) ? (int)i : -1);
		len = damage(pkt, buf, odpd__reply__pack(&r, buf));
		reply_unpack_both(pkt, len, &ok);
		total++;
	}
	print_message("%u of %u damaged replies decoded (both ways alike)\n", ok, total);
	assert_true(ok > 1000 && ok < total);
}


/* Bodies whose length takes more than one byte (a long string in a flat
 * body): packed after their key and moved along for the longer length,
 * and read back, as protobuf-c does. */
static void test_long_body(void **state)
{
	static uint8_t a[BUF * 8], b[BUF * 8];
	static char name[20000];
	static const size_t lens[] = { 100, 120, 125, 126, 127, 128, 200, 16370, 16390, 19999 };
	unsigned ok = 0;

	(void)state;
	for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
		Odpd__Request req = ODPD__REQUEST__INIT;
		Odpd__RegMr rm = ODPD__REG_MR__INIT;
		Odpd__Reply rep = ODPD__REPLY__INIT;
		Odpd__ImportPdReply ip = ODPD__IMPORT_PD_REPLY__INIT;
		size_t want;

		memset(name, 'x', lens[k]);
		name[lens[k]] = 0;
		req.has_id = 1;
		req.id = k + 1;
		rm.has_addr = rm.has_length = rm.has_access = rm.has_kind = rm.has_flags = 1;
		rm.addr = 0x7f0000001000ull;
		rm.length = 4096;
		rm.access = 7;
		rm.kind = ODPD__MR_KIND__MR_ODP;
		rm.flags = 4;
		rm.device = name;
		rm.has_client_pd = 1;
		rm.client_pd = 1;
		req.body_case = ODPD__REQUEST__BODY_REG_MR;
		req.reg_mr = &rm;
		want = odpd__request__pack(&req, b);
		assert_int_equal(odpd_envelope_pack(&req.base, a, sizeof(a)), want);
		assert_memory_equal(a, b, want);
		unpack_both(b, want, &ok);

		rep.has_id = 1;
		rep.id = k + 1;
		ip.has_pd_handle = 1;
		ip.pd_handle = 3;
		ip.pd = name;
		rep.body_case = ODPD__REPLY__BODY_IMPORT_PD;
		rep.import_pd = &ip;
		want = odpd__reply__pack(&rep, b);
		assert_int_equal(odpd_reply_pack_bounded(&rep, a, sizeof(a)), want);
		assert_memory_equal(a, b, want);
		reply_unpack_both(b, want, &ok);
	}
	assert_int_equal(ok, 2 * sizeof(lens) / sizeof(lens[0]));
}

/* A body whose message has no fields (its descriptor's field list is NULL)
 * with a field in it anyway: both decoders agree (an unknown field: kept by
 * protobuf-c). tests/fuzz found the fast reader indexing that NULL list. */
static void test_empty_body_with_field(void **state)
{
	uint8_t buf[64];
	unsigned ok = 0, bodies = 0;

	(void)state;
	for (unsigned i = 0; i < odpd__request__descriptor.n_fields; i++) {
		const ProtobufCFieldDescriptor *f = body_field(&odpd__request__descriptor, i);
		const ProtobufCMessageDescriptor *bd;

		if (!f || (bd = f->descriptor)->n_fields != 0)
			continue;
		bodies++;
		for (unsigned id = 1; id < 4; id++) {
			size_t len = 0;

			buf[len++] = 1 << 3;                       /* Request.id = 7 */
			buf[len++] = 7;
			for (unsigned key = f->id << 3 | 2; ; key >>= 7) {  /* the body: 2 bytes */
				buf[len++] = (uint8_t)(key | (key >= 0x80 ? 0x80 : 0));
				if (key < 0x80)
					break;
			}
			buf[len++] = 2;
			buf[len++] = (uint8_t)(id << 3);           /* field id, a varint */
			buf[len++] = 1;
			unpack_both(buf, len, &ok);
		}
	}
	assert_true(bodies > 0);
	assert_int_equal(ok, 3 * bodies);
}

/* Bodies as protobuf-c reads them but never writes them: a scalar sent
 * twice (the last counts), uint32 and int32 values in 5 bytes (their low 32
 * bits, as an mlx5 key of 2^28 and more is sent), a negative int32 (10
 * bytes), a bool of 2 or in two bytes or twice, an unknown field, a wire
 * type that does not fit. Each as an MrReply (its own reader, since 1.4.9)
 * and as a RegMr (the table's): both decoders agree. */
static void test_unusual_scalars(void **state)
{
	static const struct {
		uint8_t n, b[16];
	} bodies[] = {
		{ 4, { 0x08, 0x05, 0x08, 0x07 } },
		{ 6, { 0x10, 0xff, 0xff, 0xff, 0xff, 0x0f } },
		{ 6, { 0x10, 0x80, 0x80, 0x80, 0x80, 0x7f } },
		{ 6, { 0x18, 0xa9, 0x8f, 0xa8, 0x80, 0x01 } },
		{ 11, { 0x60, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01 } },
		{ 6, { 0x60, 0x85, 0x80, 0x80, 0x80, 0x10 } },
		{ 6, { 0x20, 0x85, 0x80, 0x80, 0x80, 0x10 } },
		{ 2, { 0x48, 0x02 } },
		{ 3, { 0x48, 0x81, 0x00 } },
		{ 4, { 0x48, 0x01, 0x48, 0x00 } },
		{ 4, { 0x30, 0x01, 0x30, 0x00 } },
		{ 11, { 0x70, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01 } },
		{ 2, { 0x78, 0x01 } },
		{ 2, { 0x0a, 0x00 } },
		{ 4, { 0x68, 0x07, 0x40, 0x03 } },
		{ 5, { 0x10, 0x01, 0x10, 0x82, 0x01 } },
		{ 7, { 0x70, 0x05, 0x68, 0x03, 0x70, 0x06, 0x18 } },
		{ 8, { 0x18, 0x04, 0x68, 0xff, 0xff, 0xff, 0xff, 0x1f } },
		{ 2, { 0x48, 0x7f } },
	};
	unsigned ok = 0;

	(void)state;
	for (unsigned i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		uint8_t buf[64];
		size_t len = 0;

		buf[len++] = 1 << 3;                           /* Reply.id = 1 */
		buf[len++] = 1;
		buf[len++] = ODPD__REPLY__BODY_MR << 3 | 2;
		buf[len++] = bodies[i].n;
		memcpy(buf + len, bodies[i].b, bodies[i].n);
		reply_unpack_both(buf, len + bodies[i].n, &ok);
		buf[2] = ODPD__REQUEST__BODY_REG_MR << 3 | 2;  /* the same in a Request */
		unpack_both(buf, len + bodies[i].n, &ok);
	}
	print_message("%u of %u decoded (both ways alike)\n", ok, 2 * (unsigned)(sizeof(bodies) / sizeof(bodies[0])));
	assert_true(ok >= 26);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_request_every_body),
		cmocka_unit_test(test_request_damaged),
		cmocka_unit_test(test_request_pack),
		cmocka_unit_test(test_reply_pack),
		cmocka_unit_test(test_reply_unpack),
		cmocka_unit_test(test_long_body),
		cmocka_unit_test(test_empty_body_with_field),
		cmocka_unit_test(test_unusual_scalars),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
