/* SPDX-License-Identifier: MIT */
/*
 * The protocol and every bad input of the issue, against a real odpd. Each
 * bad request must get an error reply with a message, change nothing (odpd's
 * counts, its open fds, the kernel's MRs and VmPin), and leave the
 * connection usable. Runs on the host (no RDMA device) and in the rxe VM.
 */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>
#include <json.h>

#include "harness.h"
#include "odpd.h"


/* ---------------------------------------------------------------- helpers */

static Odpd__Request status_req(void)
{
	static Odpd__Status st = ODPD__STATUS__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;

	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &st;
	return req;
}

/* The connection still answers a well-formed request. */
static void assert_usable(int fd)
{
	Odpd__Request req = status_req();
	Odpd__Reply *r = raw_call(fd, 999, &req, NULL, 0);

	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
}

static void expect_event_error(int fd, int status)
{
	Odpd__Reply *r = raw_recv(fd);

	assert_int_equal(r->id, 0);
	if (r->status != status)
		fail_msg("expected %s, got %s: %s", strerror(status), strerror(r->status),
			 r->message ? r->message : "");
	assert_non_null(r->message);
	odpd__reply__free_unpacked(r, NULL);
}

static Odpd__Request attach_req(Odpd__AttachSegment *a, uint64_t addr, uint64_t off, uint64_t len)
{
	Odpd__Request req = ODPD__REQUEST__INIT;

	odpd__attach_segment__init(a);
	a->has_client_addr = a->has_file_offset = a->has_length = 1;
	a->client_addr = addr;
	a->file_offset = off;
	a->length = len;
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = a;
	return req;
}

/* Attach @fd and expect @status; the snapshot around it must not change. */
static void attach_refused(int fd, uint64_t addr, uint64_t off, uint64_t len, int status)
{
	Odpd__AttachSegment a;
	Odpd__Request req = attach_req(&a, addr, off, len);
	struct snapshot before, after;
	int conn = raw_connect_hello(test_daemon.sock);

	snapshot_take(&test_daemon, test_admin_fd, &before);
	raw_expect_error(conn, 10, &req, &fd, 1, status);
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	assert_usable(conn);
	close(conn);
}

/* Attach a whole sealed memfd where odpd chooses; returns the reply. */
static Odpd__Reply *attach_ok(int conn, int fd)
{
	Odpd__AttachSegment a;
	Odpd__Request req = attach_req(&a, 0, 0, 0);
	Odpd__Reply *r = raw_call(conn, 20, &req, &fd, 1);

	if (r->status)
		fail_msg("attach: %s: %s", strerror(r->status), r->message);
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_SEGMENT);
	return r;
}

/* ---------------------------------------------------------------- framing */

static void test_request_before_hello(void **state)
{
	Odpd__Request req = status_req();
	int fd = odpd_wire_connect(test_daemon.sock);

	(void)state;
	assert_true(fd >= 0);
	raw_expect_error(fd, 5, &req, NULL, 0, EPROTO);
	close(fd);
	close(raw_connect_hello(test_daemon.sock));
}

static void test_wrong_version(void **state)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello h = ODPD__HELLO__INIT;
	Odpd__Reply *r;
	int fd = odpd_wire_connect(test_daemon.sock);

	(void)state;
	assert_true(fd >= 0);
	h.has_version = 1;
	h.version = 9999;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &h;
	r = raw_call(fd, 3, &req, NULL, 0);
	assert_int_equal(r->status, EPROTONOSUPPORT);
	assert_non_null(strstr(r->message, "9999"));
	/* the frozen part: any client can learn what to speak */
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_HELLO);
	assert_true(r->hello->has_version_min && r->hello->has_version_max);
	assert_int_equal(r->hello->version_min, ODPD_PROTOCOL_VERSION_MIN);
	assert_int_equal(r->hello->version_max, ODPD_PROTOCOL_VERSION_MAX);
	assert_int_equal(r->hello->version, 0);
	odpd__reply__free_unpacked(r, NULL);
	/* still before Hello: no other request is served */
	Odpd__Request st = status_req();
	raw_expect_error(fd, 4, &st, NULL, 0, EPROTO);
	/* the client may retry with a version from the range */
	h.version = ODPD_PROTOCOL_VERSION;
	r = raw_call(fd, 5, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->hello->version, ODPD_PROTOCOL_VERSION);
	odpd__reply__free_unpacked(r, NULL);
	/* and a second Hello is refused */
	raw_expect_error(fd, 6, &req, NULL, 0, EALREADY);
	close(fd);
}

static void test_zero_length_packet(void **state)
{
	int fd = raw_connect_hello(test_daemon.sock);

	(void)state;
	raw_send_bytes(fd, "", 0);
	expect_event_error(fd, EBADMSG);
	assert_usable(fd);
	close(fd);
}

static void test_unparsable_packet(void **state)
{
	static const uint8_t junk[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x99 };
	int fd = raw_connect_hello(test_daemon.sock);

	(void)state;
	raw_send_bytes(fd, junk, sizeof(junk));
	expect_event_error(fd, EBADMSG);
	assert_usable(fd);
	close(fd);
}

static void test_short_packet(void **state)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello h = ODPD__HELLO__INIT;
	uint8_t buf[256];
	size_t len;
	int fd = raw_connect_hello(test_daemon.sock);

	(void)state;
	h.client_name = (char *)"a name long enough to be cut in the middle";
	req.has_id = 1;
	req.id = 77;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &h;
	len = odpd__request__pack(&req, buf);
	raw_send_bytes(fd, buf, len / 2);            /* a valid message, cut short */
	expect_event_error(fd, EBADMSG);
	assert_usable(fd);
	close(fd);
}

/*
 * A request that does not fit in odpd's decoding arena (manager.h,
 * ODPD_ARENA_SIZE, 16 KiB): a Hello with a 40 KiB client name. Its name
 * goes to malloc, and is freed (protocol-valgrind finds a leak), both after
 * the request and when the same bytes cut short fail to parse; the name
 * reaches the client list, cut to what odpd keeps.
 */
static void test_request_past_arena(void **state)
{
	static char name[40 * 1024];
	static uint8_t buf[48 * 1024];
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello h = ODPD__HELLO__INIT;
	Odpd__Reply *r, *sr_reply;
	Odpd__StatusReply *sr;
	bool found = false;
	size_t len;
	int fd;

	(void)state;
	memset(name, 'n', sizeof(name) - 1);
	h.has_version = 1;
	h.version = ODPD_PROTOCOL_VERSION;
	h.client_name = name;
	req.has_id = 1;
	req.id = 41;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &h;
	len = odpd__request__get_packed_size(&req);
	assert_true(len > 40 * 1024 && len <= sizeof(buf));
	odpd__request__pack(&req, buf);

	fd = odpd_wire_connect(test_daemon.sock);
	assert_true(fd >= 0);
	raw_send_bytes(fd, buf, len - 1);        /* the name cut short: not a message */
	expect_event_error(fd, EBADMSG);
	r = raw_call(fd, 42, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	assert_usable(fd);                       /* the next request decodes in the arena */
	sr = status_get(test_admin_fd, &sr_reply);
	for (size_t i = 0; i < sr->n_clients; i++)
		if (sr->clients[i]->name && strncmp(sr->clients[i]->name, "nnnnnnnn", 8) == 0)
			found = true;
	odpd__reply__free_unpacked(sr_reply, NULL);
	assert_true(found);
	close(fd);
}

/* Bytes queued on @fd to be read (all its packets). */
static int inq(int fd)
{
	int n = 0;

	assert_int_equal(ioctl(fd, FIONREAD, &n), 0);
	return n;
}

/*
 * A client that does not read until odpd's socket is full: odpd packs each
 * reply in one buffer of its own and sends it from there, so the replies
 * that must wait are copied into its output queue. They arrive in order,
 * each the answer to its own request.
 */
static void test_replies_queued(void **state)
{
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	int fd = raw_connect_hello(test_daemon.sock);
	unsigned sent = 0, queued = 0;
	int before;

	(void)state;
	d.has_handle = 1;
	req.has_id = 1;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &d;
	/* send one request at a time until its answer stays in odpd, then 8 more */
	while (queued < 9) {
		assert_true(sent < 100000);
		req.id = 100 + sent;
		d.handle = 5000 + sent;
		before = inq(fd);
		raw_send(fd, &req, NULL, 0);
		sent++;
		if (queued) {
			queued++;
			continue;
		}
		for (int i = 0; i < 200 && inq(fd) == before; i++) {   /* 0.2 s */
			struct timespec ts = { 0, 1000 * 1000 };
			nanosleep(&ts, NULL);
		}
		if (inq(fd) == before)
			queued = 1;
	}
	for (unsigned i = 0; i < sent; i++) {
		Odpd__Reply *r = raw_recv(fd);

		if (r->id != 100 + i)
			fail_msg("reply %u of %u: id %llu, expected %u", i, sent, (unsigned long long)r->id,
				 100 + i);
		assert_int_equal(r->status, ENOENT);
		odpd__reply__free_unpacked(r, NULL);
	}
	assert_usable(fd);
	close(fd);
}

static void test_oversized_packet(void **state)
{
	size_t len = ODPD_MAX_PACKET + 4096;
	uint8_t *big = calloc(1, len);
	int fd = raw_connect_hello(test_daemon.sock);
	int sz = (int)len * 2;

	(void)state;
	assert_non_null(big);
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	raw_send_bytes(fd, big, len);
	expect_event_error(fd, EMSGSIZE);
	assert_usable(fd);
	free(big);
	close(fd);
}

static void test_request_id_zero(void **state)
{
	Odpd__Request req = status_req();
	int fd = raw_connect_hello(test_daemon.sock);

	(void)state;
	req.has_id = 1;
	req.id = 0;
	raw_send(fd, &req, NULL, 0);
	expect_event_error(fd, EINVAL);
	assert_usable(fd);
	close(fd);
}

static void test_unknown_request(void **state)
{
	Odpd__Request req = ODPD__REQUEST__INIT;     /* no body: a newer client's request */
	int fd = raw_connect_hello(test_daemon.sock);

	(void)state;
	raw_expect_error(fd, 8, &req, NULL, 0, EOPNOTSUPP);
	assert_usable(fd);
	close(fd);
}

/* An fd where none is expected is refused and closed (no fd leak in odpd). */
static void test_unexpected_fd(void **state)
{
	Odpd__Request req = status_req();
	struct snapshot before, after;
	int fd = raw_connect_hello(test_daemon.sock);
	int memfd = sealed_memfd(4096);

	(void)state;
	snapshot_take(&test_daemon, test_admin_fd, &before);
	raw_expect_error(fd, 9, &req, &memfd, 1, EINVAL);
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	close(memfd);
	close(fd);
}

/* Run @body in a child as uid and gid 65534 (neither root nor in an admin
 * group) and require that it exits 0; skipped unless the tests run as root. */
static void as_nobody_expect_success(int (*body)(void))
{
	int st;
	pid_t pid;

	if (geteuid() != 0)
		skip();
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgid(65534) < 0 || setuid(65534) < 0)
			_exit(10);
		_exit(body());
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

static int status_refused(void)
{
	Odpd__Request req = status_req();
	int fd = raw_connect_hello(test_daemon.sock);
	Odpd__Reply *r = raw_call(fd, 2, &req, NULL, 0);

	return r->status == EPERM && r->message && *r->message ? 0 : 11;
}

/* Status is an admin request: a client that is neither root nor in the
 * admin group gets EPERM (checked from SO_PEERCRED). */
static void test_status_needs_admin(void **state)
{
	(void)state;
	as_nobody_expect_success(status_refused);
	assert_usable(test_admin_fd);                    /* root is admin */
}

static Odpd__Request hello_req(Odpd__Hello *h, bool monitor)
{
	Odpd__Request req = ODPD__REQUEST__INIT;

	odpd__hello__init(h);
	h->has_version = 1;
	h->version = ODPD_PROTOCOL_VERSION;
	h->has_monitor = monitor;
	h->monitor = monitor;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = h;
	return req;
}

/* The number of connections that Status lists as clients, and of monitors. */
static void clients_and_monitors(unsigned *clients, unsigned *monitors)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr = status_get(test_admin_fd, &r);

	*clients = (unsigned)sr->n_clients;
	*monitors = sr->monitors;
	odpd__reply__free_unpacked(r, NULL);
}

/*
 * Hello.monitor leaves a connection out of the clients an operator sees
 * (odpctl clients, status, D-Bus): only admin connections may be monitors.
 * uid 65534 asking gets EPERM with a message and is no monitor; its Hello
 * without it then succeeds, and it is listed. Root may be one.
 */
