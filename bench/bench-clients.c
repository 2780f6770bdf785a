/* SPDX-License-Identifier: MIT */
/*
 * bench-clients: many connections at once against one odpd (issue 23, section
 * 3). N connections from several uids (a few processes per uid, each holding
 * its share of the connections) each say Hello, attach a 1 MiB segment
 * (odpd_alloc), write its first 64 KiB and register them as one pinned MR,
 * then verify it (odpd_verify: RDMA READ by odpd, CRC checked) once, or
 * --verifies times. Meanwhile another client (root, libodpd's cache off)
 * registers and deregisters one 4 KiB page every 10 ms: its odpd_reg latency
 * (a miss: a registration on a worker) idle, while the connections are made
 * and register, while they are all connected and idle, and while they verify.
 * Finally the processes exit, all at once: the time until odpd has let go of
 * them (its fd count back where it was).
 *
 * odpd's own memory in each state: RssAnon + RssShmem of /proc/PID/status,
 * less what the clients' memfds (segments, use tables: any memfd odpd did not
 * create) have resident in odpd's mappings (the pinned 64 KiB of each
 * segment and the pages of the use table odpd reads), over the state before
 * the first connection, per connection; of it, malloc's main arena ([heap]:
 * the event loop's allocations) and the verify bounce buffers. Also RssFile
 * (the provider's queues, mapped from the kernel), fds, mappings and the
 * kernel's RDMA objects of odpd (rdma resource show qp / cq / mr / pd) per
 * connection. "After the verifies, idle": once odpd's kernel objects and
 * bounce buffers are back to where they were before the verifies (odpd gives
 * an idle verifier back after --verify-idle-ms), or --settle-ms later.
 *
 * First (--verify-cost N, default 10), the other client alone verifies a
 * 64 KiB MR N times back to back (its verifier kept) and N times each after
 * verify-idle-ms + 0.5 s (made anew): what keeping a verifier saves.
 *
 * bench-clients --socket PATH [--clients N] [--uids U,U,...] [--procs P]
 *   [--verifies K] [--samples S] [--settle-ms MS] [--verify-idle-ms MS]
 *   [--verify-cost N]   (ODPD_BENCH_ODPD_PID: odpd)
 * bench/run-clients runs it in the VM. A benchmark: it reports, never asserts
 * on speed or size; exit 1 if a call failed.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "bench-util.h"

const char bench_name[] = "bench-clients";

#define SEG_BYTES (1 * MiB)
#define MR_BYTES (64 * KiB)
#define MAX_VERIFIES 8
#define PROBE_CAP 100000u
#define PROBE_PAUSE_US 10000
#define VCOST_N 20

/* Steps of one connection, timed. */
enum { ST_CONNECT, ST_ALLOC, ST_REG, ST_VERIFY0, N_STEPS = ST_VERIFY0 + MAX_VERIFIES };

/* What the probe client's samples are filed under. */
enum { PR_IDLE, PR_SETUP, PR_HELD, PR_VERIFY, PR_STOP, N_PR = PR_STOP };
static const char *const pr_names[N_PR] = {
	"idle (no other client)", "while N connect, attach, register", "N connected, idle",
	"while N verify",
};

struct shared {
	unsigned ready[2];                  /* connections through phase 1 (registered), 2 (verified) */
	unsigned long failures[N_STEPS];
	char first_error[256];
	int probe_phase;
	unsigned probe_n[N_PR];
	double probe[N_PR][PROBE_CAP];      /* µs */
	unsigned n_vcost;                   /* the probe's verifies, idle: */
	double vkept[VCOST_N], vnew[VCOST_N];   /* back to back; each after verify-idle-ms */
	double lat[];                       /* [connection][step] µs; < 0: not done */
};

static struct shared *sh;
static pid_t odpd_pid;

static void fail_step(int step, const char *what)
{
	if (__atomic_fetch_add(&sh->failures[step], 1, __ATOMIC_RELAXED) == 0 && !sh->first_error[0])
		snprintf(sh->first_error, sizeof(sh->first_error), "%s: %s", what, odpd_errmsg());
}

static void wait_go(int fd)
{
	char b;

	while (read(fd, &b, 1) < 0 && errno == EINTR)   /* EOF: go */
		;
}

