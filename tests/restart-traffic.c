/* SPDX-License-Identifier: MIT */
/*
 * restart-traffic: a client that keeps working through odpd MRs while odpd is
 * restarted (issue 25), and reports precisely what it noticed. One program,
 * three modes:
 *
 *  --mode traffic  odpd_alloc a segment, register K pinned MRs over it (local
 *                  write, remote write, remote read), import odpd's PD
 *                  (odpd_import_pd) and make one RC QP on it connected to
 *                  itself. Then, until SIGTERM/SIGINT or --seconds: fill one
 *                  MR with a new pattern, RDMA WRITE it into the next MR, check
 *                  the bytes there, RDMA READ them back into the first and
 *                  check again; and one odpd request (a fresh pinned MR over a
 *                  page of its own, ODPD_REG_NO_CACHE, then odpd_dereg), each
 *                  call timed (CLOCK_MONOTONIC) for the longest request
 *                  latency: the pause a restart causes. Where odpd's provider
 *                  cannot import (the stock profile: EOPNOTSUPP) the data path
 *                  is odpd_verify instead: the daemon reads the MR with the HCA
 *                  and its CRC is compared with the bytes written here.
 *  --mode shared   join the shared PD --pd NAME (odpd_join_pd), register MR A
 *                  (held) and MR B (released at once with odpd_dereg_relaxed),
 *                  then send a probe request every --interval-ms until told to
 *                  stop. At the end: register B's range again and report
 *                  whether it was a cache hit (struct odpd_mr.cache_hit) with
 *                  the same keys; release it relaxed, odpd_flush_relaxed, and
 *                  register the range once more: flush is a barrier only if
 *                  that one is not a hit. Needs odpd's relaxed-window-ms
 *                  longer than the run, or odpd takes B back on its own.
 *  --mode hold     hold --hold N MRs (fresh pinned MRs over one page,
 *                  ODPD_REG_NO_CACHE; 50,000 per connection, odpd's limit
 *                  being 65,536 references per connection) and send a probe
 *                  request every --interval-ms: the load for bench/run-restart.
 *
 * Key files (--keys FILE): FILE.start once everything is set up (its
 * appearance says the client is ready: written to FILE.start.tmp and
 * renamed), FILE.end at the end; one line per MR, "iova length lkey rkey"
 * (hexadecimal but length). The end file has the keys as odpd gives them at
 * the end: for traffic and shared, a registration of the MR's range again
 * (a cache hit, whose keys are odpd's MR's, checked with odpd_verify and
 * released); "lost" for keys once the connection was lost.
 *
 * Output: one line per event worth knowing (a failed work request, a
 * mismatch, a failed call with its errno and odpd_errmsg), an errno
 * breakdown, then one summary line:
 *   restart-traffic: mode traffic data rdma iterations N requests R failed_wr F
 *     mismatches M errors E enotconn C max_request_us U max_wr_us W
 *     mean_request_us A median_request_us D p99_request_us P keys same
 * (shared adds relaxed_hit 0|1 flush_barrier 0|1). After a lost connection
 * (ENOTCONN) no more requests are sent, and after a failed work request no
 * more are posted (the QP is in the error state): each counts once.
 * SIGUSR1 prints the counters so far, between iterations:
 *   restart-traffic: status iterations N requests R failed_wr F mismatches M errors E
 *     enotconn C max_request_us U max_wr_us W mean_request_us A median_request_us D
 *     p99_request_us P
 * Request latencies are each odpd call's (odpd_reg and odpd_dereg of the probe,
 * odpd_verify on the verify data path), in microseconds; A, D and P are over
 * every request since the start.
 * Exit status 0 only if F = M = E = 0 and the keys at the end are those of the
 * start (and, for shared, the relaxed MR was a hit and flush a barrier);
 * 1 otherwise; 2 for bad arguments.
 *
 *   restart-traffic --mode traffic|shared|hold [--socket PATH] [--keys FILE]
 *                   [--seconds S] [--mrs K] [--mr-size BYTES] [--pd NAME]
 *                   [--hold N] [--interval-ms MS]
 *
 * e.g. in the testbed VM, against odpd at /run/odpd/odpd.sock:
 *   restart-traffic --mode traffic --keys /share/t & ...; kill -TERM $!; wait $!
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "demo-util.h"
#include "odpd.h"
#include "rcqp.h"

#define ACCESS_RDMA (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define ACCESS_SHARED (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ)
#define PROBE_SIZE 4096
#define HOLD_PER_CONN 50000
#define MAX_ERRNO 256

enum mode { MODE_TRAFFIC, MODE_SHARED, MODE_HOLD };

static struct {
	enum mode mode;
	const char *sock, *keys, *pd_name;
	double seconds;
	unsigned mrs, interval_ms;
	size_t mr_size;
	unsigned long hold;
} opt = { .mrs = 4, .mr_size = 65536, .pd_name = "restart-test", .interval_ms = 10, .hold = 1000 };

/* What the summary line reports. */
static struct {
	unsigned long iterations, requests, failed_wr, mismatches, errors;
	unsigned long by_errno[MAX_ERRNO];
	uint64_t max_request_ns, max_wr_ns;
	bool conn_lost, qp_dead;
	uint32_t *lat_us;                   /* every request's latency, for the mean and quantiles */
	size_t n_lat, cap_lat;
} st;

