/* SPDX-License-Identifier: MIT */
/*
 * bench-preload-alloc: the allocator alone, no RDMA device and no daemon.
 * Each iteration allocates a buffer of SIZE, writes one byte to every page
 * and frees it; its time is one sample (CLOCK_MONOTONIC). Two ways:
 *   malloc   malloc() + free(): whichever malloc the process has - the C
 *            library's, or libodpd-preload.so's under LD_PRELOAD (jemalloc
 *            with extent hooks that take memory from memfd chunks);
 *   naive    (--naive) what a hand-made allocator without reuse would do to
 *            put each buffer in a segment odpd can map: memfd_create +
 *            ftruncate + F_ADD_SEALS + mmap(MAP_SHARED) per allocation,
 *            munmap + close per free;
 *   anon     (--anon) the same without a file: an anonymous private mmap per
 *            allocation, munmap per free (fresh pages every time, as the C
 *            library's malloc gives above its mmap threshold).
 * bench/run-preload runs it on the host, each variant in turn, and prints
 * the ratios. Output: one line per size,
 *   size=S mode=malloc|naive|anon first=.. median=.. p10=.. p90=.. iters=N   (us)
 * "first" is the first iteration (a new chunk or heap growth), not in the median's set.
 * Never asserts on speed.
 *
 * bench-preload-alloc [--naive|--anon] [--iters N] SIZE...   (SIZE in bytes, or with K/M)
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static long page;

static void die(const char *what)
{
	fprintf(stderr, "bench-preload-alloc: %s: %s\n", what, strerror(errno));
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

static size_t parse_size(const char *s)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	}
	if (*end == 'i')
		end++;
	if (errno || end == s || *s == '-' || *end || v == 0) {
		errno = EINVAL;
		die(s);
	}
	return (size_t)v;
}

static void touch(char *p, size_t size)
{
	for (size_t o = 0; o < size; o += (size_t)page)
		((volatile char *)p)[o] = (char)o;
}

static void one_malloc(size_t size)
{
	char *p = malloc(size);

	if (!p)
		die("malloc");
	touch(p, size);
	free(p);
}

static void one_naive(size_t size)
{
	int fd = memfd_create("naive", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	char *p;

	if (fd < 0)
		die("memfd_create");
	if (ftruncate(fd, (off_t)size) < 0)
		die("ftruncate");
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		die("F_ADD_SEALS");
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap");
	touch(p, size);
	if (munmap(p, size) < 0)
		die("munmap");
	close(fd);
}

static void one_anon(size_t size)
{
	char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap");
	touch(p, size);
	if (munmap(p, size) < 0)
		die("munmap");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "naive", no_argument, NULL, 'N' },
		{ "anon", no_argument, NULL, 'A' },
		{ "iters", required_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 }
	};
	unsigned iters = 200;
	enum { MALLOC, NAIVE, ANON } mode = MALLOC;
	static const char *const names[] = { "malloc", "naive", "anon" };
	int c;

	while ((c = getopt_long(argc, argv, "n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'N': mode = NAIVE; break;
		case 'A': mode = ANON; break;
		case 'n': iters = (unsigned)strtoul(optarg, NULL, 10); break;
		default:
			fprintf(stderr, "usage: bench-preload-alloc [--naive|--anon] [--iters N] SIZE...\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (optind >= argc || iters < 2) {
		fprintf(stderr, "usage: bench-preload-alloc [--naive|--anon] [--iters N>1] SIZE...\n");
		return 2;
	}
	page = sysconf(_SC_PAGESIZE);
	for (int i = optind; i < argc; i++) {
		size_t size = parse_size(argv[i]);
		double *t = calloc(iters, sizeof(*t)), first;

		if (!t)
			die("calloc");
		for (unsigned k = 0; k < iters; k++) {
			double t0 = now_us();

			if (mode == NAIVE)
				one_naive(size);
			else if (mode == ANON)
				one_anon(size);
			else
				one_malloc(size);
			t[k] = now_us() - t0;
		}
		first = t[0];
		qsort(t + 1, iters - 1, sizeof(*t), cmp_double);
		unsigned n = iters - 1;
		double med = n % 2 ? t[1 + n / 2] : (t[n / 2] + t[1 + n / 2]) / 2;

		printf("size=%zu mode=%s first=%.2f median=%.2f p10=%.2f p90=%.2f iters=%u\n", size,
		       names[mode], first, med, t[1 + n / 10], t[1 + (n * 9) / 10], iters);
		fflush(stdout);
		free(t);
	}
	return 0;
}