/* One process of uid @uid holding connections [@lo, @hi). */
static void worker(const char *sock, uid_t uid, unsigned lo, unsigned hi, unsigned verifies,
		   const int go[2][2])
{
	struct rlimit nofile = { 65536, 65536 }, memlock = { RLIM_INFINITY, RLIM_INFINITY };
	struct odpd_mr **mrs = calloc(hi - lo, sizeof(*mrs));
	uint8_t *pat = malloc(MR_BYTES);
	uint32_t crc;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	close(go[0][1]);
	close(go[1][1]);
	if (!mrs || !pat)
		die("out of memory");
	for (size_t i = 0; i < MR_BYTES; i++)
		pat[i] = (uint8_t)(i * 7 + (i >> 12));
	crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), pat, MR_BYTES);
	if (setrlimit(RLIMIT_NOFILE, &nofile) < 0 || setrlimit(RLIMIT_MEMLOCK, &memlock) < 0 ||
	    setgroups(0, NULL) < 0 || setgid(uid) < 0 || setuid(uid) < 0)
		die("becoming uid %u: %s", (unsigned)uid, strerror(errno));
	for (unsigned i = lo; i < hi; i++) {
		double *lat = sh->lat + (size_t)i * N_STEPS, t0 = now_us(), t1, t2;
		struct odpd_conn *c = odpd_connect(sock, NULL);
		struct odpd_segment *s;

		t1 = now_us();
		if (!c) {
			fail_step(ST_CONNECT, "odpd_connect");
			continue;
		}
		lat[ST_CONNECT] = t1 - t0;
		s = odpd_alloc(c, SEG_BYTES, 0);
		if (!s) {
			fail_step(ST_ALLOC, "odpd_alloc");
			continue;
		}
		memcpy(odpd_segment_addr(s), pat, MR_BYTES);
		t2 = now_us();
		lat[ST_ALLOC] = t2 - t1;
		mrs[i - lo] = odpd_reg(c, odpd_segment_addr(s), MR_BYTES,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		if (!mrs[i - lo]) {
			fail_step(ST_REG, "odpd_reg");
			continue;
		}
		lat[ST_REG] = now_us() - t2;
		__atomic_fetch_add(&sh->ready[0], 1, __ATOMIC_RELEASE);
	}
	wait_go(go[0][0]);
	for (unsigned k = 0; k < verifies; k++)
		for (unsigned i = lo; i < hi; i++) {
			double t0 = now_us();
			uint32_t got = 0;

			if (!mrs[i - lo])
				continue;
			if (odpd_verify(mrs[i - lo], NULL, 0, &got) < 0) {
				fail_step(ST_VERIFY0 + (int)k, "odpd_verify");
				continue;
			}
			if (got != crc) {
				errno = EIO;
				fail_step(ST_VERIFY0 + (int)k, "odpd_verify: wrong CRC");
				continue;
			}
			sh->lat[(size_t)i * N_STEPS + ST_VERIFY0 + k] = now_us() - t0;
			if (k + 1 == verifies)
				__atomic_fetch_add(&sh->ready[1], 1, __ATOMIC_RELEASE);
		}
	wait_go(go[1][0]);
	_exit(0);                                /* every connection at once, as a job ends */
}

/* What a verify costs the client with the verifier kept and made anew:
 * @n verifies of a 64 KiB MR back to back (after a first one that makes
 * it), then @n each after odpd has let the verifier go (@idle_ms). */