static void test_monitor_needs_admin(void **state)
{
	Odpd__Hello h;
	Odpd__Request req;
	Odpd__Reply *r;
	unsigned c0, m0, c1, m1;
	int go[2], done[2], st, conn;
	char b = 0;
	pid_t pid;

	(void)state;
	if (geteuid() != 0)
		skip();
	clients_and_monitors(&c0, &m0);
	/* root: a monitor, not listed as a client */
	conn = odpd_wire_connect(test_daemon.sock);
	assert_true(conn >= 0);
	req = hello_req(&h, true);
	r = raw_call(conn, 1, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	clients_and_monitors(&c1, &m1);
	assert_int_equal(c1, c0);
	assert_int_equal(m1, m0 + 1);
	close(conn);

	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(done), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(go[0]);
		close(done[1]);
		if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
			_exit(10);
		conn = odpd_wire_connect(test_daemon.sock);
		if (conn < 0)
			_exit(11);
		req = hello_req(&h, true);
		r = raw_call(conn, 1, &req, NULL, 0);
		if (r->status != EPERM)
			_exit(12);
		if (!r->message || !strstr(r->message, "admin"))
			_exit(13);
		odpd__reply__free_unpacked(r, NULL);
		if (write(go[1], &b, 1) != 1 || read(done[0], &b, 1) != 1)
			_exit(14);
		req = hello_req(&h, false);       /* again, as a client */
		r = raw_call(conn, 2, &req, NULL, 0);
		if (r->status != 0)
			_exit(15);
		odpd__reply__free_unpacked(r, NULL);
		if (write(go[1], &b, 1) != 1 || read(done[0], &b, 1) != 1)
			_exit(16);
		_exit(0);
	}
	close(go[1]);
	close(done[0]);
	/* refused: neither a monitor nor yet a client that said Hello (a
	 * child that stopped early closes the pipe: read says 0) */
	if (read(go[0], &b, 1) != 1) {
		waitpid(pid, &st, 0);
		fail_msg("uid 65534's side failed at step %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
	clients_and_monitors(&c1, &m1);
	assert_int_equal(m1, m0);
	assert_int_equal(write(done[1], &b, 1), 1);
	assert_int_equal(read(go[0], &b, 1), 1);
	clients_and_monitors(&c1, &m1);
	assert_int_equal(m1, m0);
	assert_int_equal(c1, c0 + 1);                  /* listed */
	assert_int_equal(write(done[1], &b, 1), 1);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st))
		fail_msg("uid 65534's side failed at step %d", WEXITSTATUS(st));
	close(go[0]);
	close(done[1]);
}

/* Run as uid 65534 with @groups as supplementary groups and primary gid
 * 12345; return the status of a Status request on @sock. */
static int status_as_nobody(const char *sock, const gid_t *groups, int ngroups)
{
	int st;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		Odpd__Request req = status_req();
		if (setgroups((size_t)ngroups, groups) < 0 || setgid(12345) < 0 || setuid(65534) < 0)
			_exit(100);
		int fd = raw_connect_hello(sock);
		Odpd__Reply *r = raw_call(fd, 2, &req, NULL, 0);
		_exit(r->status);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

/* --admin-group: membership counts as a supplementary group too (SO_PEERGROUPS). */
static void test_admin_group(void **state)
{
	static const char *const args[] = { "--admin-group", "nogroup", NULL };
	const gid_t nogroup = 65534, other = 4242;
	struct test_daemon d = { 0 };

	(void)state;
	if (geteuid() != 0 || !getgrnam("nogroup") || getgrnam("nogroup")->gr_gid != nogroup)
		skip();
	daemon_start(&d, args);
	assert_int_equal(status_as_nobody(d.sock, &nogroup, 1), 0);
	assert_int_equal(status_as_nobody(d.sock, &other, 1), EPERM);
	daemon_stop(&d);
}

/* ---------------------------------------------------------------- segments */

static void test_attach_regular_file(void **state)
{
	char path[] = "/var/tmp/odpd-test-file.XXXXXX";
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	unlink(path);
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	attach_refused(fd, 0, 0, 0, EINVAL);
	close(fd);
}

static void test_attach_pipe(void **state)
{
	int p[2];

	(void)state;
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	attach_refused(p[0], 0, 0, 0, EINVAL);
	close(p[0]);
	close(p[1]);
}

static void test_attach_memfd_without_sealing(void **state)
{
	int fd = memfd_create("no-sealing", MFD_CLOEXEC);

	(void)state;
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	attach_refused(fd, 0, 0, 0, EINVAL);
	close(fd);
}

static void test_attach_memfd_without_seals(void **state)
{
	int fd = memfd_create("no-seals", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	(void)state;
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	attach_refused(fd, 0, 0, 0, EINVAL);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);   /* still one missing */
	attach_refused(fd, 0, 0, 0, EINVAL);
	close(fd);
}

static void test_attach_map_private(void **state)
{
	const size_t len = 1 << 20;
	int fd = sealed_memfd(len);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);

	(void)state;
	assert_true(p != MAP_FAILED);
	attach_refused(fd, (uintptr_t)p, 0, len, EINVAL);
	munmap(p, len);
	close(fd);
}

static void test_attach_unmapped_or_wrong_range(void **state)
{
	const size_t len = 1 << 20;
	int fd = sealed_memfd(len);
	uint8_t *p = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

	(void)state;
	assert_true(p != MAP_FAILED);
	attach_refused(fd, (uintptr_t)p, 0, 2 * len, EINVAL);      /* past the file's end */
	attach_refused(fd, (uintptr_t)p + 4096, 0, len - 4096, EINVAL); /* wrong file offset */
	attach_refused(fd, (uintptr_t)p + 1, 0, 4096, EINVAL);     /* not page aligned */
	attach_refused(fd, UINT64_MAX - 4095, 0, 8192, EINVAL);    /* address + length overflows */
	munmap(p, 2 * len);
	attach_refused(fd, (uintptr_t)p, 0, len, EINVAL);          /* not mapped at all */
	close(fd);
}

static void test_attach_and_detach(void **state)
{
	const size_t len = 4 << 20;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__DetachSegment d = ODPD__DETACH_SEGMENT__INIT;
	struct snapshot before, mid;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	Odpd__Reply *r;

	(void)state;
	snapshot_take(&test_daemon, test_admin_fd, &before);
	r = attach_ok(conn, fd);
	assert_int_equal(r->segment->length, len);
	assert_true(r->segment->iova_is_addr);
	/* the client can map it at the daemon's address */
	void *p = mmap((void *)(uintptr_t)r->segment->addr, len, PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
	assert_ptr_equal(p, (void *)(uintptr_t)r->segment->addr);
	snapshot_take(&test_daemon, test_admin_fd, &mid);
	assert_int_equal(mid.segments, before.segments + 1);
	assert_int_equal(mid.segment_bytes, before.segment_bytes + len);
	d.has_segment = 1;
	d.segment = r->segment->segment;
	odpd__reply__free_unpacked(r, NULL);
	req.body_case = ODPD__REQUEST__BODY_DETACH_SEGMENT;
	req.detach_segment = &d;
	r = raw_call(conn, 21, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	raw_expect_error(conn, 22, &req, NULL, 0, ENOENT);          /* twice */
	/* the reply comes before the worker has unmapped it */
	snapshot_settles_to(&test_daemon, test_admin_fd, &before);
	munmap(p, len);
	close(fd);
	close(conn);
}

/* Rss in kB of odpd's mapping that starts at @addr (/proc/PID/smaps), -1: none. */
static long daemon_rss_kb_at(uint64_t addr)
{
	char path[64], line[256];
	unsigned long start;
	long kb = -1;
	bool in = false;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)test_daemon.pid);
	f = fopen(path, "re");
	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-", &start) == 1 && strchr(line, '-') && strchr(line, ' ') > strchr(line, '-'))
			in = start == addr;
		else if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
			break;
	}
	fclose(f);
	return kb;
}

/*
 * MapSegment: odpd maps its view of pages the client has faulted in (what
 * libodpd's pre-fault policies ask for): just that range, answered when
 * done; refusals for an unknown segment and a range outside it.
 */
