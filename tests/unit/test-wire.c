/* SPDX-License-Identifier: MIT */
/* Unit tests of proto/wire.c (framing) and of the frozen fields of odpd.proto. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "odpd-wire.h"

#define CAP (ODPD_MAX_PACKET + 1)

struct fixture {
	int sv[2];
	uint8_t buf[CAP];
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, f->sv) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	if (f->sv[0] >= 0)
		close(f->sv[0]);
	if (f->sv[1] >= 0)
		close(f->sv[1]);
	free(f);
	return 0;
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;   /* the directory's own fd */
}

static int make_memfd(const char *name)
{
	int fd = memfd_create(name, 0);     /* no CLOEXEC: the receiver must add it */

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 4096), 0);
	return fd;
}

static void assert_same_file(int a, int b)
{
	struct stat sa, sb;

	assert_int_equal(fstat(a, &sa), 0);
	assert_int_equal(fstat(b, &sb), 0);
	assert_int_equal(sa.st_dev, sb.st_dev);
	assert_int_equal(sa.st_ino, sb.st_ino);
}

/* ------------------------------------------------------------ framing */

static void test_round_trip_with_fd(void **state)
{
	struct fixture *f = *state;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__AttachSegment as = ODPD__ATTACH_SEGMENT__INIT;
	struct odpd_packet p;
	int fd = make_memfd("unit-wire");

	req.has_id = 1;
	req.id = 0x123456789ull;
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &as;
	as.has_client_addr = as.has_length = 1;
	as.client_addr = 0x7f0000200000ull;
	as.length = 1 << 20;

	assert_int_equal(odpd_wire_send(f->sv[0], &req.base, &fd, 1, 0), 0);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, protobuf_c_message_get_packed_size(&req.base));
	assert_false(p.truncated);
	assert_false(p.ctrunc);
	assert_false(p.eof);
	assert_int_equal(p.nfds, 1);
	assert_true(p.fds[0] != fd);
	assert_same_file(p.fds[0], fd);
	assert_true(fcntl(p.fds[0], F_GETFD) & FD_CLOEXEC);

	Odpd__Request *got = odpd__request__unpack(NULL, p.len, f->buf);
	assert_non_null(got);
	assert_int_equal(got->id, req.id);
	assert_int_equal(got->body_case, ODPD__REQUEST__BODY_ATTACH_SEGMENT);
	assert_int_equal(got->attach_segment->client_addr, as.client_addr);
	assert_int_equal(got->attach_segment->length, as.length);
	assert_false(got->attach_segment->has_file_offset);
	odpd__request__free_unpacked(got, NULL);

	odpd_packet_close_fds(&p);
	assert_int_equal(p.nfds, 0);
	close(fd);
}

static void test_round_trip_max_fds_in_order(void **state)
{
	struct fixture *f = *state;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello hello = ODPD__HELLO__INIT;
	struct odpd_packet p;
	int fds[ODPD_MAX_FDS];

	for (unsigned i = 0; i < ODPD_MAX_FDS; i++)
		fds[i] = make_memfd("unit-wire-n");
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	int before = count_fds();

	assert_int_equal(odpd_wire_send(f->sv[0], &req.base, fds, ODPD_MAX_FDS, 0), 0);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_false(p.ctrunc);
	assert_int_equal(p.nfds, ODPD_MAX_FDS);
	for (unsigned i = 0; i < ODPD_MAX_FDS; i++) {
		assert_same_file(p.fds[i], fds[i]);
		assert_true(fcntl(p.fds[i], F_GETFD) & FD_CLOEXEC);
	}
	assert_int_equal(count_fds(), before + (int)ODPD_MAX_FDS);
	odpd_packet_close_fds(&p);
	assert_int_equal(count_fds(), before);
	for (unsigned i = 0; i < ODPD_MAX_FDS; i++)
		close(fds[i]);

	/* more than the limit is refused by the sender, and nothing is sent */
	int many[ODPD_MAX_FDS + 1];
	for (unsigned i = 0; i <= ODPD_MAX_FDS; i++)
		many[i] = f->sv[0];
	assert_int_equal(odpd_wire_send(f->sv[0], &req.base, many, ODPD_MAX_FDS + 1, 0), -EMSGSIZE);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, MSG_DONTWAIT), -EAGAIN);
}