/* One MR's keys, as the key files list them. */
struct keys {
	uint64_t iova;
	size_t length;
	uint32_t lkey, rkey;
	bool lost;
};

static volatile sig_atomic_t stop, want_status;

static void on_signal(int sig)
{
	if (sig == SIGUSR1)
		want_status = 1;
	else
		stop = 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A call failed with errno @e: count it, say what it was (the first 20 times). */
static void call_failed(const char *what, int e)
{
	st.errors++;
	st.by_errno[e > 0 && e < MAX_ERRNO ? e : 0]++;
	if (e == ENOTCONN)
		st.conn_lost = true;
	if (st.errors <= 20)
		fprintf(stderr, "restart-traffic: iteration %lu: %s: %s (%s)\n", st.iterations, what,
			strerror(e), odpd_errmsg());
}

/* Record a request's latency, from @t0 to now. */
static void request_done(uint64_t t0)
{
	uint64_t d = now_ns() - t0;

	st.requests++;
	if (d > st.max_request_ns)
		st.max_request_ns = d;
	if (st.n_lat == st.cap_lat) {
		size_t cap = st.cap_lat ? 2 * st.cap_lat : 4096;
		uint32_t *p = realloc(st.lat_us, cap * sizeof(*p));

		if (!p)
			return;     /* the mean and quantiles then leave the rest out */
		st.lat_us = p;
		st.cap_lat = cap;
	}
	st.lat_us[st.n_lat++] = d / 1000 > UINT32_MAX ? UINT32_MAX : (uint32_t)(d / 1000);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* " mean_request_us A median_request_us M p99_request_us P" of the requests so
 * far (0 without any); sorts a copy. */
static const char *latency_stats(void)
{
	static char out[128];
	uint64_t sum = 0;
	uint32_t *v;
	size_t n = st.n_lat;

	if (!n || !(v = malloc(n * sizeof(*v)))) {
		snprintf(out, sizeof(out), " mean_request_us 0 median_request_us 0 p99_request_us 0");
		return out;
	}
	memcpy(v, st.lat_us, n * sizeof(*v));
	qsort(v, n, sizeof(*v), cmp_u32);
	for (size_t i = 0; i < n; i++)
		sum += v[i];
	snprintf(out, sizeof(out), " mean_request_us %llu median_request_us %u p99_request_us %u",
		 (unsigned long long)(sum / n), n % 2 ? v[n / 2] : (uint32_t)(((uint64_t)v[n / 2 - 1] + v[n / 2]) / 2),
		 v[(n - 1) * 99 / 100]);
	free(v);
	return out;
}

/* The probe request: a fresh MR over the probe page, then its deregistration.
 * Local write only, so that a test can tell these MRs from the held ones. */
static void probe(struct odpd_conn *conn, void *page)
{
	struct odpd_reg_attr a = {
		.comp_mask = ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
		.access = IBV_ACCESS_LOCAL_WRITE, .flags = ODPD_REG_NO_CACHE,
	};
	struct odpd_mr *mr;
	uint64_t t0;

	if (st.conn_lost)
		return;
	t0 = now_ns();
	mr = odpd_reg_attr(conn, page, PROBE_SIZE, &a);
	if (!mr) {
		call_failed("probe odpd_reg", errno);
		return;
	}
	request_done(t0);
	t0 = now_ns();
	if (odpd_dereg(mr) < 0) {
		call_failed("probe odpd_dereg", errno);
		return;
	}
	request_done(t0);
}

static void fill(unsigned char *p, size_t n, unsigned long seed)
{
	uint32_t x = (uint32_t)(seed * 2654435761u) | 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (unsigned char)x;
	}
}

static void mismatch(const char *what)
{
	if (st.mismatches++ < 20)
		fprintf(stderr, "restart-traffic: iteration %lu: %s: the bytes differ\n", st.iterations, what);
}

static void wait_interval(void)
{
	struct timespec ts = { .tv_sec = opt.interval_ms / 1000, .tv_nsec = (long)(opt.interval_ms % 1000) * 1000000 };

	if (opt.interval_ms)
		nanosleep(&ts, NULL);
}

/* The counters so far, on SIGUSR1: a test asks after each restart. */
static void print_status(void)
{
	printf("restart-traffic: status iterations %lu requests %lu failed_wr %lu mismatches %lu errors %lu "
	       "enotconn %lu max_request_us %llu max_wr_us %llu%s\n", st.iterations, st.requests, st.failed_wr,
	       st.mismatches, st.errors, st.by_errno[ENOTCONN], (unsigned long long)(st.max_request_ns / 1000),
	       (unsigned long long)(st.max_wr_ns / 1000), latency_stats());
	fflush(stdout);
}

/* Between iterations: a status line if asked; whether to stop. */
static bool done(uint64_t t_end)
{
	if (want_status) {
		want_status = 0;
		print_status();
	}
	return stop || (t_end && now_ns() >= t_end);
}

static int write_keys(const char *suffix, const struct keys *k, size_t n)
{
	char path[4096], tmp[4200];
	FILE *f;

	if (!opt.keys)
		return 0;
	snprintf(path, sizeof(path), "%s.%s", opt.keys, suffix);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f) {
		perror(tmp);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		if (k[i].lost)
			fprintf(f, "%#llx %zu lost lost\n", (unsigned long long)k[i].iova, k[i].length);
		else
			fprintf(f, "%#llx %zu %#x %#x\n", (unsigned long long)k[i].iova, k[i].length, k[i].lkey,
				k[i].rkey);
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0) {
		perror(path);
		return -1;
	}
	return 0;
}

