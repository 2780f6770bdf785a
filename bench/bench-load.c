/* SPDX-License-Identifier: MIT */
/*
 * bench-load: many clients at once against one odpd (issue 10's load test,
 * a benchmark: it reports, never asserts on speed). N client processes
 * connect, attach a segment each and wait for one another; then each runs
 * M cycles of odpd_reg (pinned, local write + remote read) / odpd_verify /
 * odpd_dereg, timing every call. Meanwhile the parent samples odpd's fd
 * count; at the end it reads odpd's peak RSS (VmHWM). Prints p50/p99/max
 * latency per call, throughput, failures, peak RSS and fds.
 *
 * bench-load --socket PATH --pid ODPD_PID [--clients N] [--cycles M] [--size BYTES]
 * (bench/run-load runs it in the VM.)
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench-util.h"

const char bench_name[] = "bench-load";

enum { OP_REG, OP_VERIFY, OP_DEREG, N_OPS };
static const char *const op_names[N_OPS] = { "odpd_reg", "odpd_verify", "odpd_dereg" };

static int go_pipe[2];                     /* the parent closes [1]: all start */

struct shared {
	unsigned ready;                     /* clients connected and attached */
	unsigned long failures[N_OPS], connect_failures;
	double lat[];                       /* [client][cycle][op], µs; < 0: failed */
};