static void verify_cost(struct odpd_conn *c, uint8_t *p, unsigned n, unsigned idle_ms)
{
	struct odpd_mr *mr = odpd_reg(c, p, MR_BYTES, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	uint32_t crc;

	if (!mr || odpd_verify(mr, NULL, 0, &crc) < 0)
		die("probe: %s", odpd_errmsg());
	for (unsigned i = 0; i < n; i++) {
		double t0 = now_us();

		if (odpd_verify(mr, NULL, 0, &crc) < 0)
			die("probe: odpd_verify: %s", odpd_errmsg());
		sh->vkept[i] = now_us() - t0;
	}
	for (unsigned i = 0; i < n; i++) {
		double t0;

		usleep((idle_ms + 500) * 1000u);
		t0 = now_us();
		if (odpd_verify(mr, NULL, 0, &crc) < 0)
			die("probe: odpd_verify: %s", odpd_errmsg());
		sh->vnew[i] = now_us() - t0;
	}
	sh->n_vcost = n;
	if (odpd_dereg(mr) < 0)
		die("probe: odpd_dereg: %s", odpd_errmsg());
}

/* The other client: first verify_cost, then a 4 KiB registration (a miss)
 * every 10 ms. */
static void probe(const char *sock, int ready, const int go[2][2], unsigned vcost, unsigned idle_ms)
{
	struct odpd_conn *c;
	struct odpd_segment *s;
	const unsigned pages = 256;
	uint8_t *p;
	unsigned i = 0;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	close(go[0][1]);                         /* the workers' go signals are EOF */
	close(go[1][1]);
	setenv("ODPD_CACHE", "0", 1);
	c = connect_odpd(sock);
	s = segment(c, pages * 4096);
	p = odpd_segment_addr(s);
	if (vcost)
		verify_cost(c, p, vcost, idle_ms);
	if (write(ready, "r", 1) != 1)
		_exit(1);
	for (;;) {
		int ph = __atomic_load_n(&sh->probe_phase, __ATOMIC_ACQUIRE);
		double t0, t1;
		struct odpd_mr *mr;

		if (ph == PR_STOP)
			break;
		t0 = now_us();
		mr = odpd_reg(c, p + (size_t)(i++ % pages) * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
		t1 = now_us();
		if (!mr || odpd_dereg(mr) < 0)
			die("probe: %s", odpd_errmsg());
		if (sh->probe_n[ph] < PROBE_CAP)
			sh->probe[ph][sh->probe_n[ph]++] = t1 - t0;
		usleep(PROBE_PAUSE_US);
	}
	odpd_disconnect(c);
	_exit(0);
}

/* ---------------------------------------------------------------- odpd, seen from outside */

/* odpd's open fds. */
static long count_fds(void)
{
	long n = proc_fds(odpd_pid);

	if (n < 0)
		die("/proc/%d/fd: %s", (int)odpd_pid, strerror(errno));
	return n;
}

/* A field of odpd's /proc/PID/status, in kB. */
static long status_kb(const char *field)
{
	long kb = proc_status_kb(odpd_pid, field);

	if (kb < 0)
		die("no %s in /proc/%d/status", field, (int)odpd_pid);
	return kb;
}

/* Open fds of odpd. */
/* A field of the guest's /proc/meminfo in kB, -1 if none. */
static long meminfo_kb(const char *field)
{
	char line[256];
	size_t n = strlen(field);
	long kb = -1;
	FILE *f = fopen("/proc/meminfo", "re");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':')
			kb = strtol(line + n + 1, NULL, 10);
	if (f)
		fclose(f);
	return kb;
}

struct state {
	long anon, shmem, file;             /* kB, /proc/PID/status */
	long client;                        /* kB resident in odpd's mappings of clients' memfds */
	long bounce;                        /* kB resident in odpd's verify buffers */
	long heap;                          /* kB of RssAnon in [heap]: malloc's main arena (the loop) */
	long fds, maps;
	long qp, cq, mr, pd;
};

/* Has odpd kept verifiers that @registered (before the verifies) had not?
 * (Not by MRs: the other client's come and go. A verifier's MR goes before
 * its bounce buffer's mapping.) */
static bool verifiers_left(const struct state *s, const struct state *registered)
{
	return s->qp > registered->qp || s->cq > registered->cq || s->bounce > registered->bounce;
}

static long own_kb(const struct state *s)
{
	return s->anon + s->shmem - s->client;
}

/* Rss of odpd's mappings of memfds: the clients' (any odpd did not make)
 * into s->client, odpd's verify buffers into s->bounce. */
static void memfd_rss(struct state *s)
{
	char path[64], line[512];
	enum { NONE, CLIENT, BOUNCE, HEAP } cur = NONE;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)odpd_pid);
	f = fopen(path, "re");
	if (!f)
		die("%s: %s", path, strerror(errno));
	s->client = s->bounce = s->heap = s->maps = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char name[256] = "";
		long kb;

		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &lo, &hi, name) >= 2) {
			s->maps++;
			if (!strcmp(name, "[heap]"))
				cur = HEAP;
			else if (strncmp(name, "/memfd:", 7) != 0)
				cur = NONE;
			else if (!strncmp(name + 7, "odpd-verify", 11))
				cur = BOUNCE;
			else if (!strncmp(name + 7, "odpd-hit-generations", 20))
				cur = NONE;          /* odpd's own: counted */
			else
				cur = CLIENT;
		} else if (cur == HEAP && sscanf(line, "Anonymous: %ld kB", &kb) == 1) {
			s->heap += kb;
		} else if ((cur == CLIENT || cur == BOUNCE) && sscanf(line, "Rss: %ld kB", &kb) == 1) {
			*(cur == CLIENT ? &s->client : &s->bounce) += kb;
		}
	}
	fclose(f);
}

