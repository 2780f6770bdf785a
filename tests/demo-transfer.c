/* SPDX-License-Identifier: MIT */
/*
 * demo-transfer: two processes move data through odpd MRs (daemon-PD mode).
 * The receiver registers a buffer through odpd with remote write access,
 * imports its odpd PD (odpd_import_pd) and makes an RC QP there; a second
 * process (the sender) does the same with its own connection, then RDMA
 * WRITEs its bytes into the receiver's MR with the receiver's rkey. The
 * receiver checks the bytes in its own mapping. With `-- CMD...`, runs CMD
 * while both still hold their MRs (e.g. rdma resource show mr).
 *
 *   demo-transfer [--socket PATH] [--size BYTES] [-- CMD ARGS...]
 *
 * Needs a provider that can import (mlx5; rxe in odpd's testbed profile).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "demo-util.h"
#include "odpd.h"
#include "rcqp.h"

#define ACCESS_RX (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

static const char *sock;
static size_t size = 1 << 20;

#define CHECK(cond, who, what) do { if (!(cond)) { \
	fprintf(stderr, "%s: %s: %s: %s\n", who, what, strerror(errno), odpd_errmsg()); \
	return 1; } } while (0)
#define CHECK_R(r, who, what) do { int r_ = (r); if (r_ < 0) { \
	fprintf(stderr, "%s: %s: %s\n", who, what, strerror(-r_)); return 1; } } while (0)

/* What the receiver tells the sender, and the sender tells the receiver. */
struct target {
	struct rcqp_addr qp;
	uint64_t iova;
	uint32_t rkey;
};

struct side {
	struct odpd_conn *conn;
	struct odpd_segment *seg;
	unsigned char *buf;
	struct odpd_mr *mr;
	struct ibv_pd *pd;
	struct rcqp q;
};

static int side_open(struct side *s, const char *who, unsigned access)
{
	s->conn = odpd_connect(sock, NULL);
	CHECK(s->conn, who, "odpd_connect");
	s->seg = odpd_alloc(s->conn, size, 0);
	CHECK(s->seg, who, "odpd_alloc");
	s->buf = odpd_segment_addr(s->seg);
	s->mr = odpd_reg(s->conn, s->buf, size, access);
	CHECK(s->mr, who, "odpd_reg");
	s->pd = odpd_import_pd(s->conn);
	CHECK(s->pd, who, "odpd_import_pd");
	CHECK_R(rcqp_create(&s->q, s->pd, 4), who, "creating a CQ and an RC QP on the imported PD");
	printf("%-8s pid %d: odpd MR iova %#llx, %zu bytes, lkey %#x rkey %#x; imported odpd's PD "
	       "(handle %u), own QP %u on it\n", who, (int)getpid(), (unsigned long long)s->mr->iova,
	       s->mr->length, s->mr->lkey, s->mr->rkey, s->pd->handle, s->q.local.qpn);
	return 0;
}

static void side_close(struct side *s)
{
	rcqp_destroy(&s->q);
	odpd_dereg(s->mr);
	odpd_detach(s->seg);
	odpd_disconnect(s->conn);
}

/* The sender: its own odpd connection, MR and PD; WRITEs into the receiver's MR. */
static int sender(int to_rx, int from_rx)
{
	const char *who = "sender";
	struct side s = { 0 };
	struct target t;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	uint32_t crc;
	char c;

	if (read(from_rx, &t, sizeof(t)) != sizeof(t) || side_open(&s, who, IBV_ACCESS_LOCAL_WRITE))
		return 1;
	for (size_t i = 0; i < size; i++)
		s.buf[i] = (unsigned char)(getpid() + i * 13 + (i >> 12));
	snprintf((char *)s.buf, 64, "hello from pid %d through odpd", (int)getpid());
	CHECK_R(rcqp_connect(&s.q, &t.qp), who, "connecting the QP");
	if (write(to_rx, &s.q.local, sizeof(s.q.local)) != sizeof(s.q.local) ||
	    read(from_rx, &c, 1) != 1)
		return 1;
	/* local key: the sender's odpd MR; remote key: the receiver's odpd MR */
	if (rcqp_rdma(&s.q, IBV_WR_RDMA_WRITE, (uintptr_t)s.buf, s.mr->lkey, (uint32_t)size, t.iova, t.rkey,
		      &st) < 0) {
		fprintf(stderr, "sender: RDMA WRITE failed: %s\n", ibv_wc_status_str(st));
		return 1;
	}
	crc = crc_of(s.buf, size);
	printf("sender   RDMA WRITE of %zu bytes to iova %#llx rkey %#x completed; crc32 of what I sent %08x\n",
	       size, (unsigned long long)t.iova, t.rkey, crc);
	fflush(stdout);
	if (write(to_rx, &crc, sizeof(crc)) != sizeof(crc) || read(from_rx, &c, 1) != 1)
		return 1;
	side_close(&s);
	return 0;
}

int main(int argc, char **argv)
{
	const char *who = "receiver";
	struct side r = { 0 };
	struct target t;
	struct rcqp_addr sq;
	char **cmd = NULL;
	int to_tx[2], to_rx[2], st, rc = 0;
	uint32_t crc_sent, crc_got;
	pid_t pid;

	if (demo_args(argc, argv, "demo-transfer", &sock, &size, &cmd))
		return 2;
	if (size < 64 || size > (1u << 30)) {
		fprintf(stderr, "demo-transfer: --size must be 64 bytes to 1 GiB\n");
		return 2;
	}
	if (pipe(to_tx) || pipe(to_rx)) {
		perror("pipe");
		return 1;
	}
	pid = fork();
	if (pid == 0) {
		close(to_tx[1]);
		close(to_rx[0]);
		_exit(sender(to_rx[1], to_tx[0]));
	}
	close(to_tx[0]);
	close(to_rx[1]);
	if (side_open(&r, who, ACCESS_RX))
		goto out;
	memset(r.buf, 0, size);
	t = (struct target){ .qp = r.q.local, .iova = r.mr->iova, .rkey = r.mr->rkey };
	fflush(stdout);
	if (write(to_tx[1], &t, sizeof(t)) != sizeof(t) || read(to_rx[0], &sq, sizeof(sq)) != sizeof(sq))
		goto out;
	if (rcqp_connect(&r.q, &sq) < 0) {
		fprintf(stderr, "receiver: connecting the QP failed\n");
		goto out;
	}
	if (write(to_tx[1], "g", 1) != 1 || read(to_rx[0], &crc_sent, sizeof(crc_sent)) != sizeof(crc_sent))
		goto out;
	crc_got = crc_of(r.buf, size);
	printf("receiver in my own mapping: \"%.40s\", crc32 %08x: %s\n", (char *)r.buf, crc_got,
	       crc_got == crc_sent ? "MATCHES what the sender sent" : "MISMATCH");
	if (crc_got != crc_sent)
		rc = 1;
	if (cmd) {
		fflush(stdout);
		if (run_command(cmd) != 0)
			rc = 1;
	}
	side_close(&r);
	if (write(to_tx[1], "d", 1) == 1 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	    WEXITSTATUS(st) == 0)
		return rc;
	fprintf(stderr, "demo-transfer: the sender failed\n");
	return 1;
out:
	close(to_tx[1]);
	close(to_rx[0]);
	waitpid(pid, &st, 0);
	return 1;
}
