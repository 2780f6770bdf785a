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

int main(int argc, char **argv)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__AttachSegment att = ODPD__ATTACH_SEGMENT__INIT;
	Odpd__DetachSegment det = ODPD__DETACH_SEGMENT__INIT;
	Odpd__MapSegment map = ODPD__MAP_SEGMENT__INIT;
	Odpd__RegMr reg = ODPD__REG_MR__INIT;
	Odpd__DeregMr dereg = ODPD__DEREG_MR__INIT;
	Odpd__Verify ver = ODPD__VERIFY__INIT;
	Odpd__Status st = ODPD__STATUS__INIT;
	Odpd__JoinPd join = ODPD__JOIN_PD__INIT;
	Odpd__Flush fl = ODPD__FLUSH__INIT;
	Odpd__ListMrs lm = ODPD__LIST_MRS__INIT;
	Odpd__ImportPd imp = ODPD__IMPORT_PD__INIT;
	Odpd__AdviseMr adv = ODPD__ADVISE_MR__INIT;
	Odpd__Sge sge = ODPD__SGE__INIT, *sges[1] = { &sge };

	if (argc != 2) {
		fprintf(stderr, "usage: fuzz-seeds DIR\n");
		return 2;
	}
	/* attach (the daemon picks the address), register, verify, release, detach */
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &att;
	record(FUZZ_FD_MEMFD, &req, 2);
	map.has_segment = map.has_offset = map.has_length = 1;
	map.segment = 1;
	map.length = 8192;
	req.body_case = ODPD__REQUEST__BODY_MAP_SEGMENT;
	req.map_segment = &map;
	record(0, &req, 7);
	reg.has_addr = reg.has_length = reg.has_access = 1;
	reg.addr = 0x7f0000000000ull;
	reg.length = 4096;
	reg.access = 1;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &reg;
	record(0, &req, 3);
	ver.has_handle = 1;
	ver.handle = 2;
	req.body_case = ODPD__REQUEST__BODY_VERIFY;
	req.verify = &ver;
	record(0, &req, 4);
	dereg.has_handle = dereg.has_relaxed = 1;
	dereg.handle = 2;
	dereg.relaxed = 1;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &dereg;
	record(0, &req, 5);
	det.has_segment = 1;
	det.segment = 1;
	req.body_case = ODPD__REQUEST__BODY_DETACH_SEGMENT;
	req.detach_segment = &det;
	record(0, &req, 6);
	save(argv[1], "session");

	/* at FUZZ_CLIENT_ADDR, where fuzz-request maps the memfd: register
	 * (pinned), again (a hit), release relaxed, again (reuse), verify, ODP
	 * with prefetch (refused: odpd cannot map the segment at the client's
	 * address in the client's own process), flush, list, release, detach */
	att = (Odpd__AttachSegment)ODPD__ATTACH_SEGMENT__INIT;
	att.has_client_addr = att.has_length = 1;
	att.client_addr = FUZZ_CLIENT_ADDR;
	att.length = FUZZ_MEMFD_SIZE;
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &att;
	record(FUZZ_FD_MEMFD, &req, 2);
	reg = (Odpd__RegMr)ODPD__REG_MR__INIT;
	reg.has_addr = reg.has_length = reg.has_access = 1;
	reg.addr = FUZZ_CLIENT_ADDR;
	reg.length = 8192;
	reg.access = 1;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &reg;
	record(0, &req, 3);
	record(0, &req, 4);
	dereg = (Odpd__DeregMr)ODPD__DEREG_MR__INIT;
	dereg.has_handle = dereg.has_relaxed = 1;
	dereg.handle = 2;
	dereg.relaxed = 1;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &dereg;
	record(0, &req, 5);
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &reg;
	record(0, &req, 6);
	ver = (Odpd__Verify)ODPD__VERIFY__INIT;
	ver.has_handle = ver.has_addr = ver.has_length = 1;
	ver.handle = 3;
	ver.addr = FUZZ_CLIENT_ADDR;
	ver.length = 4096;
	req.body_case = ODPD__REQUEST__BODY_VERIFY;
	req.verify = &ver;
	record(0, &req, 7);
	reg.addr = FUZZ_CLIENT_ADDR + 16384;
	reg.has_kind = reg.has_flags = 1;
	reg.kind = ODPD__MR_KIND__MR_ODP;
	reg.flags = ODPD__REG_FLAGS__REG_PREFETCH;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &reg;
	record(0, &req, 8);
	fl = (Odpd__Flush)ODPD__FLUSH__INIT;
	fl.has_all = fl.all = 1;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &fl;
	record(0, &req, 9);
	req.body_case = ODPD__REQUEST__BODY_LIST_MRS;
	req.list_mrs = &lm;
	record(0, &req, 10);
	dereg.relaxed = 0;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &dereg;
	dereg.handle = 3;
	record(0, &req, 11);
	dereg.handle = 4;
	record(0, &req, 12);
	req.body_case = ODPD__REQUEST__BODY_DETACH_SEGMENT;
	req.detach_segment = &det;
	record(0, &req, 13);
	save(argv[1], "session-client-addr");

	/* odpd picks the address (FUZZ_SEGMENT_ADDR: fuzz-request rewrites it
	 * to that one): ODP, prefetched by AdviseMr (FUZZ_LAST_LKEY: the MR
	 * answered last), ODP with REG_PREFETCH, pinned beside them, verify,
	 * release one relaxed, flush, release (advise_mr: the testbed profile's
	 * rdma-core; EOPNOTSUPP with Debian 12's) */
	att = (Odpd__AttachSegment)ODPD__ATTACH_SEGMENT__INIT;
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &att;
	record(FUZZ_FD_MEMFD, &req, 2);
	reg = (Odpd__RegMr)ODPD__REG_MR__INIT;
	reg.has_addr = reg.has_length = reg.has_access = reg.has_kind = reg.has_flags = 1;
	reg.addr = FUZZ_SEGMENT_ADDR;
	reg.length = 16384;
	reg.access = 1;
	reg.kind = ODPD__MR_KIND__MR_ODP;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &reg;
	record(0, &req, 3);
	sge = (Odpd__Sge)ODPD__SGE__INIT;
	sge.has_addr = sge.has_length = sge.has_lkey = 1;
	sge.addr = FUZZ_SEGMENT_ADDR + 4096;
	sge.length = 8192;
	sge.lkey = FUZZ_LAST_LKEY;
	adv = (Odpd__AdviseMr)ODPD__ADVISE_MR__INIT;
	adv.has_advice = adv.has_flags = 1;
	adv.flags = 1;
	adv.n_sges = 1;
	adv.sges = sges;
	req.body_case = ODPD__REQUEST__BODY_ADVISE_MR;
	req.advise_mr = &adv;
	record(0, &req, 4);
	reg.addr = FUZZ_SEGMENT_ADDR + 16384;
	reg.flags = ODPD__REG_FLAGS__REG_PREFETCH;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &reg;
	record(0, &req, 5);
	reg.addr = FUZZ_SEGMENT_ADDR + 32768;
	reg.kind = ODPD__MR_KIND__MR_PINNED;
	reg.flags = 0;
	record(0, &req, 6);
	ver = (Odpd__Verify)ODPD__VERIFY__INIT;
	ver.has_handle = ver.has_addr = ver.has_length = 1;
	ver.handle = 2;
	ver.addr = FUZZ_SEGMENT_ADDR + 4096;
	ver.length = 4096;
	req.body_case = ODPD__REQUEST__BODY_VERIFY;
	req.verify = &ver;
	record(0, &req, 7);
	ver.handle = 4;
	ver.addr = FUZZ_SEGMENT_ADDR + 32768;
	record(0, &req, 8);
	dereg = (Odpd__DeregMr)ODPD__DEREG_MR__INIT;
	dereg.has_handle = dereg.has_relaxed = 1;
	dereg.handle = 4;
	dereg.relaxed = 1;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &dereg;
	record(0, &req, 9);
	fl = (Odpd__Flush)ODPD__FLUSH__INIT;
	fl.has_all = fl.all = 1;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &fl;
	record(0, &req, 10);
	dereg.relaxed = 0;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &dereg;
	dereg.handle = 2;
	record(0, &req, 11);
	dereg.handle = 3;
	record(0, &req, 12);
	save(argv[1], "session-odp");

	/* admin and the rest, one each */
	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &st;
	record(0, &req, 2);
	req.body_case = ODPD__REQUEST__BODY_LIST_MRS;
	req.list_mrs = &lm;
	record(0, &req, 3);
	fl.has_all = 1;
	fl.all = 1;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &fl;
	record(0, &req, 4);
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

	sge.has_addr = sge.has_length = sge.has_lkey = 1;
	sge.addr = 0x7f0000000000ull;
	sge.length = 4096;
	sge.lkey = 0x100;
	adv.has_advice = adv.has_flags = 1;
	adv.flags = 1;
	adv.n_sges = 1;
	adv.sges = sges;
	req.body_case = ODPD__REQUEST__BODY_ADVISE_MR;
	req.advise_mr = &adv;
	record(0, &req, 2);
	reg.has_kind = reg.has_client_pd = reg.has_client_pd_handle = 1;
	reg.kind = ODPD__MR_KIND__MR_ODP;
	reg.client_pd = 1;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &reg;
	record(FUZZ_FD_DEVNULL, &req, 3);
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &att;
	record(FUZZ_FD_UNSEALED | FUZZ_FD_PIPE, &req, 4);
	save(argv[1], "odd");
	return 0;
}
