/* SPDX-License-Identifier: MIT */
/*
 * test-faults (VM): clients killed at random points of their work leave
 * nothing behind. 1,000 client processes, 50 at a time, each looping
 * attach / register (pinned or ODP, some with remote access) / verify /
 * release (some relaxed) / detach until SIGKILLed after a random few ms;
 * afterwards odpd holds no client, segment or MR, the kernel no MR of odpd,
 * and odpd's VmPin, fds and mappings are back at their baseline. Also: odpd
 * restarted under its clients, and the device removed and added back.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "odpd.h"

#define KIB (1ull << 10)
#define CLIENTS 1000
#define AT_ONCE 50

/* Shared with the clients: what they got done before they were killed. */
static struct progress {
	unsigned long attached, registered, verified, released;
	unsigned char connected[CLIENTS];   /* each client, once connected */
} *progress;

static void client_loop(unsigned idx)
{
	unsigned seed = idx + 1;
	struct odpd_conn *c;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	srand(seed);
	c = odpd_connect(test_daemon.sock, NULL);
	if (!c)
		_exit(1);
	__atomic_store_n(&progress->connected[idx], 1, __ATOMIC_RELEASE);
	for (;;) {
		size_t len = (size_t)(1 + rand() % 64) * 4 * KIB;
		struct odpd_segment *s = odpd_alloc(c, len, 0);
		unsigned access = IBV_ACCESS_LOCAL_WRITE;
		struct odpd_mr *mr;
		uint8_t *p;
		uint32_t crc;

		if (!s)
			continue;
		__atomic_fetch_add(&progress->attached, 1, __ATOMIC_RELAXED);
		p = odpd_segment_addr(s);
		memset(p, (int)seed, len);
		if (rand() % 3 == 0)
			access |= IBV_ACCESS_REMOTE_READ;
		if (rand() % 4 == 0)
			access |= IBV_ACCESS_ON_DEMAND;
		mr = odpd_reg(c, p, len, access);
		if (mr) {
			__atomic_fetch_add(&progress->registered, 1, __ATOMIC_RELAXED);
			if (odpd_verify(mr, NULL, 0, &crc) == 0)
				__atomic_fetch_add(&progress->verified, 1, __ATOMIC_RELAXED);
			if ((rand() % 2 ? odpd_dereg_relaxed(mr) : odpd_dereg(mr)) == 0)
				__atomic_fetch_add(&progress->released, 1, __ATOMIC_RELAXED);
		}
		odpd_detach(s);
	}
}

