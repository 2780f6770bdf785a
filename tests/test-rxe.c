/* SPDX-License-Identifier: MIT */
/*
 * Real verbs on Soft-RoCE (run inside the test VM): libodpd against a real
 * odpd. That an MR maps the client's bytes is proved by verify (RDMA READ by
 * the HCA); that an MR is gone is proved from the kernel's side (rdma
 * resource show mr, VmPin of odpd), never from odpd's own table.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <cmocka.h>
#include <json-c/json.h>
#include <rdma/rdma_cma.h>
#include <zlib.h>

#include "harness.h"
#include "odpd.h"


static struct odpd_conn *connect_or_fail(void)
{
	struct odpd_conn *c = odpd_connect(test_daemon.sock, NULL);

	if (!c)
		fail_msg("odpd_connect: %s: %s", strerror(errno), odpd_errmsg());
	return c;
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 12));
}

static uint32_t crc_of(const void *p, size_t n)
{
	return (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n);
}

static uint32_t verify_or_fail(struct odpd_mr *mr, void *addr, size_t len)
{
	uint32_t crc = 0;

	if (odpd_verify(mr, addr, len, &crc) < 0)
		fail_msg("odpd_verify: %s: %s", strerror(errno), odpd_errmsg());
	return crc;
}

struct release_check {
	const struct snapshot *base;
};

static bool released(void *arg)
{
	const struct release_check *rc = arg;
	struct snapshot now;

	snapshot_take(&test_daemon, test_admin_fd, &now);
	return now.clients == rc->base->clients && now.kernel_mrs == rc->base->kernel_mrs &&
	       now.vmpin_kb == rc->base->vmpin_kb && now.segments == rc->base->segments &&
	       now.daemon_fds == rc->base->daemon_fds;
}

/* ---------------------------------------------------------------- tests */

static void test_hello_reports_rxe(void **state)
{
	struct odpd_conn *c = connect_or_fail();
	struct odpd_device_attr a;

	(void)state;
	assert_true(odpd_device_count(c) >= 1);
	assert_int_equal(odpd_query_device(c, 0, &a, sizeof(a)), 0);
	assert_string_equal(a.name, "rxe0");
	assert_string_equal(a.transport, "RoCE");
	assert_true(a.odp);                                   /* rxe in 7.2 has ODP */
	if (test_profile_testbed()) {
		/* rdma-core 65 with odpd's rxe import patch: import and advise_mr */
		assert_int_equal(a.import, ODPD_SUPPORT_YES);
		assert_int_equal(a.advise_mr, ODPD_SUPPORT_YES);
	} else {
		/* Debian 12's rdma-core 44: upstream imports on mlx5 only; no advise_mr op in rxe */
		assert_int_equal(a.import, ODPD_SUPPORT_NO);
		assert_int_equal(a.import_errno, EOPNOTSUPP);
		assert_int_equal(a.advise_mr, ODPD_SUPPORT_NO);
	}
	assert_int_equal(odpd_query_device(c, 99, &a, sizeof(a)), -1);
	assert_int_equal(errno, ENODEV);
	odpd_disconnect(c);
}