static struct keys keys_of(const struct odpd_mr *mr)
{
	return (struct keys){ .iova = mr->iova, .length = mr->length, .lkey = mr->lkey, .rkey = mr->rkey };
}

static bool keys_equal(const struct keys *a, const struct keys *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (a[i].lost || b[i].lost || a[i].iova != b[i].iova || a[i].length != b[i].length ||
		    a[i].lkey != b[i].lkey || a[i].rkey != b[i].rkey)
			return false;
	return true;
}

/*
 * The keys odpd gives for [@addr, @addr + @len) now: register it again
 * (@access), which should be a cache hit on the MR there, have odpd read
 * it back through that MR (odpd_verify) and compare with the bytes here,
 * and release the extra reference. *@ret_hit: the registration's cache_hit.
 */
static struct keys keys_now(struct odpd_conn *conn, void *addr, size_t len, unsigned access, int *ret_hit)
{
	struct keys k = { .iova = (uintptr_t)addr, .length = len, .lost = true };
	struct odpd_mr *mr;
	uint32_t crc;

	*ret_hit = 0;
	if (st.conn_lost)
		return k;
	mr = odpd_reg(conn, addr, len, access);
	if (!mr) {
		call_failed("end: odpd_reg of a held range", errno);
		return k;
	}
	k = keys_of(mr);
	*ret_hit = mr->cache_hit;
	if (odpd_verify(mr, NULL, 0, &crc) < 0)
		call_failed("end: odpd_verify", errno);
	else if (crc != crc_of(addr, len))
		mismatch("end: odpd_verify's CRC");
	if (odpd_dereg(mr) < 0)
		call_failed("end: odpd_dereg", errno);
	return k;
}

static const char *errno_name(int e)
{
	switch (e) {
	case ENOTCONN: return "ENOTCONN";
	case ECONNRESET: return "ECONNRESET";
	case EIO: return "EIO";
	case ENOMEM: return "ENOMEM";
	case ENOENT: return "ENOENT";
	case EAGAIN: return "EAGAIN";
	case EINTR: return "EINTR";
	case ETIMEDOUT: return "ETIMEDOUT";
	case ENODEV: return "ENODEV";
	case EDQUOT: return "EDQUOT";
	case EINVAL: return "EINVAL";
	default: return NULL;
	}
}