static void state_take(struct state *s)
{
	s->anon = status_kb("RssAnon");
	s->shmem = status_kb("RssShmem");
	s->file = status_kb("RssFile");
	memfd_rss(s);
	s->fds = count_fds();
	s->qp = proc_rdma_objects(odpd_pid, "qp");
	s->cq = proc_rdma_objects(odpd_pid, "cq");
	s->mr = proc_rdma_objects(odpd_pid, "mr");
	s->pd = proc_rdma_objects(odpd_pid, "pd");
}

static void state_print(const char *what, const struct state *s, const struct state *base, unsigned n)
{
	double d = n ? n : 1;

	printf("%-34s %9.1f %7.1f %7.1f %9.1f %8.1f %6.2f %6.2f %5.2f %5.2f %5.2f %5.2f\n", what,
	       (double)(own_kb(s) - own_kb(base)) / d, (double)(s->heap - base->heap) / d,
	       (double)(s->bounce - base->bounce) / d,
	       (double)(s->file - base->file) / d, (double)(s->client - base->client) / d,
	       (double)(s->fds - base->fds) / d, (double)(s->maps - base->maps) / d,
	       (double)(s->qp - base->qp) / d, (double)(s->cq - base->cq) / d,
	       (double)(s->mr - base->mr) / d, (double)(s->pd - base->pd) / d);
}

/* ---------------------------------------------------------------- the run */

/* odpd maps a few things per connection (its segment, its use and generation
 * tables, a verifier's buffer and queues): make room for 16 each. */
static void raise_max_map_count(unsigned n)
{
	const char *path = "/proc/sys/vm/max_map_count";
	unsigned long have = 0, want = 65530ul + 16ul * n;
	FILE *f = fopen(path, "re");

	if (!f || fscanf(f, "%lu", &have) != 1)
		die("%s: %s", path, strerror(errno));
	fclose(f);
	if (have >= want)
		return;
	f = fopen(path, "we");
	if (!f || fprintf(f, "%lu\n", want) < 0 || fclose(f) != 0)
		die("raising %s to %lu: %s", path, want, strerror(errno));
	printf("vm.max_map_count raised from %lu to %lu\n", have, want);
}

static unsigned parse_uids(const char *s, uid_t *uids, unsigned max)
{
	unsigned n = 0;

	for (const char *p = s; *p;) {
		char *end;
		unsigned long v = strtoul(p, &end, 10);

		if (end == p || n == max || v == 0 || v > 4000000000ul)
			die("--uids: want a list of non-root uids, as 65534,65533");
		uids[n++] = (uid_t)v;
		p = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			die("--uids: want a list of uids, as 65534,65533");
	}
	return n;
}

static void wait_phase(unsigned idx, unsigned n, unsigned *exited, const char *what)
{
	double t0 = now_us(), last = t0;
	unsigned prev = 0;

	for (;;) {
		unsigned r = __atomic_load_n(&sh->ready[idx], __ATOMIC_ACQUIRE);
		unsigned long failed = 0;

		for (int st = 0; st < N_STEPS; st++)
			failed += sh->failures[st];
		if (r + failed >= n)
			return;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			(*exited)++;
		if (*exited)
			die("%u client process(es) died %s (%u of %u done): %s", *exited, what, r, n,
			    sh->first_error[0] ? sh->first_error : "no error recorded");
		if (now_us() - last > 10e6) {
			printf("  ... %u of %u %s after %.0f s (%.0f/s lately; odpd VmRSS %ld MiB, guest "
			       "MemAvailable %ld MiB)\n", r, n, what, (now_us() - t0) / 1e6,
			       (r - prev) / ((now_us() - last) / 1e6), status_kb("VmRSS") / 1024,
			       meminfo_kb("MemAvailable") / 1024);
			fflush(stdout);
			prev = r;
			last = now_us();
		}
		usleep(20000);
	}
}