static void client(struct shared *sh, const char *sock, unsigned idx, unsigned cycles, size_t size)
{
	struct odpd_conn *c;
	struct odpd_segment *s;
	double *lat = sh->lat + (size_t)idx * cycles * N_OPS;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	c = odpd_connect(sock, NULL);
	s = c ? odpd_alloc(c, size, 0) : NULL;
	if (!s)
		__atomic_fetch_add(&sh->connect_failures, 1, __ATOMIC_RELAXED);
	else
		memset(odpd_segment_addr(s), (int)idx, size);
	__atomic_fetch_add(&sh->ready, 1, __ATOMIC_RELEASE);
	close(go_pipe[1]);
	while (read(go_pipe[0], &(char){ 0 }, 1) < 0 && errno == EINTR)   /* EOF: go */
		;
	for (unsigned i = 0; s && i < cycles; i++) {
		double t0 = now_us(), t1, t2, t3;
		struct odpd_mr *mr = odpd_reg(c, odpd_segment_addr(s), size,
					      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
		uint32_t crc;
		int v = -1, d = -1;

		t1 = now_us();
		if (mr) {
			v = odpd_verify(mr, NULL, 0, &crc);
			t2 = now_us();
			d = odpd_dereg(mr);
		} else {
			t2 = t1;
		}
		t3 = now_us();
		lat[i * N_OPS + OP_REG] = mr ? t1 - t0 : -1;
		lat[i * N_OPS + OP_VERIFY] = v == 0 ? t2 - t1 : -1;
		lat[i * N_OPS + OP_DEREG] = d == 0 ? t3 - t2 : -1;
		for (int op = 0; op < N_OPS; op++)
			if (lat[i * N_OPS + op] < 0)
				__atomic_fetch_add(&sh->failures[op], 1, __ATOMIC_RELAXED);
	}
	if (c)
		odpd_disconnect(c);
	_exit(0);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' }, { "pid", required_argument, NULL, 'p' },
		{ "clients", required_argument, NULL, 'n' }, { "cycles", required_argument, NULL, 'm' },
		{ "size", required_argument, NULL, 'z' }, { "help", no_argument, NULL, 'h' }, { 0 },
	};
	const char *sock = NULL;
	unsigned clients = 1000, cycles = 100;
	size_t size = 64 * 1024, n_lat;
	pid_t odpd = 0, *pids;
	struct shared *sh;
	double t0, t1, *sorted;
	int peak_fds = 0, o;
	unsigned exited = 0;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'p': odpd = (pid_t)atoi(optarg); break;
		case 'n': clients = parse_n(optarg, 4096); break;
		case 'm': cycles = parse_n(optarg, 100000); break;
		case 'z': size = (size_t)parse_n(optarg, 1u << 30); break;
		default:
			printf("usage: bench-load --socket PATH --pid ODPD_PID [--clients N (1000)] "
			       "[--cycles M (100)] [--size BYTES (65536)]\n");
			return o == 'h' ? 0 : 2;
		}
	}
	if (odpd <= 0 && getenv("ODPD_BENCH_ODPD_PID"))     /* bench/run passes it */
		odpd = (pid_t)atoi(getenv("ODPD_BENCH_ODPD_PID"));
	if (!sock || odpd <= 0)
		die("bench-load: --socket and --pid (or $ODPD_BENCH_ODPD_PID) are required");
	print_command(argc, argv);
	printf("\n");
	n_lat = (size_t)clients * cycles * N_OPS;
	sh = mmap(NULL, sizeof(*sh) + n_lat * sizeof(double), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pids = calloc(clients, sizeof(*pids));
	if (sh == MAP_FAILED || !pids)
		die("bench-load: out of memory");
	if (pipe(go_pipe) < 0)
		die("bench-load: pipe: %s", strerror(errno));
	for (unsigned i = 0; i < clients; i++) {
		pids[i] = fork();
		if (pids[i] < 0)
			die("bench-load: fork: %s", strerror(errno));
		if (pids[i] == 0)
			client(sh, sock, i, cycles, size);
	}
	/* A client that dies before it is ready (the OOM killer, in a small
	 * VM) must not hang the run: count those too. */
	while (__atomic_load_n(&sh->ready, __ATOMIC_ACQUIRE) + exited < clients) {
		int f = proc_fds(odpd);
		if (f > peak_fds)
			peak_fds = f;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			exited++;
		usleep(50000);
	}
	printf("%u clients ready, %lu could not connect or attach, %u died before they were ready; "
	       "odpd: %d fds, VmRSS %ld kB\n", sh->ready, sh->connect_failures, exited, proc_fds(odpd),
	       proc_status_kb(odpd, "VmRSS"));
	t0 = now_us();
	close(go_pipe[1]);                          /* every client's read() returns 0 */
	for (unsigned done = exited; done < clients;) {
		int f = proc_fds(odpd);

		if (f > peak_fds)
			peak_fds = f;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			done++;
		if (done < clients)
			usleep(100000);
	}
	t1 = now_us();
	sorted = malloc((size_t)clients * cycles * sizeof(double));
	if (!sorted)
		die("bench-load: out of memory");
	printf("\n%u clients x %u cycles of %zu bytes (register pinned, verify by RDMA READ, deregister), "
	       "all at once: %.1f s, %.0f cycles/s\n", clients, cycles, size, (t1 - t0) / 1e6,
	       (double)clients * cycles / ((t1 - t0) / 1e6));
	printf("%-12s %10s %10s %10s %10s  (latency per call, µs)\n", "call", "p50", "p99", "max", "failed");
	for (int op = 0; op < N_OPS; op++) {
		size_t n = 0;

		for (size_t i = 0; i < (size_t)clients * cycles; i++)
			if (sh->lat[i * N_OPS + (size_t)op] >= 0)
				sorted[n++] = sh->lat[i * N_OPS + (size_t)op];
		qsort(sorted, n, sizeof(double), cmp_double);
		if (n)
			printf("%-12s %10.0f %10.0f %10.0f %10lu\n", op_names[op], sorted[n / 2],
			       sorted[(n * 99) / 100], sorted[n - 1], sh->failures[op]);
		else
			printf("%-12s %10s %10s %10s %10lu\n", op_names[op], "-", "-", "-", sh->failures[op]);
	}
	printf("\nodpd: peak RSS (VmHWM) %ld kB, RSS now %ld kB, peak fds %d (sampled every 100 ms), "
	       "fds now %d\n", proc_status_kb(odpd, "VmHWM"), proc_status_kb(odpd, "VmRSS"), peak_fds, proc_fds(odpd));
	free(sorted);
	free(pids);
	return exited || sh->connect_failures || sh->failures[OP_REG] || sh->failures[OP_VERIFY] ||
	       sh->failures[OP_DEREG] ? 1 : 0;
}
