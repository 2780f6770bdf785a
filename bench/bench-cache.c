/* SPDX-License-Identifier: MIT */
/*
 * bench-cache: what odpd's registration cache, relaxed release and shared PDs
 * buy, measured side by side against a running odpd. Prints medians (µs) and
 * ratios and writes CSV files; exits non-zero only on errors, never on speed.
 * bench/run-cache runs it in the rxe VM and plots the CSV files with gnuplot.
 *
 * 1. Per size (4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB), one iteration runs
 *    every series once, in an order that rotates per iteration, so slow drift
 *    of the VM hits every series alike. Each sample is one registration and
 *    its release (reg + release, µs):
 *     - direct:    ibv_reg_mr + ibv_dereg_mr in-process, own context and PD,
 *                  on a touched MAP_SHARED memfd (the baseline);
 *     - miss:      odpd_reg_attr(ODPD_REG_NO_CACHE) + odpd_dereg: a fresh
 *                  registration each time;
 *     - hit:       odpd_reg + odpd_dereg of a range of which the bench holds
 *                  another reference: every odpd_reg is a cache hit;
 *     - relaxed:   odpd_reg + odpd_dereg_relaxed of one range, repeatedly:
 *                  the first is a miss (a warm-up), then hits from the
 *                  relaxed queue;
 *     - hit-nopop: as hit, with ODPD_REG_NO_POPULATE (informational: the
 *                  share of a hit that is libodpd faulting the range in).
 *    Each odpd series has its own touched odpd_alloc() segment.
 * 2. Shared PD: N (1, 8, 64) forked processes, each its own odpd_connect(),
 *    odpd_attach() of one memfd made by the parent and odpd_reg() of all of
 *    it, (i) all in one shared PD (odpd_join_pd "bench"), (ii) each in its
 *    own private PD. Measured: the wall time from a common start (every
 *    child blocks on a pipe the parent closes) until the last odpd_reg()
 *    returned; then, while every child holds its MR, odpd's VmPin
 *    (/proc/PID/status) and odpd's MRs in the kernel's MR table (rdma -j
 *    resource show mr: entries whose pid is a thread of odpd; count and
 *    bytes), against the idle daemon. Also (iii) shared-seq and (iv) own-seq:
 *    the same with the children started one after another instead of at
 *    once, which shows what the shared PD gives when registrations do not
 *    overlap in time (odpd serves no hit from an MR still being registered).
 *    The order of the modes rotates per round.
 *
 * All registrations use IBV_ACCESS_LOCAL_WRITE (an MR with remote access is
 * never shared between the members of a shared PD).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <json-c/json.h>

#include "bench-util.h"
#include "odpd.h"

#define ACCESS IBV_ACCESS_LOCAL_WRITE
#define WARMUP 2u
#define PD_NAME "bench"
#define MAX_PROCS 256u
#define SETTLE_S 120

const char bench_name[] = "bench-cache";

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* ---------------------------------------------------------------- shared memfd */

/* A sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW) of @len bytes, every page written. */
static int sealed_memfd(size_t len)
{
	int fd = memfd_create("bench-cache-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	void *p;

	if (fd < 0 || ftruncate(fd, (off_t)len) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		die("sealed memfd of %zu bytes: %s", len, strerror(errno));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap %zu bytes: %s", len, strerror(errno));
	memset(p, 0x5a, len);
	munmap(p, len);
	return fd;
}

/* ---------------------------------------------------------------- what the kernel holds for odpd */

static long vmpin_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		die("%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPin: %ld kB", &kb) == 1)
			break;
	fclose(f);
	if (kb < 0)
		die("%s: no VmPin", path);
	return kb;
}

/* The kernel's restrack names the task that created an MR: for odpd that is
 * a worker thread, so "odpd's MRs" are those of any thread of the process. */
static bool is_thread_of(pid_t pid, int tid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/task/%d", (int)pid, tid);
	return access(path, F_OK) == 0;
}

struct kmrs {
	int count;
	uint64_t bytes;
};

static struct kmrs kernel_mrs(pid_t pid)
{
	static char out[4 << 20];
	struct kmrs k = { 0, 0 };
	json_object *arr;
	size_t len;
	FILE *p;

	p = popen("rdma -j resource show mr 2>/dev/null", "r");
	if (!p)
		die("popen rdma: %s", strerror(errno));
	len = fread(out, 1, sizeof(out) - 1, p);
	if (pclose(p) != 0)
		die("rdma -j resource show mr failed (is iproute2's rdma installed?)");
	out[len] = 0;
	arr = json_tokener_parse(out);
	if (!arr || !json_object_is_type(arr, json_type_array))
		die("rdma -j resource show mr: not a JSON array");
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *mr = json_object_array_get_idx(arr, i), *jp, *jl;

