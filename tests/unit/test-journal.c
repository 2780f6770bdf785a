/* SPDX-License-Identifier: MIT */
/* Unit tests of daemon/journal.c, with systemd's notify socket faked (a
 * datagram socket of the test's): a journal that can no longer be written
 * (its rewrite failed) leaves the fd store, so that a crash drops everything
 * rather than restoring a state grown stale, and keeps no record growing. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "journal.h"

static char dir[64];
static int notify_sock = -1;
static unsigned builds, fail_from;

static void notify_start(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	snprintf(dir, sizeof(dir), "/tmp/odpd-unit-journal.XXXXXX");
	assert_non_null(mkdtemp(dir));
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/notify", dir);
	notify_sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	assert_true(notify_sock >= 0);
	assert_int_equal(bind(notify_sock, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(setenv("NOTIFY_SOCKET", sa.sun_path, 1), 0);
}

static void notify_stop(void)
{
	char path[128];

	unsetenv("NOTIFY_SOCKET");
	close(notify_sock);
	snprintf(path, sizeof(path), "%s/notify", dir);
	unlink(path);
	rmdir(dir);
}

/* Read what odpd sent so far (closing the fds it stored): was @want among
 * the messages? */
static bool notify_saw(const char *want)
{
	bool seen = false;

	for (;;) {
		char buf[512], ctl[CMSG_SPACE(16 * sizeof(int))];
		struct iovec iov = { buf, sizeof(buf) - 1 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
				     .msg_controllen = sizeof(ctl) };
		ssize_t n = recvmsg(notify_sock, &mh, MSG_CMSG_CLOEXEC);

		if (n < 0)
			break;
		buf[n] = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
				for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
					int fd;

					memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
					close(fd);
				}
		if (strstr(buf, want))
			seen = true;
	}
	return seen;
}

/* odpd_state_build_fn: an empty state, until the fail_from'th call. */
static int build(struct odpd_manager *m, OdpdState__State *st, bool clean)
{
	(void)m;
	(void)clean;
	if (++builds >= fail_from)
		return -EIO;
	st->format = 1;
	return 0;
}

static void test_journal_failed_rewrite(void **state)
{
	char name[64];
	unsigned n;

	(void)state;
	notify_start();
	builds = 0;
	fail_from = 2;                       /* the start's snapshot; not the rewrite's */
	assert_int_equal(odpd_journal_start(NULL, build, 0, 0, 0), 0);
	assert_true(notify_saw("FDNAME=odpd-journal-1"));
	/* records until the journal is rewritten, which fails */
	memset(name, 'p', sizeof(name) - 1);
	name[sizeof(name) - 1] = 0;
	for (n = 0; builds < 2 && n < 1000000; n++) {
		odpd_journal_shared(name, 0);
		odpd_journal_commit(NULL, 0, NULL, 0, false);
		if (n % 4096 == 0)
			(void)notify_saw("");    /* (keep the socket from filling) */
	}
	assert_int_equal(builds, 2);
	/* it left the store: a crash now drops everything (a state grown stale
	 * would bring back what clients released since) */
	assert_true(notify_saw("FDSTOREREMOVE=1\nFDNAME=odpd-journal-1"));
	/* and nothing piles up for it any more */
	odpd_journal_shared(name, 0);
	odpd_journal_commit(NULL, 0, NULL, 0, false);
	assert_false(odpd_journal_pending());
	odpd_journal_stop();
	assert_false(odpd_journal_on());
	notify_stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_journal_failed_rewrite),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
