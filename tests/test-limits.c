/* SPDX-License-Identifier: MIT */
/*
 * test-limits: what one user can make odpd spend is bounded per user
 * (odpd.conf(5): default-connections ... and the rules' max-connections
 * ...), with a clear errno naming the limit, while other users go on; a
 * connection ends when the process that made it exits, even if a forked
 * child holds the socket; a flood of connections on a daemon short of file
 * descriptors neither spins odpd nor stops it serving afterwards.
 *
 * Host and VM (stock): the MR references test needs a device and is skipped
 * without one unless ODPD_TEST_REQUIRE_DEVICE=1.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "odpd.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define GIB (1ull << 30)
#define UID_NOBODY 65534

/* Child side of run_as(): a failed check exits with its line number, so the
 * parent's assertion says where. */
#define CHILD_CHECK(cond) do { if (!(cond)) { \
		fprintf(stderr, "line %d: %s (errno %d: %s)\n", __LINE__, #cond, errno, odpd_errmsg()); \
		_exit(__LINE__ % 250 + 1); } } while (0)

static struct test_daemon d;
static char conf_path[128];

static void start(const char *text)
{
	memset(&d, 0, sizeof(d));
	daemon_start_conf(&d, conf_path, sizeof(conf_path), "limits", text, NULL, NULL);
}

static void stop(void)
{
	daemon_stop(&d);
	unlink(conf_path);
}

/* ---------------------------------------------------------------- connections */

static int nobody_connections(void *arg)
{
	struct odpd_conn *c[3];

	(void)arg;
	for (int i = 0; i < 3; i++)
		CHILD_CHECK((c[i] = odpd_connect(d.sock, NULL)) != NULL);
	CHILD_CHECK(odpd_connect(d.sock, NULL) == NULL);
	CHILD_CHECK(errno == EMFILE);
	CHILD_CHECK(strstr(odpd_errmsg(), "default-connections") != NULL);
	CHILD_CHECK(strstr(odpd_errmsg(), "uid 65534") != NULL);
	/* the refused connection is closed, and a freed one can be used again */
	odpd_disconnect(c[0]);
	for (int tries = 0; (c[0] = odpd_connect(d.sock, NULL)) == NULL && tries < 200; tries++)
		usleep(10000);
	CHILD_CHECK(c[0] != NULL);
	for (int i = 0; i < 3; i++)
		odpd_disconnect(c[i]);
	return 0;
}

/* default-connections = 3: a fourth connection of uid 65534 gets EMFILE
 * naming the limit and is closed; root, another user, still connects. */
static void test_user_connections(void **state)
{
	struct odpd_conn *root;
	int admin;

	(void)state;
	start("[limits]\ndefault-connections = 3\n");
	admin = raw_connect_hello(d.sock);
	assert_int_equal(run_as(UID_NOBODY, 0, nobody_connections, NULL), 0);
	root = odpd_connect(d.sock, NULL);
	assert_non_null(root);
	odpd_disconnect(root);
	wait_idle(admin);                             /* only the admin connection is left */
	close(admin);
	stop();
}

struct flood {
	int ready[2], done[2];
};

static int nobody_refused_flood(void *arg)
{
	struct flood *f = arg;
	struct odpd_conn *c[3];
	int raw[40];
	char b = 0;

	for (int i = 0; i < 3; i++)
		CHILD_CHECK((c[i] = odpd_connect(d.sock, NULL)) != NULL);
	for (int i = 0; i < 40; i++)
		CHILD_CHECK((raw[i] = odpd_wire_connect(d.sock)) >= 0);       /* over the limit, no Hello */
	CHILD_CHECK(write(f->ready[1], &b, 1) == 1);
	CHILD_CHECK(read(f->done[0], &b, 1) == 1);
	for (int i = 0; i < 40; i++)
		close(raw[i]);
	for (int i = 0; i < 3; i++)
		odpd_disconnect(c[i]);
	return 0;
}

/*
 * --max-clients 6, default-connections = 3: uid 65534 holds its 3 and keeps
 * opening connections it never says Hello on. Those take no max-clients
 * slot (at most 4 wait for a Hello, the rest are closed at once), so root
 * still connects.
 */
static void test_refused_take_no_slots(void **state)
{
	struct flood f;
	struct odpd_conn *root;
	pid_t child;
	char b = 0;
	int st, admin;

	(void)state;
	memset(&d, 0, sizeof(d));
	daemon_start_conf(&d, conf_path, sizeof(conf_path), "limits-slots", "[limits]\ndefault-connections = 3\n",
			  "--max-clients", "6");
	admin = raw_connect_hello(d.sock);
	assert_int_equal(pipe(f.ready), 0);
	assert_int_equal(pipe(f.done), 0);
	child = fork();
	assert_true(child >= 0);
	if (child == 0)
		_exit(run_as(UID_NOBODY, 0, nobody_refused_flood, &f));
	assert_int_equal(read(f.ready[0], &b, 1), 1);
	root = odpd_connect(d.sock, NULL);
	if (!root)
		fail_msg("root could not connect while another user flooded: %s", odpd_errmsg());
	odpd_disconnect(root);
	assert_int_equal(write(f.done[1], &b, 1), 1);
	assert_int_equal(waitpid(child, &st, 0), child);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(admin);
	stop();
}

/* ---------------------------------------------------------------- segments and the window */

static int nobody_segments(void *arg)
{
	struct odpd_conn *c = odpd_connect(d.sock, NULL);
	struct odpd_segment *s[2];
	int fd;

	(void)arg;
	CHILD_CHECK(c != NULL);
	CHILD_CHECK((s[0] = odpd_alloc(c, 64 * KIB, 0)) != NULL);
	CHILD_CHECK((s[1] = odpd_alloc(c, 64 * KIB, 0)) != NULL);
	CHILD_CHECK(odpd_alloc(c, 64 * KIB, 0) == NULL);
	CHILD_CHECK(errno == EMFILE);
	CHILD_CHECK(strstr(odpd_errmsg(), "[user 65534] max-segments") != NULL);
	CHILD_CHECK(odpd_detach(s[1]) == 0);
	/* 64 KiB held; 1 MiB more would pass max-mapped = 1M */
	CHILD_CHECK(odpd_alloc(c, 1 * MIB, 0) == NULL);
	CHILD_CHECK(errno == ENOSPC);
	CHILD_CHECK(strstr(odpd_errmsg(), "[user 65534] max-mapped") != NULL);
	/* a sparse memfd costs its sender nothing, but its whole size here */
	fd = memfd_create("sparse", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHILD_CHECK(fd >= 0 && ftruncate(fd, 512 * MIB) == 0);   /* under valgrind max-segment-size is 1G */
	CHILD_CHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) == 0);
	CHILD_CHECK(odpd_attach(c, fd, NULL, 0) == NULL);
	CHILD_CHECK(errno == ENOSPC);
	close(fd);
	/* what fits still does */
	CHILD_CHECK((s[1] = odpd_alloc(c, 512 * KIB, 0)) != NULL);
	CHILD_CHECK(odpd_detach(s[1]) == 0);
	CHILD_CHECK(odpd_detach(s[0]) == 0);
	odpd_disconnect(c);
	return 0;
}