static void test_register_verify_dereg(void **state)
{
	const size_t len = 4 << 20;
	struct snapshot base, before, held, after;
	struct release_check rc = { &base };
	struct odpd_conn *c = (snapshot_take(&test_daemon, test_admin_fd, &base), connect_or_fail());
	struct odpd_segment *seg = odpd_alloc(c, len, 0);
	struct odpd_mr *mr;
	uint8_t *p;
	uint32_t crc1, crc2;

	(void)state;
	assert_non_null(seg);
	p = odpd_segment_addr(seg);
	fill(p, len, 1);
	snapshot_take(&test_daemon, test_admin_fd, &before);
	mr = odpd_reg(c, p, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!mr)
		fail_msg("odpd_reg: %s: %s", strerror(errno), odpd_errmsg());
	assert_int_equal(mr->iova, (uintptr_t)p);
	assert_int_equal(mr->length, len);
	assert_true(mr->lkey != 0 && mr->rkey != 0);
	snapshot_take(&test_daemon, test_admin_fd, &held);
	assert_int_equal(held.kernel_mrs, before.kernel_mrs + 1);   /* the kernel has it */
	assert_int_equal(held.vmpin_kb, before.vmpin_kb + (long)(len >> 10));
	assert_int_equal(held.mrs, before.mrs + 1);

	crc1 = verify_or_fail(mr, NULL, 0);
	assert_int_equal(crc1, crc_of(p, len));
	/* change one page: the HCA sees the change */
	fill(p + 3 * 4096, 4096, 2);
	crc2 = verify_or_fail(mr, NULL, 0);
	assert_int_not_equal(crc2, crc1);
	assert_int_equal(crc2, crc_of(p, len));
	/* a sub-range, not page aligned */
	assert_int_equal(verify_or_fail(mr, p + 100, 3 * 4096 + 17), crc_of(p + 100, 3 * 4096 + 17));
	/* out of range */
	uint32_t x;
	assert_int_equal(odpd_verify(mr, p + len - 10, 20, &x), -1);
	assert_int_equal(errno, EINVAL);

	assert_int_equal(odpd_dereg(mr), 0);
	/* the MR is gone from the kernel at once; the bounce buffer's MR stays
	 * until the client goes */
	snapshot_take(&test_daemon, test_admin_fd, &after);
	assert_int_equal(after.kernel_mrs, before.kernel_mrs + 1);
	assert_int_equal(after.mrs, before.mrs);
	assert_int_equal(odpd_detach(seg), 0);
	odpd_disconnect(c);
	assert_true(wait_until(released, &rc));
}

/* Without remote read, verify pushes the MR's bytes with its lkey instead. */
static void test_verify_local_only_mr(void **state)
{
	const size_t len = 1 << 20;
	struct odpd_conn *c = connect_or_fail();
	struct odpd_segment *seg = odpd_alloc(c, len, 0);
	uint8_t *p = odpd_segment_addr(seg);
	struct odpd_mr *mr;

	(void)state;
	fill(p, len, 3);
	mr = odpd_reg(c, p + 8192, len - 8192, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mr);
	assert_int_equal(verify_or_fail(mr, NULL, 0), crc_of(p + 8192, len - 8192));
	assert_int_equal(odpd_dereg(mr), 0);
	assert_int_equal(odpd_detach(seg), 0);
	odpd_disconnect(c);
}

/*
 * The same memfd attached by two clients at different addresses: odpd maps
 * it once, at the first client's address, so the second client's MR needs
 * ibv_reg_mr_iova (iova = its own address, addr = odpd's mapping).
 */
