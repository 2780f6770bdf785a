/* SPDX-License-Identifier: MIT */
/*
 * bench-odp: what on-demand paging (ODP) MRs cost and save next to pinned
 * MRs, all registered through a running odpd, side by side in one run.
 * Prints medians (µs) and ratios and writes CSV files; exits non-zero only on
 * errors (and on a read-back whose CRC differs from the bytes written), never
 * on speed. bench/run-odp runs it in the rxe VM (testbed profile: advise_mr
 * needs rdma-core >= 58) and plots the CSV files with gnuplot.
 *
 * Fresh pages: before every sample the bench punches the whole segment
 * (fallocate FALLOC_FL_PUNCH_HOLE, not timed), so no page of the range is
 * in memory, in this process's page tables or in odpd's.
 *
 * 1. Registration (4 KiB to 256 MiB; IBV_ACCESS_LOCAL_WRITE): per size one
 *    odpd_alloc() segment; each iteration runs every series once, in an
 *    order that rotates per iteration; a sample is odpd_reg_attr() and
 *    odpd_dereg(), timed separately:
 *     - pinned:       a pinned MR (libodpd faults the punched range in first,
 *                     then odpd's ibv_reg_mr pins it);
 *     - odp:          IBV_ACCESS_ON_DEMAND: nothing is faulted in or pinned;
 *     - odp-prefetch: ODP with ODPD_REG_PREFETCH: odpd maps every page
 *                     (ibv_advise_mr PREFETCH_WRITE, FLUSH) before it
 *                     answers (only where the device has advise_mr, and up
 *                     to --prefetch-absent-max-mib, 16 MiB: prefetching
 *                     pages that do not exist yet grows faster than
 *                     linearly on rxe).
 *    Ratios odp / pinned and odp-prefetch / pinned.
 * 2. First RDMA READ (64 KiB to 64 MiB; LOCAL_WRITE | REMOTE_READ): the
 *    segment is punched, then written by this process (so its pages are in
 *    the file and in our page tables, not in odpd's, as a buffer an
 *    application just filled), then a fresh MR is registered and read back
 *    with odpd_verify() (odpd RDMA READs the whole MR through its rkey over a
 *    loopback RC QP pair, in chunks of its bounce buffer), timed:
 *     - odp-cold:     ODP MR, verify (the first READ faults every page in
 *                     through the HCA: rxe's ODP page fault), then verify
 *                     again (warm: every page mapped; the cost of the READ
 *                     itself);
 *     - odp-prefetch: ODP MR, odpd_advise_mr(PREFETCH_WRITE, FLUSH) of the
 *                     whole MR, then verify;
 *     - pinned:       pinned MR, verify.
 *    Every verify's CRC is checked against zlib's crc32() of the bytes
 *    written. Ratios: first READ cold / warm; prefetch + READ / READ cold;
 *    READ after prefetch / READ cold; registration + first READ, ODP / pinned.
 * 3. Prefetch cost (64 KiB to 256 MiB; LOCAL_WRITE): a fresh ODP MR, then
 *    odpd_advise_mr(PREFETCH_WRITE, FLUSH) of all of it, timed, with the
 *    pages written by this process before (written: odpd's page tables only
 *    are missing) or not at all (absent: the prefetch allocates the pages;
 *    up to --prefetch-absent-max-mib); µs per MiB, next to the pinned
 *    registration of part 1 per MiB.
 * Without advise_mr on the device the prefetch series are skipped (CSV
 * fields "nan"). Sizes up to 16 MiB run one warm-up iteration first, not
 * counted; --max-mib, --parts and --verbose are for looking closer.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "bench-util.h"
#include "odpd.h"

/* Warm-up iterations (not counted) of sizes up to WARMUP_MAX; the bigger
 * sizes follow a warmed-up daemon and each of their samples costs seconds. */
#define WARMUP 1u
#define WARMUP_MAX (16 * MiB)
#define FILL 0x5a

const char bench_name[] = "bench-odp";

static const char *out_dir;
static struct odpd_conn *conn;
static bool have_advise;               /* the device's provider has ibv_advise_mr */
static unsigned crc_errors;
static bool verbose;                   /* --verbose: every sample on stderr */
static size_t max_size = SIZE_MAX;     /* --max-mib */
static bool run_part[4] = { false, true, true, true };   /* --parts */

/* ---------------------------------------------------------------- sizes */

#define NSIZES 7
static const size_t sizes[NSIZES] = { 4 * KiB, 64 * KiB, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB };
static const char *const size_names[NSIZES] = { "4 KiB", "64 KiB", "1 MiB", "4 MiB", "16 MiB", "64 MiB",
						"256 MiB" };

