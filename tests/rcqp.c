/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "rcqp.h"

#define WAIT_NS (10ull * 1000 * 1000 * 1000)

/* A RoCE v2 IPv4-mapped GID if there is one, then any RoCE v2, then any. */
static int pick_gid(struct ibv_context *ctx, uint8_t port, int n, struct rcqp_addr *a)
{
	static const uint8_t v4[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	int best = -1, best_score = -1;

	for (int i = 0; i < n; i++) {
		struct ibv_gid_entry e;

		if (ibv_query_gid_ex(ctx, port, (uint32_t)i, &e, 0) != 0)
			continue;
		int score = 1 + 2 * (e.gid_type == IBV_GID_TYPE_ROCE_V2) + !memcmp(e.gid.raw, v4, 12);
		if (score > best_score) {
			best = i;
			best_score = score;
			a->gid = e.gid;
		}
	}
	a->gid_index = best;
	return best < 0 ? -ENOENT : 0;
}

int rcqp_create(struct rcqp *q, struct ibv_pd *pd, unsigned depth)
{
	struct ibv_port_attr pa;
	int r;

	memset(q, 0, sizeof(*q));
	q->local.port = 1;
	r = ibv_query_port(pd->context, q->local.port, &pa);
	if (r)
		return -r;
	q->local.lid = pa.lid;
	q->local.mtu = pa.active_mtu;
	q->local.global = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	if (q->local.global && (r = pick_gid(pd->context, q->local.port, pa.gid_tbl_len, &q->local)) < 0)
		return r;
	q->cq = ibv_create_cq(pd->context, (int)depth * 2, NULL, NULL, 0);
	if (!q->cq)
		return -errno;
	struct ibv_qp_init_attr ia = {
		.send_cq = q->cq, .recv_cq = q->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = depth, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	q->qp = ibv_create_qp(pd, &ia);
	if (!q->qp) {
		r = -errno;
		ibv_destroy_cq(q->cq);
		q->cq = NULL;
		return r;
	}
	q->local.qpn = q->qp->qp_num;
	return 0;
}

int rcqp_connect(struct rcqp *q, const struct rcqp_addr *remote)
{
	struct ibv_qp_attr at = {
		.qp_state = IBV_QPS_INIT, .port_num = q->local.port,
		.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE,
	};
	int r = ibv_modify_qp(q->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);

	if (r)
		return -r;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = q->local.mtu < remote->mtu ? q->local.mtu : remote->mtu;
	at.dest_qp_num = remote->qpn;
	at.max_dest_rd_atomic = 4;
	at.min_rnr_timer = 12;
	at.ah_attr.port_num = q->local.port;
	at.ah_attr.dlid = remote->lid;
	at.ah_attr.is_global = remote->global;
	at.ah_attr.grh.dgid = remote->gid;
	at.ah_attr.grh.sgid_index = (uint8_t)q->local.gid_index;
	at.ah_attr.grh.hop_limit = 64;
	r = ibv_modify_qp(q->qp, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		return -r;
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.max_rd_atomic = 4;
	r = ibv_modify_qp(q->qp, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	return -r;
}

int rcqp_post(struct rcqp *q, enum ibv_wr_opcode opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
	      uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = opcode, .send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;

	return -ibv_post_send(q->qp, &wr, &bad);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int rcqp_wait(struct rcqp *q, unsigned n, enum ibv_wc_status *ret_status)
{
	uint64_t deadline = now_ns() + WAIT_NS;
	struct ibv_wc wc[16];

	while (n > 0) {
		int k = ibv_poll_cq(q->cq, n < 16 ? (int)n : 16, wc);

		if (k < 0)
			return -EIO;
		for (int i = 0; i < k; i++)
			if (wc[i].status != IBV_WC_SUCCESS) {
				if (ret_status)
					*ret_status = wc[i].status;
				return -EIO;
			}
		n -= (unsigned)k;
		if (k == 0 && now_ns() > deadline)
			return -ETIMEDOUT;
	}
	return 0;
}

int rcqp_rdma(struct rcqp *q, enum ibv_wr_opcode opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
	      uint64_t raddr, uint32_t rkey, enum ibv_wc_status *ret_status)
{
	int r = rcqp_post(q, opcode, laddr, lkey, len, raddr, rkey);

	return r < 0 ? r : rcqp_wait(q, 1, ret_status);
}

void rcqp_destroy(struct rcqp *q)
{
	if (q->qp)
		ibv_destroy_qp(q->qp);
	if (q->cq)
		ibv_destroy_cq(q->cq);
	q->qp = NULL;
	q->cq = NULL;
}