static void test_map_segment(void **state)
{
	const size_t len = 4 << 20;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__MapSegment m = ODPD__MAP_SEGMENT__INIT;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	Odpd__Reply *r = attach_ok(conn, fd);
	uint64_t addr = r->segment->addr;
	uint8_t *p;
	long kb;

	(void)state;
	p = mmap((void *)(uintptr_t)addr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
	assert_ptr_equal(p, (void *)(uintptr_t)addr);
	memset(p, 7, len);                               /* resident, charged to us */
	assert_int_equal(daemon_rss_kb_at(addr), 0);     /* odpd never touched its view */
	m.has_segment = m.has_offset = m.has_length = 1;
	m.segment = r->segment->segment;
	odpd__reply__free_unpacked(r, NULL);
	m.offset = 1 << 20;
	m.length = (1 << 20) - 100;                      /* rounded out to pages */
	req.body_case = ODPD__REQUEST__BODY_MAP_SEGMENT;
	req.map_segment = &m;
	r = raw_call(conn, 30, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	kb = daemon_rss_kb_at(addr);
	assert_true(kb >= 1024 && kb <= 1024 + 128);     /* fault-around: a window at most */
	m.offset = 0;
	m.length = 0;                                    /* to the end */
	r = raw_call(conn, 31, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	odpd__reply__free_unpacked(r, NULL);
	assert_int_equal(daemon_rss_kb_at(addr), 4096);
	/* refusals; the connection stays usable */
	m.offset = len;
	raw_expect_error(conn, 32, &req, NULL, 0, EINVAL);
	m.offset = 4096;
	m.length = len;
	raw_expect_error(conn, 33, &req, NULL, 0, EINVAL);
	m.offset = 0;
	m.length = UINT64_MAX;
	raw_expect_error(conn, 34, &req, NULL, 0, EINVAL);
	m.length = 4096;
	m.segment += 1000;
	raw_expect_error(conn, 35, &req, NULL, 0, ENOENT);
	assert_usable(conn);
	munmap(p, len);
	close(fd);
	close(conn);
}

static void test_attach_at_client_address(void **state)
{
	const size_t len = 2 << 20;
	Odpd__AttachSegment a;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	Odpd__Request req = attach_req(&a, (uintptr_t)p + 4096, 4096, len - 4096);
	Odpd__Reply *r;

	(void)state;
	r = raw_call(conn, 30, &req, &fd, 1);
	if (r->status)
		fail_msg("attach: %s", r->message);
	assert_int_equal(r->segment->addr, (uintptr_t)p + 4096);
	assert_int_equal(r->segment->file_offset, 4096);
	odpd__reply__free_unpacked(r, NULL);
	/* the same range again overlaps */
	raw_expect_error(conn, 31, &req, &fd, 1, EEXIST);
	munmap(p, len);
	close(fd);
	close(conn);
}

/* ---------------------------------------------------------------- registration */

static Odpd__Request reg_req(Odpd__RegMr *m, uint64_t addr, uint64_t len, uint32_t access)
{
	Odpd__Request req = ODPD__REQUEST__INIT;

	odpd__reg_mr__init(m);
	m->has_addr = m->has_length = m->has_access = 1;
	m->addr = addr;
	m->length = len;
	m->access = access;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = m;
	return req;
}

static void reg_refused(int conn, uint64_t addr, uint64_t len, uint32_t access, int kind, int status)
{
	Odpd__RegMr m;
	Odpd__Request req = reg_req(&m, addr, len, access);
	struct snapshot before, after;

	if (kind >= 0) {
		m.has_kind = 1;
		m.kind = kind;
	}
	snapshot_take(&test_daemon, test_admin_fd, &before);
	raw_expect_error(conn, 40, &req, NULL, 0, status);
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	assert_usable(conn);
}

/* Does the test daemon have an RDMA device (the VM) or none (the host)? */
static bool has_device(void)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr = status_get(test_admin_fd, &r);
	bool has = sr->n_devices > 0;

	odpd__reply__free_unpacked(r, NULL);
	return has;
}

static void test_reg_bad_ranges_and_flags(void **state)
{
	const size_t len = 1 << 20;
	const uint32_t lw = ODPD__ACCESS__ACCESS_LOCAL_WRITE;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	Odpd__Reply *r = attach_ok(conn, fd);
	uint64_t base = r->segment->addr;

	(void)state;
	odpd__reply__free_unpacked(r, NULL);
	reg_refused(conn, base, len + 4096, lw, -1, EINVAL);             /* past the segment end */
	reg_refused(conn, base + len - 4096, 8192, lw, -1, EINVAL);      /* straddles the end */
	reg_refused(conn, base + 4096, UINT64_MAX - 4096, lw, -1, EINVAL); /* offset + length overflows */
	reg_refused(conn, base, 0, lw, -1, EINVAL);                       /* length 0 */
	reg_refused(conn, base, 4096, 0x100, -1, EINVAL);                 /* unknown access value */
	reg_refused(conn, base, 4096, ODPD__ACCESS__ACCESS_REMOTE_WRITE, -1, EINVAL); /* no local write */
	reg_refused(conn, base, 4096, lw, 77, EINVAL);                    /* unknown MR kind */
	/* implicit ODP: address 0 and length SIZE_MAX only; then a device with the
	 * IMPLICIT cap (rxe has none: EOPNOTSUPP; no device at all: ENODEV) */
	reg_refused(conn, base, 4096, lw, ODPD__MR_KIND__MR_IMPLICIT_ODP, has_device() ? EINVAL : ENODEV);
	reg_refused(conn, 0, UINT64_MAX, lw, ODPD__MR_KIND__MR_IMPLICIT_ODP,
		    has_device() ? EOPNOTSUPP : ENODEV);
	reg_refused(conn, 4096, 4096, lw, -1, EINVAL);                    /* in no segment */
	close(fd);
	close(conn);
}

/*
 * REG_UNPOPULATED (the client did not fault the range in): refused with
 * ENODATA, nothing made, while a page of the range is not resident; served
 * once the client has written its pages. Only for pinned ranges up to
 * HelloReply.resident_check_max (64 KiB): EINVAL otherwise (ODP, implicit
 * ODP, longer).
 */
/*
 * DeregMr.no_reply (issue 26): never answered, not even an error, so the
 * first answer read is the next request's. Three one-way releases sent back
 * to back, then an admin Status on another connection: all three are done
 * by then (odpd reads what a one-way client sent next in the same turn),
 * in odpd's counts and in the kernel's MR table. Repeated: it is about the
 * order in which odpd reads two connections.
 */
static void test_oneway_release(void **state)
{
	const uint32_t lw = ODPD__ACCESS__ACCESS_LOCAL_WRITE;
	const size_t len = 1 << 20;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	Odpd__Reply *r = attach_ok(conn, fd);
	uint64_t base = r->segment->addr, id = 100;
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT, d2 = ODPD__DEREG_MR__INIT;
	Odpd__Request dq = ODPD__REQUEST__INIT, dq2 = ODPD__REQUEST__INIT;
	struct snapshot before, after;
	Odpd__RegMr m;
	Odpd__Request req;
	uint8_t *p;

	(void)state;
	odpd__reply__free_unpacked(r, NULL);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 7, len);
	/* an unknown handle: no answer; then a DeregMr that waits: ENOENT, its own id */
	raw_oneway_dereg_req(&dq, &d, 999999);
	dq.id = ++id;
	raw_send(conn, &dq, NULL, 0);
	d2.has_handle = 1;
	d2.handle = 999998;
	dq2.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	dq2.dereg_mr = &d2;
	raw_expect_error(conn, ++id, &dq2, NULL, 0, ENOENT);
	if (test_require_device()) {
		/* a first MR of the connection opens what odpd keeps until it
		 * disconnects (its PD): before the snapshot */
		req = reg_req(&m, base, 4096, lw);
		r = raw_call(conn, ++id, &req, NULL, 0);
		if (r->status)
			fail_msg("RegMr: %s: %s", strerror(r->status), r->message);
		d2.handle = r->mr->handle;
		odpd__reply__free_unpacked(r, NULL);
		r = raw_call(conn, ++id, &dq2, NULL, 0);
		assert_int_equal(r->status, 0);
		odpd__reply__free_unpacked(r, NULL);
		snapshot_take(&test_daemon, test_admin_fd, &before);
		for (int round = 0; round < 20; round++) {
			uint64_t h[3];

			for (int k = 0; k < 3; k++) {
				req = reg_req(&m, base + (uint64_t)k * 8192, 4096, lw);
				r = raw_call(conn, ++id, &req, NULL, 0);
				if (r->status)
					fail_msg("RegMr: %s: %s", strerror(r->status), r->message);
				h[k] = r->mr->handle;
				odpd__reply__free_unpacked(r, NULL);
			}
			for (int k = 0; k < 3; k++) {
				d.handle = h[k];
				dq.id = ++id;
				raw_send(conn, &dq, NULL, 0);
			}
			snapshot_take(&test_daemon, test_admin_fd, &after);
			if (after.mrs != before.mrs || after.kernel_mrs != before.kernel_mrs)
				fail_msg("round %d: right after three one-way releases, odpd has %u MR(s) and "
					 "the kernel %d, before them %u and %d", round, after.mrs, after.kernel_mrs,
					 before.mrs, before.kernel_mrs);
			snapshot_assert_equal(&before, &after);
		}
	}
	/* none of them was answered: what odpd sent before Status's answer is here */
	assert_int_equal(inq(conn), 0);
	munmap(p, len);
	close(fd);
	close(conn);
}

/* The state letter of @pid in /proc (R, S, T...). */
static char proc_state(pid_t pid)
{
	char path[64], buf[512], *p;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	p = strrchr(buf, ')');
	assert_non_null(p);
	return p[1] == ' ' ? p[2] : 0;
}

static bool daemon_stopped(void *arg)
{
	return proc_state(*(pid_t *)arg) == 't' || proc_state(*(pid_t *)arg) == 'T';
}

static uint64_t status_errors(void)
{
	Odpd__Reply *r;
	uint64_t v = status_get(test_admin_fd, &r)->errors;

	odpd__reply__free_unpacked(r, NULL);
	return v;
}

/*
 * The order of one-way releases across connections when the connection
 * read first had a one-way release queued too: the admin connection sends
 * one (an unknown handle), then another connection one, then the admin
 * connection a Status, all while odpd is stopped. The Status was sent after
 * both releases: it sees both done (each counted in errors). odpd reads
 * the admin connection first (readable first); a Status read there in the
 * same turn, before the other connection's release, would count one.
 */
static void test_oneway_order_across_connections(void **state)
{
	int conn = raw_connect_hello(test_daemon.sock);
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
	Odpd__Request dq = ODPD__REQUEST__INIT, sq = ODPD__REQUEST__INIT;
	Odpd__Status st = ODPD__STATUS__INIT;
	pid_t pid = test_daemon.pid;
	uint64_t errors;
	Odpd__Reply *r;

	(void)state;
	raw_oneway_dereg_req(&dq, &d, 999997);
	sq.has_id = 1;
	sq.id = 5001;
	sq.body_case = ODPD__REQUEST__BODY_STATUS;
	sq.status = &st;
	for (int round = 0; round < 3; round++) {
		errors = status_errors();
		assert_int_equal(kill(pid, SIGSTOP), 0);
		assert_true(wait_until(daemon_stopped, &pid));
		dq.id = 5000;
		raw_send(test_admin_fd, &dq, NULL, 0);
		dq.id = 200 + (uint64_t)round;
		raw_send(conn, &dq, NULL, 0);
		raw_send(test_admin_fd, &sq, NULL, 0);
		assert_int_equal(kill(pid, SIGCONT), 0);
		r = raw_recv(test_admin_fd);
		assert_int_equal(r->id, sq.id);
		assert_int_equal(r->status, 0);
		assert_int_equal(r->body_case, ODPD__REPLY__BODY_STATUS_REPLY);
		if (r->status_reply->errors != errors + 2)
			fail_msg("round %d: a Status sent after two one-way releases on two connections saw %" PRIu64
				 " of them done", round, r->status_reply->errors - errors);
		odpd__reply__free_unpacked(r, NULL);
	}
	assert_int_equal(inq(conn), 0);
	close(conn);
}

/* ---------------------------------------------------------------- release rings */

#define RING_SLOTS 16u
#define RING 8u

struct ring_client {
	int conn, use_fd, gen_fd;
	_Atomic uint64_t *use;
	const _Atomic uint64_t *gen;
	uint64_t tail, id;
};

/* Write @n releases into @rc's ring, as libodpd's hit_ring_push does. */
static void ring_write(struct ring_client *rc, const uint64_t *handles, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		atomic_store(&rc->use[RING_SLOTS + 1 + (rc->tail + i) % RING], handles[i]);
	rc->tail += n;
	atomic_store(&rc->use[RING_SLOTS], rc->tail);
}

/* A request that does nothing on @rc's connection: DeregMr of a handle it
 * never had (ENOENT). odpd takes the ring before it. */
static void ring_poke(struct ring_client *rc)
{
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
	Odpd__Request dq = ODPD__REQUEST__INIT;

	d.has_handle = 1;
	d.handle = 999999;
	dq.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	dq.dereg_mr = &d;
	raw_expect_error(rc->conn, ++rc->id, &dq, NULL, 0, ENOENT);
}

static uint64_t ring_reg(struct ring_client *rc, uint64_t addr)
{
	Odpd__RegMr m;
	Odpd__Request req = reg_req(&m, addr, 4096, ODPD__ACCESS__ACCESS_LOCAL_WRITE);
	Odpd__Reply *r = raw_call(rc->conn, ++rc->id, &req, NULL, 0);
	uint64_t h;

	if (r->status)
		fail_msg("RegMr: %s: %s", strerror(r->status), r->message);
	h = r->mr->handle;
	odpd__reply__free_unpacked(r, NULL);
	return h;
}

struct kernel_count { pid_t pid; int want; };

static bool kernel_count_is(void *arg)
{
	const struct kernel_count *k = arg;

	return kernel_mr_count(k->pid) == k->want;
}

/*
 * The release ring (OpenHitTable.release_ring, doc/design.md §11), on the
 * wire: releases written into the use table's ring are done before the
 * connection's next request (the kernel's MR count says so, no Status
 * asked), by the hit timer when the connection stays quiet, and before an
 * admin Status; odpd's count of taken entries is published; a handle the
 * connection does not hold and a count that breaks the ring's rule are
 * counted in errors and release nothing of anyone's; the daemon goes on
 * serving the connection.
 */
static void test_release_ring(void **state)
{
	const size_t len = 1 << 20;
	struct ring_client rc = { .id = 100 }, other = { .id = 100 };
	struct kernel_count kc = { .pid = test_daemon.pid };
	int fd = sealed_memfd(len), base_mrs;
	Odpd__Reply *r, *sr;
	uint64_t base, h[4], oh, errors;
	uint8_t *p;

	(void)state;
	rc.conn = raw_connect_hello(test_daemon.sock);
	assert_int_equal(raw_open_hit_table_ring(rc.conn, ++rc.id, RING_SLOTS, RING, &rc.use_fd, &rc.use,
						 &rc.gen_fd, &rc.gen), RING);
	assert_int_equal(atomic_load(&rc.gen[RING_SLOTS]), 0);
	r = attach_ok(rc.conn, fd);
	base = r->segment->addr;
	odpd__reply__free_unpacked(r, NULL);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 7, len);
	if (!test_require_device()) {
		/* no MR to release: a handle it never had is an error, counted */
		errors = status_errors();
		ring_write(&rc, (uint64_t[]){ 12345 }, 1);
		ring_poke(&rc);
		assert_int_equal(atomic_load(&rc.gen[RING_SLOTS]), 1);
		assert_int_equal(status_errors(), errors + 1 + 1);   /* (and the poke's ENOENT) */
		goto out;
	}
	/* the connection's first MR opens its PD: before the count */
	h[0] = ring_reg(&rc, base);
	base_mrs = kernel_mr_count(test_daemon.pid);
	for (int k = 1; k < 4; k++)
		h[k] = ring_reg(&rc, base + (uint64_t)k * 8192);
	assert_int_equal(kernel_mr_count(test_daemon.pid), base_mrs + 3);

	/* before the connection's next request */
	ring_write(&rc, h + 1, 3);
	ring_poke(&rc);
	assert_int_equal(atomic_load(&rc.gen[RING_SLOTS]), 3);
	assert_int_equal(kernel_mr_count(test_daemon.pid), base_mrs);

	/* quiet: the hit timer takes it (relaxed-window-ms, 100 by default) */
	h[1] = ring_reg(&rc, base + 8192);
	ring_write(&rc, h + 1, 1);
	kc.want = base_mrs;
	if (!wait_until(kernel_count_is, &kc))
		fail_msg("a release written into a quiet connection's ring was not done within 20 s");
	assert_int_equal(atomic_load(&rc.gen[RING_SLOTS]), 4);

	/* before an admin Status, on another connection */
	h[1] = ring_reg(&rc, base + 8192);
	ring_write(&rc, h + 1, 1);
	sr = NULL;
	(void)status_get(test_admin_fd, &sr);
	odpd__reply__free_unpacked(sr, NULL);
	assert_int_equal(kernel_mr_count(test_daemon.pid), base_mrs);

	/* another connection's MR, named by its handle in this ring: this
	 * connection has no such reference (handles are the connection's),
	 * so nothing goes, and it is counted */
	other.conn = raw_connect_hello(test_daemon.sock);
	r = attach_ok(other.conn, fd);
	odpd__reply__free_unpacked(r, NULL);
	oh = ring_reg(&other, base + 65536);
	while (oh <= h[0] || oh == 999999)       /* a number this connection does not hold */
		oh = ring_reg(&other, base + 65536);
	base_mrs = kernel_mr_count(test_daemon.pid);
	errors = status_errors();
	ring_write(&rc, (uint64_t[]){ oh + 1000, 999999 }, 2);
	ring_poke(&rc);
	assert_int_equal(status_errors(), errors + 2 + 1);   /* (and the poke's ENOENT) */
	assert_int_equal(kernel_mr_count(test_daemon.pid), base_mrs);

	/* a count more than a ring ahead: nothing taken, counted, and the ring
	 * works on from odpd's count */
	errors = status_errors();
	rc.tail += RING + 5;
	atomic_store(&rc.use[RING_SLOTS], rc.tail);
	ring_poke(&rc);
	assert_int_equal(status_errors(), errors + 1 + 1);
	assert_int_equal(atomic_load(&rc.gen[RING_SLOTS]), rc.tail);
	assert_int_equal(kernel_mr_count(test_daemon.pid), base_mrs);
	h[1] = ring_reg(&rc, base + 8192);
	ring_write(&rc, h + 1, 1);
	ring_poke(&rc);
	assert_int_equal(kernel_mr_count(test_daemon.pid), base_mrs);
	close(other.conn);
out:
	assert_int_equal(inq(rc.conn), 0);
	munmap(rc.use, 4096);
	munmap((void *)rc.gen, 4096);
	close(rc.use_fd);
	close(rc.gen_fd);
	munmap(p, len);
	close(fd);
	close(rc.conn);
}

