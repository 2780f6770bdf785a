/* SPDX-License-Identifier: MIT */
/*
 * A restart that keeps every MR (doc/design.md §12), with systemd's notify
 * socket and fd store faked (harness.h, fake_store): odpd stops on SIGTERM,
 * hands its state and fds to the store, and the next odpd gets them back as
 * systemd passes them (LISTEN_FDS, LISTEN_FDNAMES). The tests/test-systemd
 * tier does the same under a real systemd.
 *
 * On the host (no device) a connection and its segments are kept. In the VM,
 * testbed profile (rxe can import), its MRs too: same keys, the same kernel
 * objects (rdma resource show), and odpd's cache still finds them. Stock
 * profile (rxe cannot import): the stop drops everything as a plain stop does.
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
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "odpd.h"

#define SEG_LEN (1u << 20)
#define MR_LEN (64u << 10)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

/* Can odpd keep MRs here: a device that imports (testbed), or none at all. */
static bool keeps(void)
{
	return !test_require_device() || test_profile_testbed();
}

/* SIGTERM; odpd must exit 0 (after handing over, or after a plain stop). */
static void stop(struct test_daemon *d)
{
	int st;

	assert_int_equal(kill(d->pid, SIGTERM), 0);
	assert_int_equal(waitpid(d->pid, &st, 0), d->pid);
	d->pid = 0;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* Start the next odpd with everything in @st, as systemd would. */
static void restart_from(struct test_daemon *d, struct fake_store *st)
{
	const char *names[FAKE_STORE_MAX];
	int fds[FAKE_STORE_MAX];
	unsigned n;

	pthread_mutex_lock(&st->lock);
	n = st->n;
	for (unsigned i = 0; i < n; i++) {
		fds[i] = fcntl(st->fds[i], F_DUPFD_CLOEXEC, 3);
		names[i] = strdup(st->names[i]);
	}
	pthread_mutex_unlock(&st->lock);
	daemon_pass_fds(fds, names, n);
	daemon_restart(d, NULL);
	for (unsigned i = 0; i < n; i++) {
		close(fds[i]);
		free((char *)names[i]);
	}
}

/* Every MR in the kernel's table, whichever process made it: those a
 * restart kept have no pid any more (doc/restart-facts.md). */
static int kernel_mrs(void)
{
	return test_require_device() ? kernel_res_count("mr", 0) : 0;
}

static bool store_empty(void *arg)
{
	struct fake_store *st = arg;
	bool empty;

	pthread_mutex_lock(&st->lock);
	empty = st->n == 0;
	pthread_mutex_unlock(&st->lock);
	return empty;
}

static void test_restart_keeps_connection(void **state)
{
	struct test_daemon d = { 0 };
	struct fake_store st;
	struct odpd_conn *c;
	struct odpd_segment *seg, *seg2;
	struct odpd_mr *mr = NULL, *again;
	int base_mrs = kernel_mrs(), with_mr;
	uint32_t lkey = 0, rkey = 0;

	(void)state;
	fake_store_start(&st);
	daemon_start(&d, NULL);
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	seg = odpd_alloc(c, SEG_LEN, 0);
	assert_non_null(seg);
	memset(odpd_segment_addr(seg), 0x5a, SEG_LEN);
	if (test_require_device()) {
		mr = odpd_reg(c, odpd_segment_addr(seg), MR_LEN, ACCESS);
		if (!mr)
			fail_msg("odpd_reg: %s", odpd_errmsg());
		lkey = mr->lkey;
		rkey = mr->rkey;
	}
	with_mr = kernel_mrs();
	stop(&d);
	if (!keeps()) {
		/* stock: no import, so nothing was stored and everything went */
		assert_int_equal(fake_store_find(&st, "odpd-state"), -1);
		assert_null(odpd_alloc(c, SEG_LEN, 0));
		assert_int_equal(errno, ENOTCONN);
		assert_int_equal(kernel_mrs(), base_mrs);
		odpd_disconnect(c);
		daemon_restart(&d, NULL);
		fake_store_stop(&st);
		daemon_stop(&d);
		return;
	}
	assert_true(fake_store_find(&st, "odpd-state") >= 0);
	assert_true(fake_store_find(&st, "odpd-conn-") >= 0);
	assert_true(fake_store_find(&st, "odpd-seg-") >= 0);
	if (mr)
		assert_true(fake_store_find(&st, "odpd-ctx-") >= 0);
	/* Between the two: the MRs live on in the stored contexts. */
	assert_int_equal(kernel_mrs(), with_mr);
	restart_from(&d, &st);
	/* The new odpd took everything and left nothing in the store. */
	assert_true(wait_until(store_empty, &st));
	/* The same connection goes on: a new segment, and the old one is known. */
	seg2 = odpd_alloc(c, SEG_LEN, 0);
	if (!seg2)
		fail_msg("odpd_alloc after the restart: %s", odpd_errmsg());
	if (mr) {
		/* odpd's cache still has the MR: the same keys, no new MR */
		again = odpd_reg(c, odpd_segment_addr(seg), MR_LEN, ACCESS);
		if (!again)
			fail_msg("odpd_reg after the restart: %s", odpd_errmsg());
		assert_int_equal(again->lkey, lkey);
		assert_int_equal(again->rkey, rkey);
		assert_int_equal(kernel_mrs(), with_mr);
		assert_int_equal(odpd_dereg(again), 0);
		assert_int_equal(odpd_dereg(mr), 0);
	}
	assert_int_equal(odpd_detach(seg2), 0);
	assert_int_equal(odpd_detach(seg), 0);
	odpd_disconnect(c);
	fake_store_stop(&st);
	daemon_stop(&d);
	/* The kept MR was deregistered by the second odpd: nothing is left. */
	assert_int_equal(kernel_mrs(), base_mrs);
}

/* A state the next odpd cannot read: everything is dropped, nothing leaks. */
static void test_restart_drops_unreadable_state(void **state)
{
	struct test_daemon d = { 0 };
	struct fake_store st;
	struct odpd_conn *c;
	struct odpd_segment *seg;
	int base_mrs = kernel_mrs();

	(void)state;
	if (!keeps())
		skip();
	fake_store_start(&st);
	daemon_start(&d, NULL);
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	seg = odpd_alloc(c, SEG_LEN, 0);
	assert_non_null(seg);
	if (test_require_device())
		assert_non_null(odpd_reg(c, odpd_segment_addr(seg), MR_LEN, ACCESS));
	stop(&d);
	/* Another odpd's state, of a format this one does not read: garbage. */
	{
		int fd = fake_store_find(&st, "odpd-state");
		static const char junk[] = "\x08\xff\xff\xff\x0f not a state";

		assert_true(fd >= 0);
		assert_int_equal(ftruncate(fd, 0), -1);        /* sealed: a reader trusts its size */
		pthread_mutex_lock(&st.lock);
		for (unsigned i = 0; i < st.n; i++)
			if (strcmp(st.names[i], "odpd-state") == 0) {
				int m = memfd_create("junk", MFD_CLOEXEC);

				assert_int_equal(write(m, junk, sizeof(junk)), (ssize_t)sizeof(junk));
				close(st.fds[i]);
				st.fds[i] = m;
			}
		pthread_mutex_unlock(&st.lock);
	}
	restart_from(&d, &st);
	assert_true(wait_until(store_empty, &st));
	/* The connection was closed: ENOTCONN, as after a plain stop. */
	assert_null(odpd_alloc(c, SEG_LEN, 0));
	assert_int_equal(errno, ENOTCONN);
	odpd_disconnect(c);
	/* The kernel objects went with their fds. */
	assert_int_equal(kernel_mrs(), base_mrs);
	/* And the new odpd serves new clients. */
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	odpd_disconnect(c);
	fake_store_stop(&st);
	daemon_stop(&d);
}

/* Without systemd (no notify socket) a stop drops every connection. */
static void test_restart_without_store_drops(void **state)
{
	struct test_daemon d = { 0 };
	struct odpd_conn *c;
	int base_mrs = kernel_mrs();

	(void)state;
	daemon_start(&d, NULL);
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	assert_non_null(odpd_alloc(c, SEG_LEN, 0));
	stop(&d);
	daemon_restart(&d, NULL);
	assert_null(odpd_alloc(c, SEG_LEN, 0));
	assert_int_equal(errno, ENOTCONN);
	odpd_disconnect(c);
	assert_int_equal(kernel_mrs(), base_mrs);
	daemon_stop(&d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_restart_keeps_connection),
		cmocka_unit_test(test_restart_drops_unreadable_state),
		cmocka_unit_test(test_restart_without_store_drops),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
