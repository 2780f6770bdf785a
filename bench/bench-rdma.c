/* SPDX-License-Identifier: MIT */
/*
 * bench-rdma: "an MR is an MR". RDMA WRITE latency and throughput through
 * odpd MRs against the application's own ibv_reg_mr MRs, side by side in one
 * run against a running odpd, in daemon-PD mode (odpd_import_pd). Prints
 * medians and ratios odpd / own and writes CSV files; exits non-zero only on
 * errors, never on speed. bench/run-rdma runs it in the rxe VM (testbed
 * profile: import needs rdma-core 65 with the rxe import patch) and plots
 * the CSV files with gnuplot.
 *
 * On rxe (Soft-RoCE) an RDMA WRITE is a software copy in the kernel
 * (rdma_rxe packetizes it over a netdev that loops back and copies into the
 * target MR's pages): this checks that an odpd MR adds nothing per operation
 * next to an MR the application registered itself, not what hardware would
 * do. qemu TCG inflates everything: compare within one run only.
 *
 * Two processes, each with its own odpd connection and imported PD (so its
 * own imported context): the target (a forked child) and the initiator (this
 * process). Two processes rather than two connections in one, because that
 * is how it is used: the rkey a WRITE names belongs to another process (or
 * host) with its own context, and nothing of the target's lives in the
 * initiator's process.
 *  - target:    an odpd_alloc() segment with an odpd MR (LOCAL_WRITE |
 *               REMOTE_WRITE), and a MAP_SHARED memfd of the same size,
 *               registered with plain ibv_reg_mr on the SAME imported PD with
 *               the same access; an RC QP on that PD;
 *  - initiator: likewise an odpd-MR source buffer and an own-MR source
 *               buffer (LOCAL_WRITE) of the same size on its imported PD, and
 *               an RC QP connected to the target's.
 * So only the MRs differ. The two key combinations compared:
 *  - odpd: local key odpd (initiator's odpd MR) + remote key odpd (target's);
 *  - own:  local key own + remote key own (plain ibv_reg_mr on both sides).
 * Every transfer starts at offset 0 of the (page-aligned) buffers.
 *
 * Per size (64 B, 4 KiB, 64 KiB, 1 MiB by default), R rounds (20), each
 * measuring both combinations, interleaved so that drift of the VM (and of
 * whatever else the host runs) hits both alike:
 *  - latency:    one signalled RDMA WRITE posted and its completion waited
 *                for; N pairs per round, odpd then own or own then odpd,
 *                alternating pair by pair; median and p99 over all rounds;
 *  - throughput: C signalled WRITEs per round and combination with at most
 *                Q (16) outstanding, in up to 8 blocks of at least 2 Q
 *                WRITEs, the blocks of odpd and own alternating (odpd first
 *                in even rounds); the round's sample: bytes over the summed
 *                times from a block's first post to its last completion;
 *                median over the rounds.
 * N and C are the same for both combinations: from a warm-up of both (not
 * counted), chosen so that a size takes about --seconds (unless --lat and
 * --tput fix them).
 * Completions: by default the initiator sleeps on a completion channel
 * (ibv_req_notify_cq + ibv_get_cq_event after an empty poll). Under TCG a
 * busy-polling initiator holds its vCPU until the kernel's rxe work gets
 * scheduled, so a WRITE then takes about one scheduling quantum (~1.4 ms
 * here from 64 B to 4 KiB, whatever the size): --poll spin measures that.
 * Ratios odpd / own: of the medians over all rounds, and per round (of its
 * latency medians, of its throughputs). Noise: "equal within noise" when 1
 * lies between the smallest and the largest per-round ratio (a sign test:
 * with no difference, all R rounds fall on one side with probability
 * 2^(1-R)). Informational, never an exit status.
 * At the end one WRITE of the whole buffer per combination, then the target
 * checks that the initiator's bytes arrived in both of its buffers (each
 * combination its own pattern).
 */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-util.h"
#include "odpd.h"
#include "rcqp.h"

#define TARGET_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
#define SOURCE_ACCESS IBV_ACCESS_LOCAL_WRITE
#define LAT_WARMUP 10u
#define LAT_MIN 5u
#define LAT_MAX 1000u
#define LAT_SHARE 0.4          /* of a round's time per combination; the rest: throughput */
#define TPUT_BLOCKS 8u         /* at most, per round and combination; each at least 2 windows */
#define WAIT_US (10 * 1e6)
#define MAX_SIZES 8u

const char bench_name[] = "bench-rdma";