static void test_truncated(void **state)
{
	struct fixture *f = *state;
	struct odpd_packet p;
	static uint8_t big[ODPD_MAX_PACKET + 100];

	/* a packet larger than the buffer */
	memset(big, 'a', sizeof(big));
	assert_int_equal(send(f->sv[0], big, 200, 0), 200);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, 100, &p, 0), 0);
	assert_true(p.truncated);
	assert_int_equal(p.len, 100);
	assert_false(p.eof);

	/* the daemon's buffer: one byte more than the limit shows up as truncation */
	assert_int_equal(send(f->sv[0], big, ODPD_MAX_PACKET + 1, 0), ODPD_MAX_PACKET + 1);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, ODPD_MAX_PACKET + 1);
	assert_false(p.truncated);           /* it fit, the caller refuses len > max */
	assert_int_equal(send(f->sv[0], big, sizeof(big), 0), (ssize_t)sizeof(big));
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_true(p.truncated);

	/* the packet boundary holds: the next packet is whole */
	assert_int_equal(send(f->sv[0], "xyz", 3, 0), 3);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, 3);
	assert_false(p.truncated);
	assert_memory_equal(f->buf, "xyz", 3);
}

static void test_zero_length_record(void **state)
{
	struct fixture *f = *state;
	struct odpd_packet p;

	assert_int_equal(send(f->sv[0], "", 0, 0), 0);
	assert_int_equal(send(f->sv[0], "after", 5, 0), 5);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, 0);
	assert_false(p.eof);
	assert_false(p.truncated);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, 5);
	assert_false(p.eof);

	/* alone in the queue, too */
	assert_int_equal(send(f->sv[0], "", 0, 0), 0);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, MSG_DONTWAIT), 0);
	assert_int_equal(p.len, 0);
	assert_false(p.eof);
	/* and then nothing */
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, MSG_DONTWAIT), -EAGAIN);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

/* An empty record read while signals arrive is still not an end of file:
 * the poll() that tells the two apart may answer EINTR. */
static void test_zero_length_record_through_signals(void **state)
{
	struct fixture *f = *state;
	struct sigaction sa = { .sa_handler = on_alarm }, old;
	struct itimerval tick = { { 0, 100 }, { 0, 100 } }, off = { 0 };
	struct odpd_packet p;
	unsigned eof = 0;

	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
	assert_int_equal(setitimer(ITIMER_REAL, &tick, NULL), 0);
	for (int i = 0; i < 100000 || alarms < 2000; i++) {
		assert_int_equal(send(f->sv[0], "", 0, 0), 0);
		assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, MSG_DONTWAIT), 0);
		eof += p.eof;
	}
	setitimer(ITIMER_REAL, &off, NULL);
	sigaction(SIGALRM, &old, NULL);
	print_message("%d signals during the calls\n", (int)alarms);
	assert_int_equal(eof, 0);
}

/* odpd_poll keeps its deadline while signals keep coming (poll(2) alone,
 * restarted on EINTR with its whole timeout, would never time out). */
static void test_poll_deadline_through_signals(void **state)
{
	struct fixture *f = *state;
	struct sigaction sa = { .sa_handler = on_alarm }, old;
	struct itimerval tick = { { 0, 1000 }, { 0, 1000 } }, off = { 0 };
	struct pollfd p = { .fd = f->sv[1], .events = POLLIN };
	struct timespec t0, t1;
	double ms;
	int r;

	sigemptyset(&sa.sa_mask);
	assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
	alarms = 0;
	assert_int_equal(setitimer(ITIMER_REAL, &tick, NULL), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = odpd_poll(&p, 1, 300);               /* nothing comes: times out */
	clock_gettime(CLOCK_MONOTONIC, &t1);
	setitimer(ITIMER_REAL, &off, NULL);
	sigaction(SIGALRM, &old, NULL);
	ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
	print_message("timed out after %.0f ms, %d signals meanwhile\n", ms, (int)alarms);
	assert_int_equal(r, 0);
	assert_true(ms >= 300.0);
	assert_true(alarms >= 10);
	/* and answers what is there */
	assert_int_equal(send(f->sv[0], "x", 1, 0), 1);
	assert_int_equal(odpd_poll(&p, 1, 300), 1);
	assert_true(p.revents & POLLIN);
}

static void test_peer_close_is_eof(void **state)
{
	struct fixture *f = *state;
	struct odpd_packet p;

	assert_int_equal(send(f->sv[0], "last", 4, 0), 4);
	close(f->sv[0]);
	f->sv[0] = -1;
	/* what was queued before the close still arrives */
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, 4);
	assert_false(p.eof);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, 0);
	assert_true(p.eof);
}