		if (!json_object_object_get_ex(mr, "pid", &jp) || !is_thread_of(pid, json_object_get_int(jp)))
			continue;
		k.count++;
		if (json_object_object_get_ex(mr, "mrlen", &jl))
			k.bytes += (uint64_t)json_object_get_int64(jl);
	}
	json_object_put(arr);
	return k;
}

/* odpd's pid from the listening socket: SO_PEERCRED of a plain connection. */
static pid_t peer_pid(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct ucred cr;
	socklen_t l = sizeof(cr);
	int fd;

	if (strlen(path) >= sizeof(sa.sun_path))
		die("socket path too long: %s", path);
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("connect %s: %s", path, strerror(errno));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) < 0)
		die("SO_PEERCRED on %s: %s", path, strerror(errno));
	close(fd);
	return cr.pid;
}

/* Wait until odpd holds @mrs kernel MRs and VmPin @kb (after clients left:
 * the daemon releases a disconnected client on its workers). */
static void settle(pid_t pid, int mrs, long kb)
{
	double t0 = now_us();
	struct kmrs k;
	long v;

	for (;;) {
		k = kernel_mrs(pid);
		v = vmpin_kb(pid);
		if (k.count == mrs && v == kb)
			return;
		if (now_us() - t0 > SETTLE_S * 1e6)
			die("odpd did not settle within %d s: %d kernel MRs (want %d), VmPin %ld kB (want %ld)",
			    SETTLE_S, k.count, mrs, v, kb);
		sleep_ms(100);
	}
}

/* ---------------------------------------------------------------- results */

static const char *out_dir;

/* ---------------------------------------------------------------- 1. registration by size */

enum { S_DIRECT, S_MISS, S_HIT, S_RELAXED, S_HIT_NOPOP, NSERIES };
#define NSIZES 5

static const char *const series_key[NSERIES] = { "direct", "miss", "hit", "relaxed", "hit-nopop" };
static const char *const series_what[NSERIES] = {
	"ibv_reg_mr + ibv_dereg_mr",
	"odpd_reg_attr NO_CACHE + odpd_dereg",
	"odpd_reg (hit, ref held) + odpd_dereg",
	"odpd_reg + odpd_dereg_relaxed",
	"hit with ODPD_REG_NO_POPULATE",
};
static const size_t sizes[NSIZES] = { 4 * KiB, 64 * KiB, MiB, 16 * MiB, 256 * MiB };
static const char *const size_names[NSIZES] = { "4 KiB", "64 KiB", "1 MiB", "16 MiB", "256 MiB" };

struct point {
	struct series *pair, *reg, *rel;   /* reg + release, reg, release */
	unsigned hits;                     /* registrations that were cache hits (counted ones) */
};

struct sizectx {
	struct verbs *v;
	struct odpd_conn *conn;
	size_t len;
	void *buf;                         /* direct */
	void *addr[NSERIES];               /* odpd series: their segment */
};

static struct odpd_mr *reg_flags(struct odpd_conn *c, void *addr, size_t len, uint32_t flags)
{
	struct odpd_reg_attr a = {
		.comp_mask = ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
		.access = ACCESS,
		.flags = flags,
	};
	struct odpd_mr *mr = odpd_reg_attr(c, addr, len, &a);

	if (!mr)
		die("odpd_reg_attr %zu (flags %#x): %s", len, (unsigned)flags, odpd_errmsg());
	return mr;
}

/* One sample of series @which (@count: not a warm-up), checking that the
 * cache did what defines the series. */
static void sample(struct sizectx *x, int which, struct point *pt, bool count)
{
	struct odpd_mr *mr;
	uint32_t flags;
	double t0, t1, t2;
	int hit, r;

	if (which == S_DIRECT) {
		double t[3];

		verbs_reg_dereg(x->v, x->buf, x->len, ACCESS, t);
		if (count) {
			add(pt->pair, t[2] - t[0]);
			add(pt->reg, t[1] - t[0]);
			add(pt->rel, t[2] - t[1]);
		}
		return;
	}
	flags = which == S_MISS ? ODPD_REG_NO_CACHE : which == S_HIT_NOPOP ? ODPD_REG_NO_POPULATE : 0;
	t0 = now_us();
	mr = reg_flags(x->conn, x->addr[which], x->len, flags);
	t1 = now_us();
	hit = mr->cache_hit;
	r = which == S_RELAXED ? odpd_dereg_relaxed(mr) : odpd_dereg(mr);
	t2 = now_us();
	if (r < 0)
		die("odpd_dereg%s %zu: %s", which == S_RELAXED ? "_relaxed" : "", x->len, odpd_errmsg());
	/* The series are defined by what the cache does: anything else is a broken setup. */
	if (which == S_MISS && hit)
		die("%zu bytes: an ODPD_REG_NO_CACHE registration was a cache hit", x->len);
	if ((which == S_HIT || which == S_HIT_NOPOP) && !hit)
		die("%zu bytes: %s: a registration under a held reference was not a cache hit",
		    x->len, series_key[which]);
	if (!count)
		return;
	add(pt->pair, t2 - t0);
	add(pt->reg, t1 - t0);
	add(pt->rel, t2 - t1);
	pt->hits += hit != 0;
}