static void test_shared_segment_other_address(void **state)
{
	const size_t len = 2 << 20;
	struct odpd_conn *c1 = connect_or_fail(), *c2 = connect_or_fail();
	int fd = sealed_memfd(len);
	uint8_t *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	uint8_t *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	struct odpd_segment *s1, *s2;
	struct odpd_mr *m1, *m2;

	(void)state;
	assert_true(a != MAP_FAILED && b != MAP_FAILED && a != b);
	s1 = odpd_attach(c1, fd, a, len);
	s2 = odpd_attach(c2, fd, b, len);
	if (!s1 || !s2)
		fail_msg("odpd_attach: %s: %s", strerror(errno), odpd_errmsg());
	fill(a, len, 4);
	m1 = odpd_reg(c1, a, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	m2 = odpd_reg(c2, b + 4096, len - 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(m1);
	if (!m2)
		fail_msg("odpd_reg (iova != odpd address): %s: %s", strerror(errno), odpd_errmsg());
	assert_int_equal(m2->iova, (uintptr_t)b + 4096);
	assert_int_equal(verify_or_fail(m1, NULL, 0), crc_of(a, len));
	assert_int_equal(verify_or_fail(m2, NULL, 0), crc_of(b + 4096, len - 4096));
	fill(b + 4096, 4096, 5);                      /* written through the second view */
	assert_int_equal(verify_or_fail(m1, a + 4096, 4096), crc_of(b + 4096, 4096));
	assert_int_equal(odpd_detach(s2), -1);        /* an MR is still over it */
	assert_int_equal(errno, EBUSY);
	odpd_dereg(m1);
	odpd_dereg(m2);
	odpd_detach(s1);
	odpd_detach(s2);
	odpd_disconnect(c1);
	odpd_disconnect(c2);
	munmap(a, len);
	munmap(b, len);
	close(fd);
}

/* A client that registers, verifies and dies (SIGKILL) without a word:
 * nothing it held stays in the kernel. */
static void test_disconnect_releases_everything(void **state)
{
	struct snapshot before, held, after;
	struct release_check rc = { &before };
	int pipefd[2], st;
	char ok;
	pid_t pid;

	(void)state;
	snapshot_take(&test_daemon, test_admin_fd, &before);
	assert_int_equal(pipe(pipefd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct odpd_conn *c = odpd_connect(test_daemon.sock, NULL);
		struct odpd_segment *seg = c ? odpd_alloc(c, 8 << 20, 0) : NULL;
		uint8_t *p = seg ? odpd_segment_addr(seg) : NULL;
		struct odpd_mr *m1 = p ? odpd_reg(c, p, 4 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) : NULL;
		struct odpd_mr *m2 = m1 ? odpd_reg(c, p + (4 << 20), 4 << 20, IBV_ACCESS_LOCAL_WRITE) : NULL;
		uint32_t crc;
		if (!m2 || odpd_verify(m1, NULL, 0, &crc) < 0)
			_exit(1);
		if (write(pipefd[1], "k", 1) != 1)
			_exit(2);
		pause();
		_exit(3);
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], &ok, 1), 1);
	close(pipefd[0]);
	snapshot_take(&test_daemon, test_admin_fd, &held);
	/* two MRs + the verify bounce buffer's MR; 8 MiB + the bounce buffer pinned */
	assert_int_equal(held.kernel_mrs, before.kernel_mrs + 3);
	assert_true(held.vmpin_kb >= before.vmpin_kb + (8 << 10));
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	if (!wait_until(released, &rc)) {
		snapshot_take(&test_daemon, test_admin_fd, &after);
		fail_msg("not released: clients %u/%u kernel MRs %d/%d VmPin %ld/%ld kB segments %u/%u "
			 "odpd fds %d/%d", after.clients, before.clients, after.kernel_mrs, before.kernel_mrs,
			 after.vmpin_kb, before.vmpin_kb, after.segments, before.segments,
			 after.daemon_fds, before.daemon_fds);
	}
	snapshot_take(&test_daemon, test_admin_fd, &after);
	assert_int_equal(after.kernel_mrs, before.kernel_mrs);
	assert_int_equal(after.vmpin_kb, before.vmpin_kb);
	assert_int_equal(after.segments, before.segments);
	assert_int_equal(after.daemon_fds, before.daemon_fds);
}

/* The mirror's half, in a child (its default connection ends with it).
 * Returns 0 when every call failed fast with EOPNOTSUPP. */
static int mirror_child(int ready_fd, int go_fd)
{
	struct ibv_mr *(*const calls[3])(struct rdma_cm_id *, void *, size_t) = {
		odpd_reg_msgs, odpd_reg_read, odpd_reg_write,
	};
	const char *addr = test_cm_addr() ? test_cm_addr() : "127.0.0.1";
	struct sockaddr_in sin = { .sin_family = AF_INET };
	struct rdma_cm_id *id = NULL;
	struct odpd_segment *seg;
	char c;

	setenv(ODPD_SOCKET_ENV, test_daemon.sock, 1);
	/* a synchronous id (no channel); resolving an address binds it to rxe0 */
	if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1 || rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) != 0 ||
	    rdma_resolve_addr(id, NULL, (struct sockaddr *)&sin, 2000) != 0 || !id->verbs) {
		fprintf(stderr, "rdma_resolve_addr(%s): %s (is rdma_ucm loaded?)\n", addr, strerror(errno));
		return 10;
	}
	id->pd = ibv_alloc_pd(id->verbs);
	seg = id->pd ? odpd_alloc(odpd_default_conn(), 1 << 20, 0) : NULL;
	if (!seg)
		return 11;
	for (int i = 0; i < 3; i++) {
		errno = 0;
		if (calls[i](id, odpd_segment_addr(seg), 4096) || errno != EOPNOTSUPP ||
		    !strstr(odpd_errmsg(), "import")) {
			fprintf(stderr, "mirror call %d: errno %d: %s\n", i, errno, odpd_errmsg());
			return 12 + i;
		}
	}
	if (kernel_mr_count(getpid()) != 0)
		return 15;
	/* hold the segment while the parent looks at odpd */
	if (write(ready_fd, "r", 1) != 1 || read(go_fd, &c, 1) != 1)
		return 16;
	ibv_dealloc_pd(id->pd);
	rdma_destroy_id(id);
	return 0;
}

