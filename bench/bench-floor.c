/* SPDX-License-Identifier: MIT */
/*
 * bench-floor: what any request through libodpd and odpd costs, on the
 * host's own CPU rather than under qemu TCG (issue 11: a daemon hit at most
 * 1.2 x a bare SOCK_SEQPACKET round trip). No RDMA device is needed: odpd
 * answers these two requests on its event loop without one.
 *   rtt       a bare SOCK_SEQPACKET round trip (64 bytes) to an echoing
 *             child process: what any request to a daemon costs at least;
 *   refusal   odpd_join_pd() of the shared PD the connection already joined:
 *             refused at once (EALREADY) on odpd's loop;
 *   flush     odpd_flush_relaxed() with nothing relaxed: answered at once.
 * Each case runs in batches; the median, p10 and p90 of the batches'
 * per-request times, and the ratios to the round trip, are printed. A
 * daemon hit is a request of this kind plus the cache lookup (1.08-1.2 x a
 * refusal in bench/run-hit's VM runs). Never asserts on speed.
 *
 * bench-floor --socket PATH [--rounds N]; bench/run-floor starts an odpd of
 * its own on the host and runs it.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "bench-util.h"
#include "odpd.h"

const char bench_name[] = "bench-floor";

#define BATCH 2000

static struct series *run(const char *name, unsigned rounds, void (*one)(void *arg), void *arg)
{
	struct series *s = series_new(rounds, "%s", name);

	for (unsigned r = 0; r < rounds + 2; r++) {
		double t0 = now_us();

		for (unsigned i = 0; i < BATCH; i++)
			one(arg);
		if (r >= 2)                              /* warm: the first two */
			add(s, (now_us() - t0) / BATCH);
	}
	summarize(s);
	printf("  %-10s median %8.3f us  p10 %8.3f  p90 %8.3f  (batches of %u)\n", name, s->median, s->p10,
	       s->p90, BATCH);
	return s;
}

static void op_rtt(void *arg)
{
	echo_rtt(*(int *)arg);
}

static void op_refusal(void *arg)
{
	if (odpd_join_pd(arg, "bench-floor") != -1 || errno != EALREADY)
		die("odpd_join_pd again: expected EALREADY, got %s", strerror(errno));
}

static void op_flush(void *arg)
{
	if (odpd_flush_relaxed(arg) != 0)
		die("odpd_flush_relaxed: %s: %s", strerror(errno), odpd_errmsg());
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "rounds", required_argument, NULL, 'r' },
		{ NULL, 0, NULL, 0 },
	};
	const char *sock = NULL;
	unsigned rounds = 41;
	struct series *rtt, *refusal, *flush;
	struct odpd_conn *c;
	pid_t echo_pid;
	int echo_fd, o;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 's')
			sock = optarg;
		else if (o == 'r')
			rounds = parse_n(optarg, 10000);
		else
			die("usage: bench-floor --socket PATH [--rounds N]");
	}
	if (!sock)
		die("usage: bench-floor --socket PATH [--rounds N]");
	print_command(argc, argv);
	printf("\n");
	echo_fd = echo_start(&echo_pid);
	c = connect_odpd(sock);
	if (odpd_join_pd(c, "bench-floor") != 0)
		die("odpd_join_pd: %s: %s", strerror(errno), odpd_errmsg());
	rtt = run("rtt", rounds, op_rtt, &echo_fd);
	refusal = run("refusal", rounds, op_refusal, c);
	flush = run("flush", rounds, op_flush, c);
	/* Where CPUs idle between wake-ups (a VM's vCPUs halting), how long a
	 * wake-up takes swings the batches between two modes; their p10 is
	 * the cost with the CPUs awake, the steadier figure. */
	printf("ratios (this run, the host's CPU; p10: the batches with the CPUs awake):\n");
	print_ratio("odpd refusal / bare SEQPACKET round trip, medians", refusal->median, rtt->median, 1.2,
		    true);
	print_ratio("odpd refusal / bare SEQPACKET round trip, p10", refusal->p10, rtt->p10, 1.2, true);
	print_ratio("odpd flush, nothing relaxed / round trip, medians", flush->median, rtt->median, 1.2,
		    true);
	print_ratio("odpd flush, nothing relaxed / round trip, p10", flush->p10, rtt->p10, 1.2, true);
	odpd_disconnect(c);
	child_stop(echo_fd, echo_pid);
	return 0;
}