static void print_errnos(void)
{
	if (!st.errors)
		return;
	printf("restart-traffic: errors by errno:");
	for (int e = 0; e < MAX_ERRNO; e++) {
		const char *n = errno_name(e);

		if (!st.by_errno[e])
			continue;
		if (n)
			printf(" %s %lu", n, st.by_errno[e]);
		else
			printf(" errno%d %lu", e, st.by_errno[e]);
	}
	printf("\n");
}

static void print_summary(const char *data, bool keys_same, const char *extra)
{
	print_errnos();
	printf("restart-traffic: mode %s data %s iterations %lu requests %lu failed_wr %lu mismatches %lu "
	       "errors %lu enotconn %lu max_request_us %llu max_wr_us %llu%s keys %s%s\n",
	       opt.mode == MODE_TRAFFIC ? "traffic" : opt.mode == MODE_SHARED ? "shared" : "hold", data,
	       st.iterations, st.requests, st.failed_wr, st.mismatches, st.errors, st.by_errno[ENOTCONN],
	       (unsigned long long)(st.max_request_ns / 1000), (unsigned long long)(st.max_wr_ns / 1000),
	       latency_stats(), keys_same ? "same" : "changed", extra);
	fflush(stdout);
}

static uint64_t end_time(void)
{
	return opt.seconds > 0 ? now_ns() + (uint64_t)(opt.seconds * 1e9) : 0;
}

/* One RDMA op, timed; false after a failed work request (counted once: the
 * QP is in the error state then, and no more are posted). */
static bool rdma(struct rcqp *q, enum ibv_wr_opcode op, void *local, uint32_t lkey, const struct keys *remote)
{
	enum ibv_wc_status wc = IBV_WC_SUCCESS;
	uint64_t t0 = now_ns(), d;
	int r = rcqp_rdma(q, op, (uintptr_t)local, lkey, (uint32_t)remote->length, remote->iova, remote->rkey, &wc);

	d = now_ns() - t0;
	if (d > st.max_wr_ns)
		st.max_wr_ns = d;
	if (r == 0)
		return true;
	st.failed_wr++;
	st.qp_dead = true;
	fprintf(stderr, "restart-traffic: iteration %lu: RDMA %s failed: %s; no more work requests\n", st.iterations,
		op == IBV_WR_RDMA_WRITE ? "WRITE" : "READ", r == -EIO ? ibv_wc_status_str(wc) : strerror(-r));
	return false;
}

/* Traffic: one iteration of the data path, RDMA (q) or odpd_verify (q NULL). */
static void move_data(struct rcqp *q, struct odpd_mr **mr, const struct keys *k, unsigned char *base)
{
	unsigned src = (unsigned)(st.iterations % opt.mrs), dst = (src + 1) % opt.mrs;
	unsigned char *s = base + (size_t)src * opt.mr_size, *d = base + (size_t)dst * opt.mr_size;
	size_t n = opt.mr_size;

	if (!q) {          /* no import: odpd reads the MR back */
		uint32_t crc;
		uint64_t t0;

		if (st.conn_lost)
			return;
		fill(s, n, st.iterations);
		t0 = now_ns();
		if (odpd_verify(mr[src], NULL, 0, &crc) < 0) {
			call_failed("odpd_verify", errno);
			return;
		}
		request_done(t0);
		if (crc != crc_of(s, n))
			mismatch("odpd_verify's CRC");
		return;
	}
	if (st.qp_dead)
		return;
	fill(s, n, st.iterations);
	if (!rdma(q, IBV_WR_RDMA_WRITE, s, mr[src]->lkey, &k[dst]))
		return;
	if (memcmp(s, d, n) != 0)
		mismatch("after RDMA WRITE");
	memset(s, 0, n);
	if (!rdma(q, IBV_WR_RDMA_READ, s, mr[src]->lkey, &k[dst]))
		return;
	if (memcmp(s, d, n) != 0)
		mismatch("after RDMA READ");
}

