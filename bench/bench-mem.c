/* SPDX-License-Identifier: MIT */
/*
 * bench-mem: odpd's own memory per cached MR (issue 11: at most 256 bytes,
 * measured over 100,000 MRs). Client processes (one per 50,000 MRs, the
 * per-connection limit being 65,536) each pre-fault a segment of two pages
 * per MR and register every other page as a pinned MR of its own (MRs that
 * do not touch: nothing of odpd's can merge them), all misses. First each
 * MR is released relaxed as soon as it is registered: it stays in odpd's
 * registration cache, held by no client (bench/run-mem raises the relaxed
 * queue's limits for that); then they are flushed, and the clients register
 * the same ranges again and hold them. The parent reads odpd's RssAnon
 * (/proc/PID/status: its heap, libibverbs' and the provider's objects, not
 * the segments, which are shmem) at the start, with every MR cached, and
 * with every MR held: the growth over the start per MR is a cached MR's
 * cost and a held MR's (with its client's reference; the heap reuses what
 * the flush freed). Kernel memory (the driver's MR objects and page lists)
 * is not odpd's RSS; the run prints the kernel's MR count (rdma resource
 * show mr) beside it. A benchmark: it reports, never asserts.
 *
 * bench-mem --socket PATH [--mrs N]   (ODPD_BENCH_ODPD_PID: odpd)
 * bench/run-mem runs it in the VM.
 */
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-util.h"

const char bench_name[] = "bench-mem";

#define PER_CLIENT 50000u

static pid_t odpd_pid;

/* A field of odpd's /proc/PID/status, in kB. */
static long status_kb(const char *field)
{
	long kb = proc_status_kb(odpd_pid, field);

	if (kb < 0)
		die("no %s in /proc/%d/status", field, (int)odpd_pid);
	return kb;
}

/* odpd's resident anonymous memory in kB: its main heap ([heap]: malloc on
 * the event loop) and anonymous mappings (the registry's slabs of MRs and
 * references; worker threads' malloc arenas: libibverbs' MR objects; thread
 * stacks). */
static void anon_split(long *heap_kb, long *other_kb)
{
	char path[64], line[512];
	enum { OTHER, HEAP, NONE } cur = NONE;
	FILE *f;

	*heap_kb = *other_kb = 0;
	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)odpd_pid);
	f = fopen(path, "re");
	if (!f)
		die("%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		long kb;
		char name[256] = "";

		if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &lo, &hi, name) >= 2) {
			cur = !strcmp(name, "[heap]") ? HEAP : !name[0] ? OTHER : NONE;
		} else if (cur != NONE && sscanf(line, "Anonymous: %ld kB", &kb) == 1) {
			*(cur == HEAP ? heap_kb : other_kb) += kb;
		}
	}
	fclose(f);
}

/* Register @n one-page MRs (every other page of @p), each released relaxed
 * at once when @relaxed, else held; progress every tenth. */
static void reg_all(struct odpd_conn *c, uint8_t *p, unsigned n, bool relaxed, struct odpd_mr **mrs)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	for (unsigned i = 0, step = n / 10 ? n / 10 : 1; i < n; i++) {
		static double t0;

		if (i % step == 0) {                 /* progress, and whether a registration slows down */
			double t = now_us();

			if (i)
				printf("  client %d: %u MRs %s, the last %u took %.0f us each\n", (int)getpid(),
				       i, relaxed ? "cached (released relaxed)" : "held", step, (t - t0) / step);
			fflush(stdout);
			t0 = t;
		}
		if (!(mrs[i] = odpd_reg(c, p + (size_t)i * 2 * pg, pg, IBV_ACCESS_LOCAL_WRITE)))
			die("odpd_reg #%u: %s", i, odpd_errmsg());
		if (relaxed && odpd_dereg_relaxed(mrs[i]) < 0)
			die("odpd_dereg_relaxed #%u: %s", i, odpd_errmsg());
	}
}

/* A client of @n MRs: registers them and releases each relaxed (they stay
 * in odpd's cache), reports through @ready; after a byte on @go, flushes
 * them, reports; registers @n again and holds them, reports; after EOF on
 * @go (whose write end @go_w it closes: the parent's close is the signal),
 * deregisters and reports. */
static void client(const char *sock, unsigned n, int ready, int go, int go_w)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr **mrs = calloc(n, sizeof(*mrs));
	char b = 0;
	uint8_t *p;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	close(go_w);
	setenv("ODPD_CACHE", "0", 1);            /* the daemon's cache, no process cache */
	c = odpd_connect(sock, NULL);
	s = c ? odpd_alloc(c, (size_t)n * 2 * pg, ODPD_ALLOC_POPULATE) : NULL;
	if (!mrs || !s)
		die("client: %s", odpd_errmsg());
	p = odpd_segment_addr(s);
	reg_all(c, p, n, true, mrs);
	if (write(ready, &b, 1) != 1 || read(go, &b, 1) != 1)
		_exit(1);
	if (odpd_flush_relaxed(c) < 0)
		die("odpd_flush_relaxed: %s", odpd_errmsg());
	if (write(ready, &b, 1) != 1)
		_exit(1);
	reg_all(c, p, n, false, mrs);
	if (write(ready, &b, 1) != 1 || read(go, &b, 1) != 0)
		_exit(1);
	for (unsigned i = 0; i < n; i++)
		if (odpd_dereg(mrs[i]) < 0)
			die("odpd_dereg #%u: %s", i, odpd_errmsg());
	if (write(ready, &b, 1) != 1)
		_exit(1);
	odpd_detach(s);
	odpd_disconnect(c);
	_exit(0);
}

