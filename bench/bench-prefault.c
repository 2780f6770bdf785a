/* SPDX-License-Identifier: MIT */
/*
 * bench-prefault: what faulting pages in costs a pinned registration, and
 * what the pre-fault policies save (issue 11, part 3), side by side in one
 * process against a running odpd. Per size, each case times its
 * registration and its deregistration apart:
 *   verbs-fresh      ibv_reg_mr of pages never touched (the pin faults them)
 *   verbs-resident   ibv_reg_mr of pages written before
 *   odpd-miss        odpd_reg of a new segment's untouched range: libodpd
 *                    faults it in (parallel parts of 8 MiB or more) and odpd pins
 *   odpd-prefaulted  odpd_reg of a segment made with ODPD_ALLOC_POPULATE
 *                    (policy "on attach": the faulting is off the clock)
 *   odpd-again       odpd_reg of a pre-faulted range odpd registered and
 *                    deregistered before (its own mapping of the pages is
 *                    populated already): what the registration itself costs
 *   odpd-never       odpd_reg of a segment made with ODPD_ALLOC_NO_POPULATE:
 *                    odpd's worker faults the pages (policy "never")
 *   odpd-relaxed     odpd_dereg_relaxed of a prefaulted miss (the release)
 *   populate-1       madvise(MADV_POPULATE_WRITE) of a fresh range, one call
 *   populate-par     odpd_populate of a fresh segment (policy "on hint":
 *                    parallel parts on up to 8 threads, then odpd maps its
 *                    own view of the range: one request)
 * and, from 64 MiB, how a large registration is best served on this device:
 *   bulk-one         one ibv_reg_mr of the whole range (resident pages)
 *   bulk-4-serial    4 MRs of a quarter each, one after another
 *   bulk-4-parallel  4 MRs of a quarter each, on 2 threads at once
 * libodpd's cache is off (ODPD_CACHE=0) and every registration is of a new
 * segment: each is a miss. Prints issue 11's ratios (met or not), writes
 * a CSV. A benchmark: it reports, never asserts on speed.
 *
 * bench-prefault --socket PATH [--sizes 1048576,...] [--rounds N] [--out DIR]
 * bench/run-prefault runs it in the rxe VM and plots the CSV.
 */
#include <errno.h>
#include <getopt.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench-util.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

const char bench_name[] = "bench-prefault";

#define LW IBV_ACCESS_LOCAL_WRITE
#define MAX_SIZES 8

enum { REG, DEREG };

static struct verbs v;
static struct odpd_conn *conn;
static FILE *csv;

/* A case's registration and deregistration times at one size. */
struct pair {
	struct series *s[2];
};

static void pair_init(struct pair *p, const char *name, unsigned n)
{
	p->s[REG] = series_new(n, "%s", name);
	p->s[DEREG] = series_new(n, "%s", name);
}

static void pair_report(struct pair *p, size_t size)
{
	for (int op = REG; op <= DEREG; op++) {
		struct series *s = p->s[op];

		if (!s->n)
			continue;
		summarize(s);
		printf("  %-16s %-5s %10zu B  median %11.1f us  p10 %11.1f  p90 %11.1f\n", s->name,
		       op == REG ? "reg" : "dereg", size, s->median, s->p10, s->p90);
		fprintf(csv, "%s %s %zu %.3f %.3f %.3f\n", s->name, op == REG ? "reg" : "dereg", size,
			s->median, s->p10, s->p90);
	}
}

static void pair_free(struct pair *p)
{
	for (int op = REG; op <= DEREG; op++) {
		free(p->s[op]->us);
		free(p->s[op]);
	}
}

/* A memfd mapping of @len bytes, never touched (or written, @touch). */
static void *buffer(size_t len, bool touch)
{
	return touch ? memfd_buffer(len) : memfd_buffer_fresh(len);
}

static void verbs_case(struct pair *p, size_t len, bool fresh)
{
	void *buf = buffer(len, !fresh);
	double t[3];

	verbs_reg_dereg(&v, buf, len, LW, t);
	add(p->s[REG], t[1] - t[0]);
	add(p->s[DEREG], t[2] - t[1]);
	munmap(buf, len);
}

/* odpd_reg of a new segment made with @alloc_flags (registered and
 * deregistered once first when @again); odpd_dereg, or odpd_dereg_relaxed
 * timed instead when @relaxed. */
static void odpd_case(struct pair *p, size_t len, unsigned alloc_flags, bool relaxed, bool again)
{
	struct odpd_segment *seg = odpd_alloc(conn, len, alloc_flags);
	struct odpd_mr *mr;
	double t0, t1, t2;

	if (!seg)
		die("odpd_alloc %zu: %s", len, odpd_errmsg());
	if (again && (!(mr = odpd_reg(conn, odpd_segment_addr(seg), len, LW)) || odpd_dereg(mr) < 0))
		die("odpd_reg/odpd_dereg %zu: %s", len, odpd_errmsg());
	t0 = now_us();
	mr = odpd_reg(conn, odpd_segment_addr(seg), len, LW);
	t1 = now_us();
	if (!mr)
		die("odpd_reg %zu: %s", len, odpd_errmsg());
	if ((relaxed ? odpd_dereg_relaxed(mr) : odpd_dereg(mr)) < 0)
		die("odpd_dereg: %s", odpd_errmsg());
	t2 = now_us();
	if (relaxed && odpd_flush_relaxed(conn) < 0)
		die("odpd_flush_relaxed: %s", odpd_errmsg());
	if (!relaxed)
		add(p->s[REG], t1 - t0);
	add(p->s[DEREG], t2 - t1);
	if (odpd_detach(seg) < 0)
		die("odpd_detach: %s", odpd_errmsg());
}

