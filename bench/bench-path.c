/* SPDX-License-Identifier: MIT */
/*
 * bench-path: what one request costs odpd in system calls and context
 * switches (issue 11: "measure system calls and context switches per
 * request before and after"). One client, three phases of N requests each:
 *   miss   odpd_reg of a page no MR covers (a worker registers) + odpd_dereg
 *          (a worker deregisters): 2 requests, 2 jobs;
 *   hit    odpd_reg of a page an MR we hold covers (answered on the loop)
 *          + odpd_dereg of that reference (no job): 2 requests.
 * Then 4 KiB misses idle and while another client registers 256 MiB again
 * and again: median and p99 of each.
 * For each phase, odpd's threads' context switches (voluntary + involuntary,
 * /proc/PID/task/TID/status) and, with --strace, its system calls (strace -c
 * -f attached for the phase), divided by the requests. Also each phase's
 * median latency. A benchmark: it reports, never asserts.
 *
 * bench-path --socket PATH [--iters N] [--strace]   (ODPD_BENCH_ODPD_PID: odpd)
 * With --strace, strace's tables go to build/bench-path-{miss,hit}.strace.
 * bench/run-path runs it in the VM.
 */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-util.h"

const char bench_name[] = "bench-path";

static pid_t odpd_pid;

/* Context switches of every thread of odpd so far. */
static unsigned long ctx_switches(void)
{
	char path[320], line[256];
	unsigned long sum = 0, v;
	struct dirent *e;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)odpd_pid);
	d = opendir(path);
	if (!d)
		die("%s: %s", path, strerror(errno));
	while ((e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)odpd_pid, e->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;                       /* a thread that just ended */
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "voluntary_ctxt_switches: %lu", &v) == 1 ||
			    sscanf(line, "nonvoluntary_ctxt_switches: %lu", &v) == 1)
				sum += v;
		fclose(f);
	}
	closedir(d);
	return sum;
}