static void probe_until(int ph, unsigned samples)
{
	__atomic_store_n(&sh->probe_phase, ph, __ATOMIC_RELEASE);
	while (sh->probe_n[ph] < samples)
		usleep(20000);
}

static void step_stats(const char *name, int step, unsigned n)
{
	struct series *s = series_new(n, "%s", name);

	for (unsigned i = 0; i < n; i++)
		if (sh->lat[(size_t)i * N_STEPS + step] >= 0)
			add(s, sh->lat[(size_t)i * N_STEPS + step]);
	if (!s->n) {
		printf("  %-44s %10s %10s %10s %8lu\n", name, "-", "-", "-", sh->failures[step]);
		return;
	}
	summarize(s);
	printf("  %-44s %10.0f %10.0f %10.0f %8lu\n", name, s->median, s->p99, s->p90, sh->failures[step]);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' }, { "clients", required_argument, NULL, 'n' },
		{ "uids", required_argument, NULL, 'u' }, { "procs", required_argument, NULL, 'p' },
		{ "verifies", required_argument, NULL, 'v' }, { "samples", required_argument, NULL, 'S' },
		{ "settle-ms", required_argument, NULL, 't' }, { "verify-idle-ms", required_argument, NULL, 'i' },
		{ "verify-cost", required_argument, NULL, 'c' }, { "help", no_argument, NULL, 'h' }, { 0 },
	};
	const char *sock = NULL, *pid_env = getenv("ODPD_BENCH_ODPD_PID");
	unsigned n = 1000, n_uids, procs = 8, verifies = 1, samples = 200, settle_ms = 10000, exited = 0;
	unsigned idle_ms = 1000, vcost = 10;
	uid_t uids[64];
	struct state base, registered, verified, settled, gone;
	struct series *pr[N_PR];
	double t_setup, t_verify, t_settle, t_gone, t0;
	long fds0;
	int go[2][2], ready[2], o;
	pid_t probe_pid, *pids;
	size_t shsize;
	char b;

	setvbuf(stdout, NULL, _IOLBF, 0);     /* progress, through the VM's serial line */
	n_uids = parse_uids("65534,65533,65532,65531", uids, 64);
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'n': n = parse_n(optarg, 1000000); break;
		case 'u': n_uids = parse_uids(optarg, uids, 64); break;
		case 'p': procs = parse_n(optarg, 1024); break;
		case 'v': verifies = parse_n(optarg, MAX_VERIFIES); break;
		case 'S': samples = parse_n(optarg, PROBE_CAP); break;
		case 't': settle_ms = parse_n(optarg, 3600000); break;
		case 'i': idle_ms = strcmp(optarg, "0") ? parse_n(optarg, 3600000) : 0; break;
		case 'c': vcost = strcmp(optarg, "0") ? parse_n(optarg, VCOST_N) : 0; break;
		default:
			printf("usage: bench-clients --socket PATH [--clients N (1000)] [--uids U,U,... "
			       "(65534,65533,65532,65531)] [--procs P (8)] [--verifies K (1)] [--samples S "
			       "(200)] [--settle-ms MS (10000)] [--verify-idle-ms MS (odpd's: 1000)] "
			       "[--verify-cost N (10; 0: none)]\n");
			return o == 'h' ? 0 : 2;
		}
	}
	if (!sock || !pid_env)
		die("needs --socket and ODPD_BENCH_ODPD_PID");
	if (procs < n_uids)
		procs = n_uids;
	if (procs > n)
		procs = n;
	odpd_pid = (pid_t)atoi(pid_env);
	print_command(argc, argv);
	printf("\n");
	raise_max_map_count(n);
	printf("%u connections from %u processes of %u uids; each: Hello, odpd_alloc %lu KiB, write "
	       "and register %lu KiB pinned, %u verify(s)\n", n, procs, n_uids, SEG_BYTES / KiB,
	       MR_BYTES / KiB, verifies);
	shsize = sizeof(*sh) + (size_t)n * N_STEPS * sizeof(double);
	sh = mmap(NULL, shsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pids = calloc(procs, sizeof(*pids));
	if (sh == MAP_FAILED || !pids)
		die("out of memory");
	for (size_t i = 0; i < (size_t)n * N_STEPS; i++)
		sh->lat[i] = -1;
	if (pipe(go[0]) < 0 || pipe(go[1]) < 0 || pipe(ready) < 0)
		die("pipe: %s", strerror(errno));

	/* the other client, idle */
	fds0 = count_fds();
	probe_pid = fork();
	if (probe_pid < 0)
		die("fork: %s", strerror(errno));
	if (probe_pid == 0)
		probe(sock, ready[1], (const int(*)[2])go, vcost, idle_ms);
	if (read(ready[0], &b, 1) != 1)
		die("the probe client failed");
	probe_until(PR_IDLE, samples);
	state_take(&base);
	printf("the other client took %u samples idle; connecting\n", samples);

	/* phase 1: connect, attach, register */
	__atomic_store_n(&sh->probe_phase, PR_SETUP, __ATOMIC_RELEASE);
	t0 = now_us();
	for (unsigned p = 0; p < procs; p++) {
		unsigned lo = (unsigned)((uint64_t)n * p / procs), hi = (unsigned)((uint64_t)n * (p + 1) / procs);

		pids[p] = fork();
		if (pids[p] < 0)
			die("fork: %s", strerror(errno));
		if (pids[p] == 0)
			worker(sock, uids[p % n_uids], lo, hi, verifies, (const int(*)[2])go);
	}
	close(go[0][0]);
	close(go[1][0]);
	wait_phase(0, n, &exited, "connected, attached and registered");
	t_setup = now_us() - t0;
	state_take(&registered);
	printf("%u connected and registered in %.1f s\n", n, t_setup / 1e6);
	probe_until(PR_HELD, samples);

	/* phase 2: verify */
	__atomic_store_n(&sh->probe_phase, PR_VERIFY, __ATOMIC_RELEASE);
	t0 = now_us();
	close(go[0][1]);
	wait_phase(1, n, &exited, "verified");
	t_verify = now_us() - t0;
	state_take(&verified);
	printf("%u verified in %.1f s\n", n, t_verify / 1e6);
	/* until odpd gives the verifiers back (its QPs, CQs, MRs and bounce
	 * buffers where they were), or settle_ms */
	t0 = now_us();
	do {
		usleep(200000);
		state_take(&settled);
	} while (verifiers_left(&settled, &registered) && now_us() - t0 < settle_ms * 1e3);
	t_settle = now_us() - t0;
	__atomic_store_n(&sh->probe_phase, PR_STOP, __ATOMIC_RELEASE);
	if (waitpid(probe_pid, NULL, 0) != probe_pid)
		die("waitpid: %s", strerror(errno));

	/* phase 3: every client process exits */
	printf("the verifiers %s after %.1f s; the clients exit\n",
	       verifiers_left(&settled, &registered) ? "are still there" : "went", t_settle / 1e6);
	t0 = now_us();
	close(go[1][1]);
	for (unsigned done = 0; done < procs;)
		if (waitpid(-1, NULL, 0) > 0)
			done++;
	do {                                     /* (the probe's connection went before) */
		gone.fds = count_fds();
		if (gone.fds > fds0)
			usleep(10000);
	} while (gone.fds > fds0 && now_us() - t0 < 600e6);
	t_gone = now_us() - t0;
	state_take(&gone);

	printf("\ntimes: connect + attach + register all %.1f s; verify all %.1f s; verifiers given back "
	       "%.1f s after the last verify%s; all %u disconnected (odpd's fds back) %.2f s after the "
	       "processes were told to exit\n", t_setup / 1e6, t_verify / 1e6, t_settle / 1e6,
	       verifiers_left(&settled, &registered) ? " (NOT within --settle-ms)" : "", n, t_gone / 1e6);
	if (gone.fds > fds0)
		printf("odpd still holds %ld fds more than before the first connection 600 s later\n",
		       gone.fds - fds0);
	printf("\nper connection, over the state before the first (%d kB own, %ld fds, %ld maps):\n",
	       (int)own_kb(&base), base.fds, base.maps);
	printf("%-34s %9s %7s %7s %9s %8s %6s %6s %5s %5s %5s %5s\n", "state", "own kB", "heap", "bounce", "RssFile",
	       "client", "fds", "maps", "qp", "cq", "mr", "pd");
	state_print("registered", &registered, &base, n);
	state_print("right after the verifies", &verified, &base, n);
	state_print("after the verifies, idle", &settled, &base, n);
	state_print("all disconnected", &gone, &base, n);
	printf("(own = RssAnon + RssShmem - client; client = resident pages of the clients' memfds in "
	       "odpd's mappings; heap = malloc's main arena and bounce = odpd's verify buffers, both "
	       "inside own; kernel objects of odpd: qp cq mr pd)\n");
	printf("target (issue 23): own <= 128 KiB per connection in both states: %s\n",
	       (own_kb(&registered) - own_kb(&base)) / (double)n <= 128 &&
	       (own_kb(&settled) - own_kb(&base)) / (double)n <= 128 ? "met" : "MISSED");
	printf("odpd peak: VmHWM %ld kB\n", status_kb("VmHWM"));

	printf("\nlatency per call, µs:                          %10s %10s %10s %8s\n", "p50", "p99", "p90",
	       "failed");
	step_stats("odpd_connect (Hello)", ST_CONNECT, n);
	step_stats("odpd_alloc 1 MiB + write 64 KiB", ST_ALLOC, n);
	step_stats("odpd_reg 64 KiB", ST_REG, n);
	for (unsigned k = 0; k < verifies; k++) {
		char name[64];

		snprintf(name, sizeof(name), "odpd_verify 64 KiB, #%u of the connection", k + 1);
		step_stats(name, ST_VERIFY0 + (int)k, n);
	}
	if (sh->n_vcost) {
		struct series *kept = series_new(VCOST_N, "kept"), *anew = series_new(VCOST_N, "anew");

		for (unsigned i = 0; i < sh->n_vcost; i++) {
			add(kept, sh->vkept[i]);
			add(anew, sh->vnew[i]);
		}
		summarize(kept);
		summarize(anew);
		printf("\none client alone, odpd_verify 64 KiB (µs, %u each): verifier kept p50 %.0f p90 %.0f; "
		       "made anew (after %u ms idle) p50 %.0f p90 %.0f: %.2f x, +%.0f µs\n", sh->n_vcost,
		       kept->median, kept->p90, idle_ms + 500, anew->median, anew->p90,
		       anew->median / kept->median, anew->median - kept->median);
	}
	printf("\nanother client's 4 KiB odpd_reg (a miss), one every %d ms:\n", PROBE_PAUSE_US / 1000);
	printf("  %-44s %10s %10s %10s %8s\n", "", "p50", "p99", "p99/idle", "samples");
	for (int ph = 0; ph < N_PR; ph++) {
		pr[ph] = series_new(PROBE_CAP, "%s", pr_names[ph]);
		for (unsigned i = 0; i < sh->probe_n[ph]; i++)
			add(pr[ph], sh->probe[ph][i]);
		if (!pr[ph]->n)
			continue;
		summarize(pr[ph]);
		printf("  %-44s %10.0f %10.0f %10.2f %8u\n", pr_names[ph], pr[ph]->median, pr[ph]->p99,
		       pr[ph]->p99 / pr[PR_IDLE]->p99, pr[ph]->n);
	}
	printf("target (issue 23): p99 with N connected within 2 x idle: %s\n",
	       pr[PR_HELD]->p99 <= 2 * pr[PR_IDLE]->p99 ? "met" : "MISSED");
	if (sh->first_error[0])
		printf("\nfirst failure: %s\n", sh->first_error);
	for (int st = 0; st < N_STEPS; st++)
		if (sh->failures[st])
			return 1;
	return 0;
}