/* Which sizes each part measures (part 2 reads the whole MR back, twice for
 * odp-cold: 256 MiB would dominate the run). */
static const bool in_part1[NSIZES] = { true, true, true, true, true, true, true };
static const bool in_part2[NSIZES] = { false, true, true, false, true, true, false };
static const bool in_part3[NSIZES] = { false, true, true, true, true, true, true };

/* Iterations by size: --iters up to 1 MiB, --mid-iters 4 and 16 MiB, --big-iters beyond. */
static unsigned iters_small = 60, iters_mid = 8, iters_big = 3;

/* Prefetching pages that do not exist yet (odp-prefetch of part 1, absent
 * of part 3) up to this size only: on rxe it grows faster than linearly
 * (a trial: 1.2 s at 16 MiB, 20-24 s at 64 MiB). --prefetch-absent-max-mib. */
static size_t absent_max = 16 * MiB;

static unsigned warmup_of(size_t len)
{
	return len <= WARMUP_MAX ? WARMUP : 0;
}

static bool in_part(int part, int i)
{
	static const bool *const parts[4] = { NULL, in_part1, in_part2, in_part3 };

	return run_part[part] && sizes[i] <= max_size && parts[part][i];
}

static unsigned iters_of(size_t len)
{
	return len <= MiB ? iters_small : len <= 16 * MiB ? iters_mid : iters_big;
}

/* ---------------------------------------------------------------- helpers */

static struct odpd_segment *fresh_segment(size_t len)
{
	struct odpd_segment *s = odpd_alloc(conn, len, 0);

	if (!s)
		die("odpd_alloc %zu: %s", len, odpd_errmsg());
	return s;
}

/* Drop every page of @s: from the file, so from every mapping (ours, odpd's). */
static void punch(struct odpd_segment *s)
{
	if (fallocate(odpd_segment_fd(s), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
		      (off_t)odpd_segment_length(s)) < 0)
		die("fallocate PUNCH_HOLE %zu: %s", odpd_segment_length(s), strerror(errno));
}

/* Punched, then every page written by this process (the file has the pages;
 * odpd's page tables do not). */
static void punch_fill(struct odpd_segment *s, size_t len)
{
	punch(s);
	memset(odpd_segment_addr(s), FILL, len);
}

static struct odpd_mr *reg(struct odpd_segment *s, size_t len, unsigned access, uint32_t flags)
{
	struct odpd_reg_attr a = {
		.comp_mask = ODPD_REG_ATTR_ACCESS | ODPD_REG_ATTR_FLAGS,
		.access = access,
		.flags = flags,
	};
	struct odpd_mr *mr = odpd_reg_attr(conn, odpd_segment_addr(s), len, &a);

	if (!mr)
		die("odpd_reg_attr %zu (access %#x, flags %#x): %s", len, access, (unsigned)flags,
		    odpd_errmsg());
	if (mr->cache_hit)
		die("odpd_reg_attr %zu (access %#x): a cache hit, but every MR of this bench is fresh", len,
		    access);
	return mr;
}

static void dereg(struct odpd_mr *mr)
{
	if (odpd_dereg(mr) < 0)
		die("odpd_dereg: %s", odpd_errmsg());
}

static void advise_all(struct odpd_mr *mr)
{
	struct ibv_sge sge = { .addr = mr->iova, .length = (uint32_t)mr->length, .lkey = mr->lkey };

	if (mr->length > UINT32_MAX)
		die("advise: %zu bytes do not fit one ibv_sge", mr->length);
	if (odpd_advise_mr(conn, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1) < 0)
		die("odpd_advise_mr PREFETCH_WRITE FLUSH %zu: %s", mr->length, odpd_errmsg());
}

/* odpd_verify of the whole MR, its CRC checked against @want; returns µs. */
/*
 * odpd_verify of the whole MR, its CRC checked against @want; returns µs, or
 * NaN when the read-back failed with ETIMEDOUT (no completion within 10 s)
 * or EIO (a failed completion): counted in *@failures and printed, not
 * fatal (on rxe a READ of a fresh ODP MR sometimes never completes: the
 * bench measures the others and says how many).
 */
static double verify(struct odpd_mr *mr, uint32_t want, const char *what, unsigned *failures)
{
	uint32_t crc = 0;
	double t0 = now_us(), t;

	if (odpd_verify(mr, NULL, 0, &crc) < 0) {
		if (errno != ETIMEDOUT && errno != EIO)
			die("odpd_verify %s %zu: %s", what, mr->length, odpd_errmsg());
		printf("    read-back failed: %s, %zu bytes, after %.1f s: %s (%s); sample dropped\n", what,
		       mr->length, (now_us() - t0) / 1e6, odpd_errmsg(), strerrorname_np(errno));
		fflush(stdout);
		(*failures)++;
		return NAN;
	}
	t = now_us() - t0;
	if (crc != want) {
		fprintf(stderr, "bench-odp: %s, %zu bytes: the HCA read CRC %08x, the bytes written have %08x\n",
			what, mr->length, crc, want);
		crc_errors++;
	}
	return t;
}