/* Wait for a byte from each of @n clients. */
static void wait_clients(int ready, unsigned n, const char *what)
{
	char b;

	for (unsigned i = 0; i < n; i++)
		if (read(ready, &b, 1) != 1)
			die("a client failed %s", what);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "mrs", required_argument, NULL, 'n' },
		{ 0 },
	};
	const char *sock = NULL, *pid_env = getenv("ODPD_BENCH_ODPD_PID");
	unsigned n_mrs = 100000, n_clients;
	long anon0, anon_cached, anon_flushed, anon_held, anon_end, rss0, rss1, kmrs;
	long heap0, other0, heap_cached, other_cached, heap_held, other_held;
	double t0, t1, t2, t3, per_cached, per_held;
	int ready[2], go[2];
	int o;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'n': n_mrs = parse_n(optarg, 10000000); break;
		default: die("usage: bench-mem --socket PATH [--mrs N]");
		}
	}
	if (!sock || !pid_env)
		die("needs --socket and ODPD_BENCH_ODPD_PID");
	odpd_pid = (pid_t)atoi(pid_env);
	print_command(argc, argv);
	printf("\n");
	if (pipe(ready) < 0 || pipe(go) < 0)
		die("pipe: %s", strerror(errno));
	anon0 = status_kb("RssAnon");
	rss0 = status_kb("VmRSS");
	anon_split(&heap0, &other0);
	n_clients = (n_mrs + PER_CLIENT - 1) / PER_CLIENT;
	t0 = now_us();
	for (unsigned i = 0; i < n_clients; i++) {
		unsigned n = i + 1 < n_clients ? PER_CLIENT : n_mrs - i * PER_CLIENT;
		pid_t pid = fork();

		if (pid < 0)
			die("fork: %s", strerror(errno));
		if (pid == 0)
			client(sock, n, ready[1], go[0], go[1]);
	}
	wait_clients(ready[0], n_clients, "to register and release");
	t1 = now_us();
	anon_cached = status_kb("RssAnon");
	anon_split(&heap_cached, &other_cached);
	printf("all %u MRs cached (released relaxed) after %.1f s; flushing\n", n_mrs, (t1 - t0) / 1e6);
	fflush(stdout);
	for (unsigned i = 0; i < n_clients; i++)
		if (write(go[1], "g", 1) != 1)
			die("write: %s", strerror(errno));
	wait_clients(ready[0], n_clients, "to flush");
	anon_flushed = status_kb("RssAnon");
	t2 = now_us();
	wait_clients(ready[0], n_clients, "to register and hold");
	t3 = now_us();
	anon_held = status_kb("RssAnon");
	anon_split(&heap_held, &other_held);
	rss1 = status_kb("VmRSS");
	printf("all %u MRs held after %.1f s; counting the kernel's\n", n_mrs, (t3 - t2) / 1e6);
	fflush(stdout);
	kmrs = proc_rdma_objects(odpd_pid, "mr");
	printf("the kernel's count took %.1f s; deregistering\n", (now_us() - t3) / 1e6);
	fflush(stdout);
	close(go[1]);                             /* EOF: every client deregisters */
	wait_clients(ready[0], n_clients, "to deregister");
	while (wait(NULL) > 0)
		;
	anon_end = status_kb("RssAnon");
	per_cached = (double)(anon_cached - anon0) * 1024 / n_mrs;
	per_held = (double)(anon_held - anon0) * 1024 / n_mrs;
	printf("%u pinned one-page MRs, %u clients: cached in %.1f s, held in %.1f s\n", n_mrs, n_clients,
	       (t1 - t0) / 1e6, (t3 - t2) / 1e6);
	printf("kernel MRs of odpd while held (rdma resource show mr): %ld\n", kmrs);
	printf("odpd RssAnon: %ld kB before, %ld kB with the MRs cached, %ld kB flushed, %ld kB held, "
	       "%ld kB at the end; VmRSS %ld -> %ld kB\n", anon0, anon_cached, anon_flushed, anon_held,
	       anon_end, rss0, rss1);
	printf("odpd's memory per cached MR: %.1f bytes (RssAnon growth / MRs, released relaxed: in the cache, "
	       "held by no client)   target <= 256: %s\n", per_cached, per_cached <= 256 ? "met" : "MISSED");
	printf("  of which malloc's main heap %.1f bytes, anonymous mappings (the MR slab; worker arenas: "
	       "libibverbs' MR objects) %.1f bytes\n", (double)(heap_cached - heap0) * 1024 / n_mrs,
	       (double)(other_cached - other0) * 1024 / n_mrs);
	printf("odpd's memory per held MR:   %.1f bytes (RssAnon growth over the start / MRs: the MR and its "
	       "client's reference)\n", per_held);
	printf("  of which malloc's main heap %.1f bytes, anonymous mappings (slabs, worker arenas) %.1f bytes\n",
	       (double)(heap_held - heap0) * 1024 / n_mrs, (double)(other_held - other0) * 1024 / n_mrs);
	return 0;
}