static void test_reg_unpopulated(void **state)
{
	const uint32_t lw = ODPD__ACCESS__ACCESS_LOCAL_WRITE, flag = ODPD__REG_FLAGS__REG_UNPOPULATED;
	const size_t len = 1 << 20;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	Odpd__Reply *r = attach_ok(conn, fd);
	uint64_t base = r->segment->addr;
	Odpd__RegMr m;
	Odpd__Request req;
	struct snapshot before, after;
	uint8_t *p;

	(void)state;
	odpd__reply__free_unpacked(r, NULL);
	req = reg_req(&m, base + 8192, 8192, lw);
	m.has_flags = 1;
	m.flags = flag;
	snapshot_take(&test_daemon, test_admin_fd, &before);
	raw_expect_error(conn, 41, &req, NULL, 0, test_require_device() ? ENODATA : ENODEV);
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	/* the client writes the pages: resident, registered */
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p + 8192, 5, 8192);
	req.id = 42;
	req.has_id = 1;
	r = raw_call(conn, 42, &req, NULL, 0);
	assert_int_equal(r->status, test_require_device() ? 0 : ENODEV);
	odpd__reply__free_unpacked(r, NULL);
	/* too long for the flag, or ODP */
	req = reg_req(&m, base, 128 * 1024, lw);
	m.has_flags = 1;
	m.flags = flag;
	if (test_require_device()) {
		raw_expect_error(conn, 43, &req, NULL, 0, EINVAL);
		m.length = 4096;
		m.has_kind = 1;
		m.kind = ODPD__MR_KIND__MR_ODP;
		raw_expect_error(conn, 44, &req, NULL, 0, EINVAL);
	}
	/* implicit ODP (no range to look at): EINVAL too, not ignored */
	req = reg_req(&m, 0, UINT64_MAX, lw);
	m.has_flags = m.has_kind = 1;
	m.flags = flag;
	m.kind = ODPD__MR_KIND__MR_IMPLICIT_ODP;
	raw_expect_error(conn, 45, &req, NULL, 0, EINVAL);
	munmap(p, len);
	close(fd);
	close(conn);                             /* odpd releases the MR */
	wait_idle(test_admin_fd);
}

/* A segment sealed against writes may only be registered read-only. */
static void test_reg_write_on_read_only_segment(void **state)
{
	const size_t len = 1 << 20;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	Odpd__Reply *r;

	(void)state;
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
	r = attach_ok(conn, fd);
	reg_refused(conn, r->segment->addr, 4096, ODPD__ACCESS__ACCESS_LOCAL_WRITE, -1, EACCES);
	odpd__reply__free_unpacked(r, NULL);
	close(fd);
	close(conn);
}

/*
 * A client that does not wait for its answers: a registration (a job on a
 * worker, with a device), a Status and a second registration sent back to
 * back. odpd serves one request of a connection at a time and answers in
 * order; the packets that arrive while the job runs wait (the read event
 * is paused only then) and are served after it.
 */
static void test_pipelined_requests(void **state)
{
	Odpd__RegMr m1, m2;
	Odpd__Status st = ODPD__STATUS__INIT;
	Odpd__Request sreq = ODPD__REQUEST__INIT;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(1 << 20);
	Odpd__Reply *r = attach_ok(conn, fd);
	Odpd__Request req1 = reg_req(&m1, r->segment->addr, 64 * 1024, 0);
	Odpd__Request req2 = reg_req(&m2, r->segment->addr + 64 * 1024, 64 * 1024, 0);
	const uint64_t ids[3] = { 61, 62, 63 };

	(void)state;
	odpd__reply__free_unpacked(r, NULL);
	sreq.body_case = ODPD__REQUEST__BODY_STATUS;
	sreq.status = &st;
	req1.id = ids[0];
	req1.has_id = 1;
	sreq.id = ids[1];
	sreq.has_id = 1;
	req2.id = ids[2];
	req2.has_id = 1;
	raw_send(conn, &req1, NULL, 0);
	raw_send(conn, &sreq, NULL, 0);
	raw_send(conn, &req2, NULL, 0);
	for (int i = 0; i < 3; i++) {
		r = raw_recv(conn);
		assert_int_equal(r->id, ids[i]);
		if (i == 1)
			assert_int_equal(r->status, 0);
		else
			assert_int_equal(r->status, test_require_device() ? 0 : ENODEV);
		odpd__reply__free_unpacked(r, NULL);
	}
	close(fd);
	close(conn);                             /* odpd releases both MRs */
	wait_idle(test_admin_fd);
}

static void test_reg_without_device(void **state)
{
	Odpd__RegMr m;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(1 << 20);
	Odpd__Reply *r = attach_ok(conn, fd);
	Odpd__Request req = reg_req(&m, r->segment->addr, 4096, 0);

	(void)state;
	odpd__reply__free_unpacked(r, NULL);
	if (test_require_device())               /* with a device: an unknown device name */
		m.device = (char *)"no-such-device";
	raw_expect_error(conn, 50, &req, NULL, 0, ENODEV);
	close(fd);
	close(conn);
}

/* Client-PD mode with an fd that is not a uverbs device: refused before
 * any ioctl could reach it. */
static void test_client_pd_not_uverbs(void **state)
{
	const size_t len = 1 << 20;
	Odpd__RegMr m;
	int conn = raw_connect_hello(test_daemon.sock);
	int fd = sealed_memfd(len);
	Odpd__Reply *r = attach_ok(conn, fd);
	Odpd__Request req = reg_req(&m, r->segment->addr, 4096, ODPD__ACCESS__ACCESS_LOCAL_WRITE);
	int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
	struct snapshot before, after;

	(void)state;
	odpd__reply__free_unpacked(r, NULL);
	m.has_client_pd = m.has_client_pd_handle = 1;
	m.client_pd = 1;
	snapshot_take(&test_daemon, test_admin_fd, &before);
	raw_expect_error(conn, 60, &req, &devnull, 1, EINVAL);
	raw_expect_error(conn, 61, &req, NULL, 0, EINVAL);           /* no fd at all */
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
	close(devnull);
	close(fd);
	close(conn);
}

/*
 * Can uid 65534 reopen @fd read-write through /proc/self/fd? Tried in a
 * child, which drops root first (a client of another uid than odpd's):
 * the errno of the open, 0 if it succeeded. Root only.
 */
static int reopen_rw_unprivileged(int fd)
{
	char path[64];
	int status;
	pid_t pid;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int rw;

		if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
		    setresuid(65534, 65534, 65534) < 0)
			_exit(100);
		rw = open(path, O_RDWR | O_CLOEXEC);
		_exit(rw >= 0 ? 0 : errno > 0 && errno < 100 ? errno : 101);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_true(WEXITSTATUS(status) < 100);
	return WEXITSTATUS(status);
}

/*
 * OpenHitTable (libodpd's own registration cache): what odpd refuses (no fd,
 * a pipe, a memfd not sealed against shrinking, one too small for its
 * slots, a second table), with nothing left behind; and that the generation
 * table it hands out can never be written by the client, however it tries:
 * its fd is a read-only description of a 0600 memfd of odpd's.
 */
