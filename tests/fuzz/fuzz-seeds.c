/* SPDX-License-Identifier: MIT */
/*
 * fuzz-seeds DIR: write fuzz-request's seed corpus: valid sessions of every
 * request type (fuzz-input.h records), so that the fuzzer starts from what
 * odpd accepts and mutates from there.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-input.h"

static uint8_t out[1 << 16];
static size_t used;

static void record(uint8_t flags, Odpd__Request *req, uint64_t id)
{
	size_t n;

	req->has_id = 1;
	req->id = id;
	n = odpd__request__get_packed_size(req);
	if (used + 3 + n > sizeof(out))
		abort();
	out[used++] = flags;
	out[used++] = (uint8_t)n;
	out[used++] = (uint8_t)(n >> 8);
	odpd__request__pack(req, out + used);
	used += n;
}

/* A FUZZ_OP_* record: @n bytes of u16 arguments and data. */
static void op(uint8_t flags, const uint8_t *b, size_t n)
{
	if (used + 3 + n > sizeof(out))
		abort();
	out[used++] = flags;
	out[used++] = (uint8_t)n;
	out[used++] = (uint8_t)(n >> 8);
	memcpy(out + used, b, n);
	used += n;
}

static void save(const char *dir, const char *name)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "we");
	if (!f || fwrite(out, 1, used, f) != used || fclose(f) != 0) {
		fprintf(stderr, "fuzz-seeds: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	used = 0;
}

/* One record per request kind; @id is the request id. */
static void attach(uint64_t client_addr, uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__AttachSegment a = ODPD__ATTACH_SEGMENT__INIT;

	if (client_addr) {                  /* else odpd picks the address */
		a.has_client_addr = a.has_length = 1;
		a.client_addr = client_addr;
		a.length = FUZZ_MEMFD_SIZE;
	}
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &a;
	record(FUZZ_FD_MEMFD, &req, id);
}

static void reg(uint64_t addr, uint64_t length, Odpd__MrKind kind, uint32_t flags, uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__RegMr r = ODPD__REG_MR__INIT;

	r.has_addr = r.has_length = r.has_access = 1;
	r.addr = addr;
	r.length = length;
	r.access = 1;
	r.has_kind = kind != ODPD__MR_KIND__MR_PINNED;
	r.kind = kind;
	r.has_flags = flags != 0;
	r.flags = flags;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &r;
	record(0, &req, id);
}

static void dereg(uint64_t handle, bool relaxed, uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;

	d.has_handle = d.has_relaxed = 1;
	d.handle = handle;
	d.relaxed = relaxed;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &d;
	record(0, &req, id);
}

/* @addr 0: the whole MR */
static void verify(uint64_t handle, uint64_t addr, uint64_t length, uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Verify v = ODPD__VERIFY__INIT;

	v.has_handle = 1;
	v.handle = handle;
	v.has_addr = v.has_length = addr != 0;
	v.addr = addr;
	v.length = length;
	req.body_case = ODPD__REQUEST__BODY_VERIFY;
	req.verify = &v;
	record(0, &req, id);
}

static void advise(uint64_t addr, uint32_t length, uint32_t lkey, uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__AdviseMr a = ODPD__ADVISE_MR__INIT;
	Odpd__Sge sge = ODPD__SGE__INIT, *sges[1] = { &sge };

	sge.has_addr = sge.has_length = sge.has_lkey = 1;
	sge.addr = addr;
	sge.length = length;
	sge.lkey = lkey;
	a.has_advice = a.has_flags = 1;
	a.flags = 1;
	a.n_sges = 1;
	a.sges = sges;
	req.body_case = ODPD__REQUEST__BODY_ADVISE_MR;
	req.advise_mr = &a;
	record(0, &req, id);
}

static void flush_all(uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Flush f = ODPD__FLUSH__INIT;

	f.has_all = f.all = 1;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &f;
	record(0, &req, id);
}

static void list_mrs(uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__ListMrs l = ODPD__LIST_MRS__INIT;

	req.body_case = ODPD__REQUEST__BODY_LIST_MRS;
	req.list_mrs = &l;
	record(0, &req, id);
}

static void detach(uint64_t segment, uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__DetachSegment d = ODPD__DETACH_SEGMENT__INIT;

	d.has_segment = 1;
	d.segment = segment;
	req.body_case = ODPD__REQUEST__BODY_DETACH_SEGMENT;
	req.detach_segment = &d;
	record(0, &req, id);
}

static void open_hits(uint32_t slots, uint64_t id)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__OpenHitTable o = ODPD__OPEN_HIT_TABLE__INIT;

	o.has_slots = 1;
	o.slots = slots;
	req.body_case = ODPD__REQUEST__BODY_OPEN_HIT_TABLE;
	req.open_hit_table = &o;
	record(FUZZ_FD_MEMFD, &req, id);
}

