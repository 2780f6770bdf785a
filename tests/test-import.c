/* SPDX-License-Identifier: MIT */
/*
 * Daemon-PD mode for applications, on real rxe verbs in the VM:
 * odpd_import_pd() hands a process the PD its odpd MRs live in, and that
 * process's own QPs move data through the MRs' keys. In the `testbed`
 * profile (rdma-core 65 with the rxe import patch) import works; in `stock`
 * (Debian 12's rdma-core 44) it must answer EOPNOTSUPP and change nothing.
 * What is left behind is judged from the kernel's side (rdma resource show)
 * and odpd's fds, never from odpd's own table.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "odpd.h"
#include "rcqp.h"

#define SEG_LEN (64u << 10)
#define HALF (SEG_LEN / 2)
#define ACCESS_ALL (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

static struct odpd_conn *connect_or_fail(void)
{
	struct odpd_conn *c = odpd_connect(test_daemon.sock, NULL);

	if (!c)
		fail_msg("odpd_connect: %s: %s", strerror(errno), odpd_errmsg());
	return c;
}

/* Byte @i of pattern @seed; a buffer holds bytes [0, n) of it. */
static uint8_t pattern(unsigned seed, size_t i)
{
	return (uint8_t)(seed * 131 + i * 7 + (i >> 12));
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = pattern(seed, i);
}

/* Does @p hold bytes [@from, @from + @n) of pattern @seed? */
static bool filled(const uint8_t *p, size_t n, unsigned seed, size_t from)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != pattern(seed, from + i))
			return false;
	return true;
}

/* A connection with one segment, an MR over all of it and its imported PD. */
struct side {
	struct odpd_conn *conn;
	struct odpd_segment *seg;
	uint8_t *buf;
	struct odpd_mr *mr;
	struct ibv_pd *pd;
};

/* 0, or a small code naming the step that failed (for a child's exit status). */
static int side_open(struct side *s, unsigned access)
{
	memset(s, 0, sizeof(*s));
	s->conn = odpd_connect(test_daemon.sock, NULL);
	if (!s->conn)
		return 1;
	s->seg = odpd_alloc(s->conn, SEG_LEN, 0);
	if (!s->seg)
		return 2;
	s->buf = odpd_segment_addr(s->seg);
	s->mr = odpd_reg(s->conn, s->buf, SEG_LEN, access);
	if (!s->mr)
		return 3;
	s->pd = odpd_import_pd(s->conn);
	return s->pd ? 0 : 4;
}

static void side_close(struct side *s)
{
	if (s->mr)
		odpd_dereg(s->mr);
	if (s->seg)
		odpd_detach(s->seg);
	odpd_disconnect(s->conn);
}

static void skip_unless_testbed(void)
{
	if (!test_profile_testbed())
		skip();
}

/* ---------------------------------------------------------------- stock */

/* Without a provider that imports: EOPNOTSUPP, and no PD is even opened. */
static void test_import_refused_without_provider(void **state)
{
	struct snapshot before, after;
	struct odpd_conn *c;
	int fds;

	(void)state;
	if (test_profile_testbed())
		skip();
	c = connect_or_fail();
	fds = fd_count(getpid());
	snapshot_take(&test_daemon, test_admin_fd, &before);
	errno = 0;
	assert_null(odpd_import_pd(c));
	assert_int_equal(errno, EOPNOTSUPP);
	assert_non_null(strstr(odpd_errmsg(), "cannot import"));
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);   /* daemon fds too: no context was opened */
	assert_int_equal(fd_count(getpid()), fds);
	/* still usable, and join still allowed: nothing was bound */
	assert_int_equal(odpd_join_pd(c, "after-refused-import"), 0);
	odpd_disconnect(c);
}

/* ---------------------------------------------------------------- testbed */