static const char *fmt_ratio(double v, char buf[static 16])
{
	if (isnan(v))
		snprintf(buf, 16, "-");
	else
		snprintf(buf, 16, "%.3f", v);
	return buf;
}

/* The median of @s, NaN when it has no samples (a series skipped). */
static double med(struct series *s)
{
	if (!s->n)
		return NAN;
	summarize(s);
	return s->median;
}

/* ---------------------------------------------------------------- 1. registration */

enum { R_PINNED, R_ODP, R_ODP_PREFETCH, NREG };
static const char *const reg_key[NREG] = { "pinned", "odp", "odp-prefetch" };
static const char *const reg_what[NREG] = {
	"odpd_reg (pinned) + odpd_dereg",
	"odpd_reg ON_DEMAND + odpd_dereg",
	"odpd_reg ON_DEMAND, REG_PREFETCH + dereg",
};

struct regpt {
	struct series *pair, *reg, *dereg;
};

static struct regpt regpts[NSIZES][NREG];

static void reg_sample(struct odpd_segment *seg, size_t len, int which, struct regpt *pt, bool count)
{
	unsigned access = IBV_ACCESS_LOCAL_WRITE | (which == R_PINNED ? 0 : IBV_ACCESS_ON_DEMAND);
	uint32_t flags = which == R_ODP_PREFETCH ? ODPD_REG_PREFETCH : 0;
	struct odpd_mr *mr;
	double t0, t1, t2;

	punch(seg);
	t0 = now_us();
	mr = reg(seg, len, access, flags);
	t1 = now_us();
	dereg(mr);
	t2 = now_us();
	if (verbose)
		fprintf(stderr, "    reg %zu %s%s: reg %.1f dereg %.1f us\n", len, reg_key[which], count ? "" : " (warm-up)",
			t1 - t0, t2 - t1);
	if (!count)
		return;
	add(pt->pair, t2 - t0);
	add(pt->reg, t1 - t0);
	add(pt->dereg, t2 - t1);
}

static void run_reg(void)
{
	for (int i = 0; i < NSIZES; i++) {
		struct odpd_segment *seg;
		unsigned n = iters_of(sizes[i]), w = warmup_of(sizes[i]);
		double t0 = now_us();
		int done = 0;

		for (int s = 0; s < NREG; s++) {
			regpts[i][s].pair = series_new(n, "%s %s", reg_key[s], size_names[i]);
			regpts[i][s].reg = series_new(n, "%s reg %s", reg_key[s], size_names[i]);
			regpts[i][s].dereg = series_new(n, "%s dereg %s", reg_key[s], size_names[i]);
		}
		if (!in_part(1, i))
			continue;
		seg = fresh_segment(sizes[i]);
		for (unsigned k = 0; k < n + w; k++)
			for (int j = 0; j < NREG; j++) {
				int s = (int)((j + k) % NREG);

				if (s == R_ODP_PREFETCH && (!have_advise || sizes[i] > absent_max))
					continue;
				reg_sample(seg, sizes[i], s, &regpts[i][s], k >= w);
				done++;
			}
		if (odpd_detach(seg) < 0)
			die("odpd_detach: %s", odpd_errmsg());
		printf("  %-8s %3u iterations, %2d samples (+%u warm-up iteration), %.1f s\n", size_names[i], n, done, w,
		       (now_us() - t0) / 1e6);
		fflush(stdout);
	}
}