static void populate_case(struct pair *p, size_t len, bool parallel)
{
	double t0, t1;

	if (parallel) {
		struct odpd_segment *seg = odpd_alloc(conn, len, 0);

		if (!seg)
			die("odpd_alloc %zu: %s", len, odpd_errmsg());
		t0 = now_us();
		if (odpd_populate(seg, odpd_segment_addr(seg), len) < 0)
			die("odpd_populate: %s", odpd_errmsg());
		t1 = now_us();
		odpd_detach(seg);
	} else {
		void *buf = buffer(len, false);

		t0 = now_us();
		if (madvise(buf, len, MADV_POPULATE_WRITE) < 0)
			die("madvise(MADV_POPULATE_WRITE): %s", strerror(errno));
		t1 = now_us();
		munmap(buf, len);
	}
	add(p->s[REG], t1 - t0);
}

/* ---------------------------------------------------------------- bulk */

struct quarter {
	uint8_t *addr;
	size_t len;
	struct ibv_mr *mr[2];
	bool dereg;
};

static void *quarters_run(void *arg)
{
	struct quarter *q = arg;

	for (int i = 0; i < 2; i++) {
		if (q->dereg) {
			if (ibv_dereg_mr(q->mr[i]))
				die("ibv_dereg_mr: %s", strerror(errno));
		} else if (!(q->mr[i] = ibv_reg_mr(v.pd, q->addr + i * q->len, q->len, LW))) {
			die("ibv_reg_mr %zu: %s", q->len, strerror(errno));
		}
	}
	return NULL;
}

/* @len of resident pages as 1 MR, or 4 of a quarter each, serially or on 2 threads. */
static void bulk_case(struct pair *p, uint8_t *buf, size_t len, int how)
{
	struct quarter q[2] = { { buf, len / 4, { 0 }, false }, { buf + len / 2, len / 4, { 0 }, false } };
	struct ibv_mr *one = NULL;
	pthread_t th;
	double t[3];

	for (int op = REG; op <= DEREG; op++) {
		t[op] = now_us();
		q[0].dereg = q[1].dereg = op == DEREG;
		if (how == 0 && op == REG && !(one = ibv_reg_mr(v.pd, buf, len, LW)))
			die("ibv_reg_mr %zu: %s", len, strerror(errno));
		if (how == 0 && op == DEREG && ibv_dereg_mr(one))
			die("ibv_dereg_mr: %s", strerror(errno));
		if (how == 1) {
			quarters_run(&q[0]);
			quarters_run(&q[1]);
		}
		if (how == 2) {
			if (pthread_create(&th, NULL, quarters_run, &q[1]))
				die("pthread_create failed");
			quarters_run(&q[0]);
			pthread_join(th, NULL);
		}
	}
	t[2] = now_us();
	add(p->s[REG], t[1] - t[0]);
	add(p->s[DEREG], t[2] - t[1]);
}

/* ---------------------------------------------------------------- main */