static void run_sizes(struct verbs *v, struct odpd_conn *conn, const unsigned *iters,
		      struct point pts[NSIZES][NSERIES])
{
	for (int i = 0; i < NSIZES; i++) {
		struct sizectx x = { .v = v, .conn = conn, .len = sizes[i] };
		struct odpd_segment *seg[NSERIES] = { NULL };
		struct odpd_mr *held;
		unsigned n = iters[i];
		double t0 = now_us();

		x.buf = memfd_buffer(sizes[i]);
		for (int s = S_MISS; s < NSERIES; s++) {
			if (s == S_HIT_NOPOP) {
				x.addr[s] = x.addr[S_HIT];   /* the same held range */
				continue;
			}
			seg[s] = segment(conn, sizes[i]);
			x.addr[s] = odpd_segment_addr(seg[s]);
		}
		for (int s = 0; s < NSERIES; s++) {
			pts[i][s].pair = series_new(n, "%s %s", series_key[s], size_names[i]);
			pts[i][s].reg = series_new(n, "%s reg %s", series_key[s], size_names[i]);
			pts[i][s].rel = series_new(n, "%s release %s", series_key[s], size_names[i]);
		}
		held = reg_flags(conn, x.addr[S_HIT], sizes[i], 0);   /* the reference hits go to */
		for (unsigned k = 0; k < n + WARMUP; k++)
			for (int j = 0; j < NSERIES; j++) {
				int s = (int)((j + k) % NSERIES);

				sample(&x, s, &pts[i][s], k >= WARMUP);
			}
		if (odpd_dereg(held) < 0)
			die("odpd_dereg: %s", odpd_errmsg());
		if (odpd_flush_relaxed(conn) < 0)
			die("odpd_flush_relaxed: %s", odpd_errmsg());
		for (int s = S_MISS; s < NSERIES; s++)
			if (seg[s] && odpd_detach(seg[s]) < 0)
				die("odpd_detach: %s", odpd_errmsg());
		munmap(x.buf, sizes[i]);
		for (int s = 0; s < NSERIES; s++) {
			summarize(pts[i][s].pair);
			summarize(pts[i][s].reg);
			summarize(pts[i][s].rel);
		}
		printf("  %-8s %4u iterations x %d series (+%u warm-up), %.1f s\n", size_names[i], n,
		       NSERIES, WARMUP, (now_us() - t0) / 1e6);
		fflush(stdout);
	}
}

