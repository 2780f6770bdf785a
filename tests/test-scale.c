/* SPDX-License-Identifier: MIT */
/*
 * test-scale (VM, stock profile): 1,000 clients at once, from four uids.
 * Each connection says Hello, attaches a 1 MiB segment, writes and registers
 * 64 KiB of it pinned (with remote read), and verifies it once (odpd reads
 * it back with the HCA: the CRC must match). With all of them connected and
 * registered, odpd lists them, the kernel holds their MRs, and another
 * client still registers; when their processes exit all at once, odpd lets
 * go of everything: no client, segment, MR, pin or extra fd is left.
 * bench/run-clients measures the same at up to 10,000 (memory, fds, latency
 * of the other client, the time to let go); this test asserts only what must
 * hold, never a time or a size.
 */
#include <errno.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <cmocka.h>

#include "harness.h"
#include "odpd.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define CLIENTS 1000
#define PROCS 4
#define SEG_BYTES MIB
#define MR_BYTES (64 * KIB)

static const uid_t uids[PROCS] = { 0, 65534, 1000, 1001 };

/* One process of @uid with CLIENTS / PROCS connections; writes one byte to
 * @ready when all are registered and verified (or exits non-zero), then
 * waits for EOF on @go and exits with every connection open. */
static void worker(const char *sock, uid_t uid, int ready, int go)
{
	struct rlimit nofile = { 4096, 4096 }, memlock = { RLIM_INFINITY, RLIM_INFINITY };
	static uint8_t pat[MR_BYTES];
	uint32_t want;
	char b;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	for (size_t i = 0; i < sizeof(pat); i++)
		pat[i] = (uint8_t)(i * 13 + uid);
	want = (uint32_t)crc32(crc32(0L, Z_NULL, 0), pat, sizeof(pat));
	if (setrlimit(RLIMIT_NOFILE, &nofile) < 0 || setrlimit(RLIMIT_MEMLOCK, &memlock) < 0 ||
	    setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 || setresuid(uid, uid, uid) < 0)
		_exit(90);
	for (int i = 0; i < CLIENTS / PROCS; i++) {
		struct odpd_conn *c = odpd_connect(sock, NULL);
		struct odpd_segment *s = c ? odpd_alloc(c, SEG_BYTES, 0) : NULL;
		struct odpd_mr *mr;
		uint32_t crc = 0;

		if (!s) {
			fprintf(stderr, "uid %u, connection %d: %s\n", (unsigned)uid, i, odpd_errmsg());
			_exit(1);
		}
		memcpy(odpd_segment_addr(s), pat, sizeof(pat));
		mr = odpd_reg(c, odpd_segment_addr(s), MR_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		if (!mr || odpd_verify(mr, NULL, 0, &crc) < 0) {
			fprintf(stderr, "uid %u, connection %d: %s\n", (unsigned)uid, i, odpd_errmsg());
			_exit(2);
		}
		if (crc != want) {
			fprintf(stderr, "uid %u, connection %d: verify read CRC %#x, wrote %#x\n",
				(unsigned)uid, i, crc, want);
			_exit(3);
		}
	}
	if (write(ready, "r", 1) != 1)
		_exit(4);
	while (read(go, &b, 1) < 0 && errno == EINTR)
		;
	_exit(0);                            /* every connection at once, as a job ends */
}

static int probe(void *arg)
{
	const char *sock = arg;
	struct odpd_conn *c = odpd_connect(sock, NULL);
	struct odpd_segment *s = c ? odpd_alloc(c, 64 * KIB, 0) : NULL;
	struct odpd_mr *mr = s ? odpd_reg(c, odpd_segment_addr(s), 4 * KIB, IBV_ACCESS_LOCAL_WRITE) : NULL;

	if (!mr || odpd_dereg(mr) < 0)
		return 1;
	odpd_disconnect(c);
	return 0;
}

/* Lines of `odpctl -s SOCK clients` that name a pid of @pids. */
static unsigned odpctl_lists(const char *sock, const pid_t *pids)
{
	const char *odpctl = getenv("ODPD_TEST_ODPCTL");
	char cmd[512], line[512];
	unsigned n = 0;
	FILE *p;

	assert_non_null(odpctl);
	snprintf(cmd, sizeof(cmd), "%s -s %s clients", odpctl, sock);
	p = popen(cmd, "r");
	assert_non_null(p);
	while (fgets(line, sizeof(line), p)) {
		char *t = line;

		for (int f = 0; f < 1 && t; f++)        /* second column: the pid */
			t = strpbrk(t + strspn(t, " "), " ");
		for (int i = 0; t && i < PROCS; i++)
			if (atoi(t) == pids[i])
				n++;
	}
	assert_int_equal(pclose(p), 0);
	return n;
}

static void test_thousand_clients(void **state)
{
	struct rlimit nofile = { 65536, 65536 };
	struct test_daemon d = { 0 };
	char conf[128];
	struct snapshot base, now;
	int ready[2], go[2], admin, st;
	pid_t pids[PROCS];
	char b;
	Odpd__Reply *r;
	Odpd__StatusReply *sr;

	(void)state;
	if (!test_require_device()) {
		skip();
		return;
	}
	/* odpd raises its soft fd limit to this hard one: a quarter each user */
	assert_int_equal(setrlimit(RLIMIT_NOFILE, &nofile), 0);
	/* 250 connections per user: past the default of 64 */
	daemon_start_conf(&d, conf, sizeof(conf), "scale",
			  "[limits]\ndefault-connections = 300\ndefault-segments = 300\n",
			  "--max-clients", "1100");
	admin = raw_connect_hello(d.sock);
	snapshot_take(&d, admin, &base);
	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(go), 0);
	for (int i = 0; i < PROCS; i++) {
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			close(ready[0]);
			close(go[1]);
			worker(d.sock, uids[i], ready[1], go[0]);
		}
	}
	close(ready[1]);
	close(go[0]);
	for (int i = 0; i < PROCS; i++)
		assert_int_equal(read(ready[0], &b, 1), 1);   /* EOF: a worker failed */
	close(ready[0]);

	sr = status_get(admin, &r);
	assert_int_equal(sr->n_clients, CLIENTS + 1);     /* and the admin connection */
	assert_true(sr->mrs >= CLIENTS);
	assert_true(sr->segments >= CLIENTS);
	odpd__reply__free_unpacked(r, NULL);
	assert_true(kernel_mr_count(d.pid) >= CLIENTS);
	assert_int_equal(odpctl_lists(d.sock, pids), CLIENTS);
	assert_int_equal(run_as(2000, 1 << 20, probe, d.sock), 0);   /* a user of its own */

	close(go[1]);                                     /* all exit at once */
	for (int i = 0; i < PROCS; i++) {
		assert_int_equal(waitpid(pids[i], &st, 0), pids[i]);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	wait_idle(admin);
	snapshot_settles_to(&d, admin, &base);
	snapshot_take(&d, admin, &now);
	assert_int_equal(now.clients, 1);
	close(admin);
	daemon_stop(&d);
	unlink(conf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_thousand_clients),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