enum { C_VFRESH, C_VRES, C_MISS, C_PRE, C_AGAIN, C_NEVER, C_RELAXED, C_POP1, C_POPN, C_BULK1, C_BULK4S, C_BULK4P, N_C };
static const char *const case_names[N_C] = {
	"verbs-fresh", "verbs-resident", "odpd-miss", "odpd-prefaulted", "odpd-again", "odpd-never", "odpd-relaxed",
	"populate-1", "populate-par", "bulk-one", "bulk-4-serial", "bulk-4-parallel",
};

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "sizes", required_argument, NULL, 'z' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "out", required_argument, NULL, 'o' },
		{ 0 },
	};
	const char *sock = NULL, *out = "build/bench-results/prefault";
	size_t sizes[MAX_SIZES] = { 4096, 65536, 1 << 20, 16 << 20, 256 << 20 };
	unsigned n_sizes = 5, max_rounds = 21;
	const char *threads = getenv("ODPD_POPULATE_THREADS");
	int o;

	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (o) {
		case 's': sock = optarg; break;
		case 'r': max_rounds = parse_n(optarg, 10000); break;
		case 'o': out = optarg; break;
		case 'z': n_sizes = parse_sizes(optarg, sizes, MAX_SIZES, 1024 * MiB); break;
		default:
			die("usage: bench-prefault --socket PATH [--sizes N,...] [--rounds N] [--out DIR]");
		}
	}
	if (!sock)
		die("--socket is required");
	print_command(argc, argv);
	printf("\nODPD_POPULATE_THREADS=%s, CPUs here %ld\n", threads ? threads : "(unset: the CPUs, at most 8)",
	       sysconf(_SC_NPROCESSORS_ONLN));
	verbs_open(&v);
	setenv("ODPD_CACHE", "0", 1);             /* every registration a miss */
	conn = connect_odpd(sock);
	mkdir_p(out);
	csv = csv_open(out, "prefault.csv", "case op size median_us p10_us p90_us");

	for (unsigned i = 0; i < n_sizes; i++) {
		size_t len = sizes[i];
		/* fewer rounds for large sizes: a fresh 256 MiB takes a while under TCG */
		unsigned rounds = len >= (64u << 20) ? 5 : len >= (16u << 20) ? 9 : max_rounds;
		struct pair p[N_C];
		uint8_t *bulk = NULL;

		rounds = rounds < max_rounds ? rounds : max_rounds;
		for (int k = 0; k < N_C; k++)
			pair_init(&p[k], case_names[k], rounds);
		if (len >= (64u << 20))
			bulk = buffer(len, true);
		printf("size %zu bytes (%u rounds):\n", len, rounds);
		/* the cases interleaved round by round: drift hits them alike */
		for (unsigned r = 0; r < rounds; r++) {
			verbs_case(&p[C_VFRESH], len, true);
			verbs_case(&p[C_VRES], len, false);
			odpd_case(&p[C_MISS], len, 0, false, false);
			odpd_case(&p[C_PRE], len, ODPD_ALLOC_POPULATE, false, false);
			odpd_case(&p[C_AGAIN], len, ODPD_ALLOC_POPULATE, false, true);
			odpd_case(&p[C_NEVER], len, ODPD_ALLOC_NO_POPULATE, false, false);
			odpd_case(&p[C_RELAXED], len, ODPD_ALLOC_POPULATE, true, false);
			populate_case(&p[C_POP1], len, false);
			populate_case(&p[C_POPN], len, true);
			if (bulk)
				for (int how = 0; how < 3; how++)
					bulk_case(&p[C_BULK1 + how], bulk, len, how);
		}
		for (int k = 0; k < N_C; k++)
			pair_report(&p[k], len);
		printf("ratios at %zu bytes (medians, this run):\n", len);
		print_ratio("pre-faulted miss / ibv_reg_mr of fresh pages", p[C_PRE].s[REG]->median,
		      p[C_VFRESH].s[REG]->median, len >= (1u << 20) ? 0.3 : 0, true);
		print_ratio("miss (libodpd faults first) / ibv_reg_mr of fresh pages", p[C_MISS].s[REG]->median,
		      p[C_VFRESH].s[REG]->median, 0, true);
		print_ratio("miss, policy never (odpd faults) / ibv_reg_mr of fresh pages",
		      p[C_NEVER].s[REG]->median, p[C_VFRESH].s[REG]->median, 0, true);
		print_ratio("pre-faulted miss / ibv_reg_mr of resident pages", p[C_PRE].s[REG]->median,
		      p[C_VRES].s[REG]->median, 0, true);
		print_ratio("miss over pages odpd mapped before / ibv_reg_mr of resident pages",
		      p[C_AGAIN].s[REG]->median, p[C_VRES].s[REG]->median, 0, true);
		print_ratio("odpd_dereg / odpd_reg (pre-faulted miss)", p[C_PRE].s[DEREG]->median,
		      p[C_PRE].s[REG]->median, 1.0, true);
		print_ratio("odpd_dereg / odpd_reg (miss)", p[C_MISS].s[DEREG]->median, p[C_MISS].s[REG]->median,
		      1.0, true);
		print_ratio("odpd_dereg_relaxed / odpd_reg (pre-faulted miss)", p[C_RELAXED].s[DEREG]->median,
		      p[C_PRE].s[REG]->median, 1.0, true);
		print_ratio("ibv_dereg_mr / ibv_reg_mr (resident)", p[C_VRES].s[DEREG]->median,
		      p[C_VRES].s[REG]->median, 0, true);
		print_ratio("odpd_populate (parallel, + odpd maps its view) / one MADV_POPULATE_WRITE",
		      p[C_POPN].s[REG]->median,
		      p[C_POP1].s[REG]->median, 0, true);
		if (bulk) {
			print_ratio("4 MRs one after another / 1 MR (reg)", p[C_BULK4S].s[REG]->median,
			      p[C_BULK1].s[REG]->median, 0, true);
			print_ratio("4 MRs on 2 threads / 1 MR (reg)", p[C_BULK4P].s[REG]->median,
			      p[C_BULK1].s[REG]->median, 0, true);
			print_ratio("4 MRs on 2 threads / 1 MR (dereg)", p[C_BULK4P].s[DEREG]->median,
			      p[C_BULK1].s[DEREG]->median, 0, true);
			munmap(bulk, len);
		}
		for (int k = 0; k < N_C; k++)
			pair_free(&p[k]);
	}
	csv_close(csv, out, "prefault.csv");
	odpd_disconnect(conn);
	verbs_close(&v);
	printf("bench-prefault: csv in %s/prefault.csv\n", out);
	return 0;
}