static const char note_rxe[] =
	"on rxe (Soft-RoCE) an RDMA WRITE is a software copy in the kernel: this checks that an odpd MR "
	"adds nothing per operation next to the application's own MR, not hardware throughput; "
	"qemu TCG: compare within one run only";

enum { M_ODPD, M_OWN, NMODES };
static const char *const mode_key[NMODES] = { "odpd", "own" };
static const char *const mode_what[NMODES] = {
	"local key odpd + remote key odpd",
	"local key own + remote key own (ibv_reg_mr)",
};

enum { P_EVENT, P_SPIN, P_YIELD, NPOLL };
static const char *const poll_key[NPOLL] = { "event", "spin", "yield" };
static int poll_mode = P_EVENT;

/* One side: its odpd connection, imported PD, a segment with an odpd MR, a
 * memfd of the same size with an ibv_reg_mr MR on that PD, and an RC QP. */
struct side {
	struct odpd_conn *conn;
	struct ibv_pd *pd;
	struct odpd_segment *seg;
	struct odpd_mr *omr;
	void *own_buf;
	struct ibv_mr *own_mr;
	struct ibv_comp_channel *channel;
	struct rcqp q;
	size_t len;
	void *addr[NMODES];
	uint32_t lkey[NMODES], rkey[NMODES];
};

/* What the target tells the initiator; ok 0: msg says what failed. */
struct target_info {
	int ok;
	char msg[1024];
	struct rcqp_addr qp;
	uint64_t addr[NMODES];
	uint32_t rkey[NMODES];
};

/* rcqp's CQ has no completion channel: make the CQ and QP again, alike but
 * with one (rcqp_create filled q->local: port, GID, MTU; the QPN changes). */
static int channel_cq(struct side *s, unsigned depth, char *msg, size_t msg_len)
{
	struct ibv_qp_init_attr ia = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = depth, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	s->channel = ibv_create_comp_channel(s->pd->context);
	if (!s->channel) {
		snprintf(msg, msg_len, "ibv_create_comp_channel: %s", strerror(errno));
		return -1;
	}
	rcqp_destroy(&s->q);
	s->q.cq = ibv_create_cq(s->pd->context, (int)depth * 2, NULL, s->channel, 0);
	if (!s->q.cq) {
		snprintf(msg, msg_len, "ibv_create_cq with a completion channel: %s", strerror(errno));
		return -1;
	}
	ia.send_cq = ia.recv_cq = s->q.cq;
	s->q.qp = ibv_create_qp(s->pd, &ia);
	if (!s->q.qp) {
		snprintf(msg, msg_len, "ibv_create_qp: %s", strerror(errno));
		return -1;
	}
	s->q.local.qpn = s->q.qp->qp_num;
	return 0;
}

/* 0, or -1 with @msg saying what failed. */
static int side_open(struct side *s, const char *sock, size_t len, int access, unsigned depth, bool channel,
		     char *msg, size_t msg_len)
{
	int r;

	memset(s, 0, sizeof(*s));
	s->len = len;
	s->conn = odpd_connect(sock, NULL);
	if (!s->conn) {
		snprintf(msg, msg_len, "odpd_connect %s: %s", sock, odpd_errmsg());
		return -1;
	}
	/* First, so a stack without import fails before anything is allocated. */
	s->pd = odpd_import_pd(s->conn);
	if (!s->pd) {
		int e = errno;

		snprintf(msg, msg_len, "%s%s", odpd_errmsg(),
			 e == EOPNOTSUPP ? " - this benchmark needs daemon-PD mode (import): run it in the"
					   " testbed profile (bench/run-rdma does: tests/vm/rxe-vm --profile"
					   " testbed, rdma-core 65 with the rxe import patch)" : "");
		return -1;
	}
	s->seg = segment(s->conn, len);
	s->addr[M_ODPD] = odpd_segment_addr(s->seg);
	s->omr = odpd_reg(s->conn, s->addr[M_ODPD], len, (unsigned)access);
	if (!s->omr) {
		snprintf(msg, msg_len, "odpd_reg %zu bytes: %s", len, odpd_errmsg());
		return -1;
	}
	if ((uintptr_t)s->addr[M_ODPD] != s->omr->iova) {
		snprintf(msg, msg_len, "odpd MR iova %#llx is not its address %p",
			 (unsigned long long)s->omr->iova, s->addr[M_ODPD]);
		return -1;
	}
	s->own_buf = s->addr[M_OWN] = memfd_buffer(len);
	s->own_mr = ibv_reg_mr(s->pd, s->own_buf, len, access);
	if (!s->own_mr) {
		snprintf(msg, msg_len, "ibv_reg_mr %zu bytes on the imported PD: %s", len, strerror(errno));
		return -1;
	}
	s->lkey[M_ODPD] = s->omr->lkey;
	s->rkey[M_ODPD] = s->omr->rkey;
	s->lkey[M_OWN] = s->own_mr->lkey;
	s->rkey[M_OWN] = s->own_mr->rkey;
	r = rcqp_create(&s->q, s->pd, depth);
	if (r < 0) {
		snprintf(msg, msg_len, "RC QP on the imported PD: %s", strerror(-r));
		return -1;
	}
	return channel ? channel_cq(s, depth, msg, msg_len) : 0;
}