/* The librdmacm mirror on a device that cannot import: NULL/EOPNOTSUPP,
 * checked before anything is sent, and nothing registered anywhere. */
static void test_mirror_fails_fast_without_import(void **state)
{
	struct snapshot before, during;
	int ready[2], go[2], st;
	char c;
	pid_t pid;

	(void)state;
	if (test_profile_testbed())
		skip();            /* rxe imports there: test-cm covers the mirror working */
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	snapshot_take(&test_daemon, test_admin_fd, &before);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(mirror_child(ready[1], go[0]));
	close(ready[1]);
	close(go[0]);
	if (read(ready[0], &c, 1) == 1) {
		snapshot_take(&test_daemon, test_admin_fd, &during);
		assert_int_equal(during.segments, before.segments + 1);   /* the child's segment */
		assert_int_equal(during.mrs, before.mrs);                 /* but no MR */
		assert_int_equal(during.kernel_mrs, before.kernel_mrs);
		assert_int_equal(during.vmpin_kb, before.vmpin_kb);
	}
	assert_int_equal(write(go[1], "g", 1), 1);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	close(ready[0]);
	close(go[1]);
}

/* The daemon's own import path, reached with the raw protocol (the library
 * fails fast before it): a real uverbs cmd_fd gets ibv_import_device's
 * EOPNOTSUPP from rxe, and nothing stays behind (no fd, no MR). */
static void test_client_pd_import_error_path(void **state)
{
	const size_t len = 1 << 20;
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	int conn, fd;
	Odpd__RegMr m;
	Odpd__Request req;
	struct snapshot before, after;

	(void)state;
	if (test_profile_testbed())
		skip();            /* rxe imports there: test-cm covers the daemon's import */
	list = ibv_get_device_list(NULL);
	ctx = list ? ibv_open_device(list[0]) : NULL;
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	conn = raw_connect_hello(test_daemon.sock);
	fd = sealed_memfd(len);
	assert_non_null(pd);
	raw_client_pd_req(&req, &m, raw_attach(conn, 2, fd), pd->handle);
	snapshot_take(&test_daemon, test_admin_fd, &before);
	raw_expect_error(conn, 3, &req, &ctx->cmd_fd, 1, EOPNOTSUPP);
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	close(conn);
	close(fd);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
}