static void test_peer_shutdown_is_eof(void **state)
{
	struct fixture *f = *state;
	struct odpd_packet p;

	assert_int_equal(shutdown(f->sv[0], SHUT_WR), 0);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, MSG_DONTWAIT), 0);
	assert_int_equal(p.len, 0);
	assert_true(p.eof);
}

static void test_too_many_fds_closed(void **state)
{
	struct fixture *f = *state;
	const unsigned n = ODPD_MAX_FDS + 3;
	int fds[ODPD_MAX_FDS + 3];
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(fds))];
	} control;
	struct odpd_packet p;

	int before = count_fds();
	for (unsigned i = 0; i < n; i++)
		fds[i] = make_memfd("unit-wire-extra");

	struct iovec iov = { .iov_base = "x", .iov_len = 1 };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = control.buf, .msg_controllen = sizeof(control.buf),
	};
	memset(&control, 0, sizeof(control));
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(fds));
	memcpy(CMSG_DATA(c), fds, sizeof(fds));
	assert_int_equal(sendmsg(f->sv[0], &mh, 0), 1);
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
	assert_int_equal(count_fds(), before);

	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, 1);
	assert_true(p.ctrunc);
	assert_true(p.nfds <= ODPD_MAX_FDS);
	/* whatever arrived is in p.fds; nothing else was left open */
	assert_int_equal(count_fds(), before + (int)p.nfds);
	odpd_packet_close_fds(&p);
	assert_int_equal(count_fds(), before);
}

static void test_pack_too_large(void **state)
{
	struct fixture *f = *state;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello hello = ODPD__HELLO__INIT;
	struct odpd_packet p;
	char *name = malloc(ODPD_MAX_PACKET + 1);

	assert_non_null(name);
	req.has_id = 1;
	req.id = 1;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	hello.client_name = name;

	/* exactly ODPD_MAX_PACKET bytes: allowed, and arrives whole */
	size_t n = ODPD_MAX_PACKET - 20;
	for (;;) {
		memset(name, 'n', n);
		name[n] = '\0';
		size_t len = protobuf_c_message_get_packed_size(&req.base);
		if (len == ODPD_MAX_PACKET)
			break;
		assert_true(len < ODPD_MAX_PACKET);
		n++;
	}
	assert_int_equal(odpd_wire_send(f->sv[0], &req.base, NULL, 0, 0), 0);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, 0), 0);
	assert_int_equal(p.len, ODPD_MAX_PACKET);
	assert_false(p.truncated);
	Odpd__Request *got = odpd__request__unpack(NULL, p.len, f->buf);
	assert_non_null(got);
	assert_int_equal(strlen(got->hello->client_name), n);
	odpd__request__free_unpacked(got, NULL);

	/* one byte more: -EMSGSIZE, and nothing is sent */
	name[n] = 'n';
	name[n + 1] = '\0';
	assert_int_equal(protobuf_c_message_get_packed_size(&req.base), ODPD_MAX_PACKET + 1);
	assert_int_equal(odpd_wire_send(f->sv[0], &req.base, NULL, 0, 0), -EMSGSIZE);
	assert_int_equal(odpd_wire_recv(f->sv[1], f->buf, CAP, &p, MSG_DONTWAIT), -EAGAIN);
	free(name);
}

/*
 * Sending to a closed peer is an error, not a SIGPIPE (odpd-wire.h: MSG_NOSIGNAL
 * is always added). Linux raises no SIGPIPE for SOCK_SEQPACKET at all, so the
 * flag is checked on a stream pair too, where it matters. SIGPIPE is blocked
 * meanwhile, so that a regression shows up as a pending signal (whatever the
 * disposition this process inherited) instead of killing the test.
 */
static void test_send_no_sigpipe(void **state)
{
	struct fixture *f = *state;
	Odpd__Request req = ODPD__REQUEST__INIT;
	sigset_t pipe_set, old, pending;
	const struct timespec zero = { 0, 0 };
	int st[2], r_seq, r_stream;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, st), 0);
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	assert_int_equal(sigprocmask(SIG_BLOCK, &pipe_set, &old), 0);
	close(f->sv[1]);
	f->sv[1] = -1;
	close(st[1]);
	r_seq = odpd_wire_send(f->sv[0], &req.base, NULL, 0, 0);
	r_stream = odpd_wire_send(st[0], &req.base, NULL, 0, 0);
	assert_int_equal(sigpending(&pending), 0);
	bool raised = sigismember(&pending, SIGPIPE);
	if (raised)
		sigtimedwait(&pipe_set, NULL, &zero);
	assert_int_equal(sigprocmask(SIG_SETMASK, &old, NULL), 0);
	close(st[0]);
	assert_int_equal(r_seq, -EPIPE);
	assert_int_equal(r_stream, -EPIPE);
	assert_false(raised);
}

