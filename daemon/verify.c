/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "keep.h"
#include "log.h"
#include "verify.h"

#define VERIFY_TIMEOUT_NS (10ull * 1000 * 1000 * 1000)

struct odpd_verifier {
	struct odpd_domain *dom;
	struct ibv_pd *pd;
	uint8_t *buf;                     /* the bounce buffer: NULL until a verify needs it */
	size_t size;                      /* its length, at most max_buf */
	size_t max_buf;
	struct ibv_mr *mr;                /* the bounce buffer's */
	uint32_t limbo;                   /* its slot in the limbo (keep.h) */
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;           /* qa requests, qb responds */
	uint32_t max_msg;
};

/* Where the loopback QPs address each other: a GID on RoCE, the LID on IB. */
struct loop_addr {
	uint8_t port;
	enum ibv_mtu mtu;
	bool global;
	int gid_index;
	union ibv_gid gid;
	uint16_t lid;
};

static bool gid_is_v4_mapped(const union ibv_gid *g)
{
	static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	return memcmp(g->raw, prefix, sizeof(prefix)) == 0;
}

/* Prefer a RoCE v2 IPv4-mapped GID (rxe on lo: ::ffff:127.0.0.1), then any RoCE v2, then any. */
static int pick_gid(struct ibv_context *ctx, struct loop_addr *a, uint32_t gid_tbl_len)
{
	int best = -1, best_score = -1;

	for (uint32_t i = 0; i < gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(ctx, a->port, i, &e, 0) != 0)
			continue;
		int score = 1 + (e.gid_type == IBV_GID_TYPE_ROCE_V2) * 2 + gid_is_v4_mapped(&e.gid);
		if (score > best_score) {
			best = (int)i;
			best_score = score;
			a->gid = e.gid;
		}
	}
	a->gid_index = best;
	return best < 0 ? -ENOENT : 0;
}

static int loop_addr_get(struct ibv_context *ctx, struct loop_addr *a, uint32_t *max_msg,
			 struct odpd_err *err)
{
	struct ibv_port_attr pa;
	int r;

	memset(a, 0, sizeof(*a));
	a->port = 1;
	r = ibv_query_port(ctx, a->port, &pa);
	if (r)
		return err_set(err, r, "ibv_query_port: %s", strerror(r));
	if (pa.state != IBV_PORT_ACTIVE)
		return err_set(err, ENETDOWN, "port 1 of %s is not active", ibv_get_device_name(ctx->device));
	a->mtu = pa.active_mtu;
	a->lid = pa.lid;
	*max_msg = pa.max_msg_sz;
	a->global = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	if (a->global && pick_gid(ctx, a, (uint32_t)pa.gid_tbl_len) < 0)
		return err_set(err, ENETDOWN, "no usable GID on port 1 of %s", ibv_get_device_name(ctx->device));
	return 0;
}

static int qp_connect(struct ibv_qp *qp, uint32_t dest_qpn, const struct loop_addr *a)
{
	struct ibv_qp_attr at = {
		.qp_state = IBV_QPS_INIT, .port_num = a->port,
		.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
	};
	int r = ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (r)
		return r;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = a->mtu;
	at.dest_qp_num = dest_qpn;
	at.max_dest_rd_atomic = 1;
	at.min_rnr_timer = 12;
	at.ah_attr.port_num = a->port;
	at.ah_attr.dlid = a->lid;
	at.ah_attr.is_global = a->global;
	at.ah_attr.grh.dgid = a->gid;
	at.ah_attr.grh.sgid_index = (uint8_t)a->gid_index;
	at.ah_attr.grh.hop_limit = 64;
	r = ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		return r;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static struct ibv_qp *qp_new(struct odpd_verifier *v, struct ibv_pd *pd)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = v->cq, .recv_cq = v->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 2, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	return ibv_create_qp(pd, &ia);
}

static void bounce_free(struct odpd_verifier *v)
{
	if (v->mr && ibv_dereg_mr(v->mr) == 0)
		keep_limbo_leave(v->limbo);
	v->mr = NULL;
	v->limbo = 0;
	if (v->buf)
		munmap(v->buf, v->size);
	v->buf = NULL;
	v->size = 0;
}

