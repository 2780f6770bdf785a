/* SPDX-License-Identifier: MIT */
/*
 * bench-reg: what registering through odpd costs next to doing it in-process,
 * measured side by side in one process against a running odpd. Prints medians
 * (µs) and ratios; exits non-zero only on errors, never on speed. bench/run
 * runs it in the rxe VM.
 *
 *  - verbs:   ibv_reg_mr / ibv_dereg_mr on a touched MAP_SHARED memfd, own
 *             context and PD on the first device (the baseline);
 *  - odpd:    odpd_reg / odpd_dereg on a touched odpd_alloc() segment;
 *  - rtt:     one bare daemon round trip: DeregMr of an unknown handle on a
 *             raw protocol connection (ENOENT, no kernel work);
 *  - verify:  odpd_verify, the first one of a connection (sets up the
 *             loopback QP pair) against later ones, and 64 MiB throughput;
 *  - memory:  odpd's VmRSS / RssShmem / VmPin idle and holding a 64 MiB MR.
 *
 * One iteration of each size runs verbs, odpd (and at 4 KiB the round trip)
 * back to back, so slow drift of the VM hits every series alike.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "bench-util.h"
#include "odpd.h"
#include "odpd-wire.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)
#define WARMUP 2u

const char bench_name[] = "bench-reg";

/* ---------------------------------------------------------------- the table */

static void print_header(void)
{
	printf("%-36s %5s %11s %11s %11s %8s  %s\n",
	       "measurement", "n", "median_us", "p10_us", "p90_us", "ratio", "ratio of medians to");
}

/* One table line; @base NULL: no ratio. @note: free text after the ratio column. */
static void print_row(struct series *s, struct series *base, const char *note)
{
	summarize(s);
	printf("%-36s %5u %11.1f %11.1f %11.1f ", s->name, s->n, s->median, s->p10, s->p90);
	if (base)
		printf("%8.2f  %s%s%s\n", s->median / base->median, base->name,
		       note ? "; " : "", note ? note : "");
	else
		printf("%8s  %s\n", "-", note ? note : "");
}

/* ---------------------------------------------------------------- raw protocol */

static uint8_t rx_buf[ODPD_MAX_PACKET + 1];

static Odpd__Reply *raw_call(int fd, Odpd__Request *req)
{
	static uint64_t next_id = 1;
	struct odpd_packet pkt;
	Odpd__Reply *r;
	int e;

	req->has_id = 1;
	req->id = next_id++;
	e = odpd_wire_send(fd, &req->base, NULL, 0, 0);
	if (e < 0)
		die("send %s: %s", odpd_request_name(req->body_case), strerror(-e));
	e = odpd_wire_recv(fd, rx_buf, sizeof(rx_buf), &pkt, 0);
	if (e < 0)
		die("recv: %s", strerror(-e));
	if (pkt.eof || pkt.truncated || pkt.nfds) {
		odpd_packet_close_fds(&pkt);
		die("bad reply packet (eof %d, truncated %d, %u fds)", pkt.eof, pkt.truncated, pkt.nfds);
	}
	r = odpd__reply__unpack(NULL, pkt.len, rx_buf);
	if (!r || r->id != req->id)
		die("malformed reply to %s", odpd_request_name(req->body_case));
	return r;
}

static int raw_connect(const char *path)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello h = ODPD__HELLO__INIT;
	Odpd__Reply *r;
	int fd = odpd_wire_connect(path);

	if (fd < 0)
		die("connect %s: %s", path, strerror(-fd));
	h.has_version = 1;
	h.version = ODPD_PROTOCOL_VERSION;
	h.client_name = (char *)"bench-reg";
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &h;
	r = raw_call(fd, &req);
	if (r->status)
		die("hello: %s", r->message ? r->message : strerror(r->status));
	odpd__reply__free_unpacked(r, NULL);
	return fd;
}