static int run_traffic(void)
{
	struct odpd_conn *conn = odpd_connect(opt.sock, NULL);
	struct odpd_segment *seg, *pseg;
	struct odpd_mr **mr;
	struct keys *k0, *k1;
	struct ibv_pd *pd;
	struct rcqp q, *qp = NULL;
	unsigned char *base;
	const char *data = "rdma";
	uint64_t t_end;
	bool same;

	if (!conn || !(seg = odpd_alloc(conn, (size_t)opt.mrs * opt.mr_size, 0)) ||
	    !(pseg = odpd_alloc(conn, PROBE_SIZE, 0))) {
		fprintf(stderr, "restart-traffic: set-up: %s (%s)\n", strerror(errno), odpd_errmsg());
		return 1;
	}
	base = odpd_segment_addr(seg);
	mr = calloc(opt.mrs, sizeof(*mr));
	k0 = calloc(opt.mrs, sizeof(*k0));
	k1 = calloc(opt.mrs, sizeof(*k1));
	if (!mr || !k0 || !k1)
		return 1;
	for (unsigned i = 0; i < opt.mrs; i++) {
		fill(base + (size_t)i * opt.mr_size, opt.mr_size, 1000 + i);
		mr[i] = odpd_reg(conn, base + (size_t)i * opt.mr_size, opt.mr_size, ACCESS_RDMA);
		if (!mr[i]) {
			fprintf(stderr, "restart-traffic: odpd_reg of MR %u: %s (%s)\n", i, strerror(errno), odpd_errmsg());
			return 1;
		}
		k0[i] = keys_of(mr[i]);
	}
	pd = odpd_import_pd(conn);
	if (!pd && errno == EOPNOTSUPP) {
		data = "verify";
		printf("restart-traffic: odpd_import_pd: EOPNOTSUPP (%s): the data path is odpd_verify\n", odpd_errmsg());
	} else if (!pd) {
		fprintf(stderr, "restart-traffic: odpd_import_pd: %s (%s)\n", strerror(errno), odpd_errmsg());
		return 1;
	} else {
		int r = rcqp_create(&q, pd, 4);

		if (r == 0)
			r = rcqp_connect(&q, &q.local);
		if (r < 0) {
			fprintf(stderr, "restart-traffic: an RC QP on odpd's PD, to itself: %s\n", strerror(-r));
			return 1;
		}
		qp = &q;
	}
	if (write_keys("start", k0, opt.mrs) < 0)
		return 1;
	printf("restart-traffic: pid %d: %u MRs of %zu bytes, data path %s, probe every %u ms; ready\n",
	       (int)getpid(), opt.mrs, opt.mr_size, data, opt.interval_ms);
	fflush(stdout);
	t_end = end_time();
	while (!done(t_end)) {
		move_data(qp, mr, k0, base);
		probe(conn, odpd_segment_addr(pseg));
		st.iterations++;
		wait_interval();
	}
	for (unsigned i = 0; i < opt.mrs; i++) {
		int hit;

		k1[i] = keys_now(conn, base + (size_t)i * opt.mr_size, opt.mr_size, ACCESS_RDMA, &hit);
		if (!k1[i].lost && !hit)
			fprintf(stderr, "restart-traffic: end: MR %u's range was not a cache hit: a new MR\n", i);
	}
	same = keys_equal(k0, k1, opt.mrs);
	write_keys("end", k1, opt.mrs);
	if (qp)
		rcqp_destroy(qp);
	odpd_disconnect(conn);  /* deregisters and detaches what is left */
	print_summary(data, same, "");
	return st.failed_wr || st.mismatches || st.errors || !same;
}