/* MSG_DONTWAIT reaches sendmsg: a full socket answers -EAGAIN at once. */
static void test_send_full_nonblocking(void **state)
{
	struct fixture *f = *state;
	Odpd__Request req = ODPD__REQUEST__INIT;
	struct timeval tmo = { 1, 0 };   /* a blocking send gives up after 1 s */
	struct timespec t0, t1;
	int r = 0;

	assert_int_equal(setsockopt(f->sv[0], SOL_SOCKET, SO_SNDTIMEO, &tmo, sizeof(tmo)), 0);
	req.has_id = 1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < 100000 && r == 0; i++) {
		req.id = (uint64_t)i;
		r = odpd_wire_send(f->sv[0], &req.base, NULL, 0, MSG_DONTWAIT);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_int_equal(r, -EAGAIN);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (secs >= 0.5)
		fail_msg("filling the socket took %.2f s: the send blocked", secs);
}

static void test_request_name(void **state)
{
	(void)state;
	assert_string_equal(odpd_request_name(ODPD__REQUEST__BODY_HELLO), "hello");
	assert_string_equal(odpd_request_name(ODPD__REQUEST__BODY_REG_MR), "reg_mr");
	assert_string_equal(odpd_request_name(ODPD__REQUEST__BODY_ATTACH_SEGMENT), "attach_segment");
	assert_string_equal(odpd_request_name(ODPD__REQUEST__BODY__NOT_SET), "unknown");
}

/* ------------------------------------------------------------ frozen fields */

/*
 * The answer to a Hello must stay readable by a client of any version, so
 * these bytes are written by hand from the field numbers and wire types that
 * odpd.proto freezes. Renumbering or retyping a frozen field breaks this test.
 */
#define REFUSAL_TEXT "protocol version 9 is not supported"
static const uint8_t frozen_reply[] = {
	0x08, 0x07,                     /* 1: id = 7 (varint) */
	0x10, 0x5d,                     /* 2: status = 93 = EPROTONOSUPPORT (varint) */
	0x1a, sizeof(REFUSAL_TEXT) - 1, /* 3: message (length-delimited) */
	'p', 'r', 'o', 't', 'o', 'c', 'o', 'l', ' ', 'v', 'e', 'r', 's', 'i', 'o', 'n', ' ',
	'9', ' ', 'i', 's', ' ', 'n', 'o', 't', ' ', 's', 'u', 'p', 'p', 'o', 'r', 't', 'e', 'd',
	0x22, 0x06,                     /* 4: hello (length-delimited HelloReply) */
	0x08, 0x00,                     /*   1: version = 0 (refused) */
	0x10, 0x01,                     /*   2: version_min = 1 */
	0x18, 0x01,                     /*   3: version_max = 1 */
};

static void test_frozen_reply_decodes(void **state)
{
	(void)state;
	assert_int_equal(EPROTONOSUPPORT, 93);  /* the byte above */
	Odpd__Reply *r = odpd__reply__unpack(NULL, sizeof(frozen_reply), frozen_reply);

	assert_non_null(r);
	assert_true(r->has_id);
	assert_int_equal(r->id, 7);
	assert_true(r->has_status);
	assert_int_equal(r->status, EPROTONOSUPPORT);
	assert_non_null(r->message);
	assert_string_equal(r->message, REFUSAL_TEXT);
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_HELLO);
	assert_non_null(r->hello);
	assert_true(r->hello->has_version);
	assert_int_equal(r->hello->version, 0);
	assert_true(r->hello->has_version_min);
	assert_int_equal(r->hello->version_min, 1);
	assert_true(r->hello->has_version_max);
	assert_int_equal(r->hello->version_max, 1);
	odpd__reply__free_unpacked(r, NULL);

	/* min and max apart, so that swapping their numbers shows */
	static const uint8_t range[] = { 0x08, 0x02, 0x10, 0x01, 0x18, 0x03 };
	Odpd__HelloReply *h = odpd__hello_reply__unpack(NULL, sizeof(range), range);
	assert_non_null(h);
	assert_int_equal(h->version, 2);
	assert_int_equal(h->version_min, 1);
	assert_int_equal(h->version_max, 3);
	odpd__hello_reply__free_unpacked(h, NULL);
}

