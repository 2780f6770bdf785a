/* SPDX-License-Identifier: MIT */
/*
 * bench-codec: the request path's codec alone, on the host's CPU. Packs or
 * reads one message N times, with odpd's fast codec (proto/envelope.c) or
 * protobuf-c's own functions, as an odpd and a libodpd do for every
 * registration: a RegMr request, its MrReply answer, and an error answer
 * (what a refused request gets). bench/run-codec runs each case under
 * callgrind twice (N and 2N) and prints instructions per operation; without
 * valgrind it prints nanoseconds. Never asserts on speed.
 *
 * Usage: bench-codec CASE N
 *   CASE: {mr-reply,reg-mr,error}-{pack,unpack}[-protobuf-c]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "odpd-envelope.h"

/* An arena emptied before each read, as odpd's request arena and libodpd's
 * reply arena are. */
static _Alignas(16) unsigned char arena[8192];
static size_t arena_used;

static void *arena_alloc(void *data, size_t size)
{
	void *p = arena + arena_used;

	(void)data;
	size = (size + 15) & ~(size_t)15;
	if (size > sizeof(arena) - arena_used)
		return NULL;
	arena_used += size;
	return p;
}

static void arena_free(void *data, void *p)
{
	(void)data;
	(void)p;
}

static ProtobufCAllocator arena_allocator = { .alloc = arena_alloc, .free = arena_free };

int main(int argc, char **argv)
{
	Odpd__MrReply mr = ODPD__MR_REPLY__INIT;
	Odpd__RegMr reg = ODPD__REG_MR__INIT;
	Odpd__Reply reply = ODPD__REPLY__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	const ProtobufCMessage *m;
	uint8_t buf[512];
	size_t len;
	unsigned long n, sum = 0;
	const char *c;
	bool pack, generic;
	struct timespec t0, t1;

	if (argc != 3 || !(n = strtoul(argv[2], NULL, 10))) {
		fprintf(stderr, "usage: bench-codec {mr-reply,reg-mr,error}-{pack,unpack}[-protobuf-c] N\n");
		return 2;
	}
	c = argv[1];
	/* an MrReply as odpd sends one for a daemon hit with a hit-table slot */
	mr.has_handle = mr.has_lkey = mr.has_rkey = mr.has_iova = mr.has_length = 1;
	mr.has_kernel_handle = mr.has_access = mr.has_generation = mr.has_cache_hit = 1;
	mr.has_mr_iova = mr.has_mr_length = mr.has_slot = mr.has_ticket = 1;
	mr.handle = 4711;
	mr.lkey = 0x1f2a3b;
	mr.rkey = 0x1f2a3b;
	mr.iova = mr.mr_iova = 0x7f3a12345000ull;
	mr.length = mr.mr_length = 4096;
	mr.kernel_handle = 812;
	mr.access = 1;
	mr.generation = 9422;
	mr.cache_hit = 1;
	mr.slot = 77;
	mr.ticket = 123456789;
	/* a RegMr as libodpd sends one for a 4 KiB pinned range */
	reg.has_addr = reg.has_length = reg.has_access = reg.has_kind = reg.has_flags = 1;
	reg.addr = 0x7f3a12345000ull;
	reg.length = 4096;
	reg.access = 1;
	reg.kind = ODPD__MR_KIND__MR_PINNED;
	reg.flags = ODPD__REG_FLAGS__REG_UNPOPULATED;
	if (!strncmp(c, "mr-reply-", 9)) {
		reply.has_id = reply.has_status = 1;
		reply.id = 100001;
		reply.body_case = ODPD__REPLY__BODY_MR;
		reply.mr = &mr;
		m = &reply.base;
	} else if (!strncmp(c, "error-", 6)) {
		reply.has_id = reply.has_status = 1;
		reply.id = 100001;
		reply.status = 17;                  /* EEXIST: Reply.status is a positive errno */
		reply.message = "PD \"bench\": this connection is in a PD already";
		m = &reply.base;
	} else if (!strncmp(c, "reg-mr-", 7)) {
		req.has_id = req.has_revocations_seen = 1;
		req.id = 100001;
		req.body_case = ODPD__REQUEST__BODY_REG_MR;
		req.reg_mr = &reg;
		m = &req.base;
	} else {
		fprintf(stderr, "bench-codec: no case %s\n", c);
		return 2;
	}
	pack = strstr(c, "-pack") != NULL;
	generic = strstr(c, "-protobuf-c") != NULL;
	len = protobuf_c_message_pack(m, buf);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (unsigned long i = 0; i < n; i++) {
		if (pack) {
			sum += generic ? protobuf_c_message_pack(m, buf) : odpd_envelope_pack(m, buf, sizeof(buf));
			continue;
		}
		arena_used = 0;
		if (m == &req.base) {
			Odpd__Request *r = generic ? odpd__request__unpack(&arena_allocator, len, buf)
						   : odpd_request_unpack(&arena_allocator, len, buf);
			sum += r ? r->id : 0;
		} else {
			Odpd__Reply *r = generic ? odpd__reply__unpack(&arena_allocator, len, buf)
						 : odpd_reply_unpack(&arena_allocator, len, buf);
			sum += r ? r->id : 0;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("%-28s %zu bytes, %.1f ns per operation (check %lu)\n", c, len,
	       ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / (double)n, sum);
	return 0;
}