/* The PD is imported once per connection, and binds the connection to it. */
static void test_import_once_and_binds(void **state)
{
	struct odpd_conn *c, *m1, *m2;
	struct ibv_pd *pd, *p1, *p2;

	(void)state;
	skip_unless_testbed();
	c = connect_or_fail();
	pd = odpd_import_pd(c);
	if (!pd)
		fail_msg("odpd_import_pd: %s: %s", strerror(errno), odpd_errmsg());
	assert_ptr_equal(odpd_import_pd(c), pd);
	assert_int_equal(odpd_join_pd(c, "too-late"), -1);
	assert_int_equal(errno, EBUSY);

	/* members of a shared PD import the same PD (same handle, same kernel object) */
	m1 = connect_or_fail();
	m2 = connect_or_fail();
	assert_int_equal(odpd_join_pd(m1, "import-shared"), 0);
	assert_int_equal(odpd_join_pd(m2, "import-shared"), 0);
	p1 = odpd_import_pd(m1);
	p2 = odpd_import_pd(m2);
	assert_non_null(p1);
	assert_non_null(p2);
	assert_int_equal(p1->handle, p2->handle);
	odpd_disconnect(m1);
	odpd_disconnect(m2);
	odpd_disconnect(c);
}

/*
 * Process B moves data through process A's keys: each has its own odpd
 * connection, MR and imported PD and its own QP there; B RDMA WRITEs into
 * A's MR from its own MR, and RDMA READs A's other half back. A checks the
 * bytes in its own mapping, B in its.
 */
struct peer_info {
	struct rcqp_addr qp;
	uint64_t iova;
	uint32_t rkey;
};

static int child_b(int to_a, int from_a, const struct peer_info *a)
{
	struct side b;
	struct rcqp q;
	enum ibv_wc_status st = IBV_WC_SUCCESS;
	char go;
	int r = side_open(&b, IBV_ACCESS_LOCAL_WRITE);

	if (r)
		return 10 + r;
	if (rcqp_create(&q, b.pd, 4) < 0)
		return 20;
	if (write(to_a, &q.local, sizeof(q.local)) != sizeof(q.local))
		return 21;
	if (rcqp_connect(&q, &a->qp) < 0)
		return 22;
	if (read(from_a, &go, 1) != 1)       /* A's QP is connected too */
		return 23;
	fill(b.buf, HALF, 2);
	memset(b.buf + HALF, 0, HALF);
	/* local key: B's odpd MR; remote key: A's odpd MR */
	if (rcqp_rdma(&q, IBV_WR_RDMA_WRITE, (uintptr_t)b.buf, b.mr->lkey, HALF, a->iova, a->rkey, &st) < 0) {
		fprintf(stderr, "RDMA WRITE: %s\n", ibv_wc_status_str(st));
		return 24;
	}
	if (rcqp_rdma(&q, IBV_WR_RDMA_READ, (uintptr_t)b.buf + HALF, b.mr->lkey, HALF, a->iova + HALF,
		      a->rkey, &st) < 0) {
		fprintf(stderr, "RDMA READ: %s\n", ibv_wc_status_str(st));
		return 25;
	}
	if (!filled(b.buf + HALF, HALF, 1, HALF))
		return 26;
	rcqp_destroy(&q);
	side_close(&b);
	return 0;
}