/* ...and the daemon's side packs exactly those bytes. */
static void test_frozen_reply_encodes(void **state)
{
	(void)state;
	Odpd__Reply r = ODPD__REPLY__INIT;
	Odpd__HelloReply h = ODPD__HELLO_REPLY__INIT;
	uint8_t out[sizeof(frozen_reply) + 16];

	r.has_id = r.has_status = 1;
	r.id = 7;
	r.status = EPROTONOSUPPORT;
	r.message = (char *)REFUSAL_TEXT;
	r.body_case = ODPD__REPLY__BODY_HELLO;
	r.hello = &h;
	h.has_version = h.has_version_min = h.has_version_max = 1;
	h.version = 0;
	h.version_min = 1;
	h.version_max = 1;
	assert_int_equal(odpd__reply__get_packed_size(&r), sizeof(frozen_reply));
	assert_int_equal(odpd__reply__pack(&r, out), sizeof(frozen_reply));
	assert_memory_equal(out, frozen_reply, sizeof(frozen_reply));
}

/* The client's half: Request.id = 1, Request.hello = 2, Hello.version = 1. */
static const uint8_t frozen_request[] = {
	0x08, 0x2a,                     /* 1: id = 42 */
	0x12, 0x02,                     /* 2: hello (length-delimited) */
	0x08, 0x09,                     /*   1: version = 9 */
};

static void test_frozen_request(void **state)
{
	(void)state;
	Odpd__Request *r = odpd__request__unpack(NULL, sizeof(frozen_request), frozen_request);

	assert_non_null(r);
	assert_int_equal(r->id, 42);
	assert_int_equal(r->body_case, ODPD__REQUEST__BODY_HELLO);
	assert_true(r->hello->has_version);
	assert_int_equal(r->hello->version, 9);
	odpd__request__free_unpacked(r, NULL);

	Odpd__Request q = ODPD__REQUEST__INIT;
	Odpd__Hello h = ODPD__HELLO__INIT;
	uint8_t out[sizeof(frozen_request) + 16];
	q.has_id = 1;
	q.id = 42;
	q.body_case = ODPD__REQUEST__BODY_HELLO;
	q.hello = &h;
	h.has_version = 1;
	h.version = 9;
	assert_int_equal(odpd__request__pack(&q, out), sizeof(frozen_request));
	assert_memory_equal(out, frozen_request, sizeof(frozen_request));
}

/* A reply from a newer daemon, with fields this tree does not know, still decodes. */
static void test_frozen_reply_with_unknown_fields(void **state)
{
	(void)state;
	uint8_t buf[sizeof(frozen_reply) + 16];
	size_t n = sizeof(frozen_reply);

	memcpy(buf, frozen_reply, n);
	buf[n++] = 0xc0;                /* field 1000, varint: tag 8000 */
	buf[n++] = 0x3e;
	buf[n++] = 0x05;
	Odpd__Reply *r = odpd__reply__unpack(NULL, n, buf);
	assert_non_null(r);
	assert_int_equal(r->id, 7);
	assert_int_equal(r->status, EPROTONOSUPPORT);
	assert_int_equal(r->hello->version_max, 1);
	odpd__reply__free_unpacked(r, NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_round_trip_with_fd, setup, teardown),
		cmocka_unit_test_setup_teardown(test_round_trip_max_fds_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
		cmocka_unit_test_setup_teardown(test_zero_length_record, setup, teardown),
		cmocka_unit_test_setup_teardown(test_zero_length_record_through_signals, setup, teardown),
		cmocka_unit_test_setup_teardown(test_poll_deadline_through_signals, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peer_close_is_eof, setup, teardown),
		cmocka_unit_test_setup_teardown(test_peer_shutdown_is_eof, setup, teardown),
		cmocka_unit_test_setup_teardown(test_too_many_fds_closed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pack_too_large, setup, teardown),
		cmocka_unit_test_setup_teardown(test_send_no_sigpipe, setup, teardown),
		cmocka_unit_test_setup_teardown(test_send_full_nonblocking, setup, teardown),
		cmocka_unit_test(test_request_name),
		cmocka_unit_test(test_frozen_reply_decodes),
		cmocka_unit_test(test_frozen_reply_encodes),
		cmocka_unit_test(test_frozen_request),
		cmocka_unit_test(test_frozen_reply_with_unknown_fields),
	};

	return cmocka_run_group_tests_name("wire", tests, NULL, NULL);
}