static void test_hit_table(void **state)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__OpenHitTable o = ODPD__OPEN_HIT_TABLE__INIT;
	struct snapshot s0, s1;
	int conn = raw_connect_hello(test_daemon.sock);
	int p[2], fd, use, gen = -1, mem;
	struct stat st;
	volatile uint64_t *ro;
	uint64_t *priv, word = 0x4141414141414141ull;
	Odpd__Reply *r;

	(void)state;
	snapshot_take(&test_daemon, test_admin_fd, &s0);
	o.has_slots = 1;
	o.slots = 64;                                  /* 512 bytes of use table */
	req.body_case = ODPD__REQUEST__BODY_OPEN_HIT_TABLE;
	req.open_hit_table = &o;
	raw_expect_error(conn, 2, &req, NULL, 0, EINVAL);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	raw_expect_error(conn, 3, &req, &p[0], 1, EINVAL);
	close(p[0]);
	close(p[1]);
	fd = memfd_create("use-unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_int_equal(ftruncate(fd, 4096), 0);
	raw_expect_error(conn, 4, &req, &fd, 1, EINVAL);
	close(fd);
	fd = sealed_memfd(256);
	raw_expect_error(conn, 5, &req, &fd, 1, EINVAL);
	close(fd);
	snapshot_take(&test_daemon, test_admin_fd, &s1);
	snapshot_assert_equal(&s0, &s1);

	use = sealed_memfd(4096);
	r = raw_call_fd(conn, 6, &req, &use, 1, &gen);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_HIT_TABLE);
	assert_int_equal(r->hit_table->slots, 64);
	assert_true(r->hit_table->has_events_slot);      /* the events word: none sent yet */
	assert_int_equal(r->hit_table->events_slot, 1);
	odpd__reply__free_unpacked(r, NULL);
	assert_true(gen >= 0);
	raw_expect_error(conn, 7, &req, &use, 1, EALREADY);
	close(use);

	/* a read-only description of a memfd that cannot change size: no
	 * writable shared mapping, no write, no resize, no new seal */
	assert_int_equal(fcntl(gen, F_GETFL) & O_ACCMODE, O_RDONLY);
	assert_int_equal(fcntl(gen, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_int_equal(fstat(gen, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(st.st_uid, geteuid());       /* odpd's (the test runs it as itself) */
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, gen, 0) == MAP_FAILED);
	assert_int_equal(errno, EACCES);
	assert_int_equal(write(gen, &word, sizeof(word)), -1);
	assert_int_equal(errno, EBADF);
	assert_int_equal(ftruncate(gen, 1 << 20), -1);
	assert_true(errno == EINVAL || errno == EBADF);
	assert_int_equal(fcntl(gen, F_ADD_SEALS, F_SEAL_WRITE), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(fcntl(gen, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
	assert_int_equal(errno, EPERM);
	/* reopened read-write through /proc by another uid than odpd's (which
	 * is the test's): no. (Root may: it overrides the mode.) */
	if (geteuid() == 0)
		assert_int_equal(reopen_rw_unprivileged(gen), EACCES);
	else
		print_message("not root: reopening under another uid not tried\n");
	/* a read-only mapping stays read-only, even to /proc/self/mem's forced write */
	ro = mmap(NULL, 4096, PROT_READ, MAP_SHARED, gen, 0);
	assert_true(ro != MAP_FAILED);
	assert_int_equal(mprotect((void *)ro, 4096, PROT_READ | PROT_WRITE), -1);
	assert_int_equal(errno, EACCES);
	mem = open("/proc/self/mem", O_RDWR | O_CLOEXEC);
	assert_true(mem >= 0);
	assert_int_equal(pwrite(mem, &word, sizeof(word), (off_t)(uintptr_t)&ro[1]), -1);
	close(mem);
	/* a private copy is the client's own: the daemon's words do not change */
	priv = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, gen, 0);
	assert_true(priv != MAP_FAILED);
	priv[1] = word;
	assert_int_not_equal(ro[1], word);
	munmap(priv, 4096);
	munmap((void *)ro, 4096);
	close(gen);
	close(conn);
}

#define HUGE_USE "odpd-test-huge-use"
#define HUGE_SEG "odpd-test-huge-seg"

/* A hugetlb memfd (MFD_HUGETLB) of @size bytes named @name, sealed against
 * shrinking and growing; -1 if the kernel has none to give. */
static int huge_memfd(const char *name, size_t size)
{
	int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);

	if (fd < 0)
		return -1;
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	return fd;
}

struct named_maps {
	const char *name;
	int want;
};

static bool named_maps_are(void *arg)
{
	const struct named_maps *n = arg;

	return maps_named(test_daemon.pid, n->name, NULL) == n->want;
}

/*
 * A use table in a hugetlb memfd: the kernel would round odpd's mapping of
 * it up to the huge page, and odpd unmaps only the table's length, which
 * fails (EINVAL) and left the mapping behind for every connection, while the
 * user's mapped-bytes charge was given back. odpd refuses it (EINVAL, saying
 * MFD_HUGETLB), and nothing of it stays mapped in odpd.
 */
static void test_hit_table_hugetlb(void **state)
{
	const size_t huge = 2 << 20;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__OpenHitTable o = ODPD__OPEN_HIT_TABLE__INIT;
	struct named_maps none = { HUGE_USE, 0 };
	struct snapshot s0, s1;
	int status[4], mapped = 0;
	char msg[4][256];

	(void)state;
	if (!hugepages_free(1)) {
		skip();
		return;
	}
	snapshot_take(&test_daemon, test_admin_fd, &s0);
	o.has_slots = 1;
	o.slots = 64;
	req.body_case = ODPD__REQUEST__BODY_OPEN_HIT_TABLE;
	req.open_hit_table = &o;
	for (int i = 0; i < 4; i++) {
		int conn = raw_connect_hello(test_daemon.sock), use = huge_memfd(HUGE_USE, huge), gen = -1;
		Odpd__Reply *r;

		assert_true(use >= 0);
		r = raw_call_fd(conn, 2, &req, &use, 1, &gen);
		status[i] = r->status;
		snprintf(msg[i], sizeof(msg[i]), "%s", r->message ? r->message : "");
		odpd__reply__free_unpacked(r, NULL);
		mapped += maps_named(test_daemon.pid, HUGE_USE, NULL);
		if (gen >= 0)
			close(gen);
		close(use);
		close(conn);
	}
	wait_idle(test_admin_fd);
	/* what odpd mapped of the tables is gone with their connections */
	wait_until(named_maps_are, &none);
	if (maps_named(test_daemon.pid, HUGE_USE, NULL) != 0)
		fail_msg("odpd still maps %d hugetlb use table(s) of closed connections (%d were mapped)",
			 maps_named(test_daemon.pid, HUGE_USE, NULL), mapped);
	for (int i = 0; i < 4; i++) {
		if (status[i] != EINVAL)
			fail_msg("a hugetlb use table: expected EINVAL, got %s: %s", strerror(status[i]), msg[i]);
		if (!strstr(msg[i], "MFD_HUGETLB"))
			fail_msg("the refusal does not say what to change: %s", msg[i]);
	}
	snapshot_take(&test_daemon, test_admin_fd, &s1);
	snapshot_assert_equal(&s0, &s1);
	hugepages_restore();
}

/*
 * A hugetlb segment (doc/design.md §2) is legitimate: odpd maps whole huge
 * pages of it, counts them (segment bytes: the whole 2 MiB, whatever length
 * the client attached), and unmaps exactly them at detach: at a client
 * address with a length of one small page, and in the window.
 */
static void test_attach_hugetlb(void **state)
{
	const size_t huge = 2 << 20;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__DetachSegment d = ODPD__DETACH_SEGMENT__INIT;
	struct named_maps none = { HUGE_SEG, 0 };
	struct snapshot s0, s1;
	uint64_t bytes;
	int conn, fd;
	void *p;
	Odpd__Reply *r;

	(void)state;
	if (!hugepages_free(1)) {
		skip();
		return;
	}
	conn = raw_connect_hello(test_daemon.sock);
	fd = huge_memfd(HUGE_SEG, huge);
	assert_true(fd >= 0);
	p = mmap(NULL, huge, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	snapshot_take(&test_daemon, test_admin_fd, &s0);
	for (int where = 0; where < 2; where++) {
		Odpd__AttachSegment a;
		Odpd__Request at = where ? attach_req(&a, 0, 0, 0) : attach_req(&a, (uintptr_t)p, 0, 4096);

		r = raw_call(conn, 10 + (uint64_t)where, &at, &fd, 1);
		if (r->status)
			fail_msg("attach of a hugetlb segment (%s): %s", where ? "window" : "client address",
				 r->message);
		assert_int_equal(r->segment->length, where ? huge : 4096);
		d.has_segment = 1;
		d.segment = r->segment->segment;
		odpd__reply__free_unpacked(r, NULL);
		snapshot_take(&test_daemon, test_admin_fd, &s1);
		assert_int_equal(s1.segment_bytes, s0.segment_bytes + huge);
		/* the segment and its witness view, whole huge pages */
		assert_int_equal(maps_named(test_daemon.pid, HUGE_SEG, &bytes), 2);
		assert_int_equal(bytes, 2 * huge);
		req.body_case = ODPD__REQUEST__BODY_DETACH_SEGMENT;
		req.detach_segment = &d;
		r = raw_call(conn, 20 + (uint64_t)where, &req, NULL, 0);
		assert_int_equal(r->status, 0);
		odpd__reply__free_unpacked(r, NULL);
		snapshot_settles_to(&test_daemon, test_admin_fd, &s0);
		wait_until(named_maps_are, &none);
		assert_int_equal(maps_named(test_daemon.pid, HUGE_SEG, NULL), 0);
	}
	munmap(p, huge);
	close(fd);
	close(conn);
	hugepages_restore();
}

/* Where shmem uses transparent huge pages, st_blksize says 2 MiB, but a
 * mapping of a memfd is still made of small pages: a segment attached at a
 * small-page boundary is accepted, and counted in small pages. Only in the
 * VM (a setting of the whole machine). */
static void test_attach_shmem_thp(void **state)
{
	const char *knob = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";
	const size_t len = 64 << 10;
	char old[128] = "", *sel, *end;
	struct snapshot s0, s1;
	int conn, fd;
	uint8_t *p;
	FILE *f;
	Odpd__AttachSegment a;
	Odpd__Request req;
	Odpd__Reply *r;

	(void)state;
	if (!getenv("ODPD_VM") || !(f = fopen(knob, "re"))) {
		print_message("not in the VM (or no %s): shmem with transparent huge pages skipped\n", knob);
		skip();
		return;
	}
	assert_non_null(fgets(old, sizeof(old), f));
	fclose(f);
	sel = strchr(old, '[');
	end = sel ? strchr(sel, ']') : NULL;
	assert_true(sel && end);
	*end = 0;
	f = fopen(knob, "we");
	assert_non_null(f);
	fputs("always", f);
	assert_int_equal(fclose(f), 0);

	conn = raw_connect_hello(test_daemon.sock);
	fd = sealed_memfd(len);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	snapshot_take(&test_daemon, test_admin_fd, &s0);
	req = attach_req(&a, (uintptr_t)p + 4096, 4096, len - 4096);
	r = raw_call(conn, 10, &req, &fd, 1);
	if (r->status)
		fail_msg("attach at a 4 KiB boundary with shmem_enabled=always: %s", r->message);
	odpd__reply__free_unpacked(r, NULL);
	snapshot_take(&test_daemon, test_admin_fd, &s1);
	assert_int_equal(s1.segment_bytes, s0.segment_bytes + len);
	munmap(p, len);
	close(fd);
	close(conn);
	f = fopen(knob, "we");
	assert_non_null(f);
	fputs(sel + 1, f);
	assert_int_equal(fclose(f), 0);
}

/* Many bad packets in a row from one client while another is served. */
static void test_other_clients_unaffected(void **state)
{
	int bad = raw_connect_hello(test_daemon.sock);
	int good = raw_connect_hello(test_daemon.sock);

	(void)state;
	for (int i = 0; i < 50; i++)
		raw_send_bytes(bad, "\xff\xff", 2);
	assert_usable(good);
	for (int i = 0; i < 50; i++)
		expect_event_error(bad, EBADMSG);
	close(bad);
	assert_usable(good);
	close(good);
}

/* ---------------------------------------------------------------- system calls per request */

/*
 * This process's sendmsg and recvmsg calls, counted: definitions in the
 * executable come before libc's for libodpd.so too (its calls go through
 * the PLT), so no LD_PRELOAD is needed. /proc/self/io's syscr does not
 * count recvmsg (only read(2) and its kin), so it cannot serve. They pass
 * the call on to the kernel as it is.
 */
static unsigned long n_sendmsg, n_recvmsg;

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	__atomic_fetch_add(&n_sendmsg, 1, __ATOMIC_RELAXED);
	return syscall(SYS_sendmsg, fd, msg, flags);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	__atomic_fetch_add(&n_recvmsg, 1, __ATOMIC_RELAXED);
	return syscall(SYS_recvmsg, fd, msg, flags);
}

/* @n segments attached and detached through libodpd on @c: the requests
 * (one sendmsg each) and the receives they cost. */
static void alloc_detach_calls(struct odpd_conn *c, unsigned n, unsigned long *ret_sends,
			       unsigned long *ret_recvs)
{
	unsigned long s0 = __atomic_load_n(&n_sendmsg, __ATOMIC_RELAXED);
	unsigned long r0 = __atomic_load_n(&n_recvmsg, __ATOMIC_RELAXED);

	for (unsigned i = 0; i < n; i++) {
		struct odpd_segment *seg = odpd_alloc(c, 64 * 1024, 0);

		if (!seg)
			fail_msg("odpd_alloc: %s", odpd_errmsg());
		assert_int_equal(odpd_detach(seg), 0);
	}
	*ret_sends = __atomic_load_n(&n_sendmsg, __ATOMIC_RELAXED) - s0;
	*ret_recvs = __atomic_load_n(&n_recvmsg, __ATOMIC_RELAXED) - r0;
}

/*
 * A request through libodpd costs its client one sendmsg and one recvmsg
 * when the connection has a hit table whose events word says no event
 * waits (issue 26): the library used to make a non-blocking recvmsg before
 * every request, to look for a DeviceEvent. With ODPD_CACHE=0 the library
 * still opens a table, without slots, for its release ring (1.4.5), and so
 * has the events word; only without a table at all (ODPD_CACHE=0 and
 * ODPD_ONEWAY_DEREG=0) it looks every time.
 */
static void test_two_system_calls_per_request(void **state)
{
	enum { N = 20 };
	struct odpd_conn *c, *plain;
	struct odpd_stats st;
	unsigned long sends, recvs;

	(void)state;
	c = odpd_connect(test_daemon.sock, NULL);
	if (!c)
		fail_msg("odpd_connect: %s", odpd_errmsg());
	assert_int_equal(odpd_stats(c, &st, sizeof(st)), 0);
	assert_true(st.hit_table);
	alloc_detach_calls(c, N, &sends, &recvs);
	print_message("with a hit table: %u segments, %lu requests, %lu recvmsg\n", N, sends, recvs);
	assert_true(sends >= 2 * N);                   /* counted: attach and detach each */
	if (recvs != sends)
		fail_msg("%lu requests took %lu recvmsg calls: the library looked for events it "
			 "knew were not there", sends, recvs);
	odpd_disconnect(c);

	setenv("ODPD_CACHE", "0", 1);
	for (int oneway = 1; oneway >= 0; oneway--) {
		if (!oneway)
			setenv("ODPD_ONEWAY_DEREG", "0", 1);
		plain = odpd_connect(test_daemon.sock, NULL);
		if (!plain)
			fail_msg("odpd_connect: %s", odpd_errmsg());
		assert_int_equal(odpd_stats(plain, &st, sizeof(st)), 0);
		assert_false(st.hit_table);            /* no local hits either way */
		alloc_detach_calls(plain, N, &sends, &recvs);
		print_message("ODPD_CACHE=0, %s: %u segments, %lu requests, %lu recvmsg\n",
			      oneway ? "a table for the release ring" : "ODPD_ONEWAY_DEREG=0, no table", N, sends,
			      recvs);
		assert_true(sends >= 2 * N);
		if (oneway)
			assert_int_equal(recvs, sends);
		else
			assert_int_equal(recvs, 2 * sends);    /* a look for events first, each time */
		odpd_disconnect(plain);
	}
	unsetenv("ODPD_ONEWAY_DEREG");
	unsetenv("ODPD_CACHE");
}

/* ---------------------------------------------------------------- cache requests */

static int cache_admin_requests_refused(void)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Flush fl = ODPD__FLUSH__INIT;
	Odpd__ListMrs lm = ODPD__LIST_MRS__INIT;
	Odpd__Reply *r;
	int fd = raw_connect_hello(test_daemon.sock), code = 20;

	req.body_case = ODPD__REQUEST__BODY_LIST_MRS;
	req.list_mrs = &lm;
	r = raw_call(fd, 2, &req, NULL, 0);
	if (r->status != EPERM || !r->message || !*r->message)
		return 11;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &fl;
	for (int i = 0; i < 3; i++, code++) {
		fl = (Odpd__Flush)ODPD__FLUSH__INIT;
		if (i == 0)
			fl.has_all = fl.all = 1;
		else if (i == 1)
			fl.has_pid = 1, fl.pid = 1;
		else
			fl.pd = (char *)"team";
		r = raw_call(fd, (uint64_t)(3 + i), &req, NULL, 0);
		if (r->status != EPERM)
			return code;
	}
	/* its own flush (no field) is allowed: nothing to do */
	fl = (Odpd__Flush)ODPD__FLUSH__INIT;
	r = raw_call(fd, 9, &req, NULL, 0);
	return r->status == 0 && r->body_case == ODPD__REPLY__BODY_FLUSH && r->flush->mrs == 0 ? 0 : 30;
}

/* As uid 65534 (no admin): every admin-only form of the cache requests is
 * EPERM with a message, and its own flush is served. */
static void test_cache_admin_requests_need_admin(void **state)
{
	(void)state;
	as_nobody_expect_success(cache_admin_requests_refused);
}

/* JoinPd: bad names are EINVAL, a second join EALREADY; RegMr with
 * unknown flags and DeregMr (relaxed) of an unknown handle are refused. */
static void test_cache_bad_requests(void **state)
{
	static const char *const bad[] = { "", "a/b", "has space", "x\n",
		"0123456789012345678901234567890123456789012345678901234567890123" };
	int fd, mfd = sealed_memfd(1 << 20);
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__JoinPd j = ODPD__JOIN_PD__INIT;
	Odpd__AttachSegment a = ODPD__ATTACH_SEGMENT__INIT;
	Odpd__RegMr m = ODPD__REG_MR__INIT;
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
	struct snapshot before, after;
	Odpd__Reply *r;
	uint64_t id = 2;

	(void)state;
	snapshot_take(&test_daemon, test_admin_fd, &before);
	fd = raw_connect_hello(test_daemon.sock);
	req.body_case = ODPD__REQUEST__BODY_JOIN_PD;
	req.join_pd = &j;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j.name = (char *)bad[i];
		raw_expect_error(fd, id++, &req, NULL, 0, EINVAL);
	}
	j.name = NULL;
	raw_expect_error(fd, id++, &req, NULL, 0, EINVAL);
	j.name = (char *)"odpd-test.pd";
	r = raw_call(fd, id++, &req, NULL, 0);
	assert_int_equal(r->status, 0);
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_JOIN_PD);
	assert_true(r->join_pd->created);
	assert_int_equal(r->join_pd->members, 1);
	odpd__reply__free_unpacked(r, NULL);
	raw_expect_error(fd, id++, &req, NULL, 0, EALREADY);
	/* a registration with flags the daemon does not know */
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &a;
	r = raw_call(fd, id++, &req, &mfd, 1);
	assert_int_equal(r->status, 0);
	m.has_addr = m.has_length = m.has_flags = 1;
	m.addr = r->segment->addr;
	m.length = 4096;
	m.flags = 0x80;
	odpd__reply__free_unpacked(r, NULL);
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &m;
	raw_expect_error(fd, id++, &req, NULL, 0, EINVAL);
	d.has_handle = d.has_relaxed = 1;
	d.handle = 4242;
	d.relaxed = 1;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &d;
	raw_expect_error(fd, id++, &req, NULL, 0, ENOENT);
	close(fd);
	close(mfd);
	wait_idle(test_admin_fd);
	snapshot_take(&test_daemon, test_admin_fd, &after);
	snapshot_assert_equal(&before, &after);
}