static void test_second_process_moves_data(void **state)
{
	struct side a;
	struct rcqp q;
	struct peer_info info;
	struct rcqp_addr bq;
	int to_b[2], to_a[2], st, r;
	pid_t pid;

	(void)state;
	skip_unless_testbed();
	r = side_open(&a, ACCESS_ALL);
	if (r)
		fail_msg("side A step %d: %s: %s", r, strerror(errno), odpd_errmsg());
	fill(a.buf, SEG_LEN, 1);
	assert_int_equal(rcqp_create(&q, a.pd, 4), 0);
	info = (struct peer_info){ .qp = q.local, .iova = a.mr->iova, .rkey = a.mr->rkey };
	assert_int_equal(pipe(to_b), 0);
	assert_int_equal(pipe(to_a), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(to_b[1]);
		close(to_a[0]);
		_exit(child_b(to_a[1], to_b[0], &info));
	}
	close(to_b[0]);
	close(to_a[1]);
	if (read(to_a[0], &bq, sizeof(bq)) == sizeof(bq)) {
		assert_int_equal(rcqp_connect(&q, &bq), 0);
		assert_int_equal(write(to_b[1], "g", 1), 1);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	/* B's bytes arrived in A's memory, through A's rkey; A's second half is intact */
	assert_true(filled(a.buf, HALF, 2, 0));
	assert_true(filled(a.buf + HALF, HALF, 1, HALF));
	close(to_b[1]);
	close(to_a[0]);
	rcqp_destroy(&q);
	side_close(&a);
}

/*
 * A client SIGKILLed while objects of its own live in the context odpd gave
 * it (a CQ, a QP, an MR it registered itself through the imported PD, next
 * to odpd's MR) leaves nothing: once odpd closes the PD the kernel destroys
 * them, and odpd's fds, MRs and pins are back where they were.
 */
static int child_killed(int ready_fd)
{
	static uint8_t own[4096];
	struct side s;
	struct rcqp q;
	int r = side_open(&s, IBV_ACCESS_LOCAL_WRITE);

	if (r)
		return 10 + r;
	if (rcqp_create(&q, s.pd, 4) < 0)
		return 20;
	if (!ibv_reg_mr(s.pd, own, sizeof(own), IBV_ACCESS_LOCAL_WRITE))
		return 21;
	if (write(ready_fd, "r", 1) != 1)
		return 22;
	pause();
	return 23;
}

struct kernel_counts {
	int qps, cqs, mrs, pds;
};

static void kernel_counts(struct kernel_counts *k)
{
	k->qps = kernel_res_count("qp", 0);
	k->cqs = kernel_res_count("cq", 0);
	k->mrs = kernel_res_count("mr", 0);
	k->pds = kernel_res_count("pd", 0);
}

static const struct snapshot *killed_base;
static const struct kernel_counts *killed_kbase;

static bool all_released(void *arg)
{
	struct snapshot now;
	struct kernel_counts k;

	(void)arg;
	snapshot_take(&test_daemon, test_admin_fd, &now);
	kernel_counts(&k);
	return now.clients == killed_base->clients && now.kernel_mrs == killed_base->kernel_mrs &&
	       now.vmpin_kb == killed_base->vmpin_kb && now.daemon_fds == killed_base->daemon_fds &&
	       now.mrs == killed_base->mrs && memcmp(&k, killed_kbase, sizeof(k)) == 0;
}

static void test_killed_importer_leaves_nothing(void **state)
{
	struct snapshot before, after;
	struct kernel_counts kb, kd, ka;
	int ready[2], st;
	char c;
	pid_t pid;

	(void)state;
	skip_unless_testbed();
	snapshot_take(&test_daemon, test_admin_fd, &before);
	kernel_counts(&kb);
	assert_true(kb.qps >= 0);
	assert_int_equal(pipe(ready), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(ready[0]);
		_exit(child_killed(ready[1]));
	}
	close(ready[1]);
	if (read(ready[0], &c, 1) != 1) {
		waitpid(pid, &st, 0);
		fail_msg("the child failed before it was ready: status %d", WEXITSTATUS(st));
	}
	kernel_counts(&kd);
	assert_int_equal(kd.qps, kb.qps + 1);
	assert_int_equal(kd.cqs, kb.cqs + 1);
	assert_int_equal(kd.mrs, kb.mrs + 2);     /* odpd's MR and the child's own */
	assert_int_equal(kd.pds, kb.pds + 1);     /* odpd's PD for that client */
	assert_int_equal(kill(pid, SIGKILL), 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	close(ready[0]);
	killed_base = &before;
	killed_kbase = &kb;
	if (!wait_until(all_released, NULL)) {
		snapshot_take(&test_daemon, test_admin_fd, &after);
		kernel_counts(&ka);
		fail_msg("left behind: qps %d->%d cqs %d->%d mrs %d->%d pds %d->%d; odpd fds %d->%d, "
			 "clients %u->%u, kernel MRs of odpd %d->%d", kb.qps, ka.qps, kb.cqs, ka.cqs,
			 kb.mrs, ka.mrs, kb.pds, ka.pds, before.daemon_fds, after.daemon_fds,
			 before.clients, after.clients, before.kernel_mrs, after.kernel_mrs);
	}
}

/* odpd_disconnect() unimports: this process's fds and odpd's go back. */
static void test_disconnect_unimports(void **state)
{
	struct snapshot before, after;
	struct odpd_conn *c;
	struct rcqp q;
	int fds;

	(void)state;
	skip_unless_testbed();
	fds = fd_count(getpid());
	snapshot_take(&test_daemon, test_admin_fd, &before);
	c = connect_or_fail();
	assert_non_null(odpd_import_pd(c));
	assert_int_equal(rcqp_create(&q, odpd_import_pd(c), 2), 0);
	rcqp_destroy(&q);
	odpd_disconnect(c);
	assert_int_equal(fd_count(getpid()), fds);
	wait_idle(test_admin_fd);
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
}

/*
 * Client-PD mode imports a client's context once per connection: more
 * registrations through copies of the same cmd_fd add MRs, not fds, to
 * odpd; a refused import keeps none; disconnecting returns every fd.
 */
static Odpd__Reply *raw_reg_client_pd(int conn, uint64_t id, uint64_t addr, uint32_t pd_handle, int cmd_fd)
{
	Odpd__RegMr m;
	Odpd__Request req;

	raw_client_pd_req(&req, &m, addr, pd_handle);
	return raw_call(conn, id, &req, &cmd_fd, 1);
}

static void test_client_pd_imports_context_once(void **state)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct snapshot before, one, four;
	Odpd__Reply *r;
	uint64_t base;
	int conn, fd, kmrs;

	(void)state;
	skip_unless_testbed();
	list = ibv_get_device_list(NULL);
	ctx = list && list[0] ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	assert_non_null(pd);
	snapshot_take(&test_daemon, test_admin_fd, &before);
	kmrs = kernel_res_count("mr", 0);
	conn = raw_connect_hello(test_daemon.sock);
	fd = sealed_memfd(SEG_LEN);
	base = raw_attach(conn, 2, fd);

	r = raw_reg_client_pd(conn, 3, base, pd->handle, ctx->cmd_fd);
	assert_int_equal(r->status, 0);
	assert_true(r->mr->has_kernel_handle);
	odpd__reply__free_unpacked(r, NULL);
	snapshot_take(&test_daemon, test_admin_fd, &one);
	for (uint64_t i = 1; i < 4; i++) {
		int dup_fd = dup(ctx->cmd_fd);      /* another copy of the same open file */

		r = raw_reg_client_pd(conn, 3 + i, base + i * 4096, pd->handle, dup_fd);
		close(dup_fd);
		assert_int_equal(r->status, 0);
		odpd__reply__free_unpacked(r, NULL);
	}
	snapshot_take(&test_daemon, test_admin_fd, &four);
	assert_int_equal(four.mrs, one.mrs + 3);
	assert_int_equal(four.daemon_fds, one.daemon_fds);
	/* four MRs in the kernel, in our PD */
	assert_int_equal(kernel_res_count("mr", 0), kmrs + 4);
	close(conn);
	close(fd);
	wait_idle(test_admin_fd);
	snapshot_take(&test_daemon, test_admin_fd, &four);
	assert_int_equal(four.daemon_fds, before.daemon_fds);
	assert_int_equal(four.mrs, before.mrs);
	assert_int_equal(kernel_res_count("mr", 0), kmrs);
	assert_int_equal(ibv_dealloc_pd(pd), 0);   /* EBUSY if odpd had left an MR in it */
	ibv_close_device(ctx);
	ibv_free_device_list(list);
}

/*
 * A client cannot grow odpd's fd table through client-PD mode: a refused
 * registration (here a PD handle that does not exist) keeps no copy of the
 * client's context, and at most ODPD_MAX_CLIENT_CTXS (16) contexts with live
 * MRs are kept per connection: the 17th is EMFILE, and once MRs are gone
 * their contexts make room. (Found by a red-team pass: before, every fresh
 * uverbs file a connection sent stayed open in odpd until it disconnected.)
 */
static void test_client_pd_contexts_bounded(void **state)
{
	enum { N = 40, CAP = 16 };
	struct ibv_device **list;
	struct ibv_context *ctx[CAP + 1];
	struct ibv_pd *pd[CAP + 1];
	uint64_t handle[CAP + 1];
	struct snapshot before, after;
	Odpd__Reply *r;
	uint64_t base, id = 10;
	int conn, seg;

	(void)state;
	skip_unless_testbed();
	list = ibv_get_device_list(NULL);
	assert_true(list && list[0]);
	conn = raw_connect_hello(test_daemon.sock);
	seg = sealed_memfd((CAP + 1) * 4096);
	base = raw_attach(conn, 2, seg);
	snapshot_take(&test_daemon, test_admin_fd, &before);
	for (int i = 0; i < N; i++) {          /* refused: no such PD */
		struct ibv_context *c = ibv_open_device(list[0]);

		assert_non_null(c);
		r = raw_reg_client_pd(conn, ++id, base, 0x7fffffff, c->cmd_fd);
		assert_int_not_equal(r->status, 0);
		odpd__reply__free_unpacked(r, NULL);
		ibv_close_device(c);
	}
	snapshot_take(&test_daemon, test_admin_fd, &after);
	if (after.daemon_fds > before.daemon_fds + 2)
		fail_msg("odpd's fds grew from %d to %d over %d refused client-PD requests",
			 before.daemon_fds, after.daemon_fds, N);
	/* 16 contexts with an MR each; the 17th is refused */
	for (int i = 0; i <= CAP; i++) {
		ctx[i] = ibv_open_device(list[0]);
		pd[i] = ctx[i] ? ibv_alloc_pd(ctx[i]) : NULL;
		assert_non_null(pd[i]);
		r = raw_reg_client_pd(conn, ++id, base + (uint64_t)i * 4096, pd[i]->handle, ctx[i]->cmd_fd);
		if (i < CAP) {
			assert_int_equal(r->status, 0);
			handle[i] = r->mr->handle;
		} else {
			assert_int_equal(r->status, EMFILE);
		}
		odpd__reply__free_unpacked(r, NULL);
	}
	/* one MR gone: its context makes room */
	{
		Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
		Odpd__Request req = ODPD__REQUEST__INIT;

		d.has_handle = 1;
		d.handle = handle[0];
		req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
		req.dereg_mr = &d;
		r = raw_call(conn, ++id, &req, NULL, 0);
		assert_int_equal(r->status, 0);
		odpd__reply__free_unpacked(r, NULL);
	}
	r = raw_reg_client_pd(conn, ++id, base + CAP * 4096, pd[CAP]->handle, ctx[CAP]->cmd_fd);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	close(conn);
	close(seg);
	wait_idle(test_admin_fd);
	for (int i = 0; i <= CAP; i++) {
		assert_int_equal(ibv_dealloc_pd(pd[i]), 0);   /* odpd left no MR in them */
		ibv_close_device(ctx[i]);
	}
	ibv_free_device_list(list);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_import_refused_without_provider, harness_test_setup),
		cmocka_unit_test_setup(test_import_once_and_binds, harness_test_setup),
		cmocka_unit_test_setup(test_second_process_moves_data, harness_test_setup),
		cmocka_unit_test_setup(test_killed_importer_leaves_nothing, harness_test_setup),
		cmocka_unit_test_setup(test_disconnect_unimports, harness_test_setup),
		cmocka_unit_test_setup(test_client_pd_imports_context_once, harness_test_setup),
		cmocka_unit_test_setup(test_client_pd_contexts_bounded, harness_test_setup),
		cmocka_unit_test(harness_test_daemon_exits_cleanly),
	};

	return cmocka_run_group_tests(tests, harness_group_setup, harness_group_teardown);
}
