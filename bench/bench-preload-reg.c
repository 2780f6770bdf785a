/* SPDX-License-Identifier: MIT */
/*
 * bench-preload-reg: what an unmodified program's ibv_reg_mr of a fresh
 * buffer costs, timed from inside the program. Links only libibverbs: run
 * plainly it measures the direct registration; run under odpd-run
 * (libodpd-preload.so) the same calls go through odpd in client-PD mode.
 * bench/run-preload runs it both ways in the rxe VM and prints the ratios.
 *
 * For each SIZE, in this order:
 *   process   the process's first registration at that size: a buffer from
 *             posix_memalign, every page touched, ibv_reg_mr timed, then
 *             ibv_dereg_mr timed; the buffer is kept. Under the preload this
 *             one also connects to odpd, has odpd import the context and
 *             attaches the buffer's chunk (the first request of a process);
 *   chunk     the first registration in a chunk the process has not
 *             registered in before (under the preload only; buffers are
 *             allocated and kept, untouched and unregistered, until one lands
 *             in a mapping of /memfd:odpd-preload that /proc/self/maps did not
 *             show before; that one is touched and timed): attach + register.
 *             Plainly there are no chunks: the next fresh buffer is timed;
 *   steady    ITERS fresh buffers, one at a time: posix_memalign, touch,
 *             ibv_reg_mr, ibv_dereg_mr, free. The median (and the first of
 *             them, min, max) of the registration and deregistration times.
 * "process" is the process's first registration only for the first SIZE:
 * bench/run-preload runs one SIZE per process.
 * Times in microseconds (CLOCK_MONOTONIC). Output: one line per size,
 *   size=S mode=preload|plain process_reg=.. process_dereg=.. chunk_reg=..
 *   chunk_dereg=.. fillers=N steady_first_reg=.. steady_reg=.. steady_reg_min=..
 *   steady_reg_max=.. steady_dereg=.. iters=N
 * Never asserts on speed; exits 1 when a call fails.
 *
 * bench-preload-reg [--dev NAME] [--iters N] SIZE...   (SIZE in bytes, or with K/M)
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define MAX_RANGES 4096
#define FILL_LIMIT ((size_t)1 << 30)    /* at most 1 GiB of address space in fillers */

static long page;
static struct ibv_pd *pd;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;

	fputs("bench-preload-reg: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		die("not a size: %s", s);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	}
	if (*end == 'i')
		end++;
	if (*end || v == 0)
		die("not a size: %s", s);
	return (size_t)v;
}

static char *alloc(size_t size)
{
	void *p = NULL;
	int e = posix_memalign(&p, (size_t)page, size);

	if (e)
		die("posix_memalign(%zu): %s", size, strerror(e));
	return p;
}

static void touch(char *p, size_t size)
{
	for (size_t o = 0; o < size; o += (size_t)page)
		((volatile char *)p)[o] = (char)o;
}

/* ibv_reg_mr + ibv_dereg_mr of [p, +size), their times in *reg and *dereg */
static void reg_dereg(char *p, size_t size, double *reg, double *dereg)
{
	double t0 = now_us(), t1, t2;
	struct ibv_mr *mr = ibv_reg_mr(pd, p, size, ACCESS);

	t1 = now_us();
	if (!mr)
		die("ibv_reg_mr(%zu bytes): %s", size, strerror(errno));
	if (ibv_dereg_mr(mr))
		die("ibv_dereg_mr(%zu bytes): %s", size, strerror(errno));
	t2 = now_us();
	*reg = t1 - t0;
	*dereg = t2 - t1;
}

/* The preload's chunks: the mappings of /memfd:odpd-preload in /proc/self/maps. */
static struct range { uintptr_t start, end; } ranges[MAX_RANGES];
static size_t n_ranges;

static void read_chunks(void)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[4096];

	if (!f)
		die("/proc/self/maps: %s", strerror(errno));
	n_ranges = 0;
	while (fgets(line, sizeof(line), f) && n_ranges < MAX_RANGES) {
		unsigned long s, e;

		if (!strstr(line, "/memfd:odpd-preload") || sscanf(line, "%lx-%lx", &s, &e) != 2)
			continue;
		ranges[n_ranges++] = (struct range){ s, e };
	}
	fclose(f);
}