/* ---------------------------------------------------------------- the bad-input matrix */

/*
 * Each case: one hostile or malformed request on a connection that holds a
 * 1 MiB segment (and, with a device, one pinned MR), with the fds it says;
 * the errno the reply must carry (with a device / without one, where the
 * device check comes first); and afterwards odpd's segments, MRs, pinned
 * bytes, open fds, the kernel's MRs and VmPin exactly as before.
 */
enum fdkind { FD_NONE, FD_SEALED, FD_SEALED2, FD_PIPE, FD_FILE, FD_UNSEALED, FD_NOSEALS, FD_DEVZERO,
	      FD_SOCKET, FD_EVENTFD, FD_DIR, FD_OPATH, FD_HUGE, FD_WSEALED };

struct bad_case {
	const char *name;
	void (*build)(Odpd__Request *req, uint64_t base, uint64_t mr);
	enum fdkind fd;
	int err_dev, err_nodev;             /* errno with a device, without (0: the same) */
	const uint8_t *raw;                 /* raw bytes instead of a Request */
	size_t raw_len;
};

/* Bodies live here for the duration of one case. */
static Odpd__AttachSegment b_att;
static Odpd__DetachSegment b_det;
static Odpd__RegMr b_reg;
static Odpd__DeregMr b_dereg;
static Odpd__Verify b_ver;
static Odpd__AdviseMr b_adv;
static Odpd__Sge b_sge, *b_sges[65];
static Odpd__JoinPd b_join;
static Odpd__ImportPd b_imp;
static Odpd__Hello b_hello;
static Odpd__Status b_status = ODPD__STATUS__INIT;

static void att(Odpd__Request *r, uint64_t addr, uint64_t off, uint64_t len)
{
	b_att = (Odpd__AttachSegment)ODPD__ATTACH_SEGMENT__INIT;
	b_att.has_client_addr = b_att.has_file_offset = b_att.has_length = 1;
	b_att.client_addr = addr;
	b_att.file_offset = off;
	b_att.length = len;
	r->body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	r->attach_segment = &b_att;
}

static void reg(Odpd__Request *r, uint64_t addr, uint64_t len, uint32_t access)
{
	b_reg = (Odpd__RegMr)ODPD__REG_MR__INIT;
	b_reg.has_addr = b_reg.has_length = b_reg.has_access = 1;
	b_reg.addr = addr;
	b_reg.length = len;
	b_reg.access = access;
	r->body_case = ODPD__REQUEST__BODY_REG_MR;
	r->reg_mr = &b_reg;
}

static void adv(Odpd__Request *r, uint32_t advice, uint32_t flags, unsigned n, uint64_t addr, uint32_t lkey)
{
	b_adv = (Odpd__AdviseMr)ODPD__ADVISE_MR__INIT;
	b_sge = (Odpd__Sge)ODPD__SGE__INIT;
	b_sge.has_addr = b_sge.has_length = b_sge.has_lkey = 1;
	b_sge.addr = addr;
	b_sge.length = 4096;
	b_sge.lkey = lkey;
	for (unsigned i = 0; i < n; i++)
		b_sges[i] = &b_sge;
	b_adv.has_advice = b_adv.has_flags = 1;
	b_adv.advice = advice;
	b_adv.flags = flags;
	b_adv.n_sges = n;
	b_adv.sges = b_sges;
	r->body_case = ODPD__REQUEST__BODY_ADVISE_MR;
	r->advise_mr = &b_adv;
}

#define MIB_ (1ull << 20)
#define LW_ ODPD__ACCESS__ACCESS_LOCAL_WRITE
#define RW_ ODPD__ACCESS__ACCESS_REMOTE_WRITE
#define U_ __attribute__((unused))

