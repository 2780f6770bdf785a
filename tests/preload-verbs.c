/* SPDX-License-Identifier: MIT */
/*
 * preload-verbs: a plain verbs program (nothing of odpd's in it) that
 * tests/test-preload runs under odpd-run, as uid 65534 with a memlock limit
 * of 8 MiB, in the testbed profile: its 16 MiB registrations can only
 * succeed through odpd. It checks what no perftest run shows: ibv_reg_mr,
 * ibv_reg_mr_iova with iova = address and ibv_reg_mr_iova2 served; data
 * moved by the program's own QPs through the keys (RDMA WRITE and READ,
 * bytes compared); ibv_rereg_mr to another buffer (same struct, new keys,
 * data lands in the new buffer) and to other access; ibv_dereg_mr; and that
 * what odpd does not serve (a stack buffer, ODP, iova != address) still
 * registers through the real call. Prints "ok N - ..." and exits 1 on the
 * first failure; the fallback lines go to stderr, where the script looks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#include "rcqp.h"

#define MIB (1u << 20)
#define LEN (16 * MIB)

static unsigned n_ok;

#define CHECK(cond, ...) do {                                           \
	if (!(cond)) {                                                  \
		printf("not ok %u - ", n_ok + 1);                       \
		printf(__VA_ARGS__);                                    \
		printf(" (line %d: %s; errno %s)\n", __LINE__, #cond,   \
		       strerror(errno));                                \
		exit(1);                                                \
	}                                                               \
} while (0)
#define OK(...) do { printf("ok %u - ", ++n_ok); printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

static long vmpin_kib(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	long kib = -1;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPin: %ld", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31 + seed);
}

/* WRITE @n bytes from @src (@lkey) into the MR at @raddr (@rkey), READ them back into @back. */
static void move(struct rcqp *q, void *src, uint32_t lkey, uint64_t raddr, uint32_t rkey,
		 void *back, uint32_t back_lkey, size_t n)
{
	enum ibv_wc_status st = IBV_WC_SUCCESS;

	CHECK(rcqp_rdma(q, IBV_WR_RDMA_WRITE, (uintptr_t)src, lkey, (uint32_t)n, raddr, rkey, &st) == 0,
	      "RDMA WRITE through the keys (status %s)", ibv_wc_status_str(st));
	CHECK(rcqp_rdma(q, IBV_WR_RDMA_READ, (uintptr_t)back, back_lkey, (uint32_t)n, raddr, rkey,
			&st) == 0, "RDMA READ through the keys (status %s)", ibv_wc_status_str(st));
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct rcqp a, b;
	unsigned char *src, *dst, *dst2, *back, stack_buf[4096];
	struct ibv_mr *msrc, *mdst, *mback, *m;
	const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	uint32_t old_rkey;

	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(list && list[0], "an RDMA device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	CHECK(rcqp_create(&a, pd, 4) == 0 && rcqp_create(&b, pd, 4) == 0, "two RC QPs");
	CHECK(rcqp_connect(&a, &b.local) == 0 && rcqp_connect(&b, &a.local) == 0, "connected");

	src = malloc(LEN);
	dst = aligned_alloc(4096, LEN);
	back = calloc(1, LEN);
	CHECK(src && dst && back, "three 16 MiB buffers");
	fill(src, LEN, 1);
	msrc = ibv_reg_mr(pd, src, LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(msrc, "ibv_reg_mr of 16 MiB under an 8 MiB memlock limit");
	mdst = ibv_reg_mr_iova(pd, dst, LEN, (uintptr_t)dst, rw);
	CHECK(mdst && mdst->addr == dst && mdst->length == LEN, "ibv_reg_mr_iova, iova = address");
	mback = ibv_reg_mr_iova2(pd, back, LEN, (uintptr_t)back, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mback, "ibv_reg_mr_iova2");
	CHECK(vmpin_kib() >= 0 && vmpin_kib() < 8192, "VmPin %ld kB stays under 8192", vmpin_kib());
	OK("48 MiB registered under an 8 MiB memlock limit (VmPin %ld kB)", vmpin_kib());

	move(&a, src, msrc->lkey, (uintptr_t)dst, mdst->rkey, back, mback->lkey, LEN);
	CHECK(memcmp(dst, src, LEN) == 0, "the WRITE landed in dst");
	CHECK(memcmp(back, src, LEN) == 0, "the READ brought it back");
	OK("RDMA WRITE and READ of 16 MiB through the program's own QPs, bytes equal");

	/* rereg to another buffer: the same struct, the new range, data lands there */
	dst2 = malloc(LEN);
	CHECK(dst2, "a fourth buffer");
	memset(dst2, 0, LEN);
	old_rkey = mdst->rkey;
	m = mdst;
	CHECK(ibv_rereg_mr(mdst, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, dst2, LEN, 0) == 0,
	      "ibv_rereg_mr to another buffer");
	CHECK(m == mdst && mdst->addr == dst2 && mdst->length == LEN, "the same struct, the new range");
	fill(src, LEN, 7);
	memset(dst, 0, LEN);
	move(&a, src, msrc->lkey, (uintptr_t)dst2, mdst->rkey, back, mback->lkey, 64 * 1024);
	CHECK(memcmp(dst2, src, 64 * 1024) == 0 && dst[0] == 0 && dst[1] == 0,
	      "after rereg the WRITE lands in the new buffer, not the old one");
	OK("ibv_rereg_mr (translation): rkey 0x%x -> 0x%x, data in the new buffer", old_rkey, mdst->rkey);
	CHECK(ibv_rereg_mr(mdst, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == 0,
	      "ibv_rereg_mr to local access only");
	CHECK(ibv_rereg_mr(mdst, 1 << 20, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT,
	      "an unknown rereg flag is refused");
	OK("ibv_rereg_mr (access), and a bad flag refused");

	/* the MR the rereg replaced is gone from the kernel: its rkey no longer works
	 * (last use of QP a: a remote access error puts it in the error state) */
	{
		enum ibv_wc_status st = IBV_WC_SUCCESS;

		CHECK(rcqp_rdma(&a, IBV_WR_RDMA_WRITE, (uintptr_t)src, msrc->lkey, 4096, (uintptr_t)dst,
				old_rkey, &st) == -EIO && st == IBV_WC_REM_ACCESS_ERR,
		      "a WRITE through the replaced rkey fails with a remote access error (status %s)",
		      ibv_wc_status_str(st));
	}
	OK("the rkey the rereg replaced is no longer valid");

	CHECK(ibv_dereg_mr(msrc) == 0 && ibv_dereg_mr(mdst) == 0 && ibv_dereg_mr(mback) == 0,
	      "ibv_dereg_mr");
	OK("ibv_dereg_mr of all three");

	/* what odpd does not serve still registers, through the real call */
	m = ibv_reg_mr(pd, stack_buf, sizeof(stack_buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && ibv_dereg_mr(m) == 0, "a stack buffer: the real ibv_reg_mr");
	/* (the kernel wants iova and address at the same offset in a page) */
	m = ibv_reg_mr_iova(pd, src, 4096, 0x10000 + ((uintptr_t)src & 4095), IBV_ACCESS_LOCAL_WRITE);
	CHECK(m && ibv_dereg_mr(m) == 0, "iova != address: the real ibv_reg_mr_iova");
	OK("a stack buffer and an iova other than the address go to libibverbs");

	free(src);
	free(dst);
	free(dst2);
	free(back);
	rcqp_destroy(&a);
	rcqp_destroy(&b);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("preload-verbs: %u passed\n", n_ok);
	return 0;
}