/* strace -c -f attached to odpd (every thread) while a phase runs. */
static pid_t strace_start(const char *out)
{
	char pid[16];
	pid_t p;

	snprintf(pid, sizeof(pid), "%d", (int)odpd_pid);
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

/* The p99 (nearest rank) of @s's samples. */
static double p99(const struct series *s)
{
	double *v = malloc(s->n * sizeof(*v));
	double r;

	if (!v)
		die("out of memory");
	memcpy(v, s->us, s->n * sizeof(*v));
	for (unsigned i = 1; i < s->n; i++)          /* small n: insertion sort */
		for (unsigned j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	r = v[(s->n * 99 + 99) / 100 - 1];
	free(v);
	return r;
}

/* 4 KiB misses (reg + dereg): idle, then while another client registers and
 * deregisters 256 MiB pinned again and again (issue 11: a client's latency
 * while another registers 256 MiB; odpd runs big jobs on all workers but one). */
static void big_neighbour(const char *sock, struct odpd_conn *c, char *base, unsigned iters)
{
	const size_t big = 256 * MiB;
	int go[2], stop[2];
	char b = 0;
	pid_t pid;

	if (pipe(go) < 0 || pipe(stop) < 0)
		die("pipe: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		struct odpd_conn *n = odpd_connect(sock, NULL);
		struct odpd_segment *s = n ? odpd_alloc(n, big, 0) : NULL;

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
		}
		odpd_disconnect(n);
		_exit(0);
	}
	if (read(go[0], &b, 1) != 1)                     /* its segment is ready */
		die("the neighbour did not start");
	for (int loaded = 0; loaded < 2; loaded++) {
		struct series *s = series_new(iters, "4 KiB miss %s", loaded ? "beside 256 MiB" : "idle");

		if (loaded) {                                  /* start it, let it get going */
			if (write(stop[1], &b, 1) != 1)
				die("starting the neighbour");
			usleep(200000);
		}
		for (unsigned i = 0; i < iters; i++) {
			double t0 = now_us();
			struct odpd_mr *mr = odpd_reg(c, base + (size_t)i * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);

			if (!mr || odpd_dereg(mr) < 0)
				die("miss: %s", odpd_errmsg());
			add(s, now_us() - t0);
		}
		summarize(s);
		printf("%-38s median %8.1f µs   p99 %9.1f µs\n", s->name, s->median, p99(s));
	}
	if (write(stop[1], &b, 1) != 1)
		die("stopping the neighbour");
	waitpid(pid, NULL, 0);
}

enum { PH_MISS, PH_HIT, N_PH };
static const char *const ph_names[N_PH] = { "miss (reg+dereg, 2 jobs)", "hit (reg+dereg, on the loop)" };

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "iters", required_argument, NULL, 'n' },
		{ "strace", no_argument, NULL, 't' },
		{ 0 }
	};
	const char *sock = getenv("ODPD_SOCKET"), *pid_env = getenv("ODPD_BENCH_ODPD_PID");
	unsigned iters = 200;
	bool use_strace = false;
	struct odpd_conn *c;
	struct odpd_segment *seg;
	struct odpd_mr *hold;
	char *base;
	int o;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'n': iters = parse_n(optarg, 100000); break;
		case 't': use_strace = true; break;
		default: die("usage: bench-path --socket PATH [--iters N] [--strace]");
		}
	}
	if (!sock || !pid_env)
		die("needs --socket and ODPD_BENCH_ODPD_PID");
	odpd_pid = (pid_t)atoi(pid_env);
	print_command(argc, argv);
	printf("\n");
	c = odpd_connect(sock, NULL);
	if (!c)
		die("odpd_connect: %s", odpd_errmsg());
	seg = odpd_alloc(c, (size_t)(iters + 1) * 4096, 0);
	if (!seg)
		die("odpd_alloc: %s", odpd_errmsg());
	base = odpd_segment_addr(seg);
	memset(base, 1, (size_t)(iters + 1) * 4096);
	hold = odpd_reg(c, base + (size_t)iters * 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!hold)
		die("odpd_reg: %s", odpd_errmsg());
	printf("%-30s %10s %12s %14s\n", "phase (N requests)", "median µs", "syscalls/req", "ctx switches/req");
	for (int ph = 0; ph < N_PH; ph++) {
		/* first plain (latency, context switches), then under strace
		 * (system calls: ptrace stops add switches of their own) */
		for (int traced = 0; traced <= (int)use_strace; traced++) {
			struct series *s = series_new(iters, "%s", ph_names[ph]);
			unsigned long cs0 = 0, cs1 = 0, calls = 0;
			pid_t st = 0;
			char trace_file[64];

			snprintf(trace_file, sizeof(trace_file), "build/bench-path-%s.strace",
				 ph == PH_MISS ? "miss" : "hit");
			if (traced)
				st = strace_start(trace_file);
			cs0 = ctx_switches();
			for (unsigned i = 0; i < iters; i++) {
				char *p = base + (size_t)(ph == PH_MISS ? i : iters) * 4096;
				double t0 = now_us();
				struct odpd_mr *mr = odpd_reg(c, p, 4096, IBV_ACCESS_LOCAL_WRITE);

				if (!mr || odpd_dereg(mr) < 0)
					die("%s: %s", ph_names[ph], odpd_errmsg());
				add(s, now_us() - t0);
			}
			cs1 = ctx_switches();
			if (traced) {
				calls = strace_stop(st, trace_file);
				printf("%-30s %10s %12.2f %14s\n", "  (under strace)", "",
				       (double)calls / (2.0 * iters), "");
				continue;
			}
			summarize(s);
			printf("%-30s %10.1f %12s %14.2f\n", ph_names[ph], s->median, "",
			       (double)(cs1 - cs0) / (2.0 * iters));
		}
	}
	big_neighbour(sock, c, base, iters);
	odpd_dereg(hold);
	odpd_disconnect(c);
	return 0;
}