/* Everything made in the imported context goes before odpd_disconnect(). */
static void side_close(struct side *s)
{
	rcqp_destroy(&s->q);
	if (s->channel && ibv_destroy_comp_channel(s->channel))
		die("ibv_destroy_comp_channel: %s", strerror(errno));
	if (s->own_mr && ibv_dereg_mr(s->own_mr))
		die("ibv_dereg_mr: %s", strerror(errno));
	if (s->own_buf)
		munmap(s->own_buf, s->len);
	if (s->omr && odpd_dereg(s->omr) < 0)
		die("odpd_dereg: %s", odpd_errmsg());
	if (s->seg && odpd_detach(s->seg) < 0)
		die("odpd_detach: %s", odpd_errmsg());
	odpd_disconnect(s->conn);
}

/* Byte @i of pattern @seed: what the initiator writes from combination @seed - 1. */
static uint8_t pattern(unsigned seed, size_t i)
{
	return (uint8_t)(seed * 77 + i * 13 + (i >> 12));
}

/* ---------------------------------------------------------------- the target (child) */

static void send_all(int fd, const void *p, size_t n)
{
	if (send(fd, p, n, MSG_NOSIGNAL) != (ssize_t)n)
		_exit(3);
}

static __attribute__((noreturn)) void target_main(int fd, const char *sock, size_t len)
{
	struct target_info info = { .ok = 1 };
	struct rcqp_addr peer;
	struct side s;
	char b;
	int r;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		_exit(4);
	if (side_open(&s, sock, len, TARGET_ACCESS, 1, false, info.msg, sizeof(info.msg)) < 0) {
		info.ok = 0;
		send_all(fd, &info, sizeof(info));
		_exit(2);
	}
	info.qp = s.q.local;
	for (int m = 0; m < NMODES; m++) {
		info.addr[m] = (uintptr_t)s.addr[m];
		info.rkey[m] = s.rkey[m];
	}
	send_all(fd, &info, sizeof(info));
	if (recv(fd, &peer, sizeof(peer), 0) != (ssize_t)sizeof(peer))
		_exit(3);
	r = rcqp_connect(&s.q, &peer);
	info.ok = r == 0;
	if (r < 0)
		snprintf(info.msg, sizeof(info.msg), "target: connecting its QP: %s", strerror(-r));
	send_all(fd, &info, sizeof(info));
	if (r < 0)
		_exit(2);
	/* 'v': the initiator is done, check what arrived; then hold until EOF. */
	if (recv(fd, &b, 1, 0) != 1 || b != 'v')
		_exit(3);
	info.ok = 1;
	info.msg[0] = 0;
	for (int m = 0; m < NMODES && info.ok; m++) {
		const uint8_t *p = s.addr[m];

		for (size_t i = 0; i < len; i++)
			if (p[i] != pattern((unsigned)m + 1, i)) {
				info.ok = 0;
				snprintf(info.msg, sizeof(info.msg),
					 "target: the %s MR's buffer holds %#x at byte %zu, the initiator wrote %#x",
					 mode_key[m], p[i], i, pattern((unsigned)m + 1, i));
				break;
			}
	}
	send_all(fd, &info, sizeof(info));
	if (recv(fd, &b, 1, 0) != 0)
		_exit(3);
	side_close(&s);
	_exit(0);
}

/* ---------------------------------------------------------------- the initiator */

/* One ibv_poll_cq of at most @max: how many completed; dies on a failed one. */
static unsigned poll_once(struct ibv_cq *cq, unsigned max)
{
	struct ibv_wc wc[16];
	int k = ibv_poll_cq(cq, max < 16 ? (int)max : 16, wc);

	if (k < 0)
		die("ibv_poll_cq failed");
	for (int i = 0; i < k; i++)
		if (wc[i].status != IBV_WC_SUCCESS)
			die("RDMA WRITE completed with %s", ibv_wc_status_str(wc[i].status));
	return (unsigned)k;
}