static pid_t daemon_pid(int fd)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Status st = ODPD__STATUS__INIT;
	Odpd__Reply *r;
	pid_t pid;

	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &st;
	r = raw_call(fd, &req);
	if (r->status || r->body_case != ODPD__REPLY__BODY_STATUS_REPLY ||
	    !r->status_reply->has_daemon_pid)
		die("status: no daemon pid (%s)", r->message ? r->message : "no message");
	pid = r->status_reply->daemon_pid;
	odpd__reply__free_unpacked(r, NULL);
	return pid;
}

/* One bare round trip: DeregMr of a handle nobody has; the daemon answers ENOENT. */
static void raw_rtt(int fd)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__DeregMr d = ODPD__DEREG_MR__INIT;
	Odpd__Reply *r;

	d.has_handle = 1;
	d.handle = UINT64_MAX;
	req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
	req.dereg_mr = &d;
	r = raw_call(fd, &req);
	if (r->status != ENOENT)
		die("DeregMr of an unknown handle: expected ENOENT, got %d", r->status);
	odpd__reply__free_unpacked(r, NULL);
}

/* ---------------------------------------------------------------- socket baseline */

/* ---------------------------------------------------------------- odpd helpers */

struct mem {
	long rss_kb, shmem_kb, pin_kb;
};

static struct mem proc_mem(pid_t pid)
{
	struct mem m = { -1, -1, -1 };
	char path[64], line[256];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		die("%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		sscanf(line, "VmRSS: %ld kB", &m.rss_kb);
		sscanf(line, "RssShmem: %ld kB", &m.shmem_kb);
		sscanf(line, "VmPin: %ld kB", &m.pin_kb);
	}
	fclose(f);
	if (m.rss_kb < 0 || m.shmem_kb < 0 || m.pin_kb < 0)
		die("%s: no VmRSS, RssShmem or VmPin", path);
	return m;
}

static void print_mem(const char *state, struct mem m, struct mem idle)
{
	printf("%-44s %9ld %9ld %9ld   %+9ld %+9ld\n", state, m.rss_kb, m.shmem_kb, m.pin_kb,
	       m.rss_kb - idle.rss_kb, m.pin_kb - idle.pin_kb);
}

static struct odpd_mr *reg(struct odpd_conn *c, void *addr, size_t len)
{
	struct odpd_mr *mr = odpd_reg(c, addr, len, ACCESS);

	if (!mr)
		die("odpd_reg %zu: %s", len, odpd_errmsg());
	return mr;
}

static void dereg(struct odpd_mr *mr)
{
	if (odpd_dereg(mr) < 0)
		die("odpd_dereg: %s", odpd_errmsg());
}