static int run_shared(void)
{
	struct odpd_conn *conn = odpd_connect(opt.sock, NULL);
	struct odpd_segment *seg, *pseg;
	struct odpd_mr *a, *b;
	struct keys k0[2], k1[2];
	unsigned char *base;
	size_t n = opt.mr_size;
	int a_hit, relaxed_hit = 0, barrier = 0;
	char extra[128];
	uint64_t t_end;
	bool same;

	if (!conn || odpd_join_pd(conn, opt.pd_name) < 0 || !(seg = odpd_alloc(conn, 2 * n, 0)) ||
	    !(pseg = odpd_alloc(conn, PROBE_SIZE, 0))) {
		fprintf(stderr, "restart-traffic: set-up: %s (%s)\n", strerror(errno), odpd_errmsg());
		return 1;
	}
	base = odpd_segment_addr(seg);
	fill(base, 2 * n, 77);
	a = odpd_reg(conn, base, n, ACCESS_SHARED);
	b = a ? odpd_reg(conn, base + n, n, ACCESS_SHARED) : NULL;
	if (!a || !b) {
		fprintf(stderr, "restart-traffic: odpd_reg in shared PD %s: %s (%s)\n", opt.pd_name, strerror(errno),
			odpd_errmsg());
		return 1;
	}
	k0[0] = keys_of(a);
	k0[1] = keys_of(b);
	if (odpd_dereg_relaxed(b) < 0) {
		fprintf(stderr, "restart-traffic: odpd_dereg_relaxed: %s (%s)\n", strerror(errno), odpd_errmsg());
		return 1;
	}
	if (write_keys("start", k0, 2) < 0)
		return 1;
	printf("restart-traffic: pid %d: shared PD %s: MR A held, MR B released relaxed, %zu bytes each; "
	       "probe every %u ms; ready\n", (int)getpid(), opt.pd_name, n, opt.interval_ms);
	fflush(stdout);
	t_end = end_time();
	while (!done(t_end)) {
		probe(conn, odpd_segment_addr(pseg));
		st.iterations++;
		wait_interval();
	}
	k1[0] = keys_now(conn, base, n, ACCESS_SHARED, &a_hit);
	k1[1] = (struct keys){ .iova = (uintptr_t)(base + n), .length = n, .lost = true };
	if (!st.conn_lost) {
		struct odpd_mr *b2 = odpd_reg(conn, base + n, n, ACCESS_SHARED), *b3;
		struct odpd_stats s;

		if (!b2) {
			call_failed("end: odpd_reg of the relaxed range", errno);
			goto out;
		}
		k1[1] = keys_of(b2);
		relaxed_hit = b2->cache_hit;
		if (odpd_stats(conn, &s, sizeof(s)) == 0)
			printf("restart-traffic: the relaxed range again: cache_hit %d (local hits %llu, daemon hits %llu)\n",
			       relaxed_hit, (unsigned long long)s.local_hits, (unsigned long long)s.daemon_hits);
		if (odpd_dereg_relaxed(b2) < 0) {
			call_failed("end: odpd_dereg_relaxed", errno);
			goto out;
		}
		if (odpd_flush_relaxed(conn) < 0) {
			call_failed("end: odpd_flush_relaxed", errno);
			goto out;
		}
		b3 = odpd_reg(conn, base + n, n, ACCESS_SHARED);
		if (!b3) {
			call_failed("end: odpd_reg after the flush", errno);
			goto out;
		}
		barrier = !b3->cache_hit;
		printf("restart-traffic: after odpd_flush_relaxed: cache_hit %d (%s)\n", b3->cache_hit,
		       barrier ? "flush is a barrier" : "NOT a barrier");
		if (odpd_dereg(b3) < 0)
			call_failed("end: odpd_dereg", errno);
	}
out:
	same = keys_equal(k0, k1, 2);
	write_keys("end", k1, 2);
	odpd_disconnect(conn);
	snprintf(extra, sizeof(extra), " held_hit %d relaxed_hit %d flush_barrier %d", a_hit, relaxed_hit, barrier);
	print_summary("none", same, extra);
	return st.errors || st.mismatches || !same || !relaxed_hit || !barrier;
}