/* Until at least one completion arrived: how many (at most @max). Dies
 * after 10 s without one. */
static unsigned reap(struct side *s, unsigned max)
{
	double t0 = 0;
	unsigned k;

	for (;;) {
		if ((k = poll_once(s->q.cq, max)))
			return k;
		if (poll_mode == P_EVENT) {
			struct pollfd pfd = { .fd = s->channel->fd, .events = POLLIN };
			struct ibv_cq *ecq;
			void *ectx;

			if (ibv_req_notify_cq(s->q.cq, 0))
				die("ibv_req_notify_cq failed");
			if ((k = poll_once(s->q.cq, max)))
				return k;       /* the armed event is taken on a later wait */
			if (poll(&pfd, 1, (int)(WAIT_US / 1e3)) != 1)
				die("no completion event within %.0f s", WAIT_US / 1e6);
			if (ibv_get_cq_event(s->channel, &ecq, &ectx))
				die("ibv_get_cq_event failed");
			ibv_ack_cq_events(ecq, 1);
			continue;
		}
		if (poll_mode == P_YIELD)
			sched_yield();
		if (t0 == 0)
			t0 = now_us();
		else if (now_us() - t0 > WAIT_US)
			die("no completion within %.0f s", WAIT_US / 1e6);
	}
}

struct run {
	struct side *s;
	const struct target_info *t;
	size_t len;
	unsigned window;
};

static void post(const struct run *x, int m)
{
	int r = rcqp_post(&x->s->q, IBV_WR_RDMA_WRITE, (uintptr_t)x->s->addr[m], x->s->lkey[m],
			  (uint32_t)x->len, x->t->addr[m], x->t->rkey[m]);

	if (r < 0)
		die("ibv_post_send (RDMA WRITE %zu bytes, %s): %s", x->len, mode_key[m], strerror(-r));
}

/* One WRITE posted and its completion waited for: µs. */
static double latency_one(const struct run *x, int m)
{
	double t0 = now_us();

	post(x, m);
	reap(x->s, 1);
	return now_us() - t0;
}

/* @count WRITEs, at most x->window outstanding: µs from the first post to
 * the last completion. */
static double throughput_us(const struct run *x, int m, unsigned count)
{
	unsigned posted = 0, done = 0;
	double t0 = now_us();

	while (done < count) {
		while (posted < count && posted - done < x->window) {
			post(x, m);
			posted++;
		}
		done += reap(x->s, posted - done);
	}
	return now_us() - t0;
}

/* ---------------------------------------------------------------- statistics */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Median and nearest-rank p99 of the samples [@from, @from + @n) of @s. */
static void slice_stats(const struct series *s, unsigned from, unsigned n, double *median, double *p99)
{
	double *v = malloc((n ? n : 1) * sizeof(double));
	unsigned r = (unsigned)((99ull * n + 99) / 100);        /* ceil(0.99 n) */

	if (!v || !n || from + n > s->n)
		die("%s: %s", s->name, v ? "no samples in range" : "out of memory");
	memcpy(v, s->us + from, n * sizeof(double));
	qsort(v, n, sizeof(double), cmp_double);
	*median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
	if (p99)
		*p99 = v[(r ? r : 1) - 1];
	free(v);
}

/* ---------------------------------------------------------------- measurement */

/* A ratio odpd / own: of the medians over all rounds, and the median,
 * smallest and largest of the per-round ratios. */
struct ratio {
	double pooled, rounds, min, max;
	bool within;        /* 1 lies in [min, max]: equal within noise */
};

struct point {
	size_t len;
	unsigned lat_iters, tput_writes, tput_blocks;
	struct series *lat[NMODES];        /* µs per WRITE, round after round */
	struct series *mbps[NMODES];       /* MB/s, one per round */
	struct series *rlat[NMODES];       /* per-round latency medians, µs */
	double lat_median[NMODES], lat_p99[NMODES], mbps_median[NMODES];
	struct ratio lat_ratio, mbps_ratio;
	double p99_ratio;
};

static void size_name(size_t len, char *buf, size_t n)
{
	if (len >= MiB && len % MiB == 0)
		snprintf(buf, n, "%zu MiB", len / MiB);
	else if (len >= KiB && len % KiB == 0)
		snprintf(buf, n, "%zu KiB", len / KiB);
	else
		snprintf(buf, n, "%zu B", len);
}

static unsigned clampu(double v, unsigned lo, unsigned hi)
{
	return v < lo ? lo : v > hi ? hi : (unsigned)v;
}