/*
 * A bounce buffer of @size bytes: a memfd of its own, never odpd's heap
 * (doc/design.md §8.1: whoever holds the context's cmd_fd can reach its MR). Its
 * fd is closed once mapped: the mapping keeps it.
 */
static int bounce_new(struct odpd_verifier *v, size_t size, struct odpd_err *err)
{
	int fd = memfd_create("odpd-verify", MFD_CLOEXEC);
	void *p;

	if (fd < 0)
		return err_set(err, errno, "memfd_create: %s", strerror(errno));
	if (ftruncate(fd, (off_t)size) < 0) {
		int e = errno;

		close(fd);
		return err_set(err, e, "ftruncate of verify buffer: %s", strerror(e));
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return err_set(err, errno, "mmap of verify buffer: %s", strerror(errno));
	v->buf = p;
	v->size = size;
	madvise(v->buf, size, MADV_DONTDUMP);
	/* In a PD a crash keeps: the next odpd deregisters it */
	v->limbo = keep_limbo_enter(v->dom, ODPD_LIMBO_PENDING);
	v->mr = ibv_reg_mr(v->pd, v->buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!v->mr) {
		int e = errno;

		keep_limbo_leave(v->limbo);
		v->limbo = 0;
		bounce_free(v);
		return err_set(err, e, "ibv_reg_mr of verify buffer: %s", strerror(e));
	}
	keep_limbo_set(v->limbo, v->dom, v->mr->handle);
	return 0;
}

int odpd_verifier_new(struct odpd_domain *dom, size_t max_buf, struct odpd_verifier **ret,
		      struct odpd_err *err)
{
	struct odpd_verifier *v = calloc(1, sizeof(*v));
	struct loop_addr a;
	int r;

	if (!v)
		return err_set(err, ENOMEM, "out of memory");
	v->dom = dom;
	v->pd = dom->pd;
	v->max_buf = max_buf;
	r = loop_addr_get(dom->ctx, &a, &v->max_msg, err);
	if (r < 0)
		goto fail;
	v->cq = ibv_create_cq(dom->ctx, 4, NULL, NULL, 0);
	if (!v->cq) {
		r = err_set(err, errno, "ibv_create_cq: %s", strerror(errno));
		goto fail;
	}
	v->qa = qp_new(v, dom->pd);
	v->qb = v->qa ? qp_new(v, dom->pd) : NULL;
	if (!v->qb) {
		r = err_set(err, errno, "ibv_create_qp: %s", strerror(errno));
		goto fail;
	}
	r = qp_connect(v->qa, v->qb->qp_num, &a);
	if (!r)
		r = qp_connect(v->qb, v->qa->qp_num, &a);
	if (r) {
		r = err_set(err, r, "connecting the verify QP pair: %s", strerror(r));
		goto fail;
	}
	*ret = v;
	return 0;
fail:
	odpd_verifier_free(v);
	return r;
}

void odpd_verifier_free(struct odpd_verifier *v)
{
	if (!v)
		return;
	if (v->qa)
		ibv_destroy_qp(v->qa);
	if (v->qb)
		ibv_destroy_qp(v->qb);
	if (v->cq)
		ibv_destroy_cq(v->cq);
	bounce_free(v);
	free(v);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int wait_completion(struct odpd_verifier *v, struct odpd_err *err)
{
	const uint64_t deadline = now_ns() + VERIFY_TIMEOUT_NS;
	const struct timespec pause = { .tv_nsec = 20000 };
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(v->cq, 1, &wc)) == 0) {
		if (now_ns() > deadline)
			return err_set(err, ETIMEDOUT, "verify: no completion within %llu s",
				       VERIFY_TIMEOUT_NS / 1000000000ull);
		nanosleep(&pause, NULL);
	}
	if (n < 0)
		return err_set(err, EIO, "verify: ibv_poll_cq failed");
	if (wc.status != IBV_WC_SUCCESS)
		return err_set(err, EIO, "verify: work completion %s (vendor error %#x)",
			       ibv_wc_status_str(wc.status), wc.vendor_err);
	return 0;
}