static int run_hold(void)
{
	unsigned long nconn = (opt.hold + HOLD_PER_CONN - 1) / HOLD_PER_CONN, got = 0;
	struct odpd_conn **conn = calloc(nconn ? nconn : 1, sizeof(*conn));
	struct keys *k = calloc(opt.hold ? opt.hold : 1, sizeof(*k));
	struct odpd_reg_attr a = {
		.comp_mask = ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
		.access = ACCESS_SHARED, .flags = ODPD_REG_NO_CACHE,
	};
	void *page = NULL, *probe_page = NULL;
	uint64_t t0 = now_ns(), t_end;
	bool same;

	if (!conn || !k)
		return 1;
	for (unsigned long c = 0; c < nconn; c++) {
		struct odpd_segment *seg, *pseg;

		conn[c] = odpd_connect(opt.sock, NULL);
		if (!conn[c] || !(seg = odpd_alloc(conn[c], 4096, 0)) || !(pseg = odpd_alloc(conn[c], PROBE_SIZE, 0))) {
			fprintf(stderr, "restart-traffic: connection %lu: %s (%s)\n", c, strerror(errno), odpd_errmsg());
			return 1;
		}
		page = odpd_segment_addr(seg);
		if (c == 0)
			probe_page = odpd_segment_addr(pseg);
		for (unsigned long i = 0; i < HOLD_PER_CONN && got < opt.hold; i++, got++) {
			struct odpd_mr *mr = odpd_reg_attr(conn[c], page, 4096, &a);

			if (!mr) {
				fprintf(stderr, "restart-traffic: MR %lu: %s (%s)\n", got, strerror(errno), odpd_errmsg());
				return 1;
			}
			k[got] = keys_of(mr);
		}
	}
	printf("restart-traffic: pid %d: holding %lu MRs on %lu connections (registered in %.1f s); ready\n",
	       (int)getpid(), got, nconn, (double)(now_ns() - t0) / 1e9);
	fflush(stdout);
	if (write_keys("start", k, got) < 0)
		return 1;
	t_end = end_time();
	while (!done(t_end)) {
		probe(conn[0], probe_page);
		st.iterations++;
		wait_interval();
	}
	/* NO_CACHE MRs are never served again: the end keys are those held, or lost. */
	for (unsigned long i = 0; i < got; i++)
		k[i].lost = st.conn_lost;
	same = !st.conn_lost;
	write_keys("end", k, got);
	t0 = now_ns();
	for (unsigned long c = 0; c < nconn; c++)
		odpd_disconnect(conn[c]);
	printf("restart-traffic: disconnected in %.1f s\n", (double)(now_ns() - t0) / 1e9);
	print_summary("none", same, "");
	return st.errors || !same;
}

static int usage(void)
{
	fprintf(stderr, "usage: restart-traffic --mode traffic|shared|hold [--socket PATH] [--keys FILE] "
		"[--seconds S] [--mrs K] [--mr-size BYTES] [--pd NAME] [--hold N] [--interval-ms MS]\n");
	return 2;
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESTART };
	bool have_mode = false, have_interval = false;

	for (int i = 1; i < argc; i++) {
		const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!v)
			return usage();
		i++;
		if (strcmp(o, "--mode") == 0) {
			have_mode = true;
			if (strcmp(v, "traffic") == 0)
				opt.mode = MODE_TRAFFIC;
			else if (strcmp(v, "shared") == 0)
				opt.mode = MODE_SHARED;
			else if (strcmp(v, "hold") == 0)
				opt.mode = MODE_HOLD;
			else
				return usage();
		} else if (strcmp(o, "--socket") == 0) {
			opt.sock = v;
		} else if (strcmp(o, "--keys") == 0) {
			opt.keys = v;
		} else if (strcmp(o, "--pd") == 0) {
			opt.pd_name = v;
		} else if (strcmp(o, "--seconds") == 0) {
			opt.seconds = strtod(v, NULL);
		} else if (strcmp(o, "--mrs") == 0) {
			opt.mrs = (unsigned)strtoul(v, NULL, 0);
		} else if (strcmp(o, "--mr-size") == 0) {
			opt.mr_size = strtoull(v, NULL, 0);
		} else if (strcmp(o, "--hold") == 0) {
			opt.hold = strtoul(v, NULL, 0);
		} else if (strcmp(o, "--interval-ms") == 0) {
			opt.interval_ms = (unsigned)strtoul(v, NULL, 0);
			have_interval = true;
		} else {
			return usage();
		}
	}
	if (!have_mode || opt.mrs < 2 || opt.mrs > 4096 || opt.mr_size < 64 || opt.mr_size > (64u << 20) ||
	    opt.hold < 1 || opt.hold > 10000000) {
		fprintf(stderr, "restart-traffic: --mode is required; --mrs 2 to 4096, --mr-size 64 B to 64 MiB, "
			"--hold 1 to 10^7\n");
		return usage();
	}
	if (!have_interval && opt.mode != MODE_TRAFFIC)
		opt.interval_ms = 50;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGUSR1, &sa, NULL);
	setvbuf(stdout, NULL, _IOLBF, 0);
	switch (opt.mode) {
	case MODE_TRAFFIC: return run_traffic();
	case MODE_SHARED: return run_shared();
	default: return run_hold();
	}
}