static void report_reg(void)
{
	char b1[16], b2[16], b3[16], b4[16], b5[16];
	FILE *f;

	printf("\n%-8s %-13s %-40s %4s %11s %11s %11s %11s %11s %9s\n", "size", "series", "what", "n",
	       "median_us", "p10_us", "p90_us", "reg_us", "dereg_us", "/pinned");
	for (int i = 0; i < NSIZES; i++) {
		if (!in_part(1, i))
			continue;
		for (int s = 0; s < NREG; s++) {
			struct regpt *p = &regpts[i][s];

			if (!p->pair->n)
				continue;
			med(p->pair);
			printf("%-8s %-13s %-40s %4u %11.1f %11.1f %11.1f %11.1f %11.1f %9.3f\n", size_names[i],
			       reg_key[s], reg_what[s], p->pair->n, p->pair->median, p->pair->p10, p->pair->p90,
			       med(p->reg), med(p->dereg), p->pair->median / med(regpts[i][R_PINNED].pair));
		}
		putchar('\n');
	}

	printf("ratios of medians, ODP / pinned (fresh pages; < 1: ODP cheaper):\n");
	printf("%-8s %12s %12s %12s   %17s %17s\n", "size", "reg+dereg", "reg", "dereg", "odp-prefetch reg",
	       "odp-pf reg+dereg");
	f = csv_open(out_dir, "odp-reg-ratios.csv", NULL);
	fprintf(f, "size_bytes,size,odp_pinned_pair,odp_pinned_reg,odp_pinned_dereg,odp_prefetch_pinned_reg,"
		   "odp_prefetch_pinned_pair\n");
	for (int i = 0; i < NSIZES; i++) {
		struct regpt *p = regpts[i], *o = &p[R_ODP], *op = &p[R_ODP_PREFETCH];
		double rp = med(p[R_PINNED].pair), rr = med(p[R_PINNED].reg), rd = med(p[R_PINNED].dereg);
		double a = med(o->pair) / rp, b = med(o->reg) / rr, c = med(o->dereg) / rd;
		double d = med(op->reg) / rr, e = med(op->pair) / rp;

		if (!in_part(1, i))
			continue;
		printf("%-8s %12s %12s %12s   %17s %17s\n", size_names[i], fmt_ratio(a, b1), fmt_ratio(b, b2),
		       fmt_ratio(c, b3), fmt_ratio(d, b4), fmt_ratio(e, b5));
		fprintf(f, "%zu,%s,%.6f,%.6f,%.6f,%.6f,%.6f\n", sizes[i], size_names[i], a, b, c, d, e);
	}
	csv_close(f, out_dir, "odp-reg-ratios.csv");

	for (int s = 0; s < NREG; s++) {
		char name[64];

		snprintf(name, sizeof(name), "odp-reg-%s.csv", reg_key[s]);
		f = csv_open(out_dir, name, NULL);
		fprintf(f, "size_bytes,size,n,median_us,p10_us,p90_us,reg_median_us,dereg_median_us,"
			   "ratio_to_pinned\n");
		for (int i = 0; i < NSIZES; i++) {
			struct regpt *p = &regpts[i][s];

			if (!in_part(1, i))
				continue;
			if (!p->pair->n) {
				fprintf(f, "%zu,%s,0,nan,nan,nan,nan,nan,nan\n", sizes[i], size_names[i]);
				continue;
			}
			fprintf(f, "%zu,%s,%u,%.2f,%.2f,%.2f,%.2f,%.2f,%.4f\n", sizes[i], size_names[i], p->pair->n,
				med(p->pair), p->pair->p10, p->pair->p90, med(p->reg), med(p->dereg),
				med(p->pair) / med(regpts[i][R_PINNED].pair));
		}
		csv_close(f, out_dir, name);
	}
}

/* ---------------------------------------------------------------- 2. first RDMA READ */

enum { F_COLD, F_PREFETCH, F_PINNED, NFIRST };
static const char *const first_key[NFIRST] = { "odp-cold", "odp-prefetch", "pinned" };

struct firstpt {
	struct series *reg, *read1, *read2, *advise, *dereg;
	unsigned reads;                    /* read-backs tried, warm-up included */
	unsigned failures;                 /* of them failed (ETIMEDOUT, EIO): samples dropped */
};

static unsigned total_read_failures;

static struct firstpt firstpts[NSIZES][NFIRST];

static void first_sample(struct odpd_segment *seg, size_t len, uint32_t want, int which, struct firstpt *pt,
			 bool count)
{
	unsigned access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			  (which == F_PINNED ? 0 : IBV_ACCESS_ON_DEMAND);
	double t0, treg, tadv = NAN, r1, r2 = NAN, tder;
	struct odpd_mr *mr;

	punch_fill(seg, len);
	t0 = now_us();
	mr = reg(seg, len, access, 0);
	treg = now_us() - t0;
	if (which == F_PREFETCH) {
		t0 = now_us();
		advise_all(mr);
		tadv = now_us() - t0;
	}
	pt->reads++;
	r1 = verify(mr, want, first_key[which], &pt->failures);
	if (which == F_COLD && !isnan(r1)) {
		pt->reads++;
		r2 = verify(mr, want, "odp-cold (second read)", &pt->failures);
	}
	t0 = now_us();
	dereg(mr);
	tder = now_us() - t0;
	if (verbose)
		fprintf(stderr, "    first-read %zu %s%s: reg %.1f advise %.1f read %.1f read2 %.1f dereg %.1f us\n", len,
			first_key[which], count ? "" : " (warm-up)", treg, tadv, r1, r2, tder);
	if (!count || isnan(r1) || (which == F_COLD && isnan(r2)))
		return;
	add(pt->reg, treg);
	add(pt->read1, r1);
	add(pt->dereg, tder);
	if (!isnan(tadv))
		add(pt->advise, tadv);
	if (!isnan(r2))
		add(pt->read2, r2);
}

