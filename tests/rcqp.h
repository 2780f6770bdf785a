/* SPDX-License-Identifier: MIT */
/*
 * rcqp.h - an RC QP and its CQ for tests, the demo and benchmarks: made on
 * any PD (an imported odpd PD or the program's own), connected to a peer by
 * exchanging struct rcqp_addr (over a pipe or a socket), and used for
 * signalled RDMA WRITE / READ with a blocking wait for the completion.
 */
#pragma once

#include <stdint.h>
#include <infiniband/verbs.h>

/* Where a QP is reached: sent to the peer as is (same host, same ABI). */
struct rcqp_addr {
	uint32_t qpn;
	uint16_t lid;
	uint8_t port;
	uint8_t global;          /* RoCE: address by GID */
	int32_t gid_index;
	union ibv_gid gid;
	uint32_t mtu;            /* enum ibv_mtu */
};

struct rcqp {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct rcqp_addr local;
};

/* CQ and QP on @pd (port 1; max_send_wr @depth); fills @q->local. 0 or -errno. */
int rcqp_create(struct rcqp *q, struct ibv_pd *pd, unsigned depth);
/* INIT -> RTR -> RTS towards @remote, with remote read/write allowed. 0 or -errno. */
int rcqp_connect(struct rcqp *q, const struct rcqp_addr *remote);
/* Post one signalled RDMA WRITE or READ (@opcode) of @len bytes between
 * [@laddr, @lkey) and [@raddr, @rkey) and wait up to 10 s for its completion.
 * 0, or -errno (-EIO with *@ret_status the completion's status). */
int rcqp_rdma(struct rcqp *q, enum ibv_wr_opcode opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
	      uint64_t raddr, uint32_t rkey, enum ibv_wc_status *ret_status);
/* Post @n signalled RDMA ops without waiting (at most the QP's depth in flight);
 * rcqp_wait() reaps @n completions. For throughput loops. */
int rcqp_post(struct rcqp *q, enum ibv_wr_opcode opcode, uint64_t laddr, uint32_t lkey, uint32_t len,
	      uint64_t raddr, uint32_t rkey);
int rcqp_wait(struct rcqp *q, unsigned n, enum ibv_wc_status *ret_status);
void rcqp_destroy(struct rcqp *q);