static uint32_t verify(struct odpd_mr *mr)
{
	uint32_t crc;

	if (odpd_verify(mr, NULL, 0, &crc) < 0)
		die("odpd_verify %zu: %s", mr->length, odpd_errmsg());
	return crc;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f, "usage: bench-reg [--socket PATH] [--iters N] [--big-iters N]\n"
		   "                 [--verify-iters N] [--first-iters N]\n"
		   "  --iters N         iterations at 4 KiB and 1 MiB, round trips and\n"
		   "                    later 4 KiB verifies (default 200)\n"
		   "  --big-iters N     registrations at 64 MiB (default 20)\n"
		   "  --verify-iters N  verifies of 64 MiB (default 10)\n"
		   "  --first-iters N   fresh connections for the first verify (default 10)\n"
		   "The socket defaults to $%s, else %s.\n", ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "iters", required_argument, NULL, 'n' },
		{ "big-iters", required_argument, NULL, 'b' },
		{ "verify-iters", required_argument, NULL, 'v' },
		{ "first-iters", required_argument, NULL, 'f' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	static const size_t sizes[] = { 4 * KiB, MiB, 64 * MiB };
	static const char *const size_names[] = { "4 KiB", "1 MiB", "64 MiB" };
	const char *sock = getenv(ODPD_SOCKET_ENV);
	unsigned iters = 200, big_iters = 20, verify_iters = 10, first_iters = 10;
	struct series *vreg[3], *vdereg[3], *vpair[3], *oreg[3], *odereg[3], *opair[3], *rtt, *echo;
	struct series *vfirst, *vlater, *vbig;
	struct odpd_segment *seg[3];
	struct odpd_mr *mr;
	struct odpd_conn *conn;
	struct verbs v;
	struct mem idle, m;
	void *buf[3];
	int c, raw, echo_fd;
	pid_t pid, echo_pid;

	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': sock = optarg; break;
		case 'n': iters = parse_n(optarg, 100000); break;
		case 'b': big_iters = parse_n(optarg, 100000); break;
		case 'v': verify_iters = parse_n(optarg, 100000); break;
		case 'f': first_iters = parse_n(optarg, 100000); break;
		case 'h': usage(stdout); return EXIT_SUCCESS;
		default: usage(stderr); return EXIT_FAILURE;
		}
	}
	if (optind < argc) {
		usage(stderr);
		return EXIT_FAILURE;
	}
	if (!sock || !*sock)
		sock = ODPD_SOCKET_DEFAULT;

	print_command(argc, argv);
	printf(", socket %s\n", sock);

	echo_fd = echo_start(&echo_pid);   /* fork before any verbs or odpd state exists */
	verbs_open(&v);
	conn = connect_odpd(sock);
	raw = raw_connect(sock);
	pid = daemon_pid(raw);
	{
		struct odpd_device_attr a;

		if (odpd_query_device(conn, 0, &a, sizeof(a)) < 0)
			die("odpd_query_device: %s", odpd_errmsg());
		printf("device: verbs %s, odpd %s (%s, fw %s); odpd pid %d\n",
		       v.name, a.name, a.transport, a.fw_ver, (int)pid);
	}
	printf("access LOCAL_WRITE|REMOTE_READ|REMOTE_WRITE, pinned; %u warm-up iterations not counted\n\n",
	       WARMUP);

	/* ---- memory, on a daemon that has done nothing yet for us */
	idle = proc_mem(pid);
	for (int i = 0; i < 3; i++) {
		buf[i] = memfd_buffer(sizes[i]);
		seg[i] = segment(conn, sizes[i]);
	}
	printf("%-44s %9s %9s %9s   %9s %9s\n", "odpd memory (kB)", "VmRSS", "RssShmem", "VmPin",
	       "dRSS", "dVmPin");
	print_mem("idle (one client connected)", idle, idle);
	print_mem("segments 4K+1M+64M, touched by the client", proc_mem(pid), idle);
	mr = reg(conn, odpd_segment_addr(seg[2]), 64 * MiB);
	m = proc_mem(pid);
	print_mem("holding one 64 MiB pinned MR", m, idle);
	dereg(mr);
	print_mem("after odpd_dereg", proc_mem(pid), idle);
	printf("pinned / registered = %.3f (VmPin +%ld kB for %lu kB registered)\n\n",
	       (double)(m.pin_kb - idle.pin_kb) / (double)(64 * MiB / KiB), m.pin_kb - idle.pin_kb,
	       64 * MiB / KiB);

	/* ---- registration, side by side */
	rtt = series_new(iters, "odpd round trip (DeregMr ENOENT)");
	echo = series_new(iters, "unix seqpacket echo 64 B (no odpd)");
	for (int i = 0; i < 3; i++) {
		unsigned n = sizes[i] == 64 * MiB ? big_iters : iters;
		const char *sz = size_names[i];

		vreg[i] = series_new(n, "verbs reg %s", sz);
		vdereg[i] = series_new(n, "verbs dereg %s", sz);
		vpair[i] = series_new(n, "verbs reg+dereg %s", sz);
		oreg[i] = series_new(n, "odpd reg %s", sz);
		odereg[i] = series_new(n, "odpd dereg %s", sz);
		opair[i] = series_new(n, "odpd reg+dereg %s", sz);
		for (unsigned k = 0; k < n + WARMUP; k++) {
			void *addr = odpd_segment_addr(seg[i]);
			double t[3], t0, t1, t2;

			verbs_reg_dereg(&v, buf[i], sizes[i], ACCESS, t);
			if (k >= WARMUP) {
				add(vreg[i], t[1] - t[0]);
				add(vdereg[i], t[2] - t[1]);
				add(vpair[i], t[2] - t[0]);
			}

			t0 = now_us();
			mr = reg(conn, addr, sizes[i]);
			t1 = now_us();
			dereg(mr);
			t2 = now_us();
			if (k >= WARMUP) {
				add(oreg[i], t1 - t0);
				add(odereg[i], t2 - t1);
				add(opair[i], t2 - t0);
			}

			if (i == 0) {
				t0 = now_us();
				raw_rtt(raw);
				t1 = now_us();
				echo_rtt(echo_fd);
				t2 = now_us();
				if (k >= WARMUP) {
					add(rtt, t1 - t0);
					add(echo, t2 - t1);
				}
			}
		}
	}

	/* ---- verify: first of a connection (fresh connections) vs later ones */
	vfirst = series_new(first_iters, "odpd verify 4 KiB, first of a conn");
	for (unsigned k = 0; k < first_iters; k++) {
		struct odpd_conn *c2 = connect_odpd(sock);
		struct odpd_segment *s2;
		double t0;

		s2 = segment(c2, 4 * KiB);
		mr = reg(c2, odpd_segment_addr(s2), 4 * KiB);
		t0 = now_us();
		verify(mr);
		add(vfirst, now_us() - t0);
		odpd_disconnect(c2);
	}
	vlater = series_new(iters, "odpd verify 4 KiB, later");
	mr = reg(conn, odpd_segment_addr(seg[0]), 4 * KiB);
	for (unsigned k = 0; k < iters + WARMUP; k++) {
		double t0 = now_us();

		verify(mr);
		if (k >= WARMUP)
			add(vlater, now_us() - t0);
	}
	dereg(mr);
	vbig = series_new(verify_iters, "odpd verify 64 MiB");
	{
		uint8_t *p = odpd_segment_addr(seg[2]);
		uint32_t want;

		for (size_t off = 0; off < 64 * MiB; off += 4 * KiB)
			memset(p + off, (int)(off / (4 * KiB)), 4 * KiB);
		want = (uint32_t)crc32(crc32(0, NULL, 0), p, (uInt)(64 * MiB));
		mr = reg(conn, p, 64 * MiB);
		for (unsigned k = 0; k < verify_iters + 1; k++) {
			double t0 = now_us();
			uint32_t got = verify(mr);

			if (k >= 1)
				add(vbig, now_us() - t0);
			if (got != want)
				die("verify 64 MiB: CRC %08x, expected %08x", got, want);
		}
		dereg(mr);
	}

	/* ---- the table */
	print_header();
	for (int i = 0; i < 3; i++) {
		print_row(vreg[i], NULL, "baseline");
		print_row(vdereg[i], NULL, "baseline");
		print_row(vpair[i], NULL, "baseline");
		print_row(oreg[i], vreg[i], NULL);
		print_row(odereg[i], vdereg[i], NULL);
		print_row(opair[i], vpair[i], NULL);
	}
	print_row(rtt, vreg[0], "no kernel work");
	print_row(echo, vreg[0], "forked echo child, socketpair");
	print_row(vlater, NULL, NULL);
	print_row(vfirst, vlater, "sets up the loopback QP pair");
	{
		char note[64];

		summarize(vbig);
		snprintf(note, sizeof(note), "%.1f MB/s at the median", 64 * MiB / vbig->median);
		print_row(vbig, NULL, note);
	}

	/* ---- leave nothing behind, and show what that leaves in the daemon */
	for (int i = 0; i < 3; i++)
		if (odpd_detach(seg[i]) < 0)
			die("odpd_detach: %s", odpd_errmsg());
	printf("\n%-44s %9s %9s %9s   %9s %9s\n", "odpd memory (kB)", "VmRSS", "RssShmem", "VmPin",
	       "dRSS", "dVmPin");
	print_mem("end: all freed; main conn keeps its verifier", proc_mem(pid), idle);
	odpd_disconnect(conn);
	close(raw);
	child_stop(echo_fd, echo_pid);
	verbs_close(&v);
	return EXIT_SUCCESS;
}