static int in_chunk(const void *p)
{
	for (size_t i = 0; i < n_ranges; i++)
		if ((uintptr_t)p >= ranges[i].start && (uintptr_t)p < ranges[i].end)
			return 1;
	return 0;
}

static void one_size(size_t size, unsigned iters)
{
	double preg, pdereg, creg, cdereg, *reg, *dereg, first;
	char *held, *p, **fill = NULL;
	size_t n_fill = 0, cap = 0;
	int preload;

	/* process: the first registration at this size */
	held = alloc(size);
	touch(held, size);
	reg_dereg(held, size, &preg, &pdereg);

	/* chunk: the first registration in a chunk not registered in before */
	read_chunks();
	preload = in_chunk(held);
	for (;;) {
		p = alloc(size);
		if (!preload || !in_chunk(p)) {
			read_chunks();
			if (!preload || in_chunk(p))
				break;          /* plainly: the next buffer; else a new chunk */
			die("a %zu-byte buffer at %p is in no /memfd:odpd-preload mapping "
			    "(ODPD_PRELOAD_MIN_SIZE above it?)", size, (void *)p);
		}
		if (n_fill == cap) {
			cap = cap ? cap * 2 : 64;
			fill = realloc(fill, cap * sizeof(*fill));
			if (!fill)
				die("out of memory");
		}
		fill[n_fill++] = p;
		if ((n_fill + 1) * size > FILL_LIMIT)
			die("no new chunk after %zu buffers of %zu bytes", n_fill, size);
	}
	touch(p, size);
	reg_dereg(p, size, &creg, &cdereg);
	free(p);
	for (size_t i = 0; i < n_fill; i++)
		free(fill[i]);
	free(fill);

	/* steady: fresh buffers, one at a time */
	reg = calloc(iters, sizeof(*reg));
	dereg = calloc(iters, sizeof(*dereg));
	if (!reg || !dereg)
		die("out of memory");
	for (unsigned i = 0; i < iters; i++) {
		p = alloc(size);
		touch(p, size);
		reg_dereg(p, size, &reg[i], &dereg[i]);
		free(p);
	}
	first = reg[0];
	free(held);
	printf("size=%zu mode=%s process_reg=%.1f process_dereg=%.1f chunk_reg=%.1f chunk_dereg=%.1f "
	       "fillers=%zu steady_first_reg=%.1f", size, preload ? "preload" : "plain", preg, pdereg,
	       creg, cdereg, n_fill, first);
	printf(" steady_reg=%.1f", median(reg, iters));
	printf(" steady_reg_min=%.1f steady_reg_max=%.1f", reg[0], reg[iters - 1]);
	printf(" steady_dereg=%.1f iters=%u\n", median(dereg, iters), iters);
	fflush(stdout);
	free(reg);
	free(dereg);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "dev", required_argument, NULL, 'd' },
		{ "iters", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	const char *dev = NULL;
	unsigned iters = 15;
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int n, c;

	while ((c = getopt_long(argc, argv, "d:n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'd': dev = optarg; break;
		case 'n': iters = (unsigned)strtoul(optarg, NULL, 10); break;
		default:
			fprintf(stderr, "usage: bench-preload-reg [--dev NAME] [--iters N] SIZE...\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (optind >= argc || iters == 0)
		die("usage: bench-preload-reg [--dev NAME] [--iters N] SIZE...");
	page = sysconf(_SC_PAGESIZE);
	list = ibv_get_device_list(&n);
	if (!list || n == 0)
		die("no RDMA device");
	for (int i = 0; i < n && !ctx; i++)
		if (!dev || strcmp(ibv_get_device_name(list[i]), dev) == 0)
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("cannot open %s", dev ? dev : "the first device");
	ibv_free_device_list(list);
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd: %s", strerror(errno));
	for (int i = optind; i < argc; i++)
		one_size(parse_size(argv[i]), iters);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return 0;
}