/* A child after fork() cannot use its parent's connection; the parent can. */
static void test_fork_child_does_not_use_parent_connection(void **state)
{
	struct odpd_conn *c = connect_or_fail();
	struct odpd_segment *seg = odpd_alloc(c, 1 << 20, 0);
	uint8_t *p = odpd_segment_addr(seg);
	struct odpd_mr *mr;
	int st;
	pid_t pid;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct odpd_mr *m = odpd_reg(c, p, 4096, IBV_ACCESS_LOCAL_WRITE);
		_exit(!m && errno == ENOTCONN ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	mr = odpd_reg(c, p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(mr);
	fill(p, 4096, 9);
	assert_int_equal(verify_or_fail(mr, NULL, 0), crc_of(p, 4096));
	odpd_dereg(mr);
	odpd_detach(seg);
	odpd_disconnect(c);
}

static void test_address_outside_segments(void **state)
{
	struct odpd_conn *c = connect_or_fail();
	static uint8_t heap[8192];

	(void)state;
	assert_null(odpd_reg(c, heap, sizeof(heap), IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(errno, EINVAL);
	assert_non_null(strstr(odpd_errmsg(), "odpd_alloc"));
	odpd_disconnect(c);
}

/* odpctl status --json as an operator sees it, while we hold an MR. */
static void test_odpctl_status(void **state)
{
	const char *odpctl = getenv("ODPD_TEST_ODPCTL");
	struct odpd_conn *c = connect_or_fail();
	struct odpd_segment *seg = odpd_alloc(c, 1 << 20, 0);
	struct odpd_mr *mr = odpd_reg(c, odpd_segment_addr(seg), 1 << 20, IBV_ACCESS_LOCAL_WRITE);
	char cmd[512], out[1 << 16];
	json_object *root, *devs, *clients, *v;
	bool found = false;
	size_t n;
	FILE *p;

	(void)state;
	assert_non_null(odpctl);
	assert_non_null(mr);
	snprintf(cmd, sizeof(cmd), "%s --socket %s status --json", odpctl, test_daemon.sock);
	p = popen(cmd, "r");
	n = fread(out, 1, sizeof(out) - 1, p);
	assert_int_equal(pclose(p), 0);
	out[n] = 0;
	root = json_tokener_parse(out);
	assert_non_null(root);
	assert_true(json_object_object_get_ex(root, "devices", &devs));
	v = json_object_object_get(json_object_array_get_idx(devs, 0), "name");
	assert_string_equal(json_object_get_string(v), "rxe0");
	v = json_object_object_get(json_object_array_get_idx(devs, 0), "import");
	assert_string_equal(json_object_get_string(v), test_profile_testbed() ? "yes" : "no");
	assert_true(json_object_object_get_ex(root, "clients", &clients));
	for (size_t i = 0; i < json_object_array_length(clients); i++) {
		json_object *cl = json_object_array_get_idx(clients, i);
		if (json_object_get_int(json_object_object_get(cl, "pid")) != getpid() ||
		    json_object_get_int(json_object_object_get(cl, "mrs")) != 1)
			continue;
		found |= json_object_get_uint64(json_object_object_get(cl, "pinned_bytes")) == 1 << 20;
	}
	if (!found)
		fail_msg("no client with pid %d, 1 MR, 1 MiB pinned in:\n%s", (int)getpid(), out);
	/* OdpStats: this suite registers no ODP MR; its 64-bit counters are strings */
	assert_true(json_object_object_get_ex(root, "odp", &v));
	assert_int_equal(json_object_get_int(json_object_object_get(v, "mrs")), 0);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "bytes")), "0");
	assert_true(json_object_is_type(json_object_object_get(v, "prefetch_errors"), json_type_string));
	json_object_put(root);
	odpd_dereg(mr);
	odpd_detach(seg);
	odpd_disconnect(c);
}

/* odpd takes RLIMIT_NOFILE's hard limit: clients make it hold fds. The VM
 * runs the test as root with the kernel's defaults (soft 1024, hard 4096 or
 * more), so the soft limit must have moved. */
static void test_nofile_raised_to_hard_limit(void **state)
{
	char path[64], line[256];
	unsigned long long soft = 0, hard = 0;
	FILE *f;

	(void)state;
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)test_daemon.pid);
	f = fopen(path, "r");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, "Max open files", 14) == 0)
			assert_int_equal(sscanf(line + 14, "%llu %llu", &soft, &hard), 2);
	fclose(f);
	assert_true(hard > 1024);
	assert_int_equal(soft, hard);
}

/* ---------------------------------------------------------------- verifiers */

#define KIB 1024u
#define MIB (1024u * 1024u)

/* odpd's mappings of verify bounce buffers (memfd "odpd-verify"): how many,
 * and their bytes into *@bytes. */
static int bounce_maps(pid_t pid, size_t *bytes)
{
	char path[64], line[512];
	int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "r");
	assert_non_null(f);
	*bytes = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (strstr(line, "/memfd:odpd-verify") && sscanf(line, "%lx-%lx", &lo, &hi) == 2) {
			n++;
			*bytes += hi - lo;
		}
	}
	fclose(f);
	return n;
}

/* What the kernel and odpd's address space hold of odpd's verbs objects. */
struct verbs_held {
	pid_t pid;
	int qp, cq, mr, bounces;
};

static void verbs_held_take(pid_t pid, struct verbs_held *h)
{
	size_t bytes;

	h->pid = pid;
	h->qp = kernel_res_count("qp", pid);
	h->cq = kernel_res_count("cq", pid);
	h->mr = kernel_mr_count(pid);
	h->bounces = bounce_maps(pid, &bytes);
}

static bool verbs_held_are(void *arg)
{
	const struct verbs_held *want = arg;
	struct verbs_held now;

	verbs_held_take(want->pid, &now);
	return now.qp == want->qp && now.cq == want->cq && now.mr == want->mr && now.bounces == want->bounces;
}