static void test_clients_killed_anywhere(void **state)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Flush fl = ODPD__FLUSH__INIT;
	struct snapshot base, now;
	unsigned started = 0;
	Odpd__Reply *r;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	progress = mmap(NULL, sizeof(*progress), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(progress != MAP_FAILED);
	snapshot_take(&test_daemon, test_admin_fd, &base);
	srand((unsigned)time(NULL));
	while (started < CLIENTS) {
		pid_t pids[AT_ONCE];
		unsigned n = 0;

		for (; n < AT_ONCE && started < CLIENTS; n++, started++) {
			pids[n] = fork();
			assert_true(pids[n] >= 0);
			if (pids[n] == 0)
				client_loop(started);
		}
		for (unsigned i = 0; i < n; i++) {
			unsigned idx = started - n + i;

			/* anywhere in its work: a random while after it connected (how
			 * long connecting takes depends on the machine's load) */
			for (int t = 0; t < 2000 && !__atomic_load_n(&progress->connected[idx],
								   __ATOMIC_ACQUIRE); t++)
				usleep(5000);
			usleep((useconds_t)(rand() % 40000));
			kill(pids[i], SIGKILL);
		}
		for (unsigned i = 0; i < n; i++)
			waitpid(pids[i], NULL, 0);
	}
	/* Relaxed MRs of the dead wait on the invalidation queue: flush them. */
	fl.has_all = 1;
	fl.all = 1;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &fl;
	r = raw_call(test_admin_fd, 9, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	wait_idle(test_admin_fd);
	snapshot_settles_to(&test_daemon, test_admin_fd, &base);
	snapshot_take(&test_daemon, test_admin_fd, &now);
	assert_int_equal(now.kernel_mrs, base.kernel_mrs);
	assert_int_equal(now.vmpin_kb, base.vmpin_kb);
	assert_int_equal(now.daemon_fds, base.daemon_fds);
	print_message("%u clients killed after %lu attaches, %lu registrations, %lu verifies, %lu "
		      "releases; odpd back at baseline: %d fds, %ld kB pinned, %d kernel MRs\n", started,
		      progress->attached, progress->registered, progress->verified, progress->released,
		      now.daemon_fds, now.vmpin_kb, now.kernel_mrs);
	/* the kills must have caught clients at work, not only before connecting */
	assert_true(progress->registered > CLIENTS / 4);
	munmap(progress, sizeof(*progress));
}

/*
 * odpd restarted under its clients: a client's next call fails with
 * ENOTCONN (and says why), nothing of the old instance stays registered in
 * the kernel, and the client connects to the new one and works. (The new
 * odpd listens on a socket of its own test directory: the harness makes
 * one per daemon; an application reconnects to its configured path.)
 */
static void test_restart_under_clients(void **state)
{
	struct test_daemon d1 = { 0 }, d2 = { 0 };
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *mr;
	uint32_t crc;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	daemon_start(&d1, NULL);
	c = odpd_connect(d1.sock, NULL);
	assert_non_null(c);
	s = odpd_alloc(c, 256 * KIB, 0);
	assert_non_null(s);
	mr = odpd_reg(c, odpd_segment_addr(s), 256 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mr);
	assert_true(kernel_mr_count(d1.pid) >= 1);
	assert_true(vmpin_kb(d1.pid) >= 256);
	daemon_stop(&d1);                              /* SIGTERM, clean exit */
	assert_int_equal(kernel_res_count("mr", 0), 0);  /* nothing of the old instance */
	assert_null(odpd_reg(c, odpd_segment_addr(s), 4096, IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(errno, ENOTCONN);
	odpd_disconnect(c);                            /* frees the MR, segment and connection */
	daemon_start(&d2, NULL);
	c = odpd_connect(d2.sock, NULL);
	assert_non_null(c);
	s = odpd_alloc(c, 256 * KIB, 0);
	assert_non_null(s);
	memset(odpd_segment_addr(s), 7, 256 * KIB);
	mr = odpd_reg(c, odpd_segment_addr(s), 256 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mr);
	assert_int_equal(odpd_verify(mr, NULL, 0, &crc), 0);
	assert_int_equal(odpd_dereg(mr), 0);
	assert_int_equal(odpd_detach(s), 0);
	odpd_disconnect(c);
	daemon_stop(&d2);
}

/* Run @cmd (sh -c) and wait up to @timeout_s for it: its exit status, or -1
 * if it did not end (then it is killed). */
static unsigned status_devices(int admin_fd, uint64_t *pinned, unsigned *mrs)
{
	Odpd__Reply *reply = NULL;
	Odpd__StatusReply *st = status_get(admin_fd, &reply);
	unsigned n = (unsigned)st->n_devices;

	*pinned = st->pinned_bytes;
	*mrs = st->mrs;
	odpd__reply__free_unpacked(reply, NULL);
	return n;
}

static bool one_device(void *arg)
{
	uint64_t pinned;
	unsigned mrs;

	return status_devices(*(int *)arg, &pinned, &mrs) == 1;
}

struct mrs_want {
	int admin;
	unsigned mrs;
};

static bool mrs_are(void *arg)
{
	const struct mrs_want *w = arg;
	uint64_t pinned;
	unsigned mrs;

	status_devices(w->admin, &pinned, &mrs);
	return mrs == w->mrs;
}

/*
 * `rdma link delete` while clients hold MRs: odpd closes every context it
 * has on the device (the kernel waits for that: the command returns), the
 * MRs are dead (nothing pinned, none served from the cache), the clients
 * that had anything there get ENODEV once, their releases succeed, others
 * are untouched; `rdma link add` makes the device usable again, on the
 * same connections, without restarting odpd.
 */
static void test_device_removal(void **state)
{
	struct test_daemon d = { 0 };
	struct odpd_conn *a, *b, *idle, *c;
	struct odpd_segment *sa, *sb, *si, *sc;
	struct odpd_mr *mra, *mrb, *mro, *mrc;
	char dev[64], netdev[64], cmd[256];
	uint32_t crc1, crc2;
	uint64_t pinned;
	unsigned mrs;
	int admin;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	rdma_link(dev, netdev);
	daemon_start(&d, NULL);
	admin = raw_connect_hello(d.sock);
	a = odpd_connect(d.sock, NULL);
	b = odpd_connect(d.sock, NULL);
	idle = odpd_connect(d.sock, NULL);
	assert_true(a && b && idle);
	sa = odpd_alloc(a, 1024 * KIB, 0);
	sb = odpd_alloc(b, 256 * KIB, 0);
	si = odpd_alloc(idle, 64 * KIB, 0);
	assert_true(sa && sb && si);
	memset(odpd_segment_addr(sa), 0x5a, 1024 * KIB);
	mra = odpd_reg(a, odpd_segment_addr(sa), 512 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(mra);
	assert_int_equal(odpd_verify(mra, NULL, 0, &crc1), 0);
	/* an ODP MR too, where the device has ODP (rxe does) */
	mro = odpd_reg(a, (char *)odpd_segment_addr(sa) + 512 * KIB, 64 * KIB,
		       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
	/* b releases its MR relaxed: b's library keeps it (odpd takes it back
	 * when unused for a relaxed window, 100 ms here) */
	mrb = odpd_reg(b, odpd_segment_addr(sb), 256 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mrb);
	assert_int_equal(odpd_dereg_relaxed(mrb), 0);
	{
		struct odpd_stats st;
		assert_int_equal(odpd_stats(b, &st, sizeof(st)), 0);
		assert_int_equal(st.cached_mrs, 1);
	}
	assert_true(kernel_mr_count(d.pid) >= 2);
	assert_int_equal(status_devices(admin, &pinned, &mrs), 1);
	assert_true(pinned >= 512 * KIB);               /* b's relaxed MR may be invalidated by now */

	snprintf(cmd, sizeof(cmd), "rdma link delete %s", dev);
	/* Returns only once every context of the device is closed: odpd's too. */
	assert_int_equal(run_cmd(cmd, 60), 0);
	assert_int_equal(status_devices(admin, &pinned, &mrs), 0);
	assert_int_equal(pinned, 0);                    /* dead MRs pin nothing */
	/* a's, until it releases them (and b's kept one, until odpd took it back) */
	assert_true(wait_until(mrs_are, &(struct mrs_want){ admin, mro ? 2 : 1 }));

	/* a and b had MRs there: their next call says so, once */
	errno = 0;                                      /* mra's range: no local hit either */
	assert_null(odpd_reg(a, odpd_segment_addr(sa), 512 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
	assert_int_equal(errno, ENODEV);
	assert_non_null(strstr(odpd_errmsg(), "was removed"));
	assert_non_null(strstr(odpd_errmsg(), dev));
	errno = 0;
	assert_int_equal(odpd_verify(mra, NULL, 0, &crc2), -1);
	assert_int_equal(errno, ENODEV);                /* the daemon: the MR is dead */
	assert_int_equal(odpd_dereg(mra), 0);
	if (mro)
		assert_int_equal(odpd_dereg(mro), 0);
	errno = 0;                                      /* b's library serves nothing dead */
	assert_null(odpd_reg(b, odpd_segment_addr(sb), 4096, IBV_ACCESS_LOCAL_WRITE));
	assert_int_equal(errno, ENODEV);
	/* idle had nothing there: no event; attach and detach still work */
	assert_int_equal(odpd_detach(si), 0);
	si = odpd_alloc(idle, 64 * KIB, 0);
	assert_non_null(si);
	assert_int_equal(status_devices(admin, &pinned, &mrs), 0);
	assert_int_equal(mrs, 0);

	snprintf(cmd, sizeof(cmd), "rdma link add %s type rxe netdev %s", dev, netdev);
	assert_int_equal(run_cmd(cmd, 60), 0);
	/* Found by a rescan once its uverbs node appears (inotify), with no
	 * request asking for it */
	assert_true(wait_until(one_device, &admin));
	mra = odpd_reg(a, odpd_segment_addr(sa), 512 * KIB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	assert_non_null(mra);
	assert_int_equal(odpd_verify(mra, NULL, 0, &crc2), 0);
	assert_int_equal(crc2, crc1);                   /* the same bytes, read by the new device */
	assert_int_equal(status_devices(admin, &pinned, &mrs), 1);
	c = odpd_connect(d.sock, NULL);                 /* a new client sees it too */
	assert_non_null(c);
	sc = odpd_alloc(c, 64 * KIB, 0);
	assert_non_null(sc);
	mrc = odpd_reg(c, odpd_segment_addr(sc), 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_non_null(mrc);
	assert_int_equal(odpd_dereg(mrc), 0);
	assert_int_equal(odpd_dereg(mra), 0);
	odpd_disconnect(c);
	odpd_disconnect(idle);
	odpd_disconnect(b);
	odpd_disconnect(a);
	wait_idle(admin);
	assert_int_equal(kernel_mr_count(d.pid), 0);
	close(admin);
	daemon_stop(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_clients_killed_anywhere, harness_test_setup),
		cmocka_unit_test(test_restart_under_clients),
		cmocka_unit_test(test_device_removal),
		cmocka_unit_test(harness_test_daemon_exits_cleanly),
	};

	if (getenv("ODPD_TEST_FILTER"))
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, harness_group_setup, harness_group_teardown);
}