/* Warm-up of both combinations (not counted), from which the counts are
 * chosen when not given: a round of both takes about @round_us. */
static void calibrate(const struct run *x, struct point *p, double round_us, unsigned lat, unsigned tput)
{
	struct series *w = series_new(NMODES * LAT_WARMUP, "warm-up");
	double mbps = 0, lat_us;

	for (int m = 0; m < NMODES; m++) {
		for (unsigned k = 0; k < LAT_WARMUP; k++)
			add(w, latency_one(x, m));
		throughput_us(x, m, x->window);
		mbps += (double)x->window * (double)p->len / throughput_us(x, m, x->window) / NMODES;
	}
	slice_stats(w, 0, w->n, &lat_us, NULL);
	free(w->us);
	free(w);
	round_us /= NMODES;
	p->lat_iters = lat ? lat : clampu(round_us * LAT_SHARE / lat_us, LAT_MIN, LAT_MAX);
	p->tput_writes = tput ? tput : clampu(round_us * (1 - LAT_SHARE) * mbps / (double)p->len, x->window, 1000000);
	p->tput_blocks = clampu(p->tput_writes / (2.0 * x->window), 1, TPUT_BLOCKS);
}

static void run_size(struct run *x, struct point *p, unsigned rounds, double seconds, unsigned lat,
		     unsigned tput)
{
	char name[32];
	double t0 = now_us();

	size_name(p->len, name, sizeof(name));
	x->len = p->len;
	calibrate(x, p, seconds * 1e6 / rounds, lat, tput);
	for (int m = 0; m < NMODES; m++) {
		p->lat[m] = series_new(rounds * p->lat_iters, "%s latency %s", mode_key[m], name);
		p->mbps[m] = series_new(rounds, "%s throughput %s", mode_key[m], name);
		p->rlat[m] = series_new(rounds, "%s round latency %s", mode_key[m], name);
	}
	for (unsigned r = 0; r < rounds; r++) {
		/* latency WRITEs in pairs, the first of a pair alternating */
		for (unsigned k = 0; k < p->lat_iters; k++)
			for (int j = 0; j < NMODES; j++) {
				int m = (int)((j + k + r) % NMODES);

				add(p->lat[m], latency_one(x, m));
			}
		/* throughput: the round's WRITEs in blocks, the first of a pair of
		 * blocks alternating (odpd first in even rounds) */
		double us[NMODES] = { 0 };
		unsigned done = 0;

		for (unsigned b = 0; b < p->tput_blocks; b++) {
			unsigned n = (p->tput_writes - done) / (p->tput_blocks - b);

			for (int j = 0; j < NMODES; j++) {
				int m = (int)((j + b + r) % NMODES);

				us[m] += throughput_us(x, m, n);
			}
			done += n;
		}
		for (int m = 0; m < NMODES; m++)
			add(p->mbps[m], (double)p->tput_writes * (double)p->len / us[m]);
	}
	printf("  %-8s %u rounds x 2 key combinations x (%u latency WRITEs + %u WRITEs of throughput in %u "
	       "block%s), %.1f s\n", name, rounds, p->lat_iters, p->tput_writes, p->tput_blocks,
	       p->tput_blocks == 1 ? "" : "s", (now_us() - t0) / 1e6);
	fflush(stdout);
}

static void ratio_stats(struct series *r, struct ratio *x)
{
	x->min = 1e300;
	x->max = 0;
	for (unsigned i = 0; i < r->n; i++) {
		x->min = r->us[i] < x->min ? r->us[i] : x->min;
		x->max = r->us[i] > x->max ? r->us[i] : x->max;
	}
	slice_stats(r, 0, r->n, &x->rounds, NULL);
	x->within = x->min <= 1.0 && 1.0 <= x->max;
	free(r->us);
	free(r);
}

static void analyze(struct point *p, unsigned rounds)
{
	struct series *rl = series_new(rounds, "latency ratios"), *rm = series_new(rounds, "throughput ratios");

	for (int m = 0; m < NMODES; m++) {
		slice_stats(p->lat[m], 0, p->lat[m]->n, &p->lat_median[m], &p->lat_p99[m]);
		for (unsigned r = 0; r < rounds; r++) {
			double med;

			slice_stats(p->lat[m], r * p->lat_iters, p->lat_iters, &med, NULL);
			add(p->rlat[m], med);
		}
		slice_stats(p->mbps[m], 0, p->mbps[m]->n, &p->mbps_median[m], NULL);
	}
	p->lat_ratio.pooled = p->lat_median[M_ODPD] / p->lat_median[M_OWN];
	p->p99_ratio = p->lat_p99[M_ODPD] / p->lat_p99[M_OWN];
	p->mbps_ratio.pooled = p->mbps_median[M_ODPD] / p->mbps_median[M_OWN];
	for (unsigned r = 0; r < rounds; r++) {
		add(rl, p->rlat[M_ODPD]->us[r] / p->rlat[M_OWN]->us[r]);
		add(rm, p->mbps[M_ODPD]->us[r] / p->mbps[M_OWN]->us[r]);
	}
	ratio_stats(rl, &p->lat_ratio);
	ratio_stats(rm, &p->mbps_ratio);
}