static void run_first(void)
{
	for (int i = 0; i < NSIZES; i++) {
		struct odpd_segment *seg;
		unsigned n = iters_of(sizes[i]), w = warmup_of(sizes[i]);
		double t0 = now_us();
		uint32_t want;
		int done = 0;

		for (int s = 0; s < NFIRST; s++) {
			struct firstpt *p = &firstpts[i][s];

			p->reg = series_new(n, "%s reg %s", first_key[s], size_names[i]);
			p->read1 = series_new(n, "%s read %s", first_key[s], size_names[i]);
			p->read2 = series_new(n, "%s read2 %s", first_key[s], size_names[i]);
			p->advise = series_new(n, "%s advise %s", first_key[s], size_names[i]);
			p->dereg = series_new(n, "%s dereg %s", first_key[s], size_names[i]);
		}
		if (!in_part(2, i))
			continue;
		seg = fresh_segment(sizes[i]);
		memset(odpd_segment_addr(seg), FILL, sizes[i]);
		want = (uint32_t)crc32(crc32(0, NULL, 0), odpd_segment_addr(seg), (uInt)sizes[i]);
		for (unsigned k = 0; k < n + w; k++)
			for (int j = 0; j < NFIRST; j++) {
				int s = (int)((j + k) % NFIRST);

				if (s == F_PREFETCH && !have_advise)
					continue;
				first_sample(seg, sizes[i], want, s, &firstpts[i][s], k >= w);
				done++;
			}
		if (odpd_detach(seg) < 0)
			die("odpd_detach: %s", odpd_errmsg());
		printf("  %-8s %3u iterations, %2d samples (+%u warm-up iteration), %.1f s\n", size_names[i], n, done, w,
		       (now_us() - t0) / 1e6);
		fflush(stdout);
	}
}

static void report_first(void)
{
	char b[6][16];
	FILE *f;

	printf("\nmedians, µs (reg: odpd_reg; read: odpd_verify of the whole MR, RDMA READ through its rkey;\n"
	       "read2: the same again on the same MR; advise: odpd_advise_mr PREFETCH_WRITE FLUSH):\n");
	printf("%-8s %-13s %4s %11s %11s %11s %11s %11s %13s\n", "size", "series", "n", "reg_us", "advise_us",
	       "read_us", "read2_us", "dereg_us", "failed/reads");
	for (int i = 0; i < NSIZES; i++) {
		if (!in_part(2, i))
			continue;
		for (int s = 0; s < NFIRST; s++) {
			struct firstpt *p = &firstpts[i][s];

			if (!p->reads)
				continue;
			snprintf(b[2], 16, "%u/%u", p->failures, p->reads);
			total_read_failures += p->failures;
			if (!p->read1->n) {
				printf("%-8s %-13s %4u %11s %11s %11s %11s %11s %13s\n", size_names[i], first_key[s], 0u,
				       "-", "-", "-", "-", "-", b[2]);
				continue;
			}
			printf("%-8s %-13s %4u %11.1f %11s %11.1f %11s %11.1f %13s\n", size_names[i], first_key[s],
			       p->read1->n, med(p->reg), p->advise->n ? (snprintf(b[0], 16, "%.1f", med(p->advise)), b[0]) : "-",
			       med(p->read1), p->read2->n ? (snprintf(b[1], 16, "%.1f", med(p->read2)), b[1]) : "-",
			       med(p->dereg), b[2]);
		}
		putchar('\n');
	}

	printf("ratios of medians, first RDMA READ of a fresh ODP MR (the application wrote the pages;\n"
	       "odpd's page tables do not have them):\n"
	       "  cold/warm:      first READ / second READ of the same MR (what faulting the pages in costs)\n"
	       "  (pf+read)/cold: odpd_advise_mr FLUSH + READ / READ without prefetch (< 1: prefetching first is faster)\n"
	       "  read-pf/cold:   READ after the prefetch / READ without (the READ's share)\n"
	       "  odp/pinned:     reg + first READ, ODP / pinned; odp-pf/pinned: reg + prefetch + READ, ODP / pinned\n");
	printf("%-8s %10s %15s %13s %11s %14s\n", "size", "cold/warm", "(pf+read)/cold", "read-pf/cold", "odp/pinned",
	       "odp-pf/pinned");
	f = csv_open(out_dir, "odp-first-read.csv", NULL);
	fprintf(f, "size_bytes,size,n,odp_reg_us,odp_read_cold_us,odp_read_warm_us,prefetch_reg_us,prefetch_advise_us,"
		   "prefetch_read_us,pinned_reg_us,pinned_read_us,ratio_cold_warm,ratio_prefetch_read_cold,"
		   "ratio_read_after_prefetch_cold,ratio_odp_pinned_total,ratio_odp_prefetch_pinned_total,"
		   "odp_cold_reads,odp_cold_failed,prefetch_reads,prefetch_failed,pinned_reads,pinned_failed\n");
	for (int i = 0; i < NSIZES; i++) {
		struct firstpt *c = &firstpts[i][F_COLD], *pf = &firstpts[i][F_PREFETCH], *pn = &firstpts[i][F_PINNED];
		double cold, warm, adv, rpf, pfreg, odpreg, pinreg, pinread;
		double r_cw, r_pfc, r_rpc, r_op, r_opp;

		if (!in_part(2, i))
			continue;
		cold = med(c->read1);
		warm = med(c->read2);
		odpreg = med(c->reg);
		adv = med(pf->advise);
		rpf = med(pf->read1);
		pfreg = med(pf->reg);
		pinreg = med(pn->reg);
		pinread = med(pn->read1);
		r_cw = cold / warm;
		r_pfc = (adv + rpf) / cold;
		r_rpc = rpf / cold;
		r_op = (odpreg + cold) / (pinreg + pinread);
		r_opp = (pfreg + adv + rpf) / (pinreg + pinread);
		printf("%-8s %10s %15s %13s %11s %14s\n", size_names[i], fmt_ratio(r_cw, b[0]), fmt_ratio(r_pfc, b[1]),
		       fmt_ratio(r_rpc, b[2]), fmt_ratio(r_op, b[3]), fmt_ratio(r_opp, b[4]));
		fprintf(f, "%zu,%s,%u,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.2f,%.6f,%.6f,%.6f,%.6f,%.6f,%u,%u,%u,%u,%u,%u\n",
			sizes[i], size_names[i], c->read1->n, odpreg, cold, warm, pfreg, adv, rpf, pinreg, pinread, r_cw,
			r_pfc, r_rpc, r_op, r_opp, c->reads, c->failures, pf->reads, pf->failures, pn->reads,
			pn->failures);
	}
	csv_close(f, out_dir, "odp-first-read.csv");
}

