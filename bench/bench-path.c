/* SPDX-License-Identifier: MIT */
/*
 * bench-path: what one request costs odpd in system calls and context
 * switches (issues 11 and 26: count system calls and context switches per
 * request rather than microseconds). One client, N operations per phase:
 *   miss         a 4 KiB odpd_reg + odpd_dereg of a page no MR covers
 *                (resident, and mapped in odpd's view since the attach),
 *                with libodpd's cache on: 2 requests, the release one-way;
 *   daemon hit   odpd_reg of a page an MR we hold covers, cache off
 *                (ODPD_CACHE=0), answered on odpd's loop; its one-way
 *                release follows untimed (counts are per request of both);
 *   peer hit     the daemon hit as issue 26 defines it: odpd_reg, cache on,
 *                of a page of a shared PD's segment that another process
 *                of the PD (hold_serve()) holds an MR over, another page
 *                each time; its release goes into the release ring, untimed
 *                (odpd takes it with the next request): 1 request;
 *   local hit    the same with the cache on: libodpd answers, no request;
 *   refusal      odpd_join_pd on a connection that has registered: odpd
 *                refuses it at once (EBUSY), 1 request, no cache work; on
 *                the miss's connection, and on the daemon hit's;
 *   verbs        ibv_reg_mr + ibv_dereg_mr of a resident page in-process, another
 *                page each time (as the miss), one after the other;
 *   verbs, woken the same, each right after a bare round trip (untimed), as
 *                odpd's verbs run right after its wake-up: under TCG a
 *                context switch empties the emulator's TLB, which a tight
 *                loop of verbs never refills (doc/benchmarks.md, 1.4.7);
 *   server       a round trip to a child that registers the page, answers and
 *                deregisters it (verbs_serve(): the floor of any
 *                registration service here).
 * For each phase, the context switches of odpd's threads (/proc/PID/task/
 * TID/status) and of this process, with their CPU time (schedstat), and, with --strace, the
 * system calls of odpd (strace -c -f attached for the phase) and of this
 * process (strace -c attached to it), per request. Then the ratios' phases
 * again in rounds, each phase in turn (rounds()), and issue 26's figures,
 * each a count or a ratio of two medians from this run. Then each phase again idle and
 * while another client registers and deregisters 256 MiB pinned again and
 * again: median, p99 and the p99 ratio (issue 11's fairness target).
 * A benchmark: it reports, never asserts.
 *
 * bench-path --socket PATH [--iters N] [--strace] [--no-neighbour] [--only PHASE]
 *   (ODPD_BENCH_ODPD_PID: odpd; --only: that phase alone, e.g. under perf;
 *   --only setup: the connections, segments and iters misses every run
 *   makes first, and nothing else, the baseline of bench/run-instructions;
 *   ODPD_BENCH_STAGES=1 with --only: SIGUSR2 to odpd before the phase, for
 *   bench/run-stages; ODPD_BENCH_TRACE_ON=FILE with --only: "1" written to
 *   FILE before the phase, for bench/run-ftrace)
 * With --strace, strace's tables go to build/bench-path-PHASE{,-client}.strace.
 * bench/run-path runs it in the VM.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-util.h"

const char bench_name[] = "bench-path";

static pid_t odpd_pid;

/* What every thread of @pid has done so far: context switches (voluntary
 * and involuntary, from status) and CPU time in µs (schedstat: ns on CPU). */
static void task_sums(pid_t pid, unsigned long *ret_cs, double *ret_cpu_us)
{
	char path[320], line[256];
	unsigned long cs = 0, v;
	unsigned long long ns, cpu = 0;
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		die("%s: %s", path, strerror(errno));
	while ((e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, e->d_name);
		if ((f = fopen(path, "re"))) {   /* else a thread that just ended */
			while (fgets(line, sizeof(line), f))
				if (sscanf(line, "voluntary_ctxt_switches: %lu", &v) == 1 ||
				    sscanf(line, "nonvoluntary_ctxt_switches: %lu", &v) == 1)
					cs += v;
			fclose(f);
		}
		snprintf(path, sizeof(path), "/proc/%d/task/%s/schedstat", (int)pid, e->d_name);
		if ((f = fopen(path, "re"))) {
			if (fscanf(f, "%llu", &ns) == 1)
				cpu += ns;
			fclose(f);
		}
	}
	closedir(d);
	*ret_cs = cs;
	*ret_cpu_us = (double)cpu / 1000.0;
}