static int post_chunk(struct odpd_verifier *v, const struct odpd_keys *k, uint64_t iova, uint32_t len,
		      bool use_rkey, struct odpd_err *err)
{
	struct ibv_sge sge;
	struct ibv_send_wr wr = { .num_sge = 1, .sg_list = &sge, .send_flags = IBV_SEND_SIGNALED }, *bad;
	int r;

	if (use_rkey) {                   /* bounce <- MR */
		sge = (struct ibv_sge){ .addr = (uintptr_t)v->buf, .length = len, .lkey = v->mr->lkey };
		wr.opcode = IBV_WR_RDMA_READ;
		wr.wr.rdma.remote_addr = iova;
		wr.wr.rdma.rkey = k->rkey;
	} else {                          /* MR -> bounce */
		sge = (struct ibv_sge){ .addr = iova, .length = len, .lkey = k->lkey };
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = (uintptr_t)v->buf;
		wr.wr.rdma.rkey = v->mr->rkey;
	}
	r = ibv_post_send(v->qa, &wr, &bad);
	if (r)
		return err_set(err, r, "verify: ibv_post_send: %s", strerror(r));
	return wait_completion(v, err);
}

/* The first chunk of [iova, iova + length) to read, and its bytes in the
 * bounce buffer: [*ret_start, +*ret_len) read, the range's bytes at
 * *ret_skip, *ret_take of them. Whole pages up to @pages_end, if not 0. */
static void chunk_plan(uint64_t iova, uint64_t length, uint64_t chunk, uint64_t pages_end,
		       uint64_t *ret_start, uint32_t *ret_len, uint64_t *ret_skip, uint64_t *ret_take)
{
	const uint64_t page = 4096;
	uint64_t start = pages_end ? iova & ~(page - 1) : iova;
	uint64_t skip = iova - start;
	uint64_t take = length < chunk - skip ? length : chunk - skip;
	uint64_t end = pages_end ? (iova + take + page - 1) & ~(page - 1) : iova + take;

	if (pages_end && end > pages_end)        /* a segment that ends inside a page */
		end = pages_end;

	*ret_start = start;
	*ret_len = (uint32_t)(end - start);
	*ret_skip = skip;
	*ret_take = take;
}

/* The bounce buffer a verify of [iova, iova + length) reads through in one
 * chunk (whole pages: from @iova's page to the end of its last), at least
 * two pages (whole pages need them) and at most max_buf. */
static size_t bounce_want(const struct odpd_verifier *v, uint64_t iova, uint64_t length, uint64_t pages_end)
{
	const uint64_t page = 4096;
	uint64_t span = pages_end ? ((iova + length + page - 1) & ~(page - 1)) - (iova & ~(page - 1)) :
				    (length + page - 1) & ~(page - 1);

	if (span < 2 * page)
		span = 2 * page;
	return span < v->max_buf ? (size_t)span : v->max_buf;
}

int odpd_verify_mr(struct odpd_verifier *v, const struct odpd_keys *k, uint64_t iova, uint64_t length,
		   bool use_rkey, uint64_t pages_end, uint32_t *ret_crc, const char **ret_method,
		   struct odpd_err *err)
{
	size_t want = bounce_want(v, iova, length, pages_end);
	uint64_t chunk;
	uLong crc = crc32(0L, Z_NULL, 0);

	if (v->size < want) {                 /* none yet, or too small for this one: grown */
		int r;

		bounce_free(v);
		r = bounce_new(v, want, err);
		if (r < 0)
			return r;
	}
	chunk = v->size < v->max_msg ? v->size : v->max_msg;

	/* Whole pages need a chunk of at least two pages, page-aligned. */
	if ((chunk & ~(uint64_t)4095) < 2 * 4096)
		pages_end = 0;
	if (pages_end)
		chunk &= ~(uint64_t)4095;
	for (uint64_t done = 0; done < length;) {
		uint64_t start, skip, take;
		uint32_t n;
		int r;

		chunk_plan(iova + done, length - done, chunk, pages_end, &start, &n, &skip, &take);
		r = post_chunk(v, k, start, n, use_rkey, err);
		if (r < 0)
			return r;
		crc = crc32(crc, v->buf + skip, (uInt)take);
		done += take;
	}
	*ret_crc = (uint32_t)crc;
	*ret_method = use_rkey ? "rdma_read" : "rdma_write_lkey";
	return 0;
}
