/* SPDX-License-Identifier: MIT */
/*
 * bench-mem: odpd's own memory per cached MR (issue 11: at most 256 bytes,
 * measured over 100,000 MRs). Client processes (one per 50,000 MRs, the
 * per-connection limit being 65,536) each pre-fault a segment of two pages
 * per MR and register every other page as a pinned MR of its own (MRs that
 * do not touch: odpd's coverage maps cannot merge them), all misses, and
 * hold them; meanwhile the parent reads odpd's RssAnon (/proc/PID/status:
 * its heap, libibverbs' and the provider's objects, not the segments, which
 * are shmem) before, with every MR held, and after they are deregistered.
 * Kernel memory (the driver's MR objects and page lists) is not odpd's RSS;
 * the run prints the kernel's MR count (rdma resource show mr) beside it.
 * A benchmark: it reports, never asserts.
 *
 * bench-mem --socket PATH [--mrs N]   (ODPD_BENCH_ODPD_PID: odpd)
 * bench/run-mem runs it in the VM.
 */
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <signal.h>
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

/* A field of /proc/PID/status, in kB. */
static long status_kb(const char *field)
{
	char path[64], line[256];
	size_t n = strlen(field);
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)odpd_pid);
	f = fopen(path, "re");
	if (!f)
		die("%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':')
			kb = strtol(line + n + 1, NULL, 10);
	fclose(f);
	if (kb < 0)
		die("no %s in %s", field, path);
	return kb;
}

/* MRs the kernel holds for odpd (rdma -j resource show mr), -1 without rdma. */
static long kernel_mrs(void)
{
	char cmd[128], buf[64];
	long n = -1;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "rdma -j resource show mr 2>/dev/null | grep -o '\"pid\":%d[,}]' | wc -l",
		 (int)odpd_pid);
	p = popen(cmd, "r");
	if (p && fgets(buf, sizeof(buf), p))
		n = strtol(buf, NULL, 10);
	if (p)
		pclose(p);
	return n;
}

/* Register @n one-page MRs, report through @ready, wait for EOF on @go
 * (whose write end @go_w it closes: the parent's close is the signal),
 * deregister. */
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
	for (unsigned i = 0, step = n / 10 ? n / 10 : 1; i < n; i++) {
		static double t0;

		if (i % step == 0) {                 /* progress, and whether a registration slows down */
			double t = now_us();

			if (i)
				printf("  client %d: %u MRs held, the last %u took %.0f us each\n", (int)getpid(),
				       i, step, (t - t0) / step);
			fflush(stdout);
			t0 = t;
		}
		if (!(mrs[i] = odpd_reg(c, p + (size_t)i * 2 * pg, pg, IBV_ACCESS_LOCAL_WRITE)))
			die("odpd_reg #%u: %s", i, odpd_errmsg());
	}
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

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "mrs", required_argument, NULL, 'n' },
		{ 0 },
	};
	const char *sock = NULL, *pid_env = getenv("ODPD_BENCH_ODPD_PID");
	unsigned n_mrs = 100000, n_clients;
	long anon0, anon1, anon2, rss0, rss1, kmrs;
	int ready[2], go[2];
	double t0, t1, t2;
	char b = 0;
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
	for (unsigned i = 0; i < n_clients; i++)
		if (read(ready[0], &b, 1) != 1)
			die("a client failed before it held its MRs");
	t1 = now_us();
	anon1 = status_kb("RssAnon");
	rss1 = status_kb("VmRSS");
	printf("all %u MRs held after %.1f s; counting the kernel's\n", n_mrs, (t1 - t0) / 1e6);
	fflush(stdout);
	kmrs = kernel_mrs();
	printf("the kernel's count took %.1f s; deregistering\n", (now_us() - t1) / 1e6);
	fflush(stdout);
	t1 = now_us();
	close(go[1]);                             /* EOF: every client deregisters */
	for (unsigned i = 0; i < n_clients; i++)
		if (read(ready[0], &b, 1) != 1)
			die("a client failed to deregister");
	t2 = now_us();
	while (wait(NULL) > 0)
		;
	anon2 = status_kb("RssAnon");
	printf("%u pinned one-page MRs held by %u clients (registered in %.1f s, deregistered in %.1f s)\n",
	       n_mrs, n_clients, (t1 - t0) / 1e6, (t2 - t1) / 1e6);
	printf("kernel MRs of odpd while held (rdma resource show mr): %ld\n", kmrs);
	printf("odpd RssAnon: %ld kB before, %ld kB holding, %ld kB after; VmRSS %ld -> %ld kB\n", anon0,
	       anon1, anon2, rss0, rss1);
	printf("odpd's memory per cached MR: %.1f bytes (RssAnon growth / MRs)   target <= 256: %s\n",
	       (double)(anon1 - anon0) * 1024 / n_mrs, (anon1 - anon0) * 1024.0 / n_mrs <= 256 ? "met" : "MISSED");
	return 0;
}