static void report_sizes(struct point pts[NSIZES][NSERIES])
{
	FILE *f;

	printf("\n%-8s %-10s %-38s %4s %11s %11s %11s %11s %11s %7s %8s\n", "size", "series", "what", "n",
	       "median_us", "p10_us", "p90_us", "reg_us", "release_us", "hits", "/direct");
	for (int i = 0; i < NSIZES; i++) {
		for (int s = 0; s < NSERIES; s++) {
			struct point *p = &pts[i][s];
			char hits[16] = "-";

			if (s != S_DIRECT)
				snprintf(hits, sizeof(hits), "%u/%u", p->hits, p->pair->n);
			printf("%-8s %-10s %-38s %4u %11.1f %11.1f %11.1f %11.1f %11.1f %7s %8.3f\n",
			       size_names[i], series_key[s], series_what[s], p->pair->n, p->pair->median,
			       p->pair->p10, p->pair->p90, p->reg->median, p->rel->median, hits,
			       p->pair->median / pts[i][S_DIRECT].pair->median);
		}
		putchar('\n');
	}

	printf("ratios of medians (reg + release):\n");
	printf("%-8s %11s %11s %14s %9s   %15s\n", "size", "hit/direct", "miss/direct", "relaxed/direct",
	       "miss/hit", "hit-nopop/direct");
	f = csv_open(out_dir, "reg-ratios.csv", NULL);
	fprintf(f, "size_bytes,size,hit_direct,miss_direct,relaxed_direct,miss_hit,hit_nopop_direct\n");
	for (int i = 0; i < NSIZES; i++) {
		double d = pts[i][S_DIRECT].pair->median, m = pts[i][S_MISS].pair->median,
		       h = pts[i][S_HIT].pair->median, r = pts[i][S_RELAXED].pair->median,
		       hn = pts[i][S_HIT_NOPOP].pair->median;

		printf("%-8s %11.3f %11.3f %14.3f %9.2f   %15.3f\n", size_names[i], h / d, m / d, r / d, m / h,
		       hn / d);
		fprintf(f, "%zu,%s,%.6f,%.6f,%.6f,%.6f,%.6f\n", sizes[i], size_names[i], h / d, m / d, r / d,
			m / h, hn / d);
	}
	csv_close(f, out_dir, "reg-ratios.csv");

	for (int s = 0; s < NSERIES; s++) {
		char name[64];

		snprintf(name, sizeof(name), "reg-%s.csv", series_key[s]);
		f = csv_open(out_dir, name, NULL);
		fprintf(f, "size_bytes,size,n,median_us,p10_us,p90_us,reg_median_us,release_median_us,"
			   "cache_hits,ratio_to_direct\n");
		for (int i = 0; i < NSIZES; i++) {
			struct point *p = &pts[i][s];

			fprintf(f, "%zu,%s,%u,%.2f,%.2f,%.2f,%.2f,%.2f,%d,%.4f\n", sizes[i], size_names[i],
				p->pair->n, p->pair->median, p->pair->p10, p->pair->p90, p->reg->median,
				p->rel->median, s == S_DIRECT ? -1 : (int)p->hits,
				p->pair->median / pts[i][S_DIRECT].pair->median);
		}
		csv_close(f, out_dir, name);
	}

	f = csv_open(out_dir, "reg-samples.csv", NULL);
	fprintf(f, "size_bytes,series,iteration,pair_us,reg_us,release_us\n");
	for (int i = 0; i < NSIZES; i++)
		for (int s = 0; s < NSERIES; s++)
			for (unsigned k = 0; k < pts[i][s].pair->n; k++)
				fprintf(f, "%zu,%s,%u,%.2f,%.2f,%.2f\n", sizes[i], series_key[s], k,
					pts[i][s].pair->us[k], pts[i][s].reg->us[k], pts[i][s].rel->us[k]);
	csv_close(f, out_dir, "reg-samples.csv");
}

/* ---------------------------------------------------------------- 2. shared PD vs own PDs */

/*
 * Modes: shared and own start every child at once (the measurement);
 * the -seq modes start them one after another (the parent hands out one start
 * token at a time and waits for that child's registration), which shows what
 * the shared PD gives when registrations do not overlap in time.
 */
enum { M_SHARED, M_OWN, M_SHARED_SEQ, M_OWN_SEQ, NMODES };
static const char *const mode_key[NMODES] = { "shared", "own", "shared-seq", "own-seq" };
#define MODE_SHARED(m) ((m) == M_SHARED || (m) == M_SHARED_SEQ)
#define MODE_SEQ(m) ((m) == M_SHARED_SEQ || (m) == M_OWN_SEQ)

struct child_result {
	int err;            /* 0, or the errno of what failed */
	int hit;
	uint32_t lkey;
	double reg_us;      /* this child's odpd_reg */
	double done_us;     /* CLOCK_MONOTONIC when it returned (system-wide) */
};

struct pipes {
	int ready[2], go[2], done[2], hold[2];
};

static __attribute__((noreturn)) void child_fail(const struct pipes *p, bool started, unsigned idx,
						 const char *what)
{
	struct child_result res = { .err = errno ? errno : EIO };

	fprintf(stderr, "bench-cache: child %u: %s: %s\n", idx, what, odpd_errmsg());
	if (started) {
		if (write(p->done[1], &res, sizeof(res)) < 0)
			_exit(3);
	} else if (write(p->ready[1], "x", 1) < 0) {
		_exit(3);
	}
	_exit(2);
}