/* ---------------------------------------------------------------- 3. prefetch cost */

enum { P_WRITTEN, P_ABSENT, NPF };
static const char *const pf_key[NPF] = { "written", "absent" };

static struct series *pfpts[NSIZES][NPF];

static void run_prefetch(void)
{
	for (int i = 0; i < NSIZES; i++) {
		struct odpd_segment *seg;
		unsigned n = iters_of(sizes[i]), w = warmup_of(sizes[i]);
		double t0 = now_us();
		int done = 0;

		for (int s = 0; s < NPF; s++)
			pfpts[i][s] = series_new(n, "prefetch %s %s", pf_key[s], size_names[i]);
		if (!in_part(3, i) || !have_advise)
			continue;
		seg = fresh_segment(sizes[i]);
		for (unsigned k = 0; k < n + w; k++)
			for (int j = 0; j < NPF; j++) {
				int s = (int)((j + k) % NPF);
				struct odpd_mr *mr;
				double ta;

				if (s == P_ABSENT && sizes[i] > absent_max)
					continue;
				done++;

				if (s == P_WRITTEN)
					punch_fill(seg, sizes[i]);
				else
					punch(seg);
				mr = reg(seg, sizes[i], IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND, 0);
				ta = now_us();
				advise_all(mr);
				ta = now_us() - ta;
				dereg(mr);
				if (verbose)
					fprintf(stderr, "    prefetch %zu %s%s: advise %.1f us\n", sizes[i], pf_key[s],
						k >= w ? "" : " (warm-up)", ta);
				if (k >= w)
					add(pfpts[i][s], ta);
			}
		if (odpd_detach(seg) < 0)
			die("odpd_detach: %s", odpd_errmsg());
		printf("  %-8s %3u iterations, %2d samples (+%u warm-up iteration), %.1f s\n", size_names[i], n, done, w,
		       (now_us() - t0) / 1e6);
		fflush(stdout);
	}
}