/* max-segments = 2, max-mapped = 1M for uid 65534: EMFILE and ENOSPC naming
 * the rule, a sparse 512 MiB segment refused; root unaffected meanwhile. */
static void test_user_segments_and_window(void **state)
{
	struct odpd_conn *root;
	struct odpd_segment *s[3];
	struct snapshot s0, s1;
	int admin;

	(void)state;
	start("[user 65534]\nmax-segments = 2\nmax-mapped = 1M\n");
	admin = raw_connect_hello(d.sock);
	snapshot_take(&d, admin, &s0);
	root = odpd_connect(d.sock, NULL);
	assert_non_null(root);
	assert_int_equal(run_as(UID_NOBODY, 0, nobody_segments, NULL), 0);
	for (int i = 0; i < 3; i++) {
		s[i] = odpd_alloc(root, 2 * MIB, 0);
		assert_non_null(s[i]);
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(odpd_detach(s[i]), 0);
	odpd_disconnect(root);
	snapshot_settles_to(&d, admin, &s0);
	snapshot_take(&d, admin, &s1);
	assert_int_equal(s1.segments, 0);
	close(admin);
	stop();
}

/* ---------------------------------------------------------------- MR references */

static int nobody_mrs(void *arg)
{
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *m[3];
	uint8_t *p;

	(void)arg;
	/* the daemon's hits (a hit of the library's own costs the daemon nothing) */
	setenv("ODPD_CACHE", "0", 1);
	c = odpd_connect(d.sock, NULL);
	CHILD_CHECK(c != NULL);
	CHILD_CHECK((s = odpd_alloc(c, 64 * KIB, 0)) != NULL);
	p = odpd_segment_addr(s);
	/* ODP: nothing pinned, so only the MR limit can refuse */
	CHILD_CHECK((m[0] = odpd_reg(c, p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND)) != NULL);
	CHILD_CHECK((m[1] = odpd_reg(c, p, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND)) != NULL);
	CHILD_CHECK(odpd_reg(c, p + 4096, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) == NULL);
	CHILD_CHECK(errno == EDQUOT);
	CHILD_CHECK(strstr(odpd_errmsg(), "default-mrs") != NULL);
	/* EDQUOT is also the pinning quota: the message says it is an MR count */
	CHILD_CHECK(strstr(odpd_errmsg(), "per-user limit") != NULL);
	CHILD_CHECK(odpd_dereg(m[1]) == 0);
	CHILD_CHECK((m[2] = odpd_reg(c, p + 4096, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND)) != NULL);
	CHILD_CHECK(odpd_dereg(m[0]) == 0 && odpd_dereg(m[2]) == 0);
	CHILD_CHECK(odpd_detach(s) == 0);
	odpd_disconnect(c);
	return 0;
}

/* default-mrs = 2: a user's third MR reference (a cache hit counts too) is
 * EDQUOT naming the limit, until one is released. */
static void test_user_mrs(void **state)
{
	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start("[limits]\ndefault-mrs = 2\n");
	assert_int_equal(run_as(UID_NOBODY, 0, nobody_mrs, NULL), 0);
	stop();
}

/* Two connections of this process, c[0] and c[1], over one segment of
 * @len bytes written through (c[0]'s, which c[1] attaches at the same
 * address): its address, or NULL if a step failed. */
static uint8_t *ring_pair(struct odpd_conn **c, size_t len)
{
	struct odpd_segment *s;
	uint8_t *p;

	if (!(c[0] = odpd_connect(d.sock, NULL)) || !(c[1] = odpd_connect(d.sock, NULL)) ||
	    !(s = odpd_alloc(c[0], len, 0)))
		return NULL;
	p = odpd_segment_addr(s);
	memset(p, 1, len);
	return odpd_attach(c[1], odpd_segment_fd(s), p, len) ? p : NULL;
}

/*
 * A release written into one connection's release ring counts for a
 * request of another connection of the user (doc/design.md §11): with
 * default-mrs = 2 and both held through c[0], c[0] releases one (the ring:
 * no request) and c[1] registers at once. Without odpd taking the user's
 * rings before its MR limit refuses, that is EDQUOT (the hit timer, which
 * also takes rings, is set to look only once a minute here).
 */
static int nobody_ring_release(void *arg)
{
	struct odpd_conn *c[2];
	struct odpd_mr *m[3];
	uint8_t *p;

	(void)arg;
	CHILD_CHECK((p = ring_pair(c, MIB)) != NULL);
	for (int round = 0; round < 20; round++) {
		CHILD_CHECK((m[0] = odpd_reg(c[0], p, 4096, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK((m[1] = odpd_reg(c[0], p + 8192, 4096, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK(odpd_reg(c[1], p + 16384, 4096, IBV_ACCESS_LOCAL_WRITE) == NULL);
		CHILD_CHECK(errno == EDQUOT);                  /* the limit holds */
		CHILD_CHECK(odpd_dereg(m[0]) == 0);            /* into c[0]'s ring */
		CHILD_CHECK((m[2] = odpd_reg(c[1], p + 16384, 4096, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK(odpd_dereg(m[1]) == 0 && odpd_dereg(m[2]) == 0);
	}
	odpd_disconnect(c[1]);
	odpd_disconnect(c[0]);
	return 0;
}

static void test_user_mrs_ring_release(void **state)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr;
	int admin;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start("[limits]\ndefault-mrs = 2\nrelaxed-window-ms = 60000\n");
	assert_int_equal(run_as(UID_NOBODY, 64 * MIB, nobody_ring_release, NULL), 0);
	/* they went through the ring, not as requests */
	admin = raw_connect_hello(d.sock);
	sr = status_get(admin, &r);
	assert_non_null(sr->cache);
	if (sr->cache->ring_releases < 20)
		fail_msg("%llu releases through release rings, expected at least 20",
			 (unsigned long long)sr->cache->ring_releases);
	odpd__reply__free_unpacked(r, NULL);
	close(admin);
	stop();
}

/*
 * The same for the pinning quota, with a registration of a few bytes that
 * span two pages: default-pinned = 16K, c[0] pins 12K (8K + 4K), c[1]
 * asks for 2 bytes across a page boundary (8K of pages, though 12K + 2
 * bytes is under the limit): EDQUOT, until c[0] releases its 8K through
 * its ring. odpd must count the pages the request spans, not its length,
 * when it decides whether the user's rings could make room.
 */
static int nobody_ring_release_pinned(void *arg)
{
	struct odpd_conn *c[2];
	struct odpd_mr *m[3];
	uint8_t *p;

	(void)arg;
	CHILD_CHECK((p = ring_pair(c, MIB)) != NULL);
	for (int round = 0; round < 10; round++) {
		CHILD_CHECK((m[0] = odpd_reg(c[0], p, 8192, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK((m[1] = odpd_reg(c[0], p + 16384, 4096, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK(odpd_reg(c[1], p + 32767, 2, IBV_ACCESS_LOCAL_WRITE) == NULL);
		CHILD_CHECK(errno == EDQUOT);                  /* the limit holds */
		CHILD_CHECK(odpd_dereg(m[0]) == 0);            /* into c[0]'s ring */
		m[2] = odpd_reg(c[1], p + 32767, 2, IBV_ACCESS_LOCAL_WRITE);
		if (!m[2])
			fprintf(stderr, "round %d: %s\n", round, odpd_errmsg());
		CHILD_CHECK(m[2] != NULL);
		CHILD_CHECK(odpd_dereg(m[1]) == 0 && odpd_dereg(m[2]) == 0);
	}
	odpd_disconnect(c[1]);
	odpd_disconnect(c[0]);
	return 0;
}

static void test_user_pinned_ring_release(void **state)
{
	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start("[limits]\ndefault-pinned = 16K\nrelaxed-window-ms = 60000\n");
	assert_int_equal(run_as(UID_NOBODY, 64 * MIB, nobody_ring_release_pinned, NULL), 0);
	stop();
}

/*
 * The daemon's own limits with the release ring, on one connection: at
 * max-mrs = 3 with three MRs held, a release written into the ring and the
 * next registration on the same connection must succeed. odpd takes that
 * ring before the registration; it may put the deregistration off until
 * the answer is sent (doc/design.md §11) only while it is far from
 * max-mrs and max-pinned, and before a daemon-wide limit could refuse it
 * deregisters what it put off (the red-team found both missing: a ring's
 * worth of headroom was asked with a check that passes whenever the limit
 * is smaller than a ring, and the MRs put off still counted). Then the
 * same against max-pinned = 256K with four 64K MRs, and a registration
 * that fits under max-pinned = 8M only once a released MR is gone.
 */
static int nobody_daemon_limit_ring(void *arg)
{
	unsigned len = *(const unsigned *)arg;
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *m[5];
	uint8_t *p;

	CHILD_CHECK((c = odpd_connect(d.sock, NULL)) != NULL);
	CHILD_CHECK((s = odpd_alloc(c, MIB, 0)) != NULL);
	p = odpd_segment_addr(s);
	memset(p, 1, MIB);
	for (unsigned round = 0; round < 5; round++) {
		unsigned n = len == 4096 ? 3 : 4, i;

		for (i = 0; i < n; i++)
			CHILD_CHECK((m[i] = odpd_reg(c, p + (size_t)i * 65536, len, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK(odpd_reg(c, p + (size_t)n * 65536, len, IBV_ACCESS_LOCAL_WRITE) == NULL);
		CHILD_CHECK(errno == ENOMEM);                  /* the limit holds */
		CHILD_CHECK(odpd_dereg(m[0]) == 0);            /* into the ring */
		m[n] = odpd_reg(c, p + (size_t)n * 65536, len, IBV_ACCESS_LOCAL_WRITE);
		if (!m[n])
			fprintf(stderr, "round %u (%u bytes): %s\n", round, len, odpd_errmsg());
		CHILD_CHECK(m[n] != NULL);
		for (i = 1; i <= n; i++)
			CHILD_CHECK(odpd_dereg(m[i]) == 0);
	}
	odpd_disconnect(c);
	return 0;
}

/* max-pinned = 8M: 4M - 64K and 64K held (far enough from the limit for
 * odpd to put a ring's deregistrations off), the 64K released into the
 * ring, then 4M + 64K asked on the same connection: it fits only once the
 * 64K MR is gone, so odpd must deregister it before max-pinned decides. */
static int nobody_daemon_pinned_ring(void *arg)
{
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *big, *small, *more;
	uint8_t *p;

	(void)arg;
	CHILD_CHECK((c = odpd_connect(d.sock, NULL)) != NULL);
	CHILD_CHECK((s = odpd_alloc(c, 16 * MIB, 0)) != NULL);
	p = odpd_segment_addr(s);
	memset(p, 1, 16 * MIB);
	for (int round = 0; round < 3; round++) {
		CHILD_CHECK((big = odpd_reg(c, p, 4 * MIB - 65536, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK((small = odpd_reg(c, p + 4 * MIB, 65536, IBV_ACCESS_LOCAL_WRITE)) != NULL);
		CHILD_CHECK(odpd_dereg(small) == 0);           /* into the ring */
		more = odpd_reg(c, p + 8 * MIB, 4 * MIB + 65536, IBV_ACCESS_LOCAL_WRITE);
		if (!more)
			fprintf(stderr, "round %d: %s\n", round, odpd_errmsg());
		CHILD_CHECK(more != NULL);
		CHILD_CHECK(odpd_dereg(more) == 0 && odpd_dereg(big) == 0);
	}
	odpd_disconnect(c);
	return 0;
}

static void test_daemon_limit_ring_release(void **state)
{
	unsigned len;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start("[limits]\nmax-mrs = 3\nrelaxed-window-ms = 60000\n");
	len = 4096;
	assert_int_equal(run_as(UID_NOBODY, 64 * MIB, nobody_daemon_limit_ring, &len), 0);
	stop();
	start("[limits]\nmax-pinned = 256K\nrelaxed-window-ms = 60000\n");
	len = 65536;
	assert_int_equal(run_as(UID_NOBODY, 64 * MIB, nobody_daemon_limit_ring, &len), 0);
	stop();
	start("[limits]\nmax-pinned = 8M\nrelaxed-window-ms = 60000\n");
	assert_int_equal(run_as(UID_NOBODY, 64 * MIB, nobody_daemon_pinned_ring, NULL), 0);
	stop();
}

/* A Status from a user who is not an admin: refused (EPERM). */
static int nobody_status(void *arg)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Status st = ODPD__STATUS__INIT;
	Odpd__Reply *r;
	int conn = raw_connect_hello(d.sock);

	(void)arg;
	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &st;
	r = raw_call(conn, 2, &req, NULL, 0);
	CHILD_CHECK(r->status == EPERM);
	odpd__reply__free_unpacked(r, NULL);
	close(conn);
	return 0;
}

/*
 * A registration that asks for more than a limit allows in all is refused
 * whatever was released: odpd takes no ring for it. Were it to take every
 * ring (max-pinned could refuse it), any client could make odpd read every
 * connection's ring with each such request. c[0] writes a release into its
 * ring and sends nothing; c[1] asks to pin 2M under max-pinned = 1M: the
 * release is still c[0]'s to be taken (the kernel still holds the MR). The
 * same for a Status that is refused (not an admin); an admin's Status or
 * MR list takes every ring. (relaxed-window-ms: the hit timer, which takes the
 * rings too, looks once a minute.)
 */
static void test_refused_takes_no_ring(void **state)
{
	struct odpd_conn *c[2];
	struct odpd_mr *m, *keep;
	Odpd__Request lq = ODPD__REQUEST__INIT;
	Odpd__ListMrs lm = ODPD__LIST_MRS__INIT;
	Odpd__Reply *r;
	Odpd__StatusReply *sr;
	uint8_t *p;
	int base, admin;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start("[limits]\nmax-pinned = 1M\nrelaxed-window-ms = 60000\n");
	assert_non_null(p = ring_pair(c, 4 * MIB));
	assert_non_null(keep = odpd_reg(c[0], p + 8192, 4096, IBV_ACCESS_LOCAL_WRITE));
	assert_non_null(m = odpd_reg(c[0], p, 4096, IBV_ACCESS_LOCAL_WRITE));
	base = kernel_mr_count(d.pid);
	assert_int_equal(odpd_dereg(m), 0);             /* into c[0]'s ring */
	assert_int_equal(kernel_mr_count(d.pid), base);
	assert_null(odpd_reg(c[1], p + MIB, 2 * MIB, IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(kernel_mr_count(d.pid), base);  /* not taken for it */
	assert_int_equal(run_as(UID_NOBODY, 0, nobody_status, NULL), 0);
	assert_int_equal(kernel_mr_count(d.pid), base);  /* nor for that */
	/* an admin's MR list takes it first (odpd lists keep alone), and a
	 * Status says it went through the ring */
	admin = raw_connect_hello(d.sock);
	lq.body_case = ODPD__REQUEST__BODY_LIST_MRS;
	lq.list_mrs = &lm;
	r = raw_call(admin, 2, &lq, NULL, 0);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->mrs->n_mrs, 1);
	odpd__reply__free_unpacked(r, NULL);
	assert_int_equal(kernel_mr_count(d.pid), base - 1);
	sr = status_get(admin, &r);
	assert_non_null(sr->cache);
	assert_int_equal(sr->cache->ring_releases, 1);
	odpd__reply__free_unpacked(r, NULL);
	close(admin);
	assert_int_equal(kernel_mr_count(d.pid), base - 1);
	assert_int_equal(odpd_dereg(keep), 0);
	odpd_disconnect(c[1]);
	odpd_disconnect(c[0]);
	stop();
}

/* Is the page at @p mapped in this process (pagemap's present bit)? */
static bool mapped_here(const void *p)
{
	uint64_t e = 0;
	int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	bool ok = fd >= 0 && pread(fd, &e, sizeof(e), (off_t)((uintptr_t)p / 4096 * sizeof(e))) == sizeof(e);

	if (fd >= 0)
		close(fd);
	return ok && (e >> 63 & 1);
}

/*
 * A short registration of fresh pages goes with REG_UNPOPULATED first; the
 * MR limit refuses it (EDQUOT, before odpd looks at residency); libodpd
 * gives back the reference it keeps unused and asks again. That second
 * request has no REG_UNPOPULATED, so the range must have been faulted in
 * here first (this process's memory cgroup pays), not by odpd's pin.
 */
static int nobody_mrs_retry_populates(void *arg)
{
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *m[2];
	uint8_t *p;

	(void)arg;
	/* after setuid: /proc/self/pagemap is root's until dumpable again */
	CHILD_CHECK(prctl(PR_SET_DUMPABLE, 1) == 0);
	c = odpd_connect(d.sock, NULL);
	CHILD_CHECK(c != NULL);
	CHILD_CHECK((s = odpd_alloc(c, MIB, 0)) != NULL);
	CHILD_CHECK(!mapped_here(p = odpd_segment_addr(s)));
	p[0] = 1;
	CHILD_CHECK(mapped_here(p));                         /* pagemap says so */
	p = odpd_segment_addr(s);
	CHILD_CHECK((m[0] = odpd_reg(c, p, 4096, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHILD_CHECK(odpd_dereg_relaxed(m[0]) == 0);        /* kept unused: 1 of 2 */
	CHILD_CHECK((m[1] = odpd_reg(c, p + 4096, 4096, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHILD_CHECK(!mapped_here(p + 64 * KIB));
	CHILD_CHECK((m[0] = odpd_reg(c, p + 64 * KIB, 4096, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHILD_CHECK(mapped_here(p + 64 * KIB));             /* faulted in here, not by odpd */
	CHILD_CHECK(odpd_dereg(m[0]) == 0 && odpd_dereg(m[1]) == 0);
	CHILD_CHECK(odpd_detach(s) == 0);
	odpd_disconnect(c);
	return 0;
}

static void test_user_mrs_retry_populates(void **state)
{
	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start("[limits]\ndefault-mrs = 2\n");
	assert_int_equal(run_as(UID_NOBODY, MIB, nobody_mrs_retry_populates, NULL), 0);
	stop();
}

static int nobody_mrs_concurrent(void *arg)
{
	int a = raw_connect_hello(d.sock), b = raw_connect_hello(d.sock);
	int fa = sealed_memfd(4 << 20), fb = sealed_memfd(4 << 20);
	uint64_t ba = raw_attach(a, 2, fa), bb = raw_attach(b, 2, fb);
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__RegMr m = ODPD__REG_MR__INIT;
	Odpd__Reply *r;
	int refused = 0;

	(void)arg;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &m;
	m.has_addr = m.has_length = m.has_access = 1;
	m.access = ODPD__ACCESS__ACCESS_LOCAL_WRITE;
	m.length = 4096;
	m.addr = ba;                              /* the first reference: held 1 of 2 */
	req.has_id = 1;
	req.id = 3;
	raw_send(a, &req, NULL, 0);
	r = raw_recv(a);
	CHILD_CHECK(r->status == 0);
	odpd__reply__free_unpacked(r, NULL);
	/* two misses at once, 4 MiB of fresh pages each: both pass the check
	 * at the request; only one may be held when they complete */
	m.length = 4 << 20;
	req.id = 4;
	raw_send(a, &req, NULL, 0);
	m.addr = bb;
	raw_send(b, &req, NULL, 0);
	for (int i = 0; i < 2; i++) {
		r = raw_recv(i ? b : a);
		CHILD_CHECK(r->status == 0 || r->status == EDQUOT);
		refused += r->status == EDQUOT;
		odpd__reply__free_unpacked(r, NULL);
	}
	CHILD_CHECK(refused == 1);
	close(a);
	close(b);
	close(fa);
	close(fb);
	return 0;
}

/* default-mrs = 2, one reference held, then two misses on two connections
 * at once: exactly one is refused (EDQUOT), even when both passed the check
 * at the request before either completed. */
static void test_user_mrs_concurrent(void **state)
{
	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start("[limits]\ndefault-mrs = 2\n");
	assert_int_equal(run_as(UID_NOBODY, 64 << 20, nobody_mrs_concurrent, NULL), 0);
	stop();
}

/* ---------------------------------------------------------------- a forked child keeps the socket */

/*
 * A process connects (raw protocol: libodpd would not let a child keep its
 * socket), attaches a segment and forks a child that keeps the socket
 * open; then it exits. odpd closes its connection (and its segment)
 * although the socket is still open in the child.
 */
static void test_connection_ends_with_its_process(void **state)
{
	int admin, pipefd[2];
	struct snapshot s0;
	pid_t a, b = 0;

	(void)state;
	start("");
	admin = raw_connect_hello(d.sock);
	snapshot_take(&d, admin, &s0);
	assert_int_equal(pipe(pipefd), 0);
	a = fork();
	assert_true(a >= 0);
	if (a == 0) {
		int c = raw_connect_hello(d.sock), mfd = sealed_memfd(64 * KIB);
		pid_t child;

		raw_attach(c, 2, mfd);
		close(mfd);
		child = fork();
		if (child == 0) {
			pause();               /* holds the socket until killed */
			_exit(0);
		}
		if (write(pipefd[1], &child, sizeof(child)) != sizeof(child))
			_exit(3);
		_exit(0);                      /* without odpd_disconnect */
	}
	close(pipefd[1]);
	assert_int_equal(read(pipefd[0], &b, sizeof(b)), (ssize_t)sizeof(b));
	close(pipefd[0]);
	assert_int_equal(waitpid(a, NULL, 0), a);
	wait_idle(admin);
	snapshot_settles_to(&d, admin, &s0);
	kill(b, SIGKILL);
	close(admin);
	stop();
}

/* ---------------------------------------------------------------- a flood on few fds */

static long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	p = fgets(buf, sizeof(buf), f);
	fclose(f);
	if (!p || !(p = strrchr(buf, ')')))
		return -1;
	/* after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
	if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (long)(ut + st);
}

/*
 * odpd with RLIMIT_NOFILE 96 (prlimit, so it cannot raise it). A client
 * attaches segments (each keeps an fd in odpd) until odpd refuses with
 * EMFILE "short of file descriptors": it keeps the rest, so a new client
 * still connects and is served. Then 200 connections that never say
 * anything: odpd refuses what it has no fds for and does not spin (under a
 * second of CPU in 2 s; an accept loop failing with EMFILE takes all of
 * them). Once the segments and the flood are gone, attaching works again.
 */
static void test_connection_flood_few_fds(void **state)
{
	const char *old = getenv("ODPD_TEST_WRAPPER");
	struct odpd_segment *segs[128];
	int fds[200], n = 0, nseg = 0;
	struct odpd_conn *c, *hog;
	long t0, t1, hz = sysconf(_SC_CLK_TCK);

	(void)state;
	if (old) {                             /* valgrind: not a wrapper that composes */
		skip();
		return;
	}
	setenv("ODPD_TEST_WRAPPER", "prlimit --nofile=96:96", 1);
	/* one user past its fair share of the fds (which odpd warns about):
	 * what stops it here is odpd's reserve for everyone */
	start("[limits]\ndefault-segments = 1000\ndefault-connections = 16\n");
	unsetenv("ODPD_TEST_WRAPPER");
	hog = odpd_connect(d.sock, NULL);
	assert_non_null(hog);
	while (nseg < 128 && (segs[nseg] = odpd_alloc(hog, 64 * KIB, 0)))
		nseg++;
	assert_true(nseg > 10 && nseg < 128);
	assert_int_equal(errno, EMFILE);
	if (!strstr(odpd_errmsg(), "short of file descriptors"))
		fail_msg("not refused for odpd's fd budget: %s", odpd_errmsg());
	c = odpd_connect(d.sock, NULL);                /* room left for another client */
	if (!c)
		fail_msg("odpd_connect with odpd's segment fds at their limit: %s", odpd_errmsg());
	odpd_disconnect(c);
	{
		/* client-PD mode's cmd_fd, which odpd would keep too: refused
		 * for the budget before anything else is looked at */
		Odpd__Request req;
		Odpd__RegMr m;
		int raw = raw_connect_hello(d.sock), nul = open("/dev/null", O_RDWR | O_CLOEXEC);
		Odpd__Reply *r;

		assert_true(raw >= 0 && nul >= 0);
		raw_client_pd_req(&req, &m, 0x10000, 1);
		r = raw_call(raw, 7, &req, &nul, 1);
		assert_int_equal(r->status, EMFILE);
		if (!strstr(r->message, "short of file descriptors"))
			fail_msg("client-PD cmd_fd: %s", r->message);
		odpd__reply__free_unpacked(r, NULL);
		close(nul);
		close(raw);
	}
	for (int i = 0; i < 200; i++) {
		int fd = odpd_wire_connect(d.sock);
		if (fd >= 0)
			fds[n++] = fd;
	}
	t0 = cpu_ticks(d.pid);
	sleep(2);
	t1 = cpu_ticks(d.pid);
	assert_true(t0 >= 0 && t1 >= 0);
	if (t1 - t0 > hz)
		fail_msg("odpd used %ld ms of CPU in 2 s of a connection flood", (t1 - t0) * 1000 / hz);
	while (n)
		close(fds[--n]);
	while (nseg)
		assert_int_equal(odpd_detach(segs[--nseg]), 0);
	odpd_disconnect(hog);
	for (int tries = 0; !(c = odpd_connect(d.sock, NULL)) && tries < 300; tries++)
		usleep(10000);
	if (!c)
		fail_msg("odpd_connect after the flood: %s", odpd_errmsg());
	assert_non_null(odpd_alloc(c, 64 * KIB, 0));
	odpd_disconnect(c);
	stop();
}

/* ---------------------------------------------------------------- a fair share of the fds */

struct share {
	int ready[2], done[2];
};

/* Connections and segments until odpd says no: every refusal must be the
 * user's own limit, worked out from odpd's fd limit, never odpd's reserve. */
static int nobody_fair_share(void *arg)
{
	struct share *sh = arg;
	struct odpd_conn *c[64];
	struct odpd_segment *seg;
	int nc = 0, ns = 0;
	char b = 0;

	for (; nc < 64; nc++) {
		if (!(c[nc] = odpd_connect(d.sock, NULL)))
			break;
	}
	CHILD_CHECK(nc >= 1);
	if (nc < 64) {
		CHILD_CHECK(errno == EMFILE);
		CHILD_CHECK(strstr(odpd_errmsg(), "default-connections = auto") != NULL);
	}
	for (int i = 0; i < nc; i++) {
		while ((seg = odpd_alloc(c[i], 4096, 0)))
			ns++;
		CHILD_CHECK(errno == EMFILE);
		if (strstr(odpd_errmsg(), "short of file descriptors")) {
			fprintf(stderr, "uid 65534 took odpd's fds: %d connections, %d segments: %s\n", nc,
				ns, odpd_errmsg());
			_exit(3);
		}
		CHILD_CHECK(strstr(odpd_errmsg(), "default-segments = auto") != NULL);
	}
	CHILD_CHECK(write(sh->ready[1], &nc, sizeof(nc)) == sizeof(nc));
	CHILD_CHECK(write(sh->ready[1], &ns, sizeof(ns)) == sizeof(ns));
	CHILD_CHECK(read(sh->done[0], &b, 1) == 1);
	for (int i = 0; i < nc; i++)
		odpd_disconnect(c[i]);                 /* and their segments */
	return 0;
}

/*
 * odpd under RLIMIT_NOFILE 256 (prlimit: it cannot raise it), the [limits]
 * defaults left to odpd: uid 65534 opens connections and attaches segments
 * until refused, and is refused by its own share (a quarter of the fds:
 * EMFILE naming default-connections and default-segments = auto), never
 * because odpd ran short of fds; root then still connects, and attaches as
 * many segments as uid 65534 could.
 */
static void test_user_fair_share_of_fds(void **state)
{
	const char *old = getenv("ODPD_TEST_WRAPPER");
	struct odpd_conn *root[2];
	struct odpd_segment *segs[256];
	struct share sh;
	Odpd__StatusReply *sr;
	Odpd__QuotaInfo *q = NULL;
	Odpd__Reply *r;
	pid_t child;
	int st, nc = 0, ns = 0, fds, admin;
	char b = 0;

	(void)state;
	if (old) {                             /* valgrind: not a wrapper that composes */
		skip();
		return;
	}
	setenv("ODPD_TEST_WRAPPER", "prlimit --nofile=256:256", 1);
	start("");
	unsetenv("ODPD_TEST_WRAPPER");
	assert_int_equal(pipe(sh.ready), 0);
	assert_int_equal(pipe(sh.done), 0);
	child = fork();
	assert_true(child >= 0);
	if (child == 0)
		_exit(run_as(UID_NOBODY, 0, nobody_fair_share, &sh));
	close(sh.ready[1]);
	close(sh.done[0]);
	if (read(sh.ready[0], &nc, sizeof(nc)) != sizeof(nc) || read(sh.ready[0], &ns, sizeof(ns)) != sizeof(ns)) {
		waitpid(child, &st, 0);
		fail_msg("uid 65534's side failed (status %#x)", st);
	}
	fds = fd_count(d.pid);
	print_message("uid 65534 holds %d connections and %d segments; odpd has %d of 256 fds open\n",
		      nc, ns, fds);
	assert_true(ns >= 8 && nc * 9 /* ODPD_FDS_PER_CONNECTION */ + ns <= 256 / 4);
	/* what odpctl status shows: the user's holdings, the fds shared */
	admin = raw_connect_hello(d.sock);
	sr = status_get(admin, &r);
	assert_int_equal(sr->fd_limit, 256);
	for (size_t i = 0; i < sr->n_quotas; i++)
		if (sr->quotas[i]->uid == UID_NOBODY) {
			q = sr->quotas[i];
			assert_int_equal(q->connections, nc);
			assert_int_equal(q->segments, ns);
			assert_int_equal(q->mappings, 3 * ns + 2 * nc);   /* segments, hit tables */
		}
	assert_non_null(q);
	odpd__reply__free_unpacked(r, NULL);
	close(admin);
	/* root is served as if uid 65534 were not there */
	for (int i = 0; i < 2; i++) {
		root[i] = odpd_connect(d.sock, NULL);
		if (!root[i])
			fail_msg("root cannot connect while uid 65534 holds its share: %s", odpd_errmsg());
	}
	for (int i = 0; i < ns; i++) {
		segs[i] = odpd_alloc(root[i % 2], 4096, 0);
		if (!segs[i])
			fail_msg("root's segment %d of %d refused while uid 65534 holds its share: %s", i, ns,
				 odpd_errmsg());
	}
	for (int i = 0; i < ns; i++)
		assert_int_equal(odpd_detach(segs[i]), 0);
	for (int i = 0; i < 2; i++)
		odpd_disconnect(root[i]);
	assert_int_equal(write(sh.done[1], &b, 1), 1);
	assert_int_equal(waitpid(child, &st, 0), child);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	close(sh.ready[0]);
	close(sh.done[1]);
	stop();
}

/* ---------------------------------------------------------------- mappings */

static int nobody_mappings(void *arg)
{
	struct odpd_conn *c;
	struct odpd_segment *s[3];

	(void)arg;
	/* the library's hit table: 2 mappings of 8 */
	c = odpd_connect(d.sock, NULL);
	CHILD_CHECK(c != NULL);
	CHILD_CHECK((s[0] = odpd_alloc(c, 64 * KIB, 0)) != NULL);       /* 3 each */
	CHILD_CHECK((s[1] = odpd_alloc(c, 64 * KIB, 0)) != NULL);
	CHILD_CHECK(odpd_alloc(c, 64 * KIB, 0) == NULL);
	CHILD_CHECK(errno == ENOMEM);
	CHILD_CHECK(strstr(odpd_errmsg(), "mappings") != NULL);
	CHILD_CHECK(strstr(odpd_errmsg(), "default-mappings in odpd.conf") != NULL);
	CHILD_CHECK(strstr(odpd_errmsg(), "uid 65534") != NULL);
	/* given back at detach */
	CHILD_CHECK(odpd_detach(s[1]) == 0);
	CHILD_CHECK((s[2] = odpd_alloc(c, 64 * KIB, 0)) != NULL);
	CHILD_CHECK(odpd_detach(s[2]) == 0 && odpd_detach(s[0]) == 0);
	odpd_disconnect(c);
	return 0;
}

/*
 * default-mappings = 8: the mappings odpd makes for a user (3 per
 * segment, 2 per hit table) are counted; past the limit an attach is
 * ENOMEM naming it; a detach gives them back; root is not bound by it.
 */
static void test_user_mappings(void **state)
{
	struct odpd_conn *root;
	struct odpd_segment *s[4];

	(void)state;
	start("[limits]\ndefault-mappings = 8\n[user 0]\nmax-mappings = unlimited\n");
	assert_int_equal(run_as(UID_NOBODY, 0, nobody_mappings, NULL), 0);
	root = odpd_connect(d.sock, NULL);
	assert_non_null(root);
	for (int i = 0; i < 4; i++)
		assert_non_null(s[i] = odpd_alloc(root, 64 * KIB, 0));
	for (int i = 0; i < 4; i++)
		assert_int_equal(odpd_detach(s[i]), 0);
	odpd_disconnect(root);
	stop();
}

/* ---------------------------------------------------------------- reload */

#define RULES_WIDE "[user 65534]\nmax-pinned = 8M\nmax-mrs = 64\n"
#define RULES_NARROW "[user 65534]\nmax-pinned = 1M\nmax-mrs = 4\n"

static int admin_reload(int admin, const char *text)
{
	static uint64_t id = 5000;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reload rl = ODPD__RELOAD__INIT;
	Odpd__Reply *r;
	FILE *f = fopen(conf_path, "w");
	int status;

	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
	req.body_case = ODPD__REQUEST__BODY_RELOAD;
	req.reload = &rl;
	r = raw_call(admin, ++id, &req, NULL, 0);
	status = (int)r->status;
	odpd__reply__free_unpacked(r, NULL);
	return status;
}

struct reload_sync {
	int to_parent, from_parent;
};

/* Child: MRs charged under the wide rules, kept through a reload to the
 * narrow ones, then registrations racing reloads. */
static int nobody_reload(void *arg)
{
	const struct reload_sync *sy = arg;
	struct odpd_conn *c[2];
	struct odpd_segment *s[2];
	struct odpd_mr *held[2][8] = { { 0 } }, *mr;
	unsigned ok = 0, refused = 0;
	uint32_t crc;
	char b;

	for (int i = 0; i < 2; i++) {
		CHILD_CHECK((c[i] = odpd_connect(d.sock, NULL)) != NULL);
		CHILD_CHECK((s[i] = odpd_alloc(c[i], 4 * MIB, 0)) != NULL);
		memset(odpd_segment_addr(s[i]), i + 1, 4 * MIB);
	}
	/* wide: 3 MiB charged on one connection */
	for (int k = 0; k < 3; k++)
		CHILD_CHECK((held[0][k] = odpd_reg(c[0], (char *)odpd_segment_addr(s[0]) + k * MIB, MIB,
						  IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHILD_CHECK(write(sy->to_parent, "a", 1) == 1);
	CHILD_CHECK(read(sy->from_parent, &b, 1) == 1);
	/* narrow now: what is held stays and works; nothing more fits */
	CHILD_CHECK(odpd_reg(c[1], odpd_segment_addr(s[1]), 64 * KIB, IBV_ACCESS_LOCAL_WRITE) == NULL);
	CHILD_CHECK(errno == EDQUOT);
	CHILD_CHECK(odpd_verify(held[0][1], NULL, 0, &crc) == 0);
	for (int k = 0; k < 3; k++) {
		CHILD_CHECK(odpd_dereg(held[0][k]) == 0);
		held[0][k] = NULL;
	}
	/* released: the account is empty, the narrow limit fits again */
	CHILD_CHECK((mr = odpd_reg(c[1], odpd_segment_addr(s[1]), 512 * KIB, IBV_ACCESS_LOCAL_WRITE)) != NULL);
	CHILD_CHECK(odpd_dereg(mr) == 0);
	CHILD_CHECK(write(sy->to_parent, "b", 1) == 1);
	/* the parent reloads wide and narrow in a loop meanwhile */
	srand(7);
	for (int n = 0; n < 400; n++) {
		int i = rand() % 2, k = rand() % 8;

		if (held[i][k]) {
			CHILD_CHECK((rand() % 2 ? odpd_dereg(held[i][k]) : odpd_dereg_relaxed(held[i][k])) == 0);
			held[i][k] = NULL;
			continue;
		}
		held[i][k] = odpd_reg(c[i], (char *)odpd_segment_addr(s[i]) + (size_t)(rand() % 24) * 128 * KIB,
				      (size_t)(1 + rand() % 8) * 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
		CHILD_CHECK(held[i][k] || errno == EDQUOT);
		if (held[i][k])
			ok++;
		else
			refused++;
	}
	CHILD_CHECK(ok > 0 && refused > 0);
	for (int i = 0; i < 2; i++) {
		for (int k = 0; k < 8; k++)
			if (held[i][k])
				CHILD_CHECK(odpd_dereg_relaxed(held[i][k]) == 0);
		CHILD_CHECK(odpd_flush_relaxed(c[i]) == 0);
		CHILD_CHECK(odpd_detach(s[i]) == 0);
		odpd_disconnect(c[i]);
	}
	return 0;
}

/*
 * Reload while a user holds MRs and registers (issue 23, section 4): MRs
 * charged under rules that a reload narrows stay valid and charged; the
 * user's next registration is refused under the new rule (EDQUOT); once
 * released, the account is empty and the new limit fits. Then 400
 * registrations and releases (some relaxed) on two connections while the
 * rules flip between wide and narrow as fast as the admin socket allows:
 * each is served or refused EDQUOT, and after everything is released the
 * user's account is gone (no pinned byte, MR or connection left charged),
 * odpd pins nothing and the kernel holds no MR of it.
 */
static void test_reload_under_registrations(void **state)
{
	int to_parent[2], from_parent[2], admin, st;
	struct reload_sync sy;
	Odpd__StatusReply *sr;
	Odpd__Reply *r;
	pid_t child;
	char b;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	start(RULES_WIDE);
	admin = raw_connect_hello(d.sock);
	assert_int_equal(pipe(to_parent), 0);
	assert_int_equal(pipe(from_parent), 0);
	sy = (struct reload_sync){ to_parent[1], from_parent[0] };
	child = fork();
	assert_true(child >= 0);
	if (child == 0)
		_exit(run_as(UID_NOBODY, 64 * KIB, nobody_reload, &sy));
	assert_int_equal(read(to_parent[0], &b, 1), 1);
	assert_int_equal(admin_reload(admin, RULES_NARROW), 0);
	assert_int_equal(write(from_parent[1], "n", 1), 1);
	assert_int_equal(read(to_parent[0], &b, 1), 1);
	/* flip the rules until the child is done */
	for (unsigned n = 0; waitpid(child, &st, WNOHANG) == 0; n++)
		assert_int_equal(admin_reload(admin, n % 2 ? RULES_WIDE : RULES_NARROW), 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	wait_idle(admin);
	sr = status_get(admin, &r);
	for (size_t i = 0; i < sr->n_quotas; i++)
		if (sr->quotas[i]->uid == UID_NOBODY)
			fail_msg("uid 65534's account outlives its clients: %llu bytes pinned, %u MRs, "
				 "%u connections", (unsigned long long)sr->quotas[i]->pinned_bytes,
				 sr->quotas[i]->mrs, sr->quotas[i]->connections);
	assert_int_equal(sr->pinned_bytes, 0);
	assert_int_equal(sr->mrs, 0);
	odpd__reply__free_unpacked(r, NULL);
	assert_int_equal(kernel_mr_count(d.pid), 0);
	close(admin);
	for (int i = 0; i < 2; i++) {
		close(to_parent[i]);
		close(from_parent[i]);
	}
	stop();
}

/*
 * odpd_default_conn() (the connection of the rdma_cm mirror) after odpd
 * dropped it, here by restarting: the next call connects again and fails
 * once with ECONNRESET, saying that what was registered through the old
 * connection is gone; the call after that gets the new connection. While
 * no odpd is there, the connect error says the loss too, and the
 * ECONNRESET still comes once odpd is back. The old connection stays dead
 * (ENOTCONN) and is freed with odpd_disconnect().
 */
/* odpd on @sock (not the harness's own socket path): its pid, once it serves. */
static pid_t odpd_on(const char *sock)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		execl(getenv("ODPD_TEST_DAEMON"), "odpd", "--socket", sock, "--no-bus", (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 1200; i++) {
		struct odpd_conn *probe = odpd_connect(sock, NULL);

		if (probe) {
			odpd_disconnect(probe);
			return pid;
		}
		usleep(50000);
	}
	fail_msg("odpd did not serve on %s", sock);
	return -1;
}

static void odpd_off(pid_t pid)
{
	int st;

	kill(pid, SIGTERM);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_default_conn_reconnects(void **state)
{
	struct test_daemon d1 = { 0 };
	pid_t d2;
	struct odpd_conn *c, *c2;
	struct odpd_segment *seg;
	char sock[sizeof(d1.sock)], dir[sizeof(d1.dir)];

	(void)state;
	daemon_start(&d1, NULL);
	memcpy(sock, d1.sock, sizeof(sock));
	memcpy(dir, d1.dir, sizeof(dir));
	assert_int_equal(setenv("ODPD_SOCKET", sock, 1), 0);
	c = odpd_default_conn();
	assert_non_null(c);
	assert_ptr_equal(odpd_default_conn(), c);
	assert_non_null(seg = odpd_alloc(c, 64 * KIB, 0));

	/* odpd goes: the loss is said with the connect error */
	daemon_stop(&d1);
	errno = 0;
	assert_null(odpd_default_conn());
	assert_true(errno == ENOENT || errno == ECONNREFUSED);
	if (!strstr(odpd_errmsg(), "lost before"))
		fail_msg("no word of the lost connection: %s", odpd_errmsg());
	/* odpd is back on the same socket: ECONNRESET once, then the new one */
	d2 = odpd_on(sock);
	errno = 0;
	assert_null(odpd_default_conn());
	assert_int_equal(errno, ECONNRESET);
	if (!strstr(odpd_errmsg(), "registered through the old connection are gone"))
		fail_msg("ECONNRESET without its reason: %s", odpd_errmsg());
	c2 = odpd_default_conn();
	assert_non_null(c2);
	assert_ptr_not_equal(c2, c);
	assert_ptr_equal(odpd_default_conn(), c2);
	errno = 0;
	assert_null(odpd_alloc(c, 64 * KIB, 0));            /* the old one: dead */
	assert_int_equal(errno, ENOTCONN);
	odpd_disconnect(c);                                  /* no longer the default: freed */
	assert_non_null(seg = odpd_alloc(c2, 64 * KIB, 0));
	assert_int_equal(odpd_detach(seg), 0);

	/* a quick restart (down and up between two calls): ECONNRESET at once */
	odpd_off(d2);
	d2 = odpd_on(sock);
	errno = 0;
	assert_null(odpd_default_conn());
	assert_int_equal(errno, ECONNRESET);
	assert_non_null(odpd_default_conn());
	odpd_off(d2);
	rmdir(dir);
	unsetenv("ODPD_SOCKET");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_user_connections),
		cmocka_unit_test(test_refused_take_no_slots),
		cmocka_unit_test(test_user_segments_and_window),
		cmocka_unit_test(test_user_mrs),
		cmocka_unit_test(test_user_mrs_retry_populates),
		cmocka_unit_test(test_user_mrs_ring_release),
		cmocka_unit_test(test_user_pinned_ring_release),
		cmocka_unit_test(test_refused_takes_no_ring),
		cmocka_unit_test(test_daemon_limit_ring_release),
		cmocka_unit_test(test_user_mrs_concurrent),
		cmocka_unit_test(test_connection_ends_with_its_process),
		cmocka_unit_test(test_connection_flood_few_fds),
		cmocka_unit_test(test_user_fair_share_of_fds),
		cmocka_unit_test(test_user_mappings),
		cmocka_unit_test(test_reload_under_registrations),
		cmocka_unit_test(test_default_conn_reconnects),
	};

	if (getenv("ODPD_TEST_FILTER"))
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
