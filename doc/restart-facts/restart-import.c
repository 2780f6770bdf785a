/* restart-import: what survives the exit of the process that owns a uverbs context when
 * another process holds a dup of its cmd_fd (issue 25). Not built by meson.
 *   cc -O2 -Wall -o restart-import restart-import.c -libverbs
 * Run in the VM, testbed profile (rxe import): tests/vm/rxe-vm --profile testbed -- ./restart-import
 *
 * The child opens the first device, allocates a PD, registers a pinned MR over a memfd
 * mapping and (if the device has explicit ODP for RC) an ODP MR over a second memfd
 * mapping, sends cmd_fd, both memfds, the handles and keys to the parent over a
 * socketpair, and _exits without closing anything (a crash or a restart). The parent,
 * after the child is reaped: shows the kernel's PD/MR tables, imports device, PD and MRs
 * by handle and compares the keys, then moves data through the imported MRs with a
 * loopback RC QP pair of its own (in the imported PD), checking the bytes through its
 * own mapping of the memfds; then tries the ODP MR, advise_mr and rereg_mr on it; then
 * deregisters and closes, and shows the tables again.
 * Environment: NMR=N has the child register N more 4 KiB pinned MRs (at most 4096) and the
 * parent time their import; REMOVE=1 replaces the clean-up by `rdma link delete rxe0`
 * while the parent holds the imported context (async event, re-import of the dead fd).
 * rxe-vm passes only ODPD_* variables: run it as `env NMR=1000 REMOVE=1 ./restart-import`. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LEN (1u << 20)
#define PG 4096u

struct msg {
	uint32_t pd_handle, mr_handle, mr_lkey, mr_rkey;
	uint32_t odp_handle, odp_lkey, odp_rkey, has_odp;
	uint64_t mr_addr, odp_addr;
};

#define DIE(...) do { fprintf(stderr, "restart-import: " __VA_ARGS__); fprintf(stderr, ": %s\n", strerror(errno)); exit(1); } while (0)

static void sh(const char *what, const char *cmd)
{
	printf("--- %s: %s\n", what, cmd);
	fflush(stdout);
	if (system(cmd) != 0)
		printf("(command failed)\n");
	fflush(stdout);
}

static void *map_memfd(int fd, char fill)
{
	void *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		DIE("mmap");
	if (fill)
		memset(p, fill, LEN);
	return p;
}

static void child(int sock)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	if (!l || !l[0])
		DIE("no device");
	struct ibv_context *ctx = ibv_open_device(l[0]);
	if (!ctx)
		DIE("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		DIE("ibv_alloc_pd");
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	int m1 = memfd_create("pinned", MFD_CLOEXEC), m2 = memfd_create("odp", MFD_CLOEXEC);
	if (ftruncate(m1, LEN) || ftruncate(m2, LEN))
		DIE("ftruncate");
	char *b1 = map_memfd(m1, 'A'), *b2 = map_memfd(m2, 'B');
	struct ibv_mr *mr = ibv_reg_mr(pd, b1, LEN, acc);
	if (!mr)
		DIE("ibv_reg_mr pinned");
	struct msg m = { .pd_handle = pd->handle, .mr_handle = mr->handle, .mr_lkey = mr->lkey,
			 .mr_rkey = mr->rkey, .mr_addr = (uintptr_t)b1 };
	struct ibv_device_attr_ex ax;
	uint32_t need = IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ;
	if (!ibv_query_device_ex(ctx, NULL, &ax) && (ax.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
	    (ax.odp_caps.per_transport_caps.rc_odp_caps & need) == need) {
		struct ibv_mr *o = ibv_reg_mr(pd, b2, LEN, acc | IBV_ACCESS_ON_DEMAND);
		if (!o)
			DIE("ibv_reg_mr ODP");
		m.has_odp = 1;
		m.odp_handle = o->handle;
		m.odp_lkey = o->lkey;
		m.odp_rkey = o->rkey;
		m.odp_addr = (uintptr_t)b2;
	}
	static uint32_t extra[4096];
	int nmr = getenv("NMR") ? atoi(getenv("NMR")) : 0;
	if (nmr > 4096)
		nmr = 4096;
	for (int i = 0; i < nmr; i++) {
		struct ibv_mr *x = ibv_reg_mr(pd, b1 + (size_t)(i % 256) * PG, PG, acc);
		if (!x)
			DIE("ibv_reg_mr extra %d", i);
		extra[i] = x->handle;
	}
	printf("child %d: pd handle %u; pinned MR handle %u lkey 0x%x rkey 0x%x addr %p; ODP MR %s handle %u lkey 0x%x rkey 0x%x addr %p\n",
	       getpid(), m.pd_handle, m.mr_handle, m.mr_lkey, m.mr_rkey, (void *)b1,
	       m.has_odp ? "yes" : "no", m.odp_handle, m.odp_lkey, m.odp_rkey, (void *)b2);
	fflush(stdout);
	int fds[3] = { ctx->cmd_fd, m1, m2 };
	char cbuf[CMSG_SPACE(sizeof fds)];
	struct iovec iov = { &m, sizeof m };
	struct msghdr h = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf };
	struct cmsghdr *c = CMSG_FIRSTHDR(&h);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof fds);
	memcpy(CMSG_DATA(c), fds, sizeof fds);
	if (sendmsg(sock, &h, 0) != sizeof m)
		DIE("sendmsg");
	if (nmr && send(sock, extra, nmr * sizeof extra[0], 0) < 0)
		DIE("send extra");
	_exit(0); /* nothing closed, deregistered or unmapped: as a crash */
}