static void report_prefetch(void)
{
	char b[4][16];
	FILE *f;

	printf("\nprefetch cost: odpd_advise_mr(PREFETCH_WRITE, FLUSH) of a whole fresh ODP MR, medians;\n"
	       "written: the application wrote the pages first; absent: no page exists (the prefetch allocates);\n"
	       "pinned reg/MiB: part 1's pinned odpd_reg on punched pages (libodpd faults them in, odpd pins)\n");
	printf("%-8s %4s %12s %14s %12s %14s %15s %15s\n", "size", "n", "written_us", "written_us/MiB", "absent_us",
	       "absent_us/MiB", "pinned_reg/MiB", "absent/pinned");
	f = csv_open(out_dir, "odp-prefetch.csv", NULL);
	fprintf(f, "size_bytes,size,n,written_us,written_us_per_mib,absent_us,absent_us_per_mib,"
		   "pinned_reg_us_per_mib,ratio_absent_pinned_reg\n");
	for (int i = 0; i < NSIZES; i++) {
		double mib = (double)sizes[i] / (double)MiB;
		double w = med(pfpts[i][P_WRITTEN]), a = med(pfpts[i][P_ABSENT]);
		double pin = in_part(1, i) ? med(regpts[i][R_PINNED].reg) : NAN;

		if (!in_part(3, i))
			continue;
		printf("%-8s %4u %12.1f %14.1f %12.1f %14.1f %15s %15s\n", size_names[i], pfpts[i][P_WRITTEN]->n, w,
		       w / mib, a, a / mib, isnan(pin) ? "-" : (snprintf(b[0], 16, "%.1f", pin / mib), b[0]),
		       fmt_ratio(a / pin, b[1]));
		fprintf(f, "%zu,%s,%u,%.2f,%.2f,%.2f,%.2f,%.2f,%.6f\n", sizes[i], size_names[i],
			pfpts[i][P_WRITTEN]->n, w, w / mib, a, a / mib, pin / mib, a / pin);
	}
	csv_close(f, out_dir, "odp-prefetch.csv");
}

