/* SPDX-License-Identifier: MIT */
/* bench-util: the helpers bench-reg and bench-cache share (bench-util.h). */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"

void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fprintf(stderr, "%s: ", bench_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(EXIT_FAILURE);
}

double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

unsigned parse_n(const char *s, unsigned max)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);

	if (*s < '1' || *s > '9' || *end || v > max)
		die("bad count %s (1..%u)", s, max);
	return (unsigned)v;
}

unsigned parse_sizes(const char *s, size_t *sizes, unsigned max, size_t max_bytes)
{
	char buf[256], *save = NULL;
	unsigned n = 0;

	if (strlen(s) >= sizeof(buf))
		die("--sizes: too long");
	strcpy(buf, s);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char *end;
		unsigned long long v = strtoull(t, &end, 10);

		if (*t < '1' || *t > '9')
			die("--sizes: bad size %s", t);
		if (*end == 'K')
			v *= KiB, end++;
		else if (*end == 'M')
			v *= MiB, end++;
		if (*end || v > max_bytes)
			die("--sizes: bad size %s (1 .. %zu bytes; suffixes K and M)", t, max_bytes);
		if (n == max)
			die("--sizes: at most %u sizes", max);
		sizes[n++] = (size_t)v;
	}
	if (!n)
		die("--sizes: no size");
	return n;
}

void print_ratio(const char *what, double a, double b, double target, bool at_most)
{
	double r = a / b;

	if (target > 0)
		printf("  %-62s %8.3f   target %s %.2f: %s\n", what, r, at_most ? "<=" : ">=", target,
		       (at_most ? r <= target : r >= target) ? "met" : "MISSED");
	else
		printf("  %-62s %8.3f\n", what, r);
}

void print_command(int argc, char **argv)
{
	struct utsname u;

	printf("%s:", bench_name);
	for (int i = 0; i < argc; i++)
		printf(" %s", argv[i]);
	if (uname(&u) < 0)
		die("uname: %s", strerror(errno));
	printf("\nkernel %s %s", u.release, u.machine);
}

/* ---------------------------------------------------------------- statistics */

struct series *series_new(unsigned cap, const char *fmt, ...)
{
	struct series *s = calloc(1, sizeof(*s));
	va_list ap;

	if (!s || !(s->us = calloc(cap ? cap : 1, sizeof(double))))
		die("out of memory");
	s->cap = cap;
	va_start(ap, fmt);
	vsnprintf(s->name, sizeof(s->name), fmt, ap);
	va_end(ap);
	return s;
}

void series_free(struct series *s)
{
	if (s)
		free(s->us);
	free(s);
}

void add(struct series *s, double us)
{
	if (s->n < s->cap)
		s->us[s->n++] = us;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const double *v, unsigned n, double p)
{
	double r = ceil(p * n);
	unsigned i = r < 1 ? 0 : (unsigned)r - 1;

	return v[i < n ? i : n - 1];
}

void summarize(struct series *s)
{
	double *v;

	if (!s->n)
		die("%s: no samples", s->name);
	v = malloc(s->n * sizeof(double));
	if (!v)
		die("out of memory");
	memcpy(v, s->us, s->n * sizeof(double));
	qsort(v, s->n, sizeof(double), cmp_double);
	s->median = s->n % 2 ? v[s->n / 2] : (v[s->n / 2 - 1] + v[s->n / 2]) / 2;
	s->p10 = pct(v, s->n, 0.10);
	s->p90 = pct(v, s->n, 0.90);
	s->p99 = pct(v, s->n, 0.99);
	free(v);
}

/* ---------------------------------------------------------------- verbs baseline */

void verbs_open(struct verbs *v)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);

	if (!list)
		die("ibv_get_device_list: %s", strerror(errno));
	if (n < 1)
		die("no RDMA device");
	v->name = strdup(ibv_get_device_name(list[0]));
	v->ctx = ibv_open_device(list[0]);
	if (!v->name || !v->ctx)
		die("ibv_open_device %s: %s", ibv_get_device_name(list[0]), strerror(errno));
	ibv_free_device_list(list);
	v->pd = ibv_alloc_pd(v->ctx);
	if (!v->pd)
		die("ibv_alloc_pd: %s", strerror(errno));
}

void verbs_close(struct verbs *v)
{
	ibv_dealloc_pd(v->pd);
	ibv_close_device(v->ctx);
}

void verbs_reg_dereg(const struct verbs *v, void *buf, size_t len, int access, double t[3])
{
	struct ibv_mr *vm;

	t[0] = now_us();
	vm = ibv_reg_mr(v->pd, buf, len, access);
	t[1] = now_us();
	if (!vm)
		die("ibv_reg_mr %zu: %s", len, strerror(errno));
	errno = ibv_dereg_mr(vm);
	t[2] = now_us();
	if (errno)
		die("ibv_dereg_mr: %s", strerror(errno));
}

void *memfd_buffer_fresh(size_t len)
{
	int fd = memfd_create(bench_name, MFD_CLOEXEC);
	void *p;

	if (fd < 0 || ftruncate(fd, (off_t)len) < 0)
		die("memfd of %zu bytes: %s", len, strerror(errno));
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		die("mmap %zu bytes: %s", len, strerror(errno));
	close(fd);
	return p;
}