/* ---------------------------------------------------------------- results */

static const char *out_dir;

/* gnuplot and bench/run-rdma skip '#' lines */
static FILE *rdma_csv_open(const char *name)
{
	char header[512];

	snprintf(header, sizeof(header), "bench-rdma: %s; completions: %s", note_rxe, poll_key[poll_mode]);
	return csv_open(out_dir, name, header);
}

static void report(struct point *pts, unsigned nsizes, unsigned rounds, unsigned window)
{
	FILE *f;
	char name[32];

	printf("\n%-8s %-5s %-44s %6s %11s %11s %5s %9s\n", "size", "keys", "", "n_lat", "lat_med_us",
	       "lat_p99_us", "n_tp", "MB/s_med");
	for (unsigned i = 0; i < nsizes; i++) {
		size_name(pts[i].len, name, sizeof(name));
		for (int m = 0; m < NMODES; m++)
			printf("%-8s %-5s %-44s %6u %11.1f %11.1f %5u %9.2f\n", name, mode_key[m], mode_what[m],
			       pts[i].lat[m]->n, pts[i].lat_median[m], pts[i].lat_p99[m], pts[i].mbps[m]->n,
			       pts[i].mbps_median[m]);
	}

	printf("\nratios odpd / own (latency: above 1 = odpd slower; throughput: below 1 = odpd slower)\n"
	       "all: of the medians over all rounds; rounds: median [min..max] of the %u per-round ratios;\n"
	       "'=': 1 lies within [min..max] (equal within noise), '!': it does not\n", rounds);
	printf("%-8s %-33s %8s %-33s\n", "", "  latency median", "lat p99", "  throughput (MB/s)");
	printf("%-8s %7s %-25s %8s %7s %-25s\n", "size", "all", "  rounds", "all", "all", "  rounds");
	for (unsigned i = 0; i < nsizes; i++) {
		struct point *p = &pts[i];
		const struct ratio *l = &p->lat_ratio, *t = &p->mbps_ratio;

		size_name(p->len, name, sizeof(name));
		printf("%-8s %7.3f %7.3f [%.3f..%.3f] %s %8.3f %7.3f %7.3f [%.3f..%.3f] %s\n", name, l->pooled,
		       l->rounds, l->min, l->max, l->within ? "=" : "!", p->p99_ratio, t->pooled, t->rounds, t->min,
		       t->max, t->within ? "=" : "!");
	}

	f = rdma_csv_open("rdma.csv");
	fprintf(f, "size_bytes,size,rounds,lat_iters,tput_writes,tput_blocks,window,"
		   "lat_median_odpd_us,lat_median_own_us,lat_p99_odpd_us,lat_p99_own_us,mbps_odpd,mbps_own,"
		   "ratio_lat_median,ratio_lat_rounds,ratio_lat_rounds_min,ratio_lat_rounds_max,lat_within_noise,"
		   "ratio_lat_p99,"
		   "ratio_mbps,ratio_mbps_rounds,ratio_mbps_rounds_min,ratio_mbps_rounds_max,mbps_within_noise\n");
	for (unsigned i = 0; i < nsizes; i++) {
		struct point *p = &pts[i];
		const struct ratio *l = &p->lat_ratio, *t = &p->mbps_ratio;

		size_name(p->len, name, sizeof(name));
		fprintf(f, "%zu,%s,%u,%u,%u,%u,%u,%.2f,%.2f,%.2f,%.2f,%.3f,%.3f,"
			   "%.5f,%.5f,%.5f,%.5f,%d,%.5f,%.5f,%.5f,%.5f,%.5f,%d\n",
			p->len, name, rounds, p->lat_iters, p->tput_writes, p->tput_blocks, window, p->lat_median[M_ODPD],
			p->lat_median[M_OWN], p->lat_p99[M_ODPD], p->lat_p99[M_OWN], p->mbps_median[M_ODPD],
			p->mbps_median[M_OWN], l->pooled, l->rounds, l->min, l->max, l->within, p->p99_ratio,
			t->pooled, t->rounds, t->min, t->max, t->within);
	}
	csv_close(f, out_dir, "rdma.csv");

	f = rdma_csv_open("rdma-rounds.csv");
	fprintf(f, "size_bytes,round,first_tput,lat_median_odpd_us,lat_median_own_us,mbps_odpd,mbps_own,"
		   "ratio_lat_median,ratio_mbps\n");
	for (unsigned i = 0; i < nsizes; i++) {
		struct point *p = &pts[i];

		for (unsigned r = 0; r < rounds; r++) {
			double lo = p->rlat[M_ODPD]->us[r], lw = p->rlat[M_OWN]->us[r];
			double mo = p->mbps[M_ODPD]->us[r], mw = p->mbps[M_OWN]->us[r];

			fprintf(f, "%zu,%u,%s,%.2f,%.2f,%.3f,%.3f,%.5f,%.5f\n", p->len, r, mode_key[r % NMODES],
				lo, lw, mo, mw, lo / lw, mo / mw);
		}
	}
	csv_close(f, out_dir, "rdma-rounds.csv");

	f = rdma_csv_open("rdma-samples.csv");
	fprintf(f, "size_bytes,keys,round,iteration,lat_us\n");
	for (unsigned i = 0; i < nsizes; i++)
		for (int m = 0; m < NMODES; m++)
			for (unsigned k = 0; k < pts[i].lat[m]->n; k++)
				fprintf(f, "%zu,%s,%u,%u,%.2f\n", pts[i].len, mode_key[m], k / pts[i].lat_iters,
					k % pts[i].lat_iters, pts[i].lat[m]->us[k]);
	csv_close(f, out_dir, "rdma-samples.csv");
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f, "usage: bench-rdma [--socket PATH] [--out DIR] [--sizes LIST] [--rounds N]\n"
		   "                  [--seconds S] [--lat N] [--tput N] [--window Q] [--poll event|spin|yield]\n"
		   "  --out DIR       CSV files go here (default build/bench-results)\n"
		   "  --sizes LIST    WRITE sizes in bytes, suffixes K and M (default 64,4K,64K,1M)\n"
		   "  --rounds N      rounds per size (default 20)\n"
		   "  --seconds S     about how long each size runs (default 20): sets the counts below\n"
		   "  --lat N         latency WRITEs per round and key combination (default: from --seconds,\n"
		   "                  %u..%u)\n"
		   "  --tput N        WRITEs per throughput sample (default: from --seconds, at least Q)\n"
		   "  --window Q      outstanding WRITEs in throughput samples (default 16)\n"
		   "  --poll MODE     how the initiator waits for a completion: event (completion channel,\n"
		   "                  default), spin (busy ibv_poll_cq), yield (ibv_poll_cq + sched_yield)\n"
		   "Needs daemon-PD mode: a provider that imports (on rxe: the testbed profile).\n"
		   "The socket defaults to $%s, else %s.\n", LAT_MIN, LAT_MAX, ODPD_SOCKET_ENV,
		ODPD_SOCKET_DEFAULT);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "out", required_argument, NULL, 'o' },
		{ "sizes", required_argument, NULL, 'S' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "seconds", required_argument, NULL, 'z' },
		{ "lat", required_argument, NULL, 'l' },
		{ "tput", required_argument, NULL, 't' },
		{ "window", required_argument, NULL, 'w' },
		{ "poll", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	const char *sock = getenv(ODPD_SOCKET_ENV);
	size_t sizes[MAX_SIZES] = { 64, 4 * KiB, 64 * KiB, MiB }, max_len = 0;
	unsigned nsizes = 4, rounds = 20, seconds = 20, lat = 0, tput = 0, window = 16;
	struct point pts[MAX_SIZES];
	struct target_info info, ready;
	struct side s;
	struct run x;
	char msg[1024];
	double start = now_us();
	int sv[2], st, c;
	pid_t pid;

	out_dir = "build/bench-results";
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': sock = optarg; break;
		case 'o': out_dir = optarg; break;
		case 'S': nsizes = parse_sizes(optarg, sizes, MAX_SIZES, 64 * MiB); break;
		case 'r': rounds = parse_n(optarg, 10000); break;
		case 'z': seconds = parse_n(optarg, 86400); break;
		case 'l': lat = parse_n(optarg, 1000000); break;
		case 't': tput = parse_n(optarg, 1000000); break;
		case 'w': window = parse_n(optarg, 1024); break;
		case 'p':
			for (poll_mode = 0; poll_mode < NPOLL && strcmp(optarg, poll_key[poll_mode]); poll_mode++)
				;
			if (poll_mode == NPOLL)
				die("--poll: event, spin or yield, not %s", optarg);
			break;
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
	for (unsigned i = 0; i < nsizes; i++)
		max_len = sizes[i] > max_len ? sizes[i] : max_len;
	max_len = (max_len + 4095) & ~(size_t)4095;
	mkdir_p(out_dir);

	print_command(argc, argv);
	printf(", socket %s, results in %s\n", sock, out_dir);
	printf("note: %s\n", note_rxe);

	/* The target first, before this process touches verbs or odpd. */
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair: %s", strerror(errno));
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		target_main(sv[1], sock, max_len);
	}
	close(sv[1]);

	if (side_open(&s, sock, max_len, SOURCE_ACCESS, window, poll_mode == P_EVENT, msg, sizeof(msg)) < 0)
		die("initiator: %s", msg);
	if (recv(sv[0], &info, sizeof(info), 0) != (ssize_t)sizeof(info))
		die("the target process failed before it was ready (see above)");
	if (!info.ok)
		die("%s", info.msg);
	if ((c = rcqp_connect(&s.q, &info.qp)) < 0)
		die("initiator: connecting its QP: %s", strerror(-c));
	if (send(sv[0], &s.q.local, sizeof(s.q.local), MSG_NOSIGNAL) != (ssize_t)sizeof(s.q.local))
		die("to the target: %s", strerror(errno));
	if (recv(sv[0], &ready, sizeof(ready), 0) != (ssize_t)sizeof(ready))
		die("the target process failed while connecting (see above)");
	if (!ready.ok)
		die("%s", ready.msg);
	for (int m = 0; m < NMODES; m++)
		for (size_t i = 0; i < max_len; i++)
			((uint8_t *)s.addr[m])[i] = pattern((unsigned)m + 1, i);

	printf("device %s (imported from odpd), RC QP path MTU %d bytes; two processes, initiator %d and "
	       "target %d, each its own odpd connection and imported PD\n",
	       ibv_get_device_name(s.pd->context->device),
	       128 << (info.qp.mtu < s.q.local.mtu ? info.qp.mtu : s.q.local.mtu), (int)getpid(), (int)pid);
	printf("buffers of %zu bytes; odpd: odpd_alloc segment + odpd_reg; own: MAP_SHARED memfd + ibv_reg_mr "
	       "on the same imported PD, same access\n", max_len);
	printf("keys: initiator (local) odpd lkey %#x, own lkey %#x; target (remote) odpd rkey %#x, own rkey %#x\n",
	       s.lkey[M_ODPD], s.lkey[M_OWN], info.rkey[M_ODPD], info.rkey[M_OWN]);
	printf("%u rounds per size; latency WRITEs in pairs, odpd or own first by turns; throughput in blocks, "
	       "odpd or own first by turns, window %u; "
	       "completions: %s; per size and key combination %u latency WRITEs and two windows of warm-up, "
	       "not counted\n", rounds, window, poll_key[poll_mode], LAT_WARMUP);
	fflush(stdout);

	x = (struct run){ .s = &s, .t = &info, .window = window };
	for (unsigned i = 0; i < nsizes; i++) {
		pts[i] = (struct point){ .len = sizes[i] };
		run_size(&x, &pts[i], rounds, seconds, lat, tput);
	}

	/* The bytes arrived, through the keys each combination named. */
	x.len = max_len;
	for (int m = 0; m < NMODES; m++)
		latency_one(&x, m);
	if (send(sv[0], "v", 1, MSG_NOSIGNAL) != 1)
		die("to the target: %s", strerror(errno));
	if (recv(sv[0], &ready, sizeof(ready), 0) != (ssize_t)sizeof(ready))
		die("the target process failed while checking (see above)");
	if (!ready.ok)
		die("%s", ready.msg);
	printf("data: the target's odpd and own buffers hold what the initiator wrote from its odpd and own "
	       "buffers (%zu bytes each)\n", max_len);
	close(sv[0]);
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid: %s", strerror(errno));
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		die("the target process exited with %d", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	side_close(&s);

	for (unsigned i = 0; i < nsizes; i++)
		analyze(&pts[i], rounds);
	report(pts, nsizes, rounds, window);
	printf("\nbench-rdma: %.1f s; CSV files rdma.csv rdma-rounds.csv rdma-samples.csv in %s\n",
	       (now_us() - start) / 1e6, out_dir);
	return EXIT_SUCCESS;
}