static __attribute__((noreturn)) void child_main(const char *sock, int fd, size_t len, int mode,
						 const struct pipes *p, unsigned idx)
{
	struct child_result res = { 0 };
	struct odpd_segment *seg;
	struct odpd_conn *c;
	struct odpd_mr *mr;
	double t0;
	char b;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() == 1)
		_exit(4);
	close(p->go[1]);
	close(p->hold[1]);
	close(p->ready[0]);
	close(p->done[0]);
	c = odpd_connect(sock, NULL);
	if (!c)
		child_fail(p, false, idx, "odpd_connect");
	if (MODE_SHARED(mode) && odpd_join_pd(c, PD_NAME) < 0)
		child_fail(p, false, idx, "odpd_join_pd");
	seg = odpd_attach(c, fd, NULL, 0);
	if (!seg)
		child_fail(p, false, idx, "odpd_attach");
	if (write(p->ready[1], "r", 1) != 1)
		child_fail(p, false, idx, "write ready");
	/* Start: EOF when the parent closes its end (everyone at once), or one
	 * token byte per child (one after another). */
	if (read(p->go[0], &b, 1) != (MODE_SEQ(mode) ? 1 : 0))
		child_fail(p, false, idx, "start pipe");
	t0 = now_us();
	mr = odpd_reg(c, odpd_segment_addr(seg), len, ACCESS);
	res.done_us = now_us();
	if (!mr)
		child_fail(p, true, idx, "odpd_reg");
	res.reg_us = res.done_us - t0;
	res.hit = mr->cache_hit;
	res.lkey = mr->lkey;
	if (write(p->done[1], &res, sizeof(res)) != (ssize_t)sizeof(res))
		_exit(3);
	if (read(p->hold[0], &b, 1) != 0)  /* hold the MR until the parent has looked */
		_exit(3);
	if (odpd_dereg(mr) < 0 || odpd_detach(seg) < 0)
		child_fail(p, true, idx, "odpd_dereg/odpd_detach");
	odpd_disconnect(c);
	_exit(0);
}

struct round {
	double wall_us;
	long vmpin_kb;       /* odpd's VmPin while every child holds its MR, minus idle */
	struct kmrs k;       /* odpd's kernel MRs then, minus idle */
	unsigned distinct;   /* distinct lkeys the children got */
	unsigned hits;       /* children whose odpd_reg was a cache hit */
};

static void xpipe(int fd[2])
{
	if (pipe2(fd, O_CLOEXEC) < 0)
		die("pipe: %s", strerror(errno));
}

static void read_result(int fd, unsigned n, int mode, struct child_result *res)
{
	if (read(fd, res, sizeof(*res)) != (ssize_t)sizeof(*res))
		die("%s, %u processes: a child died", mode_key[mode], n);
	if (res->err)
		die("%s, %u processes: a child's odpd_reg failed: %s", mode_key[mode], n, strerror(res->err));
}