int main(int argc, char **argv)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__AttachSegment att = ODPD__ATTACH_SEGMENT__INIT;
	Odpd__MapSegment map = ODPD__MAP_SEGMENT__INIT;
	Odpd__RegMr cpd = ODPD__REG_MR__INIT;
	Odpd__Status st = ODPD__STATUS__INIT;
	Odpd__JoinPd join = ODPD__JOIN_PD__INIT;
	Odpd__ImportPd imp = ODPD__IMPORT_PD__INIT;

	if (argc != 2) {
		fprintf(stderr, "usage: fuzz-seeds DIR\n");
		return 2;
	}
	/* attach (the daemon picks the address), map, register (at an address
	 * the segment is not at), verify, release, detach */
	attach(0, 2);
	map.has_segment = map.has_offset = map.has_length = 1;
	map.segment = 1;
	map.length = 8192;
	req.body_case = ODPD__REQUEST__BODY_MAP_SEGMENT;
	req.map_segment = &map;
	record(0, &req, 7);
	reg(FUZZ_CLIENT_ADDR, 4096, ODPD__MR_KIND__MR_PINNED, 0, 3);
	verify(2, 0, 0, 4);
	dereg(2, true, 5);
	detach(1, 6);
	save(argv[1], "session");

	/* at FUZZ_CLIENT_ADDR, where fuzz-request maps the memfd: register
	 * (pinned), again (a hit), release relaxed, again (reuse), verify,
	 * flush, list, release, detach */
	attach(FUZZ_CLIENT_ADDR, 2);
	reg(FUZZ_CLIENT_ADDR, 8192, ODPD__MR_KIND__MR_PINNED, 0, 3);
	reg(FUZZ_CLIENT_ADDR, 8192, ODPD__MR_KIND__MR_PINNED, 0, 4);
	dereg(2, true, 5);
	reg(FUZZ_CLIENT_ADDR, 8192, ODPD__MR_KIND__MR_PINNED, 0, 6);
	verify(3, FUZZ_CLIENT_ADDR, 4096, 7);
	flush_all(8);
	list_mrs(9);
	dereg(3, false, 10);
	dereg(4, false, 11);
	detach(1, 12);
	save(argv[1], "session-client-addr");

	/* odpd picks the address (FUZZ_SEGMENT_ADDR: fuzz-request rewrites it
	 * to that one): ODP, prefetched by AdviseMr (FUZZ_LAST_LKEY: the MR
	 * answered last), ODP with REG_PREFETCH, pinned beside them, verify,
	 * release one relaxed, flush, release (advise_mr: the testbed profile's
	 * rdma-core; EOPNOTSUPP with Debian 12's). ODP at FUZZ_CLIENT_ADDR
	 * cannot work in-process: odpd cannot map the segment at an address its
	 * own client holds. */
	attach(0, 2);
	reg(FUZZ_SEGMENT_ADDR, 16384, ODPD__MR_KIND__MR_ODP, 0, 3);
	advise(FUZZ_SEGMENT_ADDR + 4096, 8192, FUZZ_LAST_LKEY, 4);
	reg(FUZZ_SEGMENT_ADDR + 16384, 16384, ODPD__MR_KIND__MR_ODP, ODPD__REG_FLAGS__REG_PREFETCH, 5);
	reg(FUZZ_SEGMENT_ADDR + 32768, 16384, ODPD__MR_KIND__MR_PINNED, 0, 6);
	verify(2, FUZZ_SEGMENT_ADDR + 4096, 4096, 7);
	verify(4, FUZZ_SEGMENT_ADDR + 32768, 4096, 8);
	dereg(4, true, 9);
	flush_all(10);
	dereg(2, false, 11);
	dereg(3, false, 12);
	save(argv[1], "session-odp");

	/* a hole punched under a relaxed MR: registering the range again must
	 * not serve the MR that pins the page the hole took away (written
	 * first, so that it differs from the zeros that take its place: the
	 * harness's oracle compares what Verify reads with the segment) */
	attach(FUZZ_CLIENT_ADDR, 2);
	op(FUZZ_OP_WRITE, (const uint8_t[]){ 0x00, 0x10, 'o', 'd', 'p', 'd' }, 6);
	reg(FUZZ_CLIENT_ADDR, 16384, ODPD__MR_KIND__MR_PINNED, 0, 3);
	dereg(2, true, 4);
	op(FUZZ_OP_PUNCH, (const uint8_t[]){ 1, 0, 1, 0 }, 4);
	reg(FUZZ_CLIENT_ADDR, 16384, ODPD__MR_KIND__MR_PINNED, 0, 5);
	verify(3, 0, 0, 6);
	dereg(3, false, 7);
	save(argv[1], "session-punch");

	/* the same with the first MR still held across the hole (no relaxed
	 * window to outlast): the second registration's lookup finds it and
	 * must see that it is stale */
	attach(FUZZ_CLIENT_ADDR, 2);
	op(FUZZ_OP_WRITE, (const uint8_t[]){ 0x00, 0x10, 'o', 'd', 'p', 'd' }, 6);
	reg(FUZZ_CLIENT_ADDR, 16384, ODPD__MR_KIND__MR_PINNED, 0, 3);
	op(FUZZ_OP_PUNCH, (const uint8_t[]){ 1, 0, 1, 0 }, 4);
	reg(FUZZ_CLIENT_ADDR, 16384, ODPD__MR_KIND__MR_PINNED, 0, 4);
	verify(3, 0, 0, 5);
	dereg(2, false, 6);
	dereg(3, false, 7);
	save(argv[1], "session-punch-held");

	/* a hit table: its use table (the memfd sent with OpenHitTable, mapped
	 * at FUZZ_CLIENT_ADDR in place of the segment) written by the client */
	attach(FUZZ_CLIENT_ADDR, 2);
	open_hits(64, 3);
	reg(FUZZ_CLIENT_ADDR, 16384, ODPD__MR_KIND__MR_PINNED, 0, 4);
	op(FUZZ_OP_WRITE, (const uint8_t[]){ 8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
					      0xff, 0xff, 0xff, 0x7f }, 18);
	dereg(2, true, 5);
	reg(FUZZ_CLIENT_ADDR, 16384, ODPD__MR_KIND__MR_PINNED, 0, 6);
	list_mrs(7);
	save(argv[1], "session-hit-table");

	/* client-PD mode (the librdmacm mirror): MRs in the client's own PD,
	 * its context's cmd_fd sent along (FUZZ_FD_CMDFD) and its PD named by
	 * FUZZ_CLIENT_PD_HANDLE; import works with the testbed profile */
	attach(FUZZ_CLIENT_ADDR, 2);
	cpd.has_addr = cpd.has_length = cpd.has_access = 1;
	cpd.addr = FUZZ_CLIENT_ADDR;
	cpd.length = 8192;
	cpd.access = 1;
	cpd.has_client_pd = cpd.has_client_pd_handle = 1;
	cpd.client_pd = 1;
	cpd.client_pd_handle = FUZZ_CLIENT_PD_HANDLE;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &cpd;
	record(FUZZ_FD_CMDFD, &req, 3);
	cpd.addr = FUZZ_CLIENT_ADDR + 8192;
	record(FUZZ_FD_CMDFD, &req, 4);
	verify(2, 0, 0, 5);
	dereg(2, false, 6);
	dereg(3, true, 7);
	save(argv[1], "session-client-pd");

	/* admin and the rest, one each */
	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &st;
	record(0, &req, 2);
	list_mrs(3);
	flush_all(4);
	save(argv[1], "admin");

	join.name = (char *)"training";
	req.body_case = ODPD__REQUEST__BODY_JOIN_PD;
	req.join_pd = &join;
	record(0, &req, 2);
	imp.device = (char *)"";
	req.body_case = ODPD__REQUEST__BODY_IMPORT_PD;
	req.import_pd = &imp;
	record(0, &req, 3);
	save(argv[1], "pd");

	/* an lkey nobody has, client-PD mode with /dev/null for a context,
	 * an attach with an unsealed memfd and a pipe */
	advise(FUZZ_CLIENT_ADDR, 4096, 0x100, 2);
	cpd = (Odpd__RegMr)ODPD__REG_MR__INIT;
	cpd.has_addr = cpd.has_length = cpd.has_access = 1;
	cpd.addr = FUZZ_CLIENT_ADDR;
	cpd.length = 4096;
	cpd.access = 1;
	cpd.has_kind = cpd.has_client_pd = cpd.has_client_pd_handle = 1;
	cpd.kind = ODPD__MR_KIND__MR_ODP;
	cpd.client_pd = 1;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &cpd;
	record(FUZZ_FD_DEVNULL, &req, 3);
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &att;
	record(FUZZ_FD_UNSEALED | FUZZ_FD_PIPE, &req, 4);
	save(argv[1], "odd");
	return 0;
}