static int gid_index(struct ibv_context *ctx, union ibv_gid *gid)
{
	for (int i = 0; i < 64; i++) {
		if (ibv_query_gid(ctx, 1, i, gid))
			continue;
		if (gid->raw[10] == 0xff && gid->raw[11] == 0xff)
			return i; /* IPv4-mapped (RoCE v2 on dummy0 or lo) */
	}
	errno = ENOENT;
	DIE("no IPv4-mapped GID");
}

static void to_rts(struct ibv_qp *qp, uint32_t dqpn, int gi, union ibv_gid *gid, enum ibv_mtu mtu)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		DIE("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = gi;
	a.ah_attr.grh.hop_limit = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		DIE("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		DIE("RTS");
}

struct pair { struct ibv_cq *cq; struct ibv_qp *a, *b; };

static struct pair mkpair(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct pair p;
	p.cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!p.cq)
		DIE("ibv_create_cq");
	struct ibv_qp_init_attr ia = { .send_cq = p.cq, .recv_cq = p.cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	p.a = ibv_create_qp(pd, &ia);
	p.b = ibv_create_qp(pd, &ia);
	if (!p.a || !p.b)
		DIE("ibv_create_qp");
	union ibv_gid gid;
	int gi = gid_index(ctx, &gid);
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa))
		DIE("ibv_query_port");
	to_rts(p.a, p.b->qp_num, gi, &gid, pa.active_mtu);
	to_rts(p.b, p.a->qp_num, gi, &gid, pa.active_mtu);
	return p;
}

static void freepair(struct pair *p)
{
	ibv_destroy_qp(p->a);
	ibv_destroy_qp(p->b);
	ibv_destroy_cq(p->cq);
}

/* One RDMA op from qp a: local [lmr, loff, len] <-> remote [raddr, rkey]. Returns the WC status. */
static int rdma(struct pair *p, enum ibv_wr_opcode op, struct ibv_mr *lmr, size_t loff,
		uint64_t raddr, uint32_t rkey, uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)lmr->addr + loff, len, lmr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED, .wr.rdma = { raddr, rkey } }, *bad;
	if (ibv_post_send(p->a, &w, &bad))
		DIE("ibv_post_send");
	struct ibv_wc wc;
	for (int i = 0; i < 20000000; i++) {
		int n = ibv_poll_cq(p->cq, 1, &wc);
		if (n < 0)
			DIE("ibv_poll_cq");
		if (n == 1)
			return wc.status;
		if (i > 1000)
			usleep(100);
	}
	errno = ETIMEDOUT;
	DIE("no completion");
}