static void wait_verbs_held(const struct verbs_held *want, const char *when)
{
	struct verbs_held now;

	if (wait_until(verbs_held_are, (void *)want))
		return;
	verbs_held_take(want->pid, &now);
	fail_msg("%s: odpd holds %d QPs, %d CQs, %d MRs, %d bounce buffer mappings (want %d, %d, %d, %d)",
		 when, now.qp, now.cq, now.mr, now.bounces, want->qp, want->cq, want->mr, want->bounces);
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#define IDLE_MS 3000

/*
 * issue 23: odpd makes a client's verifier (a loopback RC QP pair, their
 * CQ, a bounce buffer: a memfd mapped and registered) when a verify needs
 * it, sized to the verify, keeps it --verify-idle-ms after the last verify
 * and then gives all of it back: the kernel holds none of its objects and
 * odpd maps no bounce buffer (it used to keep a 1 MiB one and the QPs for
 * as long as the client was connected: about 1 MB per client that had ever
 * verified). A later verify makes a new one and reads right; a larger one
 * grows the buffer (one mapping, up to --verify-buffer); a disconnect frees
 * a kept one with the client's PD; the bounce buffer holds no fd of odpd's.
 */
static void test_verifier_given_back_when_idle(void **state)
{
	const char *args[] = { "--verify-idle-ms", "3000", NULL };
	const size_t small = 64 * KIB, big = 512 * KIB;
	struct test_daemon d = { 0 };
	struct verbs_held h, want;
	struct odpd_conn *c;
	struct odpd_segment *seg;
	struct odpd_mr *mr, *mr2;
	double sent, seen, gone;
	size_t bytes;
	uint8_t *p;
	int fds0;
	uint32_t crc;

	(void)state;
	daemon_start(&d, args);
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	seg = odpd_alloc(c, MIB, 0);
	assert_non_null(seg);
	p = odpd_segment_addr(seg);
	fill(p, MIB, 3);
	mr = odpd_reg(c, p, small, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(mr);
	fds0 = fd_count(d.pid);
	/* registered, never verified: no verifier */
	verbs_held_take(d.pid, &h);
	assert_int_equal(h.qp, 0);
	assert_int_equal(h.cq, 0);
	assert_int_equal(h.mr, 1);
	assert_int_equal(h.bounces, 0);

	/* the first verify makes it; it stays idle for verify-idle-ms */
	sent = now_s();
	assert_int_equal(verify_or_fail(mr, NULL, 0), crc_of(p, small));
	verbs_held_take(d.pid, &h);
	assert_int_equal(bounce_maps(d.pid, &bytes), 1);
	seen = now_s();
	if (seen - sent >= IDLE_MS / 1000.0)
		fail_msg("looking took %.1f s, longer than verify-idle-ms: raise IDLE_MS", seen - sent);
	assert_int_equal(h.qp, 2);                      /* the loopback pair */
	assert_int_equal(h.cq, 1);
	assert_int_equal(h.mr, 2);                      /* and the bounce buffer's */
	assert_int_equal(h.bounces, 1);
	assert_int_equal(bytes, small);                 /* as large as the verify */
	assert_int_equal(fd_count(d.pid), fds0);        /* its memfd is closed once mapped */

	/* then all of it goes, not before verify-idle-ms */
	want = (struct verbs_held){ d.pid, 0, 0, 1, 0 };
	wait_verbs_held(&want, "verify-idle-ms after the verify");
	gone = now_s();
	fprintf(stderr, "verifier kept %.2f s after the verify was sent (verify-idle-ms %d)\n", gone - sent,
		IDLE_MS);
	assert_true(gone - sent >= IDLE_MS / 1000.0 - 0.05);
	assert_int_equal(fd_count(d.pid), fds0);

	/* a second verify works: a new verifier reads the new bytes */
	fill(p, small, 4);
	crc = verify_or_fail(mr, NULL, 0);
	assert_int_equal(crc, crc_of(p, small));
	/* a larger one grows the bounce buffer, whether the verifier is still kept or not */
	mr2 = odpd_reg(c, p + big, big, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(mr2);
	sent = now_s();
	assert_int_equal(verify_or_fail(mr2, NULL, 0), crc_of(p + big, big));
	assert_int_equal(bounce_maps(d.pid, &bytes), 1);
	if (now_s() - sent < IDLE_MS / 1000.0)
		assert_int_equal(bytes, big);
	want = (struct verbs_held){ d.pid, 0, 0, 2, 0 };
	wait_verbs_held(&want, "verify-idle-ms after the larger verify");

	/* a disconnect frees a kept verifier with the client's PD */
	assert_int_equal(verify_or_fail(mr, NULL, 0), crc);
	odpd_disconnect(c);
	want = (struct verbs_held){ d.pid, 0, 0, 0, 0 };
	wait_verbs_held(&want, "after the disconnect");
	assert_true(fd_count(d.pid) < fds0);
	daemon_stop(&d);                                 /* exit status 0: no sanitizer report */
}

struct racer {
	const char *sock;
	unsigned rounds, seed;
};

/* Verify again and again, each at a time around verify-idle-ms after the
 * last, so that some find the verifier kept, some find it gone and some
 * meet its release on a worker; release and register the MR now and then. */
static int race_verifies(const struct racer *r)
{
	struct odpd_conn *c = odpd_connect(r->sock, NULL);
	struct odpd_segment *seg;
	struct odpd_mr *mr;
	uint8_t *p;

	if (!c || odpd_join_pd(c, "verify-race") < 0)
		return 10;
	seg = odpd_alloc(c, 256 * KIB, 0);
	if (!seg)
		return 11;
	p = odpd_segment_addr(seg);
	mr = odpd_reg(c, p, 128 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!mr)
		return 12;
	for (unsigned i = 0; i < r->rounds; i++) {
		uint32_t crc;

		fill(p, 128 * KIB, r->seed + i);
		if (odpd_verify(mr, NULL, 0, &crc) < 0 || crc != crc_of(p, 128 * KIB)) {
			fprintf(stderr, "race_verifies: round %u: %s\n", i, odpd_errmsg());
			return 13;
		}
		usleep(((i * 7 + r->seed) % 13) * 5000);    /* 0..60 ms: verify-idle-ms is 30 */
		if (i % 5 == 4) {
			if (odpd_dereg(mr) < 0)
				return 14;
			mr = odpd_reg(c, p, 128 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
			if (!mr)
				return 15;
		}
	}
	odpd_disconnect(c);
	return 0;
}

/*
 * Two clients of one shared PD verify at times around verify-idle-ms (30 ms
 * here): verifies that take the kept verifier, make their own beside
 * another's, put theirs back or free it, meet the timer's release on a
 * worker. Every verify reads right, odpd serves on, and once they are gone
 * nothing of a verifier is left (under the sanitizers: no report either).
 */
static void test_verifies_race_idle_release(void **state)
{
	const char *args[] = { "--verify-idle-ms", "30", NULL };
	struct test_daemon d = { 0 };
	struct racer a, b;
	struct verbs_held want;
	pid_t pid;
	int st;

	(void)state;
	daemon_start(&d, args);
	a = (struct racer){ d.sock, 40, 1 };
	b = (struct racer){ d.sock, 40, 6 };
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(race_verifies(&b));
	assert_int_equal(race_verifies(&a), 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	want = (struct verbs_held){ d.pid, 0, 0, 0, 0 };
	wait_verbs_held(&want, "after both clients went");
	daemon_stop(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_hello_reports_rxe, harness_test_setup),
		cmocka_unit_test_setup(test_register_verify_dereg, harness_test_setup),
		cmocka_unit_test_setup(test_verify_local_only_mr, harness_test_setup),
		cmocka_unit_test_setup(test_shared_segment_other_address, harness_test_setup),
		cmocka_unit_test_setup(test_disconnect_releases_everything, harness_test_setup),
		cmocka_unit_test_setup(test_mirror_fails_fast_without_import, harness_test_setup),
		cmocka_unit_test_setup(test_client_pd_import_error_path, harness_test_setup),
		cmocka_unit_test_setup(test_fork_child_does_not_use_parent_connection, harness_test_setup),
		cmocka_unit_test_setup(test_address_outside_segments, harness_test_setup),
		cmocka_unit_test_setup(test_odpctl_status, harness_test_setup),
		cmocka_unit_test_setup(test_nofile_raised_to_hard_limit, harness_test_setup),
		cmocka_unit_test(test_verifier_given_back_when_idle),
		cmocka_unit_test(test_verifies_race_idle_release),
		cmocka_unit_test(harness_test_daemon_exits_cleanly),
	};

	if (!test_require_device())
		fprintf(stderr, "test-rxe: meant for the VM (ODPD_TEST_REQUIRE_DEVICE=1)\n");
	if (getenv("ODPD_TEST_FILTER"))           /* e.g. "test_disconnect*" */
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, harness_group_setup, harness_group_teardown);
}