/* strace -c -f attached to @target (every thread) while a phase runs. */
static pid_t strace_start(pid_t target, const char *out)
{
	char pid[16];
	pid_t p;

	snprintf(pid, sizeof(pid), "%d", (int)target);
	p = fork();
	if (p < 0)
		die("fork: %s", strerror(errno));
	if (p == 0) {
		execlp("strace", "strace", "-q", "-c", "-f", "-o", out, "-p", pid, (char *)NULL);
		_exit(127);
	}
	sleep(2);                                   /* attached to every thread by now */
	return p;
}

/* Stop strace; the "total" line's call count. */
static unsigned long strace_stop(pid_t p, const char *out)
{
	char line[256];
	unsigned long calls = 0;
	double pct, secs;
	unsigned long usecs;
	int st;
	FILE *f;

	kill(p, SIGINT);
	waitpid(p, &st, 0);
	f = fopen(out, "re");
	if (!f)
		die("%s: %s", out, strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (strstr(line, "total") &&
		    sscanf(line, "%lf %lf %lu %lu", &pct, &secs, &usecs, &calls) != 4)
			sscanf(line, "%lf %lf %lu %lu", &pct, &secs, &usecs, &calls);
	fclose(f);
	return calls;
}

/*
 * The measured operations: a 4 KiB odpd_reg + odpd_dereg, as
 *   miss        of a page no MR covers, cache off: two jobs on a worker;
 *   daemon hit  of a page an MR of ours covers, cache off (ODPD_CACHE=0):
 *               two requests answered on odpd's loop;
 *   local hit   the same with libodpd's cache: no request at all;
 * and the control, 2 bare SEQPACKET round trips to an echoing process: what
 * the guest's CPUs do to any request/reply pair under load, odpd or not.
 */
/*
 * Two refusals: on the connection the miss uses (with a hit table: a
 * request costs the client its sendmsg and recvmsg), the miss's measure;
 * and on the one the daemon hit uses (ODPD_CACHE=0, no hit table: a
 * recvmsg more, looking for events), the daemon hit's.
 */
enum { PH_MISS1, PH_MISS, PH_DHIT, PH_PHIT, PH_LHIT, PH_REFUSAL, PH_REFUSAL_U, PH_VERBS, PH_RTT, PH_VERBS_W, PH_SERVER, N_PH };
static const char *const ph_names[N_PH] = {
	"miss, first (reg+dereg)", "miss (reg+dereg)", "daemon hit (its reg)",
	"daemon hit, a peer's MR (its reg)", "local hit (reg+dereg, libodpd)",
	"refusal (1 request)", "refusal, cache off (1 request)", "ibv_reg_mr+ibv_dereg_mr",
	"2 bare round trips (no odpd)", "ibv_reg_mr+ibv_dereg_mr, woken",
	"verbs server (round trip + reg)",
};
static const char *const ph_files[N_PH] = { "miss1", "miss", "hit", "peer-hit", "local", "refusal", "refusal-u", "verbs", "rtt", "verbs-woken", "server" };
/* requests to odpd per operation (0: none; counts are then per operation) */
static const unsigned ph_requests[N_PH] = { 2, 2, 2, 1, 0, 1, 1, 0, 0, 0, 0 };

struct client {
	struct odpd_conn *uncached, *cached;
	char *base1;                            /* iters pages of its own, each registered only
						  * once (the first timed pass) */
	char *base, *hitpage, *local;            /* iters pages of the cached connection's segment;
						  * one page held by uncached; one local */
	struct odpd_conn *peer;                 /* cache on, in the shared PD the holder's in */
	char *peer_base;                        /* iters pages the holder has an MR over each */
	char *verbs_pages;                      /* iters resident pages of a memfd of its own */
	int server_fd;                          /* the verbs server's socket (verbs_serve()) */
	struct verbs verbs;
	unsigned iters;
	int echo_fd;
};

/* One operation; the µs it took (the daemon hit: its odpd_reg alone). */
static double one_op(const struct client *cl, int ph, unsigned i)
{
	struct odpd_conn *c = cl->uncached;
	char *p = cl->hitpage;
	struct odpd_mr *mr;
	double t[3], t0 = now_us(), t1;

	switch (ph) {
	case PH_RTT:
		echo_rtt(cl->echo_fd);
		echo_rtt(cl->echo_fd);
		return now_us() - t0;
	case PH_REFUSAL:
	case PH_REFUSAL_U:
		if (odpd_join_pd(ph == PH_REFUSAL ? cl->cached : cl->uncached, "bench-path") != -1 || errno != EBUSY)
			die("odpd_join_pd after a registration: expected EBUSY, got %s", strerror(errno));
		return now_us() - t0;
	case PH_SERVER: {
		uint64_t off = (uint64_t)(i % cl->iters) * 4096;
		uint32_t lkey;

		if (send(cl->server_fd, &off, sizeof(off), MSG_NOSIGNAL) != (ssize_t)sizeof(off))
			die("verbs server: send: %s", strerror(errno));
		if (recv(cl->server_fd, &lkey, sizeof(lkey), 0) != (ssize_t)sizeof(lkey))
			die("verbs server: no answer (the child's ibv_reg_mr or ibv_dereg_mr failed, or it died)");
		return now_us() - t0;
	}
	case PH_VERBS_W:
		echo_rtt(cl->echo_fd);
		t0 = now_us();
		__attribute__((fallthrough));
	case PH_VERBS:
		/* a page of its own each time, as the miss has */
		verbs_reg_dereg(&cl->verbs, cl->verbs_pages + (size_t)(i % cl->iters) * 4096, 4096,
				IBV_ACCESS_LOCAL_WRITE, t);
		return now_us() - t0;
	case PH_MISS1:                          /* pages never registered */
		c = cl->cached;
		p = cl->base1 + (size_t)(i % cl->iters) * 4096;
		break;
	case PH_MISS:                           /* pages registered before */
		c = cl->cached;
		p = cl->base + (size_t)(i % cl->iters) * 4096;
		break;
	case PH_LHIT:
		c = cl->cached;
		p = cl->local;
		break;
	case PH_PHIT:
		c = cl->peer;
		p = cl->peer_base + (size_t)(i % cl->iters) * 4096;
		break;
	}
	mr = odpd_reg(c, p, 4096, IBV_ACCESS_LOCAL_WRITE);
	t1 = now_us();
	if (!mr || odpd_dereg(mr) < 0)
		die("%s: %s", ph_names[ph], odpd_errmsg());
	/* a daemon hit is one request; its release (one-way: sent, or put
	 * in the release ring, not waited for) is paid by the next one */
	return (ph == PH_DHIT || ph == PH_PHIT ? t1 : now_us()) - t0;
}

static struct series *timed(const struct client *cl, int ph, const char *suffix)
{
	struct series *s = series_new(cl->iters, "%s%s", ph_names[ph], suffix);

	for (unsigned i = 0; i < cl->iters; i++)
		add(s, one_op(cl, ph, i));
	summarize(s);
	return s;
}

/*
 * The floor of any registration service on this machine: a child
 * (child_start) with its own context and PD that, for each offset it
 * receives, registers that page of its pages (4 KiB, resident, shared with
 * it), answers with the lkey, and then deregisters it, as odpd deregisters
 * a released MR after its answer. No cache, no quota, no protocol: a round
 * trip with the verb on the far side, run right after a wake-up as odpd's is.
 */
struct server_pages {
	char *pages;
	size_t len;
};

static int verbs_serve(int fd, void *arg)
{
	const struct server_pages *sp = arg;
	struct verbs v;
	uint64_t off;
	ssize_t n;

	prctl(PR_SET_NAME, "vserver");          /* its own name in traces (bench/run-ftrace) */
	verbs_open(&v);
	while ((n = recv(fd, &off, sizeof(off), 0)) == (ssize_t)sizeof(off)) {
		struct ibv_mr *mr = off + 4096 <= sp->len ?
			ibv_reg_mr(v.pd, sp->pages + off, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
		uint32_t lkey = mr ? mr->lkey : 0;

		if (!mr || send(fd, &lkey, sizeof(lkey), MSG_NOSIGNAL) != (ssize_t)sizeof(lkey) ||
		    ibv_dereg_mr(mr))
			return 1;
	}
	verbs_close(&v);
	return n == 0 ? 0 : 1;
}

/*
 * Another process of a shared PD: it attaches the segment the parent
 * allocated (inherited, as fd 4, and mapped at the same address), holds an
 * MR over each of its pages, says so with a byte, and keeps them until the
 * parent closes the socket. A registration of one of those pages by the
 * parent's connection in the PD is then a daemon hit (issue 26's: "another
 * process of the PD holds the MR").
 */
struct holder {
	const char *sock, *pd;
	char *addr;
	size_t len;
};

static int hold_serve(int fd, void *arg)
{
	const struct holder *h = arg;
	struct odpd_conn *c;
	char b = 1;

	prctl(PR_SET_NAME, "holder");
	c = odpd_connect(h->sock, NULL);
	if (!c || odpd_join_pd(c, h->pd) < 0 || !odpd_attach(c, 4, h->addr, h->len)) {
		fprintf(stderr, "bench-path holder: %s\n", odpd_errmsg());
		return 1;
	}
	for (size_t off = 0; off < h->len; off += 4096)
		if (!odpd_reg(c, h->addr + off, 4096, IBV_ACCESS_LOCAL_WRITE)) {
			fprintf(stderr, "bench-path holder: odpd_reg: %s\n", odpd_errmsg());
			return 1;
		}
	if (send(fd, &b, 1, MSG_NOSIGNAL) != 1)
		return 1;
	while (recv(fd, &b, 1, 0) > 0)
		;
	odpd_disconnect(c);                     /* its MRs go with it */
	return 0;
}

/*
 * The ratios' medians, taken in rounds: each round runs every phase of
 * @phs for iters / ROUNDS operations in a row, so a drift of the guest's
 * speed over the run (the emulator's) falls on all of them alike. Within a
 * phase, what one operation leaves for odpd to finish after it returned (a
 * one-way release) is paid by the next one, as it is in a program.
 */
#define ROUNDS 8
static void rounds(const struct client *cl, const int *phs, unsigned n, struct series **out,
		   double (*round_median)[ROUNDS])
{
	unsigned per = cl->iters / ROUNDS ? cl->iters / ROUNDS : 1;

	for (unsigned k = 0; k < n; k++)
		out[k] = series_new(per * ROUNDS, "%s (rounds)", ph_names[phs[k]]);
	for (unsigned round = 0; round < ROUNDS; round++)
		for (unsigned k = 0; k < n; k++) {
			struct series *one = series_new(per, "%s (round %u)", ph_names[phs[k]], round);

			for (unsigned i = 0; i < per; i++) {
				double us = one_op(cl, phs[k], round * per + i);

				add(out[k], us);
				add(one, us);
			}
			summarize(one);
			round_median[k][round] = one->median;
			series_free(one);
		}
	for (unsigned k = 0; k < n; k++)
		summarize(out[k]);
}

/* Each operation idle, then while another client registers and deregisters
 * 256 MiB pinned again and again (issue 11: a client's hit p99 while another
 * registers 256 MiB within 2 x its idle p99). */
static void big_neighbour(const char *sock, const struct client *cl)
{
	const size_t big = 256 * MiB;
	struct series *idle[N_PH], *busy[N_PH];
	unsigned long neighbour_regs = 0;
	int go[2], stop[2], count[2];
	char b = 0;
	pid_t pid;

	if (pipe(go) < 0 || pipe(stop) < 0 || pipe(count) < 0)
		die("pipe: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		struct odpd_conn *n = odpd_connect(sock, NULL);
		struct odpd_segment *s = n ? odpd_alloc(n, big, 0) : NULL;
		unsigned long regs = 0;

		if (!s)
			die("neighbour: %s", odpd_errmsg());
		memset(odpd_segment_addr(s), 1, big);
		if (write(go[1], &b, 1) != 1 || read(stop[0], &b, 1) != 1)   /* ready; then start */
			_exit(1);
		fcntl(stop[0], F_SETFL, O_NONBLOCK);
		while (read(stop[0], &b, 1) != 1) {
			struct odpd_mr *mr = odpd_reg(n, odpd_segment_addr(s), big, IBV_ACCESS_LOCAL_WRITE);

			if (!mr || odpd_dereg(mr) < 0)
				die("neighbour: %s", odpd_errmsg());
			regs++;
		}
		if (write(count[1], &regs, sizeof(regs)) != sizeof(regs))
			_exit(1);
		odpd_disconnect(n);
		_exit(0);
	}
	if (read(go[0], &b, 1) != 1)                     /* its segment is ready */
		die("the neighbour did not start");
	for (int ph = PH_MISS; ph < N_PH; ph++)
		idle[ph] = timed(cl, ph, " idle");
	if (write(stop[1], &b, 1) != 1)                  /* start it, let it get going */
		die("starting the neighbour");
	usleep(200000);
	for (int ph = PH_MISS; ph < N_PH; ph++)
		busy[ph] = timed(cl, ph, " beside 256 MiB");
	if (write(stop[1], &b, 1) != 1)
		die("stopping the neighbour");
	if (read(count[0], &neighbour_regs, sizeof(neighbour_regs)) != sizeof(neighbour_regs))
		die("the neighbour did not report");
	waitpid(pid, NULL, 0);
	printf("\nwhile another client registers + deregisters 256 MiB pinned (%lu times meanwhile):\n",
	       neighbour_regs);
	printf("%-32s %11s %11s %11s %11s %9s\n", "4 KiB reg+dereg", "idle med", "idle p99",
	       "busy med", "busy p99", "p99 ratio");
	for (int ph = PH_MISS; ph < N_PH; ph++)
		printf("%-32s %9.1f µs %8.1f µs %8.1f µs %8.1f µs %9.2f\n", ph_names[ph], idle[ph]->median,
		       idle[ph]->p99, busy[ph]->median, busy[ph]->p99, busy[ph]->p99 / idle[ph]->p99);
	printf("target (issue 11): a client's hit p99 beside 256 MiB <= 2 x idle: daemon hit %s, local hit %s\n",
	       busy[PH_DHIT]->p99 <= 2 * idle[PH_DHIT]->p99 ? "met" : "MISSED",
	       busy[PH_LHIT]->p99 <= 2 * idle[PH_LHIT]->p99 ? "met" : "MISSED");
	printf("daemon hit p99 ratio / bare round trips' p99 ratio: %.2f (what odpd adds to the guest's own slow-down)\n",
	       (busy[PH_DHIT]->p99 / idle[PH_DHIT]->p99) / (busy[PH_RTT]->p99 / idle[PH_RTT]->p99));
}

/* One phase of @cl's: its median, and per request (per operation where it
 * makes none) odpd's and this process's context switches and, with
 * --strace (a second pass: ptrace stops switch too), system calls. */
struct figures {
	double median, odpd_calls, client_calls, odpd_cs, client_cs, odpd_cpu, client_cpu;
};

static struct figures phase(const struct client *cl, int ph, bool use_strace)
{
	struct figures f = { 0 };
	double per = ph_requests[ph] ? ph_requests[ph] * (double)cl->iters : (double)cl->iters;
	unsigned long cs0, cs1, own_cs0, own_cs1;
	double cpu0, cpu1, own_cpu0, own_cpu1;
	struct series *s;

	task_sums(odpd_pid, &cs0, &cpu0);
	task_sums(getpid(), &own_cs0, &own_cpu0);
	s = timed(cl, ph, "");
	task_sums(odpd_pid, &cs1, &cpu1);
	task_sums(getpid(), &own_cs1, &own_cpu1);
	f.odpd_cpu = (cpu1 - cpu0) / per;
	f.client_cpu = (own_cpu1 - own_cpu0) / per;
	f.odpd_cs = (double)(cs1 - cs0) / per;
	f.client_cs = (double)(own_cs1 - own_cs0) / per;
	f.median = s->median;
	if (use_strace && ph != PH_RTT) {
		char out[64], own[64];
		pid_t st, so;

		snprintf(out, sizeof(out), "build/bench-path-%s.strace", ph_files[ph]);
		snprintf(own, sizeof(own), "build/bench-path-%s-client.strace", ph_files[ph]);
		st = strace_start(odpd_pid, out);
		so = strace_start(getpid(), own);
		timed(cl, ph, " (strace)");
		f.client_calls = (double)strace_stop(so, own) / per;
		f.odpd_calls = (double)strace_stop(st, out) / per;
	}
	return f;
}

static void target(const char *what, double v, double goal, const char *unit)
{
	printf("  %-66s %7.2f%s  target <= %.2f%s: %s\n", what, v, unit, goal, unit,
	       v <= goal + 0.005 ? "met" : "MISSED");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "iters", required_argument, NULL, 'n' },
		{ "strace", no_argument, NULL, 't' },
		{ "no-neighbour", no_argument, NULL, 'N' },
		{ "only", required_argument, NULL, 'o' },
		{ 0 }
	};
	const char *sock = getenv("ODPD_SOCKET"), *pid_env = getenv("ODPD_BENCH_ODPD_PID");
	unsigned iters = 200;
	bool use_strace = false, neighbour = true;
	const char *only = NULL;
	struct client cl;
	struct odpd_segment *seg, *seg1, *hseg, *lseg, *pseg;
	struct odpd_mr *hold, *lhold, *warm;
	struct figures f[N_PH];
	pid_t echo_pid, server_pid, holder_pid;
	struct server_pages sp;
	struct holder holder;
	char pd_name[64], b;
	int o, holder_fd;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'n': iters = parse_n(optarg, 100000); break;
		case 't': use_strace = true; break;
		case 'N': neighbour = false; break;
		case 'o': only = optarg; break;
		default: die("usage: bench-path --socket PATH [--iters N] [--strace] [--no-neighbour] [--only PHASE]");
		}
	}
	if (!sock || !pid_env)
		die("needs --socket and ODPD_BENCH_ODPD_PID");
	odpd_pid = (pid_t)atoi(pid_env);
	print_command(argc, argv);
	printf("\n");
	/* the cache off for the daemon hit and the refusal; on for the miss
	 * and the local hit (a miss then reaches odpd as in a real program) */
	setenv("ODPD_CACHE", "0", 1);
	cl.uncached = odpd_connect(sock, NULL);
	unsetenv("ODPD_CACHE");
	cl.cached = odpd_connect(sock, NULL);
	cl.peer = odpd_connect(sock, NULL);
	if (!cl.uncached || !cl.cached || !cl.peer)
		die("odpd_connect: %s", odpd_errmsg());
	snprintf(pd_name, sizeof(pd_name), "bench-path-%d", (int)getpid());
	if (odpd_join_pd(cl.peer, pd_name) < 0)
		die("odpd_join_pd: %s", odpd_errmsg());
	cl.iters = iters;
	seg = odpd_alloc(cl.cached, (size_t)iters * 4096, 0);
	seg1 = odpd_alloc(cl.cached, (size_t)iters * 4096, 0);
	hseg = odpd_alloc(cl.uncached, 4096, 0);
	lseg = odpd_alloc(cl.cached, 4096, 0);
	pseg = odpd_alloc(cl.peer, (size_t)iters * 4096, 0);
	if (!seg || !seg1 || !hseg || !lseg || !pseg)
		die("odpd_alloc: %s", odpd_errmsg());
	cl.base = odpd_segment_addr(seg);
	cl.base1 = odpd_segment_addr(seg1);
	memset(cl.base1, 1, (size_t)iters * 4096);
	cl.hitpage = odpd_segment_addr(hseg);
	cl.local = odpd_segment_addr(lseg);
	memset(cl.base, 1, (size_t)iters * 4096);
	memset(cl.hitpage, 1, 4096);
	memset(cl.local, 1, 4096);
	hold = odpd_reg(cl.uncached, cl.hitpage, 4096, IBV_ACCESS_LOCAL_WRITE);
	lhold = odpd_reg(cl.cached, cl.local, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!hold || !lhold)
		die("odpd_reg: %s", odpd_errmsg());
	verbs_open(&cl.verbs);
	cl.verbs_pages = memfd_buffer((size_t)iters * 4096);
	cl.echo_fd = echo_start(&echo_pid);
	sp.len = (size_t)iters * 4096;
	sp.pages = memfd_buffer(sp.len);
	cl.server_fd = child_start(verbs_serve, &sp, -1, &server_pid);
	cl.peer_base = odpd_segment_addr(pseg);
	memset(cl.peer_base, 1, (size_t)iters * 4096);
	holder = (struct holder){ .sock = sock, .pd = pd_name, .addr = cl.peer_base, .len = (size_t)iters * 4096 };
	holder_fd = child_start(hold_serve, &holder, odpd_segment_fd(pseg), &holder_pid);
	if (recv(holder_fd, &b, 1, 0) != 1)
		die("the holder (another process of the PD) failed");
	/* the connection's first registration opens its PD, on a worker; it
	 * must be a daemon hit (the holder's MR), not a miss */
	{
		struct odpd_stats s0, s1;

		if (odpd_stats(cl.peer, &s0, sizeof(s0)) < 0)
			die("odpd_stats: %s", odpd_errmsg());
		warm = odpd_reg(cl.peer, cl.peer_base, 4096, IBV_ACCESS_LOCAL_WRITE);
		if (!warm || odpd_dereg(warm) < 0)
			die("odpd_reg (peer): %s", odpd_errmsg());
		if (odpd_stats(cl.peer, &s1, sizeof(s1)) < 0 || s1.daemon_hits != s0.daemon_hits + 1 ||
		    s1.misses != s0.misses)
			die("the peer's page was not a daemon hit (hits %" PRIu64 " -> %" PRIu64 ", misses %" PRIu64
			    " -> %" PRIu64 ")", s0.daemon_hits, s1.daemon_hits, s0.misses, s1.misses);
	}
	for (unsigned i = 0; i < iters; i++)       /* the "registered before" pages */
		one_op(&cl, PH_MISS, i);
	printf("%-32s %10s %11s %11s %11s %11s %11s\n", "phase", "median µs", "odpd calls", "client calls",
	       "ctx switches", "odpd CPU", "client CPU");
	printf("%-32s %10s %11s %11s %11s %11s %11s\n", "(per request; per op if none)", "", "(strace)", "(strace)",
	       "odpd+client", "µs (mean)", "µs (mean)");
	if (only && strcmp(only, "setup") == 0)    /* the setup alone: a profile's baseline */
		return 0;
	if (only) {                                /* one phase, e.g. under a profiler */
		int ph = 0;

		while (ph < N_PH && strcmp(ph_files[ph], only) != 0)
			ph++;
		if (ph == N_PH)
			die("--only: no phase %s (setup, miss1, miss, hit, peer-hit, local, refusal, refusal-u, verbs, rtt, "
			    "verbs-woken, server)",
			    only);
		if (getenv("ODPD_BENCH_TRACE_ON")) {
			/* bench/run-ftrace: the kernel's tracer from here on */
			FILE *t = fopen(getenv("ODPD_BENCH_TRACE_ON"), "we");

			if (!t || fputs("1\n", t) < 0 || fclose(t) != 0)
				die("%s: %s", getenv("ODPD_BENCH_TRACE_ON"), strerror(errno));
		}
		if (getenv("ODPD_BENCH_STAGES")) {
			/* bench/run-stages: odpd's sums start here (daemon/stages.h) */
			if (kill(odpd_pid, SIGUSR2) < 0)
				die("kill odpd: %s", strerror(errno));
			usleep(300000);
		}
		f[ph] = phase(&cl, ph, false);
		printf("%-32s %10.1f %11s %11s %11.2f %11.1f %11.1f\n", ph_names[ph], f[ph].median, "-", "-",
		       f[ph].odpd_cs + f[ph].client_cs, f[ph].odpd_cpu, f[ph].client_cpu);
		return 0;
	}
	for (int ph = 0; ph < N_PH; ph++) {
		f[ph] = phase(&cl, ph, use_strace);
		if (use_strace && ph != PH_RTT)
			printf("%-32s %10.1f %11.2f %11.2f %11.2f %11.1f %11.1f\n", ph_names[ph], f[ph].median,
			       f[ph].odpd_calls, f[ph].client_calls, f[ph].odpd_cs + f[ph].client_cs,
			       f[ph].odpd_cpu, f[ph].client_cpu);
		else
			printf("%-32s %10.1f %11s %11s %11.2f %11.1f %11.1f\n", ph_names[ph], f[ph].median, "-", "-",
			       f[ph].odpd_cs + f[ph].client_cs, f[ph].odpd_cpu, f[ph].client_cpu);
	}
	{
		/* R_*: where each phase is in phs[] (and in rs[], rm[]) */
		enum { R_MISS, R_REFUSAL, R_VERBS, R_PHIT, R_DHIT, R_RTT, R_REFUSAL_U, R_VERBS_W, R_SERVER, NPHS };
		static const int phs[NPHS] = { PH_MISS, PH_REFUSAL, PH_VERBS, PH_PHIT, PH_DHIT, PH_RTT,
					       PH_REFUSAL_U, PH_VERBS_W, PH_SERVER };
		struct series *rs[NPHS], *woken_ratio = series_new(ROUNDS, "miss ratio, woken, per round");
		double rm[NPHS][ROUNDS];

		rounds(&cl, phs, NPHS, rs, rm);
		printf("\n%d phases again in %d rounds of %u operations each (medians, µs):\n", NPHS, ROUNDS,
		       iters / ROUNDS);
		for (int k = 0; k < NPHS; k++)
			printf("%-32s %10.1f  (p10 %.1f, p90 %.1f)\n", ph_names[phs[k]], rs[k]->median, rs[k]->p10,
			       rs[k]->p90);
		/* The emulator's speed changes within a run, and a round's
		 * phases share it: each round's own medians, and the miss's
		 * ratio within the round. */
		printf("\neach round's medians (µs), and the miss's ratios within it:\n%-8s", "round");
		for (int k = 0; k < NPHS; k++)
			printf(" %11s", ph_files[phs[k]]);
		printf(" %10s %10s %10s\n", "miss/warm", "miss/woken", "miss/floor");
		for (unsigned round = 0; round < ROUNDS; round++) {
			double woken = rm[R_MISS][round] / (rm[R_REFUSAL][round] + rm[R_VERBS_W][round]);

			printf("%-8u", round + 1);
			for (int k = 0; k < NPHS; k++)
				printf(" %11.1f", rm[k][round]);
			printf(" %10.2f %10.2f %10.2f\n", rm[R_MISS][round] / (rm[R_REFUSAL][round] + rm[R_VERBS][round]),
			       woken, rm[R_MISS][round] / rm[R_SERVER][round]);
			add(woken_ratio, woken);
		}
		summarize(woken_ratio);
		printf("\nissue 26's figures (a 4 KiB miss = odpd_reg + odpd_dereg of resident pages, 2 requests):\n");
		if (use_strace) {
			target("system calls in odpd per request of a miss", f[PH_MISS].odpd_calls, 5, "");
			target("system calls in the client per request of a miss", f[PH_MISS].client_calls, 2, "");
			/* With a release ring the release is no request: the
			 * one request that reaches odpd carries both. */
			printf("  %-66s %7.2f, %.2f\n", "(per miss: odpd, the client)", 2 * f[PH_MISS].odpd_calls,
			       2 * f[PH_MISS].client_calls);
		}
		target("context switches per request of a miss, odpd and client",
		       f[PH_MISS].odpd_cs + f[PH_MISS].client_cs, 2, "");
		target("miss / (refusal + ibv_reg_mr + ibv_dereg_mr), medians of the rounds",
		       rs[R_MISS]->median / (rs[R_REFUSAL]->median + rs[R_VERBS]->median), 1.5, " ×");
		printf("  %-66s %7.2f ×\n", "(the same, medians of the phases above)",
		       f[PH_MISS].median / (f[PH_REFUSAL].median + f[PH_VERBS].median));
		printf("  %-66s %7.2f ×\n", "(of pages never registered before, phases above)",
		       f[PH_MISS1].median / (f[PH_REFUSAL].median + f[PH_VERBS].median));
		/* odpd's verbs run right after a wake-up, as the woken ones do
		 * (doc/benchmarks.md: under TCG a context switch empties the
		 * emulator's TLB; verbs in a tight loop never pay that) */
		printf("  %-66s %7.2f ×\n", "(the same, with the verbs run after a wake-up, medians of the rounds)",
		       rs[R_MISS]->median / (rs[R_REFUSAL]->median + rs[R_VERBS_W]->median));
		printf("  %-66s %7.2f ×\n", "(the same, median of the rounds' own ratios)", woken_ratio->median);
		/* the refusal on a connection like the peer hit's: cache on */
		target("daemon hit, a peer's MR (its odpd_reg) / refusal, medians of the rounds",
		       rs[R_PHIT]->median / rs[R_REFUSAL]->median, 1.1, " ×");
		printf("  %-66s %7.2f ×\n", "(the same, medians of the phases above)",
		       f[PH_PHIT].median / f[PH_REFUSAL].median);
		printf("  %-66s %7.2f ×\n", "(cache off, its own MR / refusal, cache off, medians of the rounds)",
		       rs[R_DHIT]->median / rs[R_REFUSAL_U]->median);
		printf("  %-66s %7.2f ×\n", "(refusal / bare SEQPACKET round trip, medians of the rounds)",
		       rs[R_REFUSAL]->median / (rs[R_RTT]->median / 2));
		printf("  %-66s %7.2f ×\n", "(verbs after a wake-up / verbs in a loop, medians of the rounds)",
		       rs[R_VERBS_W]->median / rs[R_VERBS]->median);
		printf("  %-66s %7.2f ×\n", "(miss / the verbs server's round trip, medians of the rounds)",
		       rs[R_MISS]->median / rs[R_SERVER]->median);
		printf("  %-66s %7.2f ×\n", "(verbs server / (refusal + verbs in a loop), medians of the rounds)",
		       rs[R_SERVER]->median / (rs[R_REFUSAL]->median + rs[R_VERBS]->median));
	}
	if (neighbour)
		big_neighbour(sock, &cl);
	child_stop(cl.echo_fd, echo_pid);
	child_stop(cl.server_fd, server_pid);
	child_stop(holder_fd, holder_pid);
	verbs_close(&cl.verbs);
	odpd_dereg(hold);
	odpd_dereg(lhold);
	odpd_disconnect(cl.cached);
	odpd_disconnect(cl.uncached);
	odpd_disconnect(cl.peer);
	return 0;
}