static int all(const char *p, char c, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != c)
			return 0;
	return 1;
}

int main(void)
{
	int sv[2];
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv))
		DIE("socketpair");
	pid_t pid = fork();
	if (pid == 0) {
		close(sv[0]);
		child(sv[1]);
	}
	close(sv[1]);
	struct msg m;
	int fds[3];
	char cbuf[CMSG_SPACE(sizeof fds)];
	struct iovec iov = { &m, sizeof m };
	struct msghdr h = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf };
	if (recvmsg(sv[0], &h, MSG_CMSG_CLOEXEC) != sizeof m)
		DIE("recvmsg");
	struct cmsghdr *c = CMSG_FIRSTHDR(&h);
	if (!c || c->cmsg_len != CMSG_LEN(sizeof fds))
		DIE("no fds");
	memcpy(fds, CMSG_DATA(c), sizeof fds);
	static uint32_t extra[4096];
	int nmr = getenv("NMR") ? atoi(getenv("NMR")) : 0;
	if (nmr > 4096)
		nmr = 4096;
	if (nmr && recv(sv[0], extra, sizeof extra, 0) != (ssize_t)(nmr * sizeof extra[0]))
		DIE("recv extra");
	int st;
	waitpid(pid, &st, 0);
	printf("parent %d: child %d exited (status 0x%x); holding its cmd_fd as fd %d\n", getpid(), pid, st, fds[0]);
	sh("after the child's exit", "rdma resource show pd; rdma resource show mr | grep -v 'mrlen 4096 pdn'; "
	   "echo \"MRs in the kernel's table: $(rdma resource show mr | wc -l)\"; grep VmPin /proc/self/status");

	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ee = { .events = EPOLLIN };
	int er = epoll_ctl(ep, EPOLL_CTL_ADD, fds[0], &ee);
	printf("epoll_ctl(ADD) of the uverbs cmd_fd (as systemd does without FDPOLL=0): %d (%s)\n", er,
	       er ? strerror(errno) : "pollable");
	close(ep);
	struct timespec t0, t1, t2;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct ibv_context *ctx = ibv_import_device(fds[0]);
	if (!ctx)
		DIE("ibv_import_device");
	struct ibv_pd *pd = ibv_import_pd(ctx, m.pd_handle);
	if (!pd)
		DIE("ibv_import_pd(%u)", m.pd_handle);
	struct ibv_mr *mr = ibv_import_mr(pd, m.mr_handle);
	if (!mr)
		DIE("ibv_import_mr(%u)", m.mr_handle);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	for (int i = 0; i < nmr; i++) {
		struct ibv_mr *x = ibv_import_mr(pd, extra[i]);
		if (!x)
			DIE("ibv_import_mr extra %u", extra[i]);
		ibv_unimport_mr(x);
	}
	clock_gettime(CLOCK_MONOTONIC, &t2);
	printf("import device+PD+MR: %.0f us; %d more MRs imported (and unimported) in %.0f us, %.1f us each\n",
	       (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3, nmr,
	       (t2.tv_sec - t1.tv_sec) * 1e6 + (t2.tv_nsec - t1.tv_nsec) / 1e3,
	       nmr ? ((t2.tv_sec - t1.tv_sec) * 1e6 + (t2.tv_nsec - t1.tv_nsec) / 1e3) / nmr : 0.0);
	printf("imported pinned MR: handle %u lkey 0x%x rkey 0x%x length %zu addr %p -> keys %s\n",
	       mr->handle, mr->lkey, mr->rkey, mr->length, mr->addr,
	       mr->lkey == m.mr_lkey && mr->rkey == m.mr_rkey ? "SAME" : "DIFFERENT");
	struct ibv_mr *odp = NULL;
	if (m.has_odp) {
		odp = ibv_import_mr(pd, m.odp_handle);
		if (!odp)
			DIE("ibv_import_mr(%u) ODP", m.odp_handle);
		printf("imported ODP MR: handle %u lkey 0x%x rkey 0x%x length %zu addr %p -> keys %s\n",
		       odp->handle, odp->lkey, odp->rkey, odp->length, odp->addr,
		       odp->lkey == m.odp_lkey && odp->rkey == m.odp_rkey ? "SAME" : "DIFFERENT");
	}
	char *p1 = map_memfd(fds[1], 0), *p2 = map_memfd(fds[2], 0);
	printf("memfd contents still there: pinned %s, odp %s\n", all(p1, 'A', LEN) ? "yes" : "NO",
	       all(p2, 'B', LEN) ? "yes" : "NO");

	char *lb = mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *lmr = ibv_reg_mr(pd, lb, 4 * PG, IBV_ACCESS_LOCAL_WRITE);
	if (!lmr)
		DIE("ibv_reg_mr local");
	struct pair q = mkpair(ctx, pd);
	memset(lb, 'W', PG);
	int s = rdma(&q, IBV_WR_RDMA_WRITE, lmr, 0, m.mr_addr + PG, m.mr_rkey, PG);
	printf("RDMA WRITE into the imported pinned MR (child's iova + 4096, 4096 B): %s; bytes through the memfd: %s\n",
	       ibv_wc_status_str(s), all(p1 + PG, 'W', PG) && all(p1, 'A', PG) ? "correct" : "WRONG");
	memset(lb + PG, 0, 2 * PG);
	s = rdma(&q, IBV_WR_RDMA_READ, lmr, PG, m.mr_addr, m.mr_rkey, 2 * PG);
	printf("RDMA READ from the imported pinned MR (8192 B): %s; bytes: %s\n", ibv_wc_status_str(s),
	       all(lb + PG, 'A', PG) && all(lb + 2 * PG, 'W', PG) ? "correct" : "WRONG");
	/* the imported MR as the local side too: lkey and the child's iova in the SGE */
	memset(p1 + 2 * PG, 'L', PG);
	struct ibv_mr as_local = *mr;
	as_local.addr = (void *)(uintptr_t)m.mr_addr;
	s = rdma(&q, IBV_WR_RDMA_WRITE, &as_local, 2 * PG, m.mr_addr + 3 * PG, m.mr_rkey, PG);
	printf("RDMA WRITE from the imported MR (imported lkey, child's iova) into itself: %s; bytes: %s\n",
	       ibv_wc_status_str(s), all(p1 + 3 * PG, 'L', PG) ? "correct" : "WRONG");
	freepair(&q);

	if (odp) {
		struct pair o = mkpair(ctx, pd);
		memset(lb, 'O', PG);
		s = rdma(&o, IBV_WR_RDMA_WRITE, lmr, 0, m.odp_addr + PG, m.odp_rkey, PG);
		printf("RDMA WRITE into the imported ODP MR (page 1): %s; memfd page 1: %s\n", ibv_wc_status_str(s),
		       all(p2 + PG, 'O', PG) ? "written" : all(p2 + PG, 'B', PG) ? "unchanged" : "OTHER");
		freepair(&o);
		o = mkpair(ctx, pd);
		memset(lb + PG, 0, PG);
		s = rdma(&o, IBV_WR_RDMA_READ, lmr, PG, m.odp_addr, m.odp_rkey, PG);
		printf("RDMA READ from the imported ODP MR (page 0): %s; bytes: %s\n", ibv_wc_status_str(s),
		       all(lb + PG, 'B', PG) ? "correct" : all(lb + PG, 0, PG) ? "none" : "OTHER");
		freepair(&o);
		struct ibv_sge sg = { m.odp_addr, PG, odp->lkey };
		int r = ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sg, 1);
		printf("ibv_advise_mr(PREFETCH_WRITE, FLUSH) on the ODP MR at the child's address: %d (%s)\n", r,
		       r ? strerror(r < 0 ? errno : r) : "ok");
		int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ON_DEMAND;
		r = ibv_rereg_mr(odp, IBV_REREG_MR_CHANGE_TRANSLATION, pd, p2, LEN, acc);
		printf("ibv_rereg_mr(CHANGE_TRANSLATION) of the ODP MR to the parent's mapping: %d (%s); keys now lkey 0x%x rkey 0x%x\n",
		       r, r ? strerror(errno) : "ok", odp->lkey, odp->rkey);
		struct ibv_mr *no = ibv_reg_mr(pd, p2, LEN, acc);
		if (!no)
			DIE("ibv_reg_mr new ODP");
		o = mkpair(ctx, pd);
		memset(lb, 'N', PG);
		s = rdma(&o, IBV_WR_RDMA_WRITE, lmr, 0, (uintptr_t)p2 + PG, no->rkey, PG);
		printf("a new ODP MR registered by the importer over its own mapping of the memfd: lkey 0x%x rkey 0x%x; RDMA WRITE into it: %s; bytes: %s\n",
		       no->lkey, no->rkey, ibv_wc_status_str(s), all(p2 + PG, 'N', PG) ? "correct" : "WRONG");
		freepair(&o);
		sh("ODP MRs after the attempts", "rdma resource show mr | grep -v 'mrlen 4096 pdn'; dmesg | grep -i -A3 'warn\\|bug\\|odp\\|rxe' | tail -20");
		ibv_dereg_mr(no);
	}
	sh("before cleanup", "rdma resource show mr | grep -v 'mrlen 4096 pdn'; rdma resource show pd");
	printf("imported context's async_fd: %d\n", ctx->async_fd);
	if (getenv("REMOVE")) { /* device removal while only this (importing) process holds the context */
		pid_t rm = fork();
		if (rm == 0) {
			execlp("rdma", "rdma", "link", "delete", "rxe0", (char *)NULL);
			_exit(127);
		}
		struct pollfd pf = { ctx->async_fd, POLLIN, 0 };
		int pr = poll(&pf, 1, 10000);
		if (pr == 1) {
			struct ibv_async_event ev;
			if (ibv_get_async_event(ctx, &ev) == 0) {
				printf("async event on the imported context: %s\n", ibv_event_type_str(ev.event_type));
				ibv_ack_async_event(&ev);
			}
		} else {
			printf("no async event on the imported context within 10 s (poll %d)\n", pr);
		}
		int ws;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		waitpid(rm, &ws, 0); /* rxe on 7.3 has disassociate_ucontext: removal does not wait for our fds */
		clock_gettime(CLOCK_MONOTONIC, &t1);
		printf("rdma link delete exited 0x%x, %.0f ms after the event, while this process still holds the context\n", ws,
		       (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
		int d = fcntl(fds[0], F_DUPFD_CLOEXEC, 3);
		struct ibv_context *again = ibv_import_device(d);
		printf("ibv_import_device on the disassociated fd: %s (%s)\n", again ? "imported" : "failed",
		       again ? "" : strerror(errno));
		if (again) {
			struct ibv_pd *p2pd = ibv_import_pd(again, m.pd_handle);
			printf("  ibv_import_pd on it: %s (%s)\n", p2pd ? "imported" : "failed", p2pd ? "" : strerror(errno));
			struct ibv_mr *p2mr = p2pd ? ibv_import_mr(p2pd, m.mr_handle) : NULL;
			printf("  ibv_import_mr on it: %s (%s)\n", p2mr ? "imported" : "failed", p2mr ? "" : strerror(errno));
			ibv_close_device(again);
		} else {
			close(d);
		}
		int r2 = ibv_dereg_mr(mr);
		printf("ibv_dereg_mr(imported pinned) after the removal: %d (%s)\n", r2, r2 ? strerror(r2) : "ok");
		ibv_close_device(ctx);
		sh("after removal", "rdma resource show mr | wc -l; rdma link show");
		return 0;
	}
	ibv_dereg_mr(lmr);
	int r = ibv_dereg_mr(mr);
	printf("ibv_dereg_mr(imported pinned): %d\n", r);
	if (odp) {
		r = ibv_dereg_mr(odp);
		printf("ibv_dereg_mr(imported ODP): %d\n", r);
	}
	r = ibv_dealloc_pd(pd);
	printf("ibv_dealloc_pd(imported): %d\n", r);
	r = ibv_close_device(ctx);
	printf("ibv_close_device(imported): %d\n", r);
	sh("after cleanup", "rdma resource show mr; rdma resource show pd; ls -l /proc/self/fd | grep -c uverbs");
	return 0;
}