static void shared_round(const char *sock, pid_t odpd, int fd, size_t len, unsigned n, int mode,
			 long idle_kb, struct kmrs idle, struct series *child_reg, struct round *ret)
{
	struct child_result *res = calloc(n, sizeof(*res));
	pid_t *pids = calloc(n, sizeof(*pids));
	uint32_t *keys = calloc(n, sizeof(*keys));
	struct pipes p;
	double t0, last = 0;
	struct kmrs k;

	if (!res || !pids || !keys)
		die("out of memory");
	xpipe(p.ready);
	xpipe(p.go);
	xpipe(p.done);
	xpipe(p.hold);
	fflush(stdout);
	fflush(stderr);
	for (unsigned i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("fork: %s", strerror(errno));
		if (pids[i] == 0)
			child_main(sock, fd, len, mode, &p, i);
	}
	close(p.ready[1]);
	close(p.done[1]);
	for (unsigned i = 0; i < n; i++) {
		char b;

		if (read(p.ready[0], &b, 1) != 1 || b != 'r')
			die("%s, %u processes: a child failed before the start", mode_key[mode], n);
	}
	t0 = now_us();
	if (MODE_SEQ(mode)) {
		for (unsigned i = 0; i < n; i++) {
			if (write(p.go[1], "g", 1) != 1)
				die("start token: %s", strerror(errno));
			read_result(p.done[0], n, mode, &res[i]);
		}
		close(p.go[1]);
	} else {
		close(p.go[1]);                /* start */
		for (unsigned i = 0; i < n; i++)
			read_result(p.done[0], n, mode, &res[i]);
	}
	for (unsigned i = 0; i < n; i++)
		if (res[i].done_us > last)
			last = res[i].done_us;
	ret->wall_us = last - t0;
	ret->vmpin_kb = vmpin_kb(odpd) - idle_kb;
	k = kernel_mrs(odpd);
	ret->k.count = k.count - idle.count;
	ret->k.bytes = k.bytes - idle.bytes;
	ret->distinct = ret->hits = 0;
	for (unsigned i = 0; i < n; i++) {
		bool seen = false;

		add(child_reg, res[i].reg_us);
		ret->hits += res[i].hit != 0;
		for (unsigned j = 0; j < ret->distinct; j++)
			seen |= keys[j] == res[i].lkey;
		if (!seen)
			keys[ret->distinct++] = res[i].lkey;
	}
	close(p.hold[1]);                      /* release */
	for (unsigned i = 0; i < n; i++) {
		int st;

		if (waitpid(pids[i], &st, 0) != pids[i])
			die("waitpid: %s", strerror(errno));
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			die("%s, %u processes: child %u exited with %d", mode_key[mode], n, i,
			    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	}
	close(p.ready[0]);
	close(p.go[0]);
	close(p.done[0]);
	close(p.hold[0]);
	free(res);
	free(pids);
	free(keys);
	settle(odpd, idle.count, idle_kb);
}

struct shared_pt {
	struct series *wall, *child_reg, *vmpin, *mrs, *mr_bytes, *distinct, *hits;
};

static void run_shared(const char *sock, pid_t odpd, size_t len, const unsigned *procs, unsigned nprocs,
		       unsigned rounds, struct shared_pt (*pts)[NMODES])
{
	int fd = sealed_memfd(len);
	struct kmrs idle;
	long idle_kb;
	FILE *f;

	settle(odpd, 0, vmpin_kb(odpd));       /* no MR left from part 1 */
	idle = kernel_mrs(odpd);
	idle_kb = vmpin_kb(odpd);
	printf("odpd idle: %d kernel MRs, VmPin %ld kB\n", idle.count, idle_kb);
	for (unsigned pi = 0; pi < nprocs; pi++)
		for (int m = 0; m < NMODES; m++) {
			unsigned n = procs[pi];
			const char *mk = mode_key[m];

			pts[pi][m].wall = series_new(rounds, "%s N=%u wall", mk, n);
			pts[pi][m].child_reg = series_new(rounds * n, "%s N=%u child reg", mk, n);
			pts[pi][m].vmpin = series_new(rounds, "%s N=%u VmPin", mk, n);
			pts[pi][m].mrs = series_new(rounds, "%s N=%u MRs", mk, n);
			pts[pi][m].mr_bytes = series_new(rounds, "%s N=%u MR bytes", mk, n);
			pts[pi][m].distinct = series_new(rounds, "%s N=%u distinct", mk, n);
			pts[pi][m].hits = series_new(rounds, "%s N=%u hits", mk, n);
		}
	f = csv_open(out_dir, "shared-pd-rounds.csv", NULL);
	fprintf(f, "round,n_procs,mode,wall_us,vmpin_kb,kernel_mrs,kernel_mr_bytes,distinct_lkeys,cache_hits\n");
	for (unsigned r = 0; r < rounds; r++)
		for (unsigned pi = 0; pi < nprocs; pi++)
			for (unsigned j = 0; j < NMODES; j++) {
				int m = (int)((r + pi + j) % NMODES);   /* the order rotates */
				struct shared_pt *pt = &pts[pi][m];
				struct round rd;
				double t0 = now_us();

				shared_round(sock, odpd, fd, len, procs[pi], m, idle_kb, idle, pt->child_reg, &rd);
				add(pt->wall, rd.wall_us);
				add(pt->vmpin, (double)rd.vmpin_kb);
				add(pt->mrs, rd.k.count);
				add(pt->mr_bytes, (double)rd.k.bytes);
				add(pt->distinct, rd.distinct);
				add(pt->hits, rd.hits);
				fprintf(f, "%u,%u,%s,%.1f,%ld,%d,%llu,%u,%u\n", r, procs[pi], mode_key[m],
					rd.wall_us, rd.vmpin_kb, rd.k.count, (unsigned long long)rd.k.bytes,
					rd.distinct, rd.hits);
				printf("  round %u: N=%-3u %-10s  wall %9.1f ms  VmPin %8ld kB  %3d MRs (%5llu MiB)  "
				       "%2u distinct lkeys, %2u hits  [%.1f s with setup and release]\n",
				       r, procs[pi], mode_key[m], rd.wall_us / 1e3, rd.vmpin_kb, rd.k.count,
				       (unsigned long long)(rd.k.bytes / MiB), rd.distinct, rd.hits,
				       (now_us() - t0) / 1e6);
				fflush(stdout);
			}
	csv_close(f, out_dir, "shared-pd-rounds.csv");
	close(fd);
}

static void report_shared(size_t len, const unsigned *procs, unsigned nprocs, struct shared_pt (*pts)[NMODES])
{
	FILE *f = csv_open(out_dir, "shared-pd.csv", NULL);

	printf("\nshared PD vs own PDs: N processes odpd_reg() the same %zu MiB memfd (medians over rounds)\n"
	       "shared/own: all N start at once; -seq: one after another (the next starts when the last returned)\n",
	       len / MiB);
	printf("child_reg: one child's odpd_reg, which includes libodpd faulting the segment into that\n"
	       "child's fresh mapping (MADV_POPULATE_WRITE); hits: children served from the cache\n");
	printf("%4s %-10s %6s %11s %12s %12s %10s %10s %9s %8s %5s\n", "N", "mode", "rounds", "wall_ms",
	       "child_reg_ms", "child_p90_ms", "VmPin_MiB", "kernel_MRs", "MR_MiB", "distinct", "hits");
	fprintf(f, "n_procs,segment_bytes,rounds");
	for (int m = 0; m < NMODES; m++)
		fprintf(f, ",wall_%s_us,child_reg_%s_us,vmpin_%s_kb,kernel_mrs_%s,kernel_mr_bytes_%s,"
			   "distinct_lkeys_%s,cache_hits_%s", mode_key[m], mode_key[m], mode_key[m], mode_key[m],
			mode_key[m], mode_key[m], mode_key[m]);
	fprintf(f, ",ratio_time_shared_own,ratio_vmpin_shared_own,ratio_mrs_shared_own"
		   ",ratio_time_seq_shared_own,ratio_vmpin_seq_shared_own,ratio_mrs_seq_shared_own\n");
	for (unsigned pi = 0; pi < nprocs; pi++) {
		fprintf(f, "%u,%zu,%u", procs[pi], len, pts[pi][0].wall->n);
		for (int m = 0; m < NMODES; m++) {
			struct shared_pt *pt = &pts[pi][m];

			summarize(pt->wall);
			summarize(pt->child_reg);
			summarize(pt->vmpin);
			summarize(pt->mrs);
			summarize(pt->mr_bytes);
			summarize(pt->distinct);
			summarize(pt->hits);
			printf("%4u %-10s %6u %11.1f %12.1f %12.1f %10.1f %10.0f %9.1f %8.0f %5.0f\n", procs[pi],
			       mode_key[m], pt->wall->n, pt->wall->median / 1e3, pt->child_reg->median / 1e3,
			       pt->child_reg->p90 / 1e3, pt->vmpin->median / 1024, pt->mrs->median,
			       pt->mr_bytes->median / MiB, pt->distinct->median, pt->hits->median);
			fprintf(f, ",%.1f,%.1f,%.0f,%.0f,%.0f,%.0f,%.0f", pt->wall->median, pt->child_reg->median,
				pt->vmpin->median, pt->mrs->median, pt->mr_bytes->median, pt->distinct->median,
				pt->hits->median);
		}
		{
			struct shared_pt *s = pts[pi] + M_SHARED, *o = pts[pi] + M_OWN;
			struct shared_pt *ss = pts[pi] + M_SHARED_SEQ, *os = pts[pi] + M_OWN_SEQ;

			fprintf(f, ",%.6f,%.6f,%.6f,%.6f,%.6f,%.6f\n", s->wall->median / o->wall->median,
				s->vmpin->median / o->vmpin->median, s->mrs->median / o->mrs->median,
				ss->wall->median / os->wall->median, ss->vmpin->median / os->vmpin->median,
				ss->mrs->median / os->mrs->median);
		}
	}
	csv_close(f, out_dir, "shared-pd.csv");
	printf("\nratios shared/own (medians):\n%4s | %-30s | %-30s\n", "", "  all at once (the issue's)",
	       "  one after another (-seq)");
	printf("%4s | %9s %9s %9s  | %9s %9s %9s\n", "N", "time", "VmPin", "MRs", "time", "VmPin", "MRs");
	for (unsigned pi = 0; pi < nprocs; pi++) {
		struct shared_pt *s = pts[pi] + M_SHARED, *o = pts[pi] + M_OWN;
		struct shared_pt *ss = pts[pi] + M_SHARED_SEQ, *os = pts[pi] + M_OWN_SEQ;

		printf("%4u | %9.3f %9.4f %9.4f  | %9.3f %9.4f %9.4f\n", procs[pi],
		       s->wall->median / o->wall->median, s->vmpin->median / o->vmpin->median,
		       s->mrs->median / o->mrs->median, ss->wall->median / os->wall->median,
		       ss->vmpin->median / os->vmpin->median, ss->mrs->median / os->mrs->median);
	}
}

/* ---------------------------------------------------------------- main */

static unsigned parse_procs(const char *s, unsigned *procs, unsigned max)
{
	char buf[256], *save = NULL;
	unsigned n = 0;

	if (strlen(s) >= sizeof(buf))
		die("--procs: too long");
	strcpy(buf, s);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max)
			die("--procs: at most %u counts", max);
		procs[n++] = parse_n(t, MAX_PROCS);
	}
	if (!n)
		die("--procs: no count");
	return n;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: bench-cache [--socket PATH] [--odpd-pid PID] [--out DIR]\n"
		   "                   [--iters N] [--mid-iters N] [--big-iters N]\n"
		   "                   [--procs N,N,...] [--shared-mib M] [--rounds N] [--skip-sizes]\n"
		   "  --odpd-pid PID    odpd's pid (default: SO_PEERCRED of the socket)\n"
		   "  --out DIR         CSV files go here (default build/bench-results)\n"
		   "  --iters N         iterations at 4 KiB, 64 KiB and 1 MiB (default 500)\n"
		   "  --mid-iters N     iterations at 16 MiB (default 100)\n"
		   "  --big-iters N     iterations at 256 MiB (default 40)\n"
		   "  --procs LIST      process counts of the shared-PD part (default 1,8,64)\n"
		   "  --shared-mib M    the segment they register, MiB (default 64)\n"
		   "  --rounds N        rounds of the shared-PD part (default 5)\n"
		   "  --skip-sizes      only the shared-PD part\n"
		   "Every series runs %u warm-up iterations first, not counted.\n"
		   "The socket defaults to $%s, else %s.\n", WARMUP, ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "odpd-pid", required_argument, NULL, 'p' },
		{ "out", required_argument, NULL, 'o' },
		{ "iters", required_argument, NULL, 'n' },
		{ "mid-iters", required_argument, NULL, 'm' },
		{ "big-iters", required_argument, NULL, 'b' },
		{ "procs", required_argument, NULL, 'P' },
		{ "shared-mib", required_argument, NULL, 'S' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "skip-sizes", no_argument, NULL, 'k' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	const char *sock = getenv(ODPD_SOCKET_ENV);
	unsigned iters = 500, mid_iters = 100, big_iters = 40, rounds = 5, shared_mib = 64;
	unsigned procs[8] = { 1, 8, 64 }, nprocs = 3;
	unsigned iter_of[NSIZES];
	static struct point pts[NSIZES][NSERIES];
	struct shared_pt (*spts)[NMODES];
	bool skip_sizes = false;
	pid_t pid = 0;
	double start = now_us();
	int c;

	out_dir = "build/bench-results";
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': sock = optarg; break;
		case 'p': pid = (pid_t)parse_n(optarg, 1u << 30); break;
		case 'o': out_dir = optarg; break;
		case 'n': iters = parse_n(optarg, 100000); break;
		case 'm': mid_iters = parse_n(optarg, 100000); break;
		case 'b': big_iters = parse_n(optarg, 100000); break;
		case 'P': nprocs = parse_procs(optarg, procs, 8); break;
		case 'S': shared_mib = parse_n(optarg, 1u << 20); break;
		case 'r': rounds = parse_n(optarg, 1000); break;
		case 'k': skip_sizes = true; break;
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
	if (!pid)
		pid = peer_pid(sock);
	mkdir_p(out_dir);
	iter_of[0] = iter_of[1] = iter_of[2] = iters;
	iter_of[3] = mid_iters;
	iter_of[4] = big_iters;

	print_command(argc, argv);
	printf(", socket %s, odpd pid %d, results in %s\n", sock, (int)pid, out_dir);
	printf("access IBV_ACCESS_LOCAL_WRITE, pinned; %u warm-up iterations per series not counted\n", WARMUP);

	if (!skip_sizes) {
		struct odpd_conn *conn;
		struct verbs v;
		struct odpd_device_attr a;

		verbs_open(&v);
		conn = connect_odpd(sock);
		if (odpd_query_device(conn, 0, &a, sizeof(a)) < 0)
			die("odpd_query_device: %s", odpd_errmsg());
		printf("device: verbs %s, odpd %s (%s)\n", v.name, a.name, a.transport);
		printf("\n== 1. registration + release by size: series interleaved, order rotating per iteration\n");
		fflush(stdout);
		run_sizes(&v, conn, iter_of, pts);
		report_sizes(pts);
		odpd_disconnect(conn);
		verbs_close(&v);
	}

	spts = calloc(nprocs, sizeof(*spts));
	if (!spts)
		die("out of memory");
	printf("\n== 2. shared PD vs own PDs: %u round(s), %u MiB segment (one memfd, each process attaches it);\n"
	       "   modes %s, %s, %s, %s in an order rotating per round\n", rounds, shared_mib,
	       mode_key[0], mode_key[1], mode_key[2], mode_key[3]);
	fflush(stdout);
	run_shared(sock, pid, (size_t)shared_mib * MiB, procs, nprocs, rounds, spts);
	report_shared((size_t)shared_mib * MiB, procs, nprocs, spts);
	printf("\nbench-cache: %.1f s; CSV files in %s\n", (now_us() - start) / 1e6, out_dir);
	return EXIT_SUCCESS;
}