void *memfd_buffer(size_t len)
{
	void *p = memfd_buffer_fresh(len);

	memset(p, 0xa5, len);
	return p;
}

/* ---------------------------------------------------------------- odpd */

struct odpd_conn *connect_odpd(const char *sock)
{
	struct odpd_conn *c = odpd_connect(sock, NULL);

	if (!c)
		die("odpd_connect %s: %s", sock, odpd_errmsg());
	return c;
}

struct odpd_segment *segment(struct odpd_conn *c, size_t len)
{
	struct odpd_segment *s = odpd_alloc(c, len, 0);

	if (!s)
		die("odpd_alloc %zu: %s", len, odpd_errmsg());
	memset(odpd_segment_addr(s), 0xa5, len);
	return s;
}

void mkdir_p(const char *dir)
{
	char p[4096];

	if (strlen(dir) >= sizeof(p))
		die("path too long: %s", dir);
	strcpy(p, dir);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0755) < 0 && errno != EEXIST)
			die("mkdir %s: %s", p, strerror(errno));
		*s = '/';
	}
	if (mkdir(p, 0755) < 0 && errno != EEXIST)
		die("mkdir %s: %s", p, strerror(errno));
}

FILE *csv_open(const char *dir, const char *name, const char *header)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "we");
	if (!f)
		die("%s: %s", path, strerror(errno));
	if (header)
		fprintf(f, "# %s\n", header);
	return f;
}

void csv_close(FILE *f, const char *dir, const char *name)
{
	if (ferror(f) | fclose(f))
		die("writing %s/%s failed", dir, name);
}

/* ---------------------------------------------------------------- a bare round trip */

int child_start(int (*serve)(int fd, void *arg), void *arg, int keep_fd, pid_t *ret_pid)
{
	int sv[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair: %s", strerror(errno));
	fflush(NULL);                          /* a die() in the child prints nothing of ours twice */
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		/* both above 4 first: either may be 3 or 4 now */
		int s = fcntl(sv[1], F_DUPFD, 5), k = keep_fd >= 0 ? fcntl(keep_fd, F_DUPFD, 5) : -1;

		if (s < 0 || (keep_fd >= 0 && k < 0) || dup2(s, 3) < 0 || (k >= 0 && dup2(k, 4) < 0) ||
		    close_range(k >= 0 ? 5 : 4, ~0U, 0) < 0)
			_exit(1);
		_exit(serve(3, arg));
	}
	close(sv[1]);
	*ret_pid = pid;
	return sv[0];
}

/* Every packet back: the bare cost of a Unix socket round trip between two
 * processes, no daemon. */
static int echo_serve(int fd, void *arg)
{
	char b[256];
	ssize_t n;

	(void)arg;
	while ((n = recv(fd, b, sizeof(b), 0)) > 0)
		if (send(fd, b, (size_t)n, MSG_NOSIGNAL) != n)
			return 1;
	return n == 0 ? 0 : 1;
}

int echo_start(pid_t *ret_pid)
{
	return child_start(echo_serve, NULL, -1, ret_pid);
}

void echo_rtt(int fd)
{
	char b[64] = { 1 };

	if (send(fd, b, sizeof(b), MSG_NOSIGNAL) != (ssize_t)sizeof(b) ||
	    recv(fd, b, sizeof(b), 0) != (ssize_t)sizeof(b))
		die("echo: %s", strerror(errno));
}

void child_stop(int fd, pid_t pid)
{
	int st;

	close(fd);
	if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
		die("child %d (child_start) failed", (int)pid);
}

long proc_status_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	size_t n = strlen(field);
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, field, n) && line[n] == ':')
			kb = strtol(line + n + 1, NULL, 10);
	fclose(f);
	return kb;
}

int proc_fds(pid_t pid)
{
	char path[64];
	struct dirent *de;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Is @tid a thread of @pid? */
static bool thread_of(pid_t pid, long tid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/task/%ld", (int)pid, tid);
	return access(path, F_OK) == 0;
}

long proc_rdma_objects(pid_t pid, const char *res)
{
	static const char key[] = "\"pid\":";
	size_t size = 1 << 20, len = 0, got;
	char cmd[64], *buf = malloc(size), *q;
	long n = 0;
	FILE *p;

	snprintf(cmd, sizeof(cmd), "rdma -j resource show %s 2>/dev/null", res);
	p = popen(cmd, "r");
	if (!p || !buf)
		die("rdma: %s", strerror(errno));
	while ((got = fread(buf + len, 1, size - 1 - len, p)) > 0)
		if ((len += got) == size - 1 && !(buf = realloc(buf, size *= 2)))
			die("out of memory");
	buf[len] = 0;
	if (pclose(p) != 0)
		n = -1;
	for (q = buf; n >= 0 && (q = strstr(q, key));)
		n += thread_of(pid, strtol(q + sizeof(key) - 1, &q, 10));
	free(buf);
	return n;
}