/* Every sample, in the order taken, for a closer look. */
static void write_samples(void)
{
	FILE *f = csv_open(out_dir, "odp-samples.csv", NULL);

	fprintf(f, "part,size_bytes,series,iteration,reg_us,dereg_us,advise_us,read_us,read2_us\n");
	for (int i = 0; i < NSIZES; i++)
		for (int s = 0; s < NREG; s++)
			for (unsigned k = 0; k < regpts[i][s].pair->n; k++)
				fprintf(f, "reg,%zu,%s,%u,%.2f,%.2f,,,\n", sizes[i], reg_key[s], k,
					regpts[i][s].reg->us[k], regpts[i][s].dereg->us[k]);
	for (int i = 0; i < NSIZES; i++)
		for (int s = 0; s < NFIRST; s++) {
			struct firstpt *p = &firstpts[i][s];

			for (unsigned k = 0; k < p->read1->n; k++) {
				fprintf(f, "first-read,%zu,%s,%u,%.2f,%.2f,", sizes[i], first_key[s], k, p->reg->us[k],
					p->dereg->us[k]);
				if (k < p->advise->n)
					fprintf(f, "%.2f", p->advise->us[k]);
				fprintf(f, ",%.2f,", p->read1->us[k]);
				if (k < p->read2->n)
					fprintf(f, "%.2f", p->read2->us[k]);
				fputc('\n', f);
			}
		}
	for (int i = 0; i < NSIZES; i++)
		for (int s = 0; s < NPF; s++)
			for (unsigned k = 0; k < pfpts[i][s]->n; k++)
				fprintf(f, "prefetch,%zu,%s,%u,,,%.2f,,\n", sizes[i], pf_key[s], k, pfpts[i][s]->us[k]);
	csv_close(f, out_dir, "odp-samples.csv");
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f)
{
	fprintf(f, "usage: bench-odp [--socket PATH] [--out DIR] [OPTIONS...]\n"
		   "  --socket PATH     odpd's socket\n"
		   "  --out DIR         CSV files go here (default build/bench-results)\n"
		   "  --iters N         iterations up to 1 MiB (default %u)\n"
		   "  --mid-iters N     iterations at 4 and 16 MiB (default %u)\n"
		   "  --big-iters N     iterations at 64 and 256 MiB (default %u)\n"
		   "  --max-mib M       only sizes up to M MiB\n"
		   "  --prefetch-absent-max-mib M  prefetch pages that do not exist yet (part 1's\n"
		   "                    odp-prefetch, part 3's absent) up to M MiB only (default %zu)\n"
		   "  --parts LIST      which parts to run, e.g. 1,3 (default 1,2,3)\n"
		   "  --verbose         every sample's times on stderr\n"
		   "Sizes up to %zu MiB run %u warm-up iteration first, not counted.\n"
		   "The socket defaults to $%s, else %s.\n", iters_small, iters_mid, iters_big, absent_max / MiB,
		WARMUP_MAX / MiB, WARMUP,
		ODPD_SOCKET_ENV, ODPD_SOCKET_DEFAULT);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "out", required_argument, NULL, 'o' },
		{ "iters", required_argument, NULL, 'n' },
		{ "mid-iters", required_argument, NULL, 'm' },
		{ "big-iters", required_argument, NULL, 'b' },
		{ "max-mib", required_argument, NULL, 'M' },
		{ "prefetch-absent-max-mib", required_argument, NULL, 'A' },
		{ "parts", required_argument, NULL, 'P' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	const char *sock = getenv(ODPD_SOCKET_ENV);
	struct odpd_device_attr a;
	double start = now_us();
	int c;

	out_dir = "build/bench-results";
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 's': sock = optarg; break;
		case 'o': out_dir = optarg; break;
		case 'n': iters_small = parse_n(optarg, 100000); break;
		case 'm': iters_mid = parse_n(optarg, 100000); break;
		case 'b': iters_big = parse_n(optarg, 100000); break;
		case 'A': absent_max = (size_t)parse_n(optarg, 1u << 20) * MiB; break;
		case 'M': max_size = (size_t)parse_n(optarg, 1u << 20) * MiB; break;
		case 'P':
			run_part[1] = run_part[2] = run_part[3] = false;
			for (const char *p = optarg; *p; p++) {
				if (*p >= '1' && *p <= '3')
					run_part[*p - '0'] = true;
				else if (*p != ',')
					die("--parts: a list of 1, 2 and 3, not %s", optarg);
			}
			break;
		case 'v': verbose = true; break;
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
	mkdir_p(out_dir);

	print_command(argc, argv);
	printf(", socket %s, results in %s\n", sock, out_dir);
	conn = connect_odpd(sock);
	if (odpd_query_device(conn, 0, &a, sizeof(a)) < 0)
		die("odpd_query_device: %s", odpd_errmsg());
	printf("device: odpd %s (%s), odp %s, RC ODP caps %#x, advise_mr %s", a.name, a.transport,
	       a.odp ? "yes" : "no", a.odp_rc_caps,
	       a.advise_mr == ODPD_SUPPORT_YES ? "yes" : a.advise_mr == ODPD_SUPPORT_NO ? "no" : "unknown");
	if (a.advise_mr == ODPD_SUPPORT_NO)
		printf(" (%s)", strerrorname_np(a.advise_mr_errno) ? strerrorname_np(a.advise_mr_errno) : "?");
	putchar('\n');
	if (!a.odp)
		die("device %s has no ODP: nothing to measure", a.name);
	have_advise = a.advise_mr == ODPD_SUPPORT_YES;
	if (!have_advise)
		printf("note: no advise_mr on this device: the prefetch series are skipped (rdma-core >= 58 has it\n"
		       "      for rxe: bench/run-odp's default testbed profile)\n");
	printf("fresh pages: every sample punches the segment first (FALLOC_FL_PUNCH_HOLE, not timed);\n"
	       "%u warm-up iteration not counted at sizes up to %zu MiB; series interleaved, order rotating\n"
	       "per iteration; prefetch of absent pages (odp-prefetch, absent) up to %zu MiB\n",
	       WARMUP, WARMUP_MAX / MiB, absent_max / MiB);

	printf("\n== 1. registration + deregistration by size, pinned vs ODP (IBV_ACCESS_LOCAL_WRITE)\n");
	fflush(stdout);
	run_reg();
	report_reg();

	printf("\n== 2. first RDMA READ (odpd_verify) of a fresh MR, ODP with and without prefetch, and pinned\n"
	       "   (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ; pages written by the application first)\n");
	fflush(stdout);
	run_first();
	report_first();

	if (have_advise) {
		printf("\n== 3. prefetch cost per MiB (odpd_advise_mr PREFETCH_WRITE, FLUSH)\n");
		fflush(stdout);
		run_prefetch();
		report_prefetch();
	} else {
		printf("\n== 3. prefetch cost: skipped (no advise_mr)\n");
		run_prefetch();                 /* empty series: the CSV says nan */
		report_prefetch();
	}
	write_samples();
	odpd_disconnect(conn);
	printf("\nbench-odp: %.1f s; CSV files in %s\n", (now_us() - start) / 1e6, out_dir);
	if (total_read_failures)
		printf("bench-odp: %u read-back(s) failed and were dropped (see failed/reads in part 2): not an error\n"
		       "of this bench; odpd_verify gave up on them (ETIMEDOUT: no completion within 10 s)\n",
		       total_read_failures);
	if (crc_errors)
		die("%u read-backs did not match the bytes written (see above)", crc_errors);
	return EXIT_SUCCESS;
}