static void c_none(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { (void)r; }
static void c_hello(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	b_hello = (Odpd__Hello)ODPD__HELLO__INIT;
	b_hello.has_version = 1;
	b_hello.version = ODPD_PROTOCOL_VERSION;
	r->body_case = ODPD__REQUEST__BODY_HELLO;
	r->hello = &b_hello;
}
static void c_status(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	r->body_case = ODPD__REQUEST__BODY_STATUS;
	r->status = &b_status;
}
static void c_att0(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { att(r, 0, 0, 0); }
static void c_att_unaligned(Odpd__Request *r, uint64_t b, U_ uint64_t m) { att(r, b + 1, 0, 4096); }
static void c_att_len0(Odpd__Request *r, uint64_t b, U_ uint64_t m) { att(r, b, 0, 0); }
static void c_att_past(Odpd__Request *r, uint64_t b, U_ uint64_t m) { att(r, b, 0, 8 * MIB_); }
static void c_att_wrap(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { att(r, UINT64_MAX - 4095, 0, 8192); }
static void c_att_unmapped(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { att(r, 0x10000, 0, 4096); }
static void c_att_off_noaddr(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { att(r, 0, 4096, 0); }
static void c_det(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	b_det = (Odpd__DetachSegment)ODPD__DETACH_SEGMENT__INIT;
	b_det.has_segment = 1;
	b_det.segment = 4242;
	r->body_case = ODPD__REQUEST__BODY_DETACH_SEGMENT;
	r->detach_segment = &b_det;
}
static void c_det_busy(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	c_det(r, 0, 0);
	b_det.segment = 1;                   /* the segment, with the MR over it */
}
static void c_reg_len0(Odpd__Request *r, uint64_t b, U_ uint64_t m) { reg(r, b, 0, LW_); }
static void c_reg_wrap(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { reg(r, UINT64_MAX - 10, 4096, LW_); }
static void c_reg_outside(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { reg(r, 0x10000, 4096, LW_); }
static void c_reg_past(Odpd__Request *r, uint64_t b, U_ uint64_t m) { reg(r, b + MIB_ - 4096, 8192, LW_); }
static void c_reg_access(Odpd__Request *r, uint64_t b, U_ uint64_t m) { reg(r, b, 4096, 0x4000); }
static void c_reg_rw_nolw(Odpd__Request *r, uint64_t b, U_ uint64_t m) { reg(r, b, 4096, RW_); }
static void c_reg_flags(Odpd__Request *r, uint64_t b, U_ uint64_t m)
{
	reg(r, b, 4096, LW_);
	b_reg.has_flags = 1;
	b_reg.flags = 0x80;
}
static void c_reg_kind(Odpd__Request *r, uint64_t b, U_ uint64_t m)
{
	reg(r, b, 4096, LW_);
	b_reg.has_kind = 1;
	b_reg.kind = 99;
}
static void c_reg_prefetch_pinned(Odpd__Request *r, uint64_t b, U_ uint64_t m)
{
	c_reg_flags(r, b, 0);
	b_reg.flags = ODPD__REG_FLAGS__REG_PREFETCH;
}
static void c_reg_implicit_addr(Odpd__Request *r, uint64_t b, U_ uint64_t m)
{
	reg(r, b, UINT64_MAX, LW_);
	b_reg.has_kind = 1;
	b_reg.kind = ODPD__MR_KIND__MR_IMPLICIT_ODP;
}
static void c_reg_device(Odpd__Request *r, uint64_t b, U_ uint64_t m)
{
	reg(r, b, 4096, LW_);
	b_reg.device = (char *)"no-such-device";
}
static void c_reg_client_pd(Odpd__Request *r, uint64_t b, U_ uint64_t m)
{
	reg(r, b, 4096, LW_);
	b_reg.has_client_pd = b_reg.has_client_pd_handle = 1;
	b_reg.client_pd = 1;
}
static void c_reg_write_ro(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m) { (void)r; }
static void c_dereg(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	b_dereg = (Odpd__DeregMr)ODPD__DEREG_MR__INIT;
	b_dereg.has_handle = 1;
	b_dereg.handle = 4242;
	r->body_case = ODPD__REQUEST__BODY_DEREG_MR;
	r->dereg_mr = &b_dereg;
}
static void c_dereg_relaxed(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	c_dereg(r, 0, 0);
	b_dereg.has_relaxed = 1;
	b_dereg.relaxed = 1;
}
static void c_dereg_none(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	c_dereg(r, 0, 0);
	b_dereg.has_handle = 0;
}
static void c_verify(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	b_ver = (Odpd__Verify)ODPD__VERIFY__INIT;
	b_ver.has_handle = 1;
	b_ver.handle = 4242;
	r->body_case = ODPD__REQUEST__BODY_VERIFY;
	r->verify = &b_ver;
}
static void c_verify_range(Odpd__Request *r, uint64_t b, uint64_t m)
{
	c_verify(r, 0, 0);
	b_ver.handle = m;
	b_ver.has_addr = b_ver.has_length = 1;
	b_ver.addr = b + MIB_;               /* past the MR's end */
	b_ver.length = 4096;
}
static void c_adv_none(Odpd__Request *r, uint64_t b, U_ uint64_t m) { adv(r, 0, 0, 0, b, 1); }
static void c_adv_advice(Odpd__Request *r, uint64_t b, U_ uint64_t m) { adv(r, 7, 0, 1, b, 1); }
static void c_adv_flags(Odpd__Request *r, uint64_t b, U_ uint64_t m) { adv(r, 0, 2, 1, b, 1); }
static void c_adv_many(Odpd__Request *r, uint64_t b, U_ uint64_t m) { adv(r, 0, 0, 65, b, 1); }
static void c_adv_lkey(Odpd__Request *r, uint64_t b, U_ uint64_t m) { adv(r, 0, 1, 1, b, 0xdead); }
static void c_join(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	b_join = (Odpd__JoinPd)ODPD__JOIN_PD__INIT;
	b_join.name = (char *)"bad/name";
	r->body_case = ODPD__REQUEST__BODY_JOIN_PD;
	r->join_pd = &b_join;
}
static void c_join_late(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	c_join(r, 0, 0);
	b_join.name = (char *)"odpd-test.late";
}
static void c_import(Odpd__Request *r, U_ uint64_t b, U_ uint64_t m)
{
	b_imp = (Odpd__ImportPd)ODPD__IMPORT_PD__INIT;
	b_imp.device = (char *)"no-such-device";
	r->body_case = ODPD__REQUEST__BODY_IMPORT_PD;
	r->import_pd = &b_imp;
}

static const uint8_t garbage[] = { 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02 };
static const uint8_t truncated[] = { 0x08, 0x96 };           /* a varint cut short */

static const struct bad_case bad_cases[] = {
	{ "empty packet", NULL, FD_NONE, EBADMSG, 0, garbage, 0 },
	{ "garbage", NULL, FD_NONE, EBADMSG, 0, garbage, sizeof(garbage) },
	{ "truncated varint", NULL, FD_NONE, EBADMSG, 0, truncated, sizeof(truncated) },
	{ "garbage with an fd", NULL, FD_SEALED, EBADMSG, 0, garbage, sizeof(garbage) },
	{ "no body", c_none, FD_NONE, EOPNOTSUPP, 0, NULL, 0 },
	{ "second Hello", c_hello, FD_NONE, EALREADY, 0, NULL, 0 },
	{ "Status with an fd", c_status, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "attach without fd", c_att0, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "attach with two fds", c_att0, FD_SEALED2, EINVAL, 0, NULL, 0 },
	{ "attach a pipe", c_att0, FD_PIPE, EINVAL, 0, NULL, 0 },
	{ "attach a regular file", c_att0, FD_FILE, EINVAL, 0, NULL, 0 },
	{ "attach an unsealable memfd", c_att0, FD_UNSEALED, EINVAL, 0, NULL, 0 },
	{ "attach a memfd without seals", c_att0, FD_NOSEALS, EINVAL, 0, NULL, 0 },
	{ "attach /dev/zero", c_att0, FD_DEVZERO, EINVAL, 0, NULL, 0 },
	{ "attach a socket", c_att0, FD_SOCKET, EINVAL, 0, NULL, 0 },
	{ "attach an eventfd", c_att0, FD_EVENTFD, EINVAL, 0, NULL, 0 },
	{ "attach a directory", c_att0, FD_DIR, EINVAL, 0, NULL, 0 },
	{ "attach an O_PATH fd", c_att0, FD_OPATH, EBADF, 0, NULL, 0 },
	{ "attach past max-segment-size", c_att0, FD_HUGE, EFBIG, 0, NULL, 0 },
	{ "attach at an unaligned address", c_att_unaligned, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "attach length 0 at an address", c_att_len0, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "attach past the file's end", c_att_past, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "attach wrapping the address space", c_att_wrap, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "attach where the client mapped nothing", c_att_unmapped, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "attach without address, with an offset", c_att_off_noaddr, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "detach an unknown segment", c_det, FD_NONE, ENOENT, 0, NULL, 0 },
	{ "detach with an fd", c_det, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "register length 0", c_reg_len0, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register wrapping", c_reg_wrap, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register outside every segment", c_reg_outside, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register past the segment", c_reg_past, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register unknown access bits", c_reg_access, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register remote write without local write", c_reg_rw_nolw, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register unknown flags", c_reg_flags, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register unknown kind", c_reg_kind, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "register REG_PREFETCH pinned", c_reg_prefetch_pinned, FD_NONE, EINVAL, ENODEV, NULL, 0 },
	{ "register implicit at an address", c_reg_implicit_addr, FD_NONE, EINVAL, ENODEV, NULL, 0 },
	{ "register on an unknown device", c_reg_device, FD_NONE, ENODEV, 0, NULL, 0 },
	{ "register with an fd, not client-PD", c_reg_len0, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "client-PD without fd", c_reg_client_pd, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "client-PD with a pipe", c_reg_client_pd, FD_PIPE, EINVAL, 0, NULL, 0 },
	{ "client-PD with a memfd", c_reg_client_pd, FD_SEALED, EINVAL, 0, NULL, 0 },
	{ "register writable on a write-sealed segment", c_reg_write_ro, FD_WSEALED, EACCES, 0, NULL, 0 },
	{ "deregister an unknown handle", c_dereg, FD_NONE, ENOENT, 0, NULL, 0 },
	{ "deregister relaxed, unknown handle", c_dereg_relaxed, FD_NONE, ENOENT, 0, NULL, 0 },
	{ "deregister without a handle", c_dereg_none, FD_NONE, ENOENT, 0, NULL, 0 },
	{ "verify an unknown handle", c_verify, FD_NONE, ENOENT, 0, NULL, 0 },
	{ "verify outside the MR", c_verify_range, FD_NONE, EINVAL, ENOENT, NULL, 0 },
	{ "advise no ranges", c_adv_none, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "advise unknown advice", c_adv_advice, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "advise unknown flags", c_adv_flags, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "advise 65 ranges", c_adv_many, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "advise an unknown lkey", c_adv_lkey, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "join a badly named PD", c_join, FD_NONE, EINVAL, 0, NULL, 0 },
	{ "join after registering", c_join_late, FD_NONE, EBUSY, 0 /* set below */, NULL, 0 },
	{ "import on an unknown device", c_import, FD_NONE, ENODEV, 0, NULL, 0 },
	{ "detach a segment with an MR", c_det_busy, FD_NONE, EBUSY, 0 /* set below */, NULL, 0 },
};

static int bad_fd(enum fdkind k, int *fds)
{
	int p[2], fd;

	switch (k) {
	case FD_NONE: return 0;
	case FD_SEALED: fds[0] = sealed_memfd(64 * 1024); return 1;
	case FD_SEALED2: fds[0] = sealed_memfd(4096); fds[1] = sealed_memfd(4096); return 2;
	case FD_PIPE:
		assert_int_equal(pipe2(p, O_CLOEXEC), 0);
		close(p[1]);
		fds[0] = p[0];
		return 1;
	case FD_FILE: fds[0] = open("/proc/self/exe", O_RDONLY | O_CLOEXEC); return 1;
	case FD_UNSEALED:
		fds[0] = memfd_create("bad", MFD_CLOEXEC);
		assert_int_equal(ftruncate(fds[0], 4096), 0);
		return 1;
	case FD_NOSEALS:
		fds[0] = memfd_create("bad", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		assert_int_equal(ftruncate(fds[0], 4096), 0);
		return 1;
	case FD_DEVZERO: fds[0] = open("/dev/zero", O_RDWR | O_CLOEXEC); return 1;
	case FD_SOCKET: fds[0] = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0); return 1;
	case FD_EVENTFD: fds[0] = eventfd(0, EFD_CLOEXEC); return 1;
	case FD_DIR: fds[0] = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC); return 1;
	case FD_OPATH: fds[0] = open("/proc/self/exe", O_PATH | O_CLOEXEC); return 1;
	case FD_HUGE:
		fd = memfd_create("huge", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		assert_int_equal(ftruncate(fd, 128ll << 30), 0);        /* sparse */
		assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
		fds[0] = fd;
		return 1;
	case FD_WSEALED: return 0;
	}
	return 0;
}

/*
 * The matrix. A write-sealed segment is attached first for its case; with
 * a device one pinned MR is registered over the segment (for "verify
 * outside", "detach busy" and "join late").
 */
static void test_bad_input_matrix(void **state)
{
	bool dev = test_require_device();
	int conn = raw_connect_hello(test_daemon.sock), mfd = sealed_memfd(MIB_), wfd;
	Odpd__Request req = ODPD__REQUEST__INIT;
	struct snapshot before;
	uint64_t base, wbase, mr = 0, id = 100;
	Odpd__Reply *r;

	(void)state;
	base = raw_attach(conn, 2, mfd);
	wfd = memfd_create("wsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	assert_int_equal(ftruncate(wfd, 65536), 0);
	assert_int_equal(fcntl(wfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
	wbase = raw_attach(conn, 3, wfd);
	if (dev) {
		reg(&req, base, MIB_, LW_);
		r = raw_call(conn, 4, &req, NULL, 0);
		assert_int_equal(r->status, 0);
		mr = r->mr->handle;
		odpd__reply__free_unpacked(r, NULL);
	}
	for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
		const struct bad_case *c = &bad_cases[i];
		int fds[2], n = bad_fd(c->fd, fds), want = dev || !c->err_nodev ? c->err_dev : c->err_nodev;

		if (!dev && (c->build == c_det_busy || c->build == c_join_late))
			continue;                         /* need the MR */
		snapshot_take(&test_daemon, test_admin_fd, &before);
		req = (Odpd__Request)ODPD__REQUEST__INIT;
		if (c->raw) {
			odpd_wire_send_buf(conn, c->raw, c->raw_len, fds, (unsigned)n, 0);
			r = raw_recv(conn);
		} else {
			if (c->fd == FD_WSEALED)
				reg(&req, wbase, 4096, LW_);
			else
				c->build(&req, base, mr);
			req.has_id = 1;
			req.id = ++id;
			r = raw_call(conn, id, &req, fds, (unsigned)n);
		}
		if (r->status != want)
			fail_msg("%s: status %d (%s), want %d (%s): %s", c->name, r->status,
				 strerror(r->status), want, strerror(want), r->message ? r->message : "");
		if (!r->message || !*r->message)
			fail_msg("%s: an error without a message", c->name);
		odpd__reply__free_unpacked(r, NULL);
		while (n)
			close(fds[--n]);
		snapshot_settles_to(&test_daemon, test_admin_fd, &before);   /* asserts equality */
	}
	close(conn);
	close(mfd);
	close(wfd);
	wait_idle(test_admin_fd);
}

/* A configuration file with an error: odpd does not start, and says where. */
static void test_bad_config_refused(void **state)
{
	char dir[] = "/tmp/odpd-conf.XXXXXX", path[64], cmd[256], out[1024];
	const char *bin = getenv("ODPD_TEST_DAEMON");
	FILE *f, *p;
	size_t n;
	int st;

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/odpd.conf", dir);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs("[limits]\nmax-pinned = lots\n", f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "%s --foreground --socket %s/s --config %s 2>&1", bin, dir, path);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	st = pclose(p);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	if (!strstr(out, path) || !strstr(out, ":2:"))
		fail_msg("odpd's complaint does not name %s:2:\n%s", path, out);
	/* a --config that does not exist is an error too */
	unlink(path);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	st = pclose(p);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
	rmdir(dir);
}

/* Run "timeout @secs PROGRAM @args 2>&1", PROGRAM from $@env; its output
 * in @out, its exit status returned. */
static int tool_run(const char *env, int secs, const char *args, char *out, size_t cap)
{
	char cmd[1024];
	FILE *p;
	size_t n;
	int st;

	snprintf(cmd, sizeof(cmd), "timeout -s KILL %d %s %s 2>&1", secs, getenv(env), args);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Run "odpd @args 2>&1" (no daemon: options that exit at once). */
static int odpd_run(const char *args, char *out, size_t cap)
{
	return tool_run("ODPD_TEST_DAEMON", 10, args, out, cap);
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

/*
 * odpd as a command-line tool: -h and -V; a bad option exits 2 with a hint;
 * --check-config exits 0 for a valid file, 1 for a broken or missing one
 * (PATH:LINE), 0 with a warning for a user name that does not resolve; and
 * odpd serves with such a rule (the name may resolve later).
 */
static void test_command_line(void **state)
{
	char dir[] = "/tmp/odpd-cli.XXXXXX", path[64], args[256], out[4096], conf[128];
	struct test_daemon d = { 0 };

	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/odpd.conf", dir);

	assert_int_equal(odpd_run("-h", out, sizeof(out)), 0);
	assert_non_null(strstr(out, "--check-config"));
	assert_non_null(strstr(out, "--max-clients N           most client connections"));
	assert_int_equal(odpd_run("-V", out, sizeof(out)), 0);
	assert_int_equal(strncmp(out, "odpd ", 5), 0);
	assert_int_equal(odpd_run("--frobnicate", out, sizeof(out)), 2);
	if (!strstr(out, "--frobnicate") || !strstr(out, "Try 'odpd --help'"))
		fail_msg("bad option: %s", out);
	assert_int_equal(odpd_run("--workers lots", out, sizeof(out)), 2);
	assert_non_null(strstr(out, "Try 'odpd --help'"));
	assert_int_equal(odpd_run("extra", out, sizeof(out)), 2);

	write_text(path, "[limits]\nmax-pinned = 1G\n");
	snprintf(args, sizeof(args), "--check-config --config %s", path);
	assert_int_equal(odpd_run(args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "valid"));
	write_text(path, "[limits]\nmax-pinned = 1G\nmax-mrs = lots\n");
	assert_int_equal(odpd_run(args, out, sizeof(out)), 1);
	snprintf(conf, sizeof(conf), "%s:3:", path);
	if (!strstr(out, conf))
		fail_msg("--check-config does not name %s: %s", conf, out);
	write_text(path, "[user no-such-user-odpd-test]\nmax-pinned = 1G\n");
	assert_int_equal(odpd_run(args, out, sizeof(out)), 0);
	snprintf(conf, sizeof(conf), "%s:1: unknown user", path);
	if (!strstr(out, "warning") || !strstr(out, conf))
		fail_msg("--check-config of an unknown user: %s", out);
	unlink(path);
	assert_int_equal(odpd_run(args, out, sizeof(out)), 1);

	/* a [user] rule whose name does not resolve does not stop odpd */
	daemon_start_conf(&d, conf, sizeof(conf), "unresolved",
			  "[user no-such-user-odpd-test]\nmax-pinned = 1G\n", NULL, NULL);
	close(raw_connect_hello(d.sock));
	daemon_stop(&d);
	unlink(conf);
	assert_int_equal(rmdir(dir), 0);
}

/* Run "odpctl @args 2>&1" against the test daemon (@args may name
 * another socket first); output in @out, exit status returned. */
static int odpctl_run(const char *args, char *out, size_t cap)
{
	return tool_run("ODPD_TEST_ODPCTL", 20, args, out, cap);
}

/*
 * odpctl as a command-line tool: complaints name "odpctl", not its path;
 * -s "" is a usage error; each command's --help is its own; clients are
 * listed by id (odpd keeps them newest first); JSON names a private PD as
 * the table does and writes a limit of none as "unlimited".
 */
static void test_odpctl_cli(void **state)
{
	static char out[65536];
	char args[256];
	int conns[3];
	json_object *root, *quotas;
	uint64_t last = 0;
	bool root_quota = false;

	(void)state;
	if (!getenv("ODPD_TEST_ODPCTL"))
		skip();
	assert_int_equal(odpctl_run("--frobnicate", out, sizeof(out)), 2);
	if (strncmp(out, "odpctl: ", 8) != 0 || !strstr(out, "Try 'odpctl --help'"))
		fail_msg("odpctl --frobnicate: %s", out);
	assert_int_equal(odpctl_run("-s '' status", out, sizeof(out)), 2);
	assert_non_null(strstr(out, "odpctl: --socket: empty path"));
	assert_int_equal(odpctl_run("verify --help", out, sizeof(out)), 0);
	assert_int_equal(strncmp(out, "Usage: odpctl [-s PATH] verify", 30), 0);
	assert_non_null(strstr(out, "every live MR of every client"));
	assert_int_equal(odpctl_run("--help flush", out, sizeof(out)), 0);
	assert_int_equal(strncmp(out, "Usage: odpctl [-s PATH] flush", 29), 0);
	assert_int_equal(odpctl_run("--help", out, sizeof(out)), 0);
	assert_int_equal(strncmp(out, "Usage: odpctl [OPTIONS] COMMAND", 31), 0);

	for (int i = 0; i < 3; i++)
		conns[i] = raw_connect_hello(test_daemon.sock);
	snprintf(args, sizeof(args), "-s %s clients --json", test_daemon.sock);
	assert_int_equal(odpctl_run(args, out, sizeof(out)), 0);
	root = json_tokener_parse(out);
	assert_non_null(root);
	assert_int_equal(json_object_array_length(root), 4);      /* and test_admin_fd */
	for (size_t i = 0; i < 4; i++) {
		json_object *c = json_object_array_get_idx(root, i);
		uint64_t id = strtoull(json_object_get_string(json_object_object_get(c, "id")), NULL, 10);

		if (id <= last)
			fail_msg("odpctl clients not sorted by id:\n%s", out);
		last = id;
		assert_string_equal(json_object_get_string(json_object_object_get(c, "pd")), "(private)");
	}
	json_object_put(root);
	snprintf(args, sizeof(args), "-s %s clients", test_daemon.sock);
	assert_int_equal(odpctl_run(args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "(private)"));
	snprintf(args, sizeof(args), "-s %s status --json", test_daemon.sock);
	assert_int_equal(odpctl_run(args, out, sizeof(out)), 0);
	root = json_tokener_parse(out);
	assert_non_null(root);
	assert_true(json_object_object_get_ex(root, "quotas", &quotas));
	for (size_t i = 0; i < json_object_array_length(quotas); i++) {
		json_object *q = json_object_array_get_idx(quotas, i);
		const char *limit = json_object_get_string(json_object_object_get(q, "limit"));

		if (json_object_get_int(json_object_object_get(q, "uid")) != 0)
			continue;
		root_quota = true;
		/* root has CAP_IPC_LOCK: no limit (was "18446744073709551615") */
		assert_string_equal(limit, "unlimited");
	}
	assert_true(root_quota);
	assert_non_null(json_object_object_get(json_object_object_get(root, "cache"), "invalidation_batches"));
	json_object_put(root);
	for (int i = 0; i < 3; i++)
		close(conns[i]);
	wait_idle(test_admin_fd);
}

static int hello_and_wait(const char *sock, int ready)
{
	int fd = raw_connect_hello(sock);

	(void)fd;
	if (write(ready, "", 1) != 1)   /* its Hello is answered */
		return 1;
	pause();                        /* until SIGKILL */
	return 0;
}

/*
 * What odpd logs about clients, at its default level (info): odpctl's
 * connections (monitors) not at all (they are at debug: a cron job running
 * odpctl must not fill the journal); a client's lines carry its pid; the
 * disconnect says how it left (closed, or its process was killed by
 * SIGKILL), the release what it freed; sizes in IEC units, "may pin
 * without limit (CAP_IPC_LOCK)" for root.
 */
/* cmocka cuts a failure message at about 1 KiB: the whole log goes to stderr first. */
static void log_fail(const char *want, const char *log)
{
	fprintf(stderr, "odpd's log:\n%s\n", log);
	fail_msg("no \"%s\" in odpd's log (above)", want);
}

static void test_client_log_lines(void **state)
{
	static char log[1 << 16], out[4096];
	char path[] = "/tmp/odpd-log.XXXXXX", args[256], want[128];
	const char *const dargs[] = { "--log-level", "info", NULL };
	struct test_daemon d = { 0 };
	int logfd, saved, admin, fd, n_disc = 0, ready[2];
	pid_t child;
	char c;
	ssize_t n;

	(void)state;
	if (!getenv("ODPD_TEST_ODPCTL") || getenv("ODPD_TEST_WRAPPER"))
		skip();
	logfd = mkstemp(path);
	assert_true(logfd >= 0);
	saved = dup(STDERR_FILENO);
	dup2(logfd, STDERR_FILENO);             /* odpd's stderr, inherited */
	daemon_start(&d, dargs);
	dup2(saved, STDERR_FILENO);
	close(saved);
	admin = raw_connect_hello(d.sock);
	/* odpctl, three times */
	for (int i = 0; i < 3; i++) {
		snprintf(args, sizeof(args), "-s %s stats", d.sock);
		assert_int_equal(odpctl_run(args, out, sizeof(out)), 0);
	}
	/* a client that closes its connection */
	fd = raw_connect_hello(d.sock);
	close(fd);
	wait_idle(admin);
	/* a client whose process is killed, once its Hello is answered (odpd
	 * counts a connection as a client from accept, and one killed before its
	 * Hello is logged at debug only) */
	assert_int_equal(pipe2(ready, O_CLOEXEC), 0);
	child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		close(ready[0]);
		_exit(hello_and_wait(d.sock, ready[1]));
	}
	close(ready[1]);
	assert_int_equal(read(ready[0], &c, 1), 1);
	close(ready[0]);
	kill(child, SIGKILL);
	wait_idle(admin);                       /* before it is reaped: odpd reads its status */
	waitpid(child, NULL, 0);
	close(admin);
	daemon_stop(&d);

	lseek(logfd, 0, SEEK_SET);
	n = read(logfd, log, sizeof(log) - 1);
	assert_true(n > 0);
	log[n] = 0;
	close(logfd);
	unlink(path);
	if (strstr(log, "odpctl") || strstr(log, "monitor"))
		fail_msg("odpctl's connections are logged at info:\n%s", log);
	for (const char *p = log; (p = strstr(p, "disconnected")); p++)
		n_disc++;
	snprintf(want, sizeof(want), "(pid %d) disconnected: it closed the connection", (int)getpid());
	if (!strstr(log, want))
		log_fail(want, log);
	snprintf(want, sizeof(want), "(pid %d) disconnected: its process was killed by SIGKILL", (int)child);
	if (!strstr(log, want))
		log_fail(want, log);
	snprintf(want, sizeof(want), "(pid %d) released: 0 MR references (0 bytes), 0 segments", (int)child);
	if (!strstr(log, want))
		log_fail(want, log);
	if (!strstr(log, "may pin without limit (CAP_IPC_LOCK)"))
		fail_msg("root's limit:\n%s", log);
	if (strstr(log, "18446744073709551615") || !strstr(log, "iB, max-mrs"))
		fail_msg("sizes not in IEC units:\n%s", log);
	/* the admin connection, the one that closed, the killed one */
	assert_int_equal(n_disc, 3);
}

/* Run "odpd --socket @sock" until it exits or is ready; its output in @out.
 * Returns its exit status, or -1 when it started serving (then it is stopped). */
static int odpd_on(const char *sock, char *out, size_t cap)
{
	char cmd[512];
	FILE *p;
	size_t n;
	int st;

	snprintf(cmd, sizeof(cmd), "timeout -s TERM 3 %s --socket %s 2>&1",
		 getenv("ODPD_TEST_DAEMON"), sock);
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	st = pclose(p);
	if (WIFEXITED(st) && WEXITSTATUS(st) == 124)     /* served until timeout stopped it */
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/*
 * odpd that cannot reserve its address window (here: ulimit -v) says so and
 * exits 1; it crashed (SIGSEGV) stopping device hot-plug it had not started.
 */
static void test_start_failure_exits_cleanly(void **state)
{
	char cmd[512], out[4096];
	size_t n;
	FILE *p;
	int st;

	(void)state;
#if defined(__SANITIZE_ADDRESS__)
	skip();                                 /* ASan's shadow needs more than ulimit -v allows */
#endif
	snprintf(cmd, sizeof(cmd), "ulimit -v 2000000; exec timeout -s TERM 10 %s --socket /tmp/odpd-nowindow.sock 2>&1",
		 getenv("ODPD_TEST_DAEMON"));
	p = popen(cmd, "r");
	assert_non_null(p);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = 0;
	st = pclose(p);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(out, "cannot reserve"))
		fail_msg("status %#x, output: %s", st, out);
}

/*
 * A second odpd on the socket of a live one refuses to start, says why, and
 * the first goes on serving; a stale socket file (nobody listening) is
 * replaced; the socket's directory is made when missing. odpd never
 * daemonizes: it serves in the foreground without --foreground.
 */
static void test_socket_in_use(void **state)
{
	char dir[] = "/tmp/odpd-sock.XXXXXX", sock[128], out[4096];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd;

	(void)state;
	assert_int_equal(odpd_on(test_daemon.sock, out, sizeof(out)), 1);
	if (!strstr(out, "another odpd is serving"))
		fail_msg("a second odpd on a live socket: %s", out);
	fd = raw_connect_hello(test_daemon.sock);       /* the first one still serves */
	close(fd);
	assert_non_null(mkdtemp(dir));
	snprintf(sock, sizeof(sock), "%s/stale.sock", dir);
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);   /* bound, never listening */
	close(fd);
	if (odpd_on(sock, out, sizeof(out)) != -1)
		fail_msg("odpd on a stale socket file did not serve: %s", out);
	snprintf(sock, sizeof(sock), "%s/run/odpd/odpd.sock", dir);
	if (odpd_on(sock, out, sizeof(out)) != -1)
		fail_msg("odpd with a missing socket directory did not serve: %s", out);
	snprintf(sock, sizeof(sock), "%s/run/odpd", dir);
	rmdir(sock);
	snprintf(sock, sizeof(sock), "%s/run", dir);
	rmdir(sock);
	snprintf(sock, sizeof(sock), "%s/stale.sock", dir);
	unlink(sock);
	assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_socket_in_use, harness_test_setup),
		cmocka_unit_test_setup(test_request_before_hello, harness_test_setup),
		cmocka_unit_test_setup(test_wrong_version, harness_test_setup),
		cmocka_unit_test_setup(test_zero_length_packet, harness_test_setup),
		cmocka_unit_test_setup(test_unparsable_packet, harness_test_setup),
		cmocka_unit_test_setup(test_short_packet, harness_test_setup),
		cmocka_unit_test_setup(test_request_past_arena, harness_test_setup),
		cmocka_unit_test_setup(test_replies_queued, harness_test_setup),
		cmocka_unit_test_setup(test_oversized_packet, harness_test_setup),
		cmocka_unit_test_setup(test_request_id_zero, harness_test_setup),
		cmocka_unit_test_setup(test_unknown_request, harness_test_setup),
		cmocka_unit_test_setup(test_unexpected_fd, harness_test_setup),
		cmocka_unit_test_setup(test_status_needs_admin, harness_test_setup),
		cmocka_unit_test_setup(test_admin_group, harness_test_setup),
		cmocka_unit_test_setup(test_monitor_needs_admin, harness_test_setup),
		cmocka_unit_test_setup(test_attach_regular_file, harness_test_setup),
		cmocka_unit_test_setup(test_attach_pipe, harness_test_setup),
		cmocka_unit_test_setup(test_attach_memfd_without_sealing, harness_test_setup),
		cmocka_unit_test_setup(test_attach_memfd_without_seals, harness_test_setup),
		cmocka_unit_test_setup(test_attach_map_private, harness_test_setup),
		cmocka_unit_test_setup(test_attach_unmapped_or_wrong_range, harness_test_setup),
		cmocka_unit_test_setup(test_attach_and_detach, harness_test_setup),
		cmocka_unit_test_setup(test_map_segment, harness_test_setup),
		cmocka_unit_test_setup(test_attach_at_client_address, harness_test_setup),
		cmocka_unit_test_setup(test_reg_bad_ranges_and_flags, harness_test_setup),
		cmocka_unit_test_setup(test_reg_write_on_read_only_segment, harness_test_setup),
		cmocka_unit_test_setup(test_pipelined_requests, harness_test_setup),
		cmocka_unit_test_setup(test_reg_without_device, harness_test_setup),
		cmocka_unit_test_setup(test_client_pd_not_uverbs, harness_test_setup),
		cmocka_unit_test_setup(test_other_clients_unaffected, harness_test_setup),
		cmocka_unit_test_setup(test_hit_table, harness_test_setup),
		cmocka_unit_test_setup(test_hit_table_hugetlb, harness_test_setup),
		cmocka_unit_test_setup(test_two_system_calls_per_request, harness_test_setup),
		cmocka_unit_test_setup(test_attach_hugetlb, harness_test_setup),
		cmocka_unit_test_setup(test_attach_shmem_thp, harness_test_setup),
		cmocka_unit_test_setup(test_cache_admin_requests_need_admin, harness_test_setup),
		cmocka_unit_test_setup(test_cache_bad_requests, harness_test_setup),
		cmocka_unit_test_setup(test_bad_config_refused, harness_test_setup),
		cmocka_unit_test_setup(test_command_line, harness_test_setup),
		cmocka_unit_test_setup(test_odpctl_cli, harness_test_setup),
		cmocka_unit_test_setup(test_reg_unpopulated, harness_test_setup),
		cmocka_unit_test_setup(test_oneway_release, harness_test_setup),
		cmocka_unit_test_setup(test_oneway_order_across_connections, harness_test_setup),
		cmocka_unit_test_setup(test_release_ring, harness_test_setup),
		cmocka_unit_test(test_start_failure_exits_cleanly),
		cmocka_unit_test_setup(test_client_log_lines, harness_test_setup),
		cmocka_unit_test_setup(test_bad_input_matrix, harness_test_setup),
		cmocka_unit_test(harness_test_daemon_exits_cleanly),
	};

	if (getenv("ODPD_TEST_FILTER"))           /* e.g. "test_disconnect*" */
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, harness_group_setup, harness_group_teardown);
}
