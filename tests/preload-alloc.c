/* SPDX-License-Identifier: MIT */
/*
 * preload-alloc: libodpd-preload.so's allocator, on the host (no device, no
 * daemon): run with LD_PRELOAD=libodpd-preload.so (tests/meson.build does).
 * Large allocations of every allocator (malloc, calloc, realloc,
 * posix_memalign, aligned_alloc, memalign, valloc, anonymous private mmap)
 * land in a MAP_SHARED memfd mapping ("/memfd:odpd-preload"), small ones
 * stay in the C library's heap; contents survive realloc; calloc and mmap
 * give zeros; munmap, mremap and MADV_DONTNEED keep the meaning they have for
 * private anonymous memory; after fork() neither side sees the other's
 * writes; many threads allocate and free at once. With "--unpreloaded" it
 * checks instead that nothing is in a segment (ODPD_PRELOAD=0, or no preload).
 * Prints "ok N - ..." lines and exits non-zero on the first failure.
 */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned n_ok;

#define CHECK(cond, ...) do {                                           \
	if (!(cond)) {                                                  \
		printf("not ok %u - ", n_ok + 1);                       \
		printf(__VA_ARGS__);                                    \
		printf(" (%s:%d: %s)\n", __FILE__, __LINE__, #cond);   \
		fflush(stdout);                                         \
		exit(1);                                                \
	}                                                               \
} while (0)
#define OK(...) do { printf("ok %u - ", ++n_ok); printf(__VA_ARGS__); printf("\n"); } while (0)

/* Is @p inside a MAP_SHARED mapping of the preload's memfd? */
static bool in_segment(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512];
	bool in = false;

	CHECK(f, "open /proc/self/maps");
	while (fgets(line, sizeof(line), f)) {
		unsigned long s, e;
		char perms[8];

		if (sscanf(line, "%lx-%lx %7s", &s, &e, perms) != 3)
			continue;
		if ((uintptr_t)p >= s && (uintptr_t)p < e) {
			in = perms[3] == 's' && strstr(line, "/memfd:odpd-preload");
			break;
		}
	}
	fclose(f);
	return in;
}

static bool all_zero(const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static void test_allocators(void)
{
	const size_t big = 1 << 20;
	char *p = malloc(big), *small = malloc(100), *q;
	void *a = NULL;

	CHECK(p && in_segment(p), "malloc(1 MiB) is in a segment");
	CHECK(small && !in_segment(small), "malloc(100) stays in the heap");
	CHECK(malloc_usable_size(p) >= big && malloc_usable_size(small) >= 100, "usable sizes");
	memset(p, 0x5a, big);
	q = realloc(p, 8 * big);
	CHECK(q && in_segment(q) && q[0] == 0x5a && q[big - 1] == 0x5a, "realloc keeps the contents");
	free(q);
	memset(small, 0x33, 100);
	q = realloc(small, 2 * big);
	CHECK(q && in_segment(q) && q[99] == 0x33, "realloc from the heap into a segment");
	q = realloc(q, 64);
	CHECK(q && q[63] == 0x33, "realloc shrinks");
	free(q);
	OK("malloc, realloc, malloc_usable_size, free");

	q = calloc(4, big);
	CHECK(q && in_segment(q) && all_zero((unsigned char *)q, 4 * big), "calloc: a segment, zeros");
	free(q);
	CHECK(posix_memalign(&a, 65536, big) == 0 && a && ((uintptr_t)a & 65535) == 0 && in_segment(a),
	      "posix_memalign");
	free(a);
	CHECK(posix_memalign(&a, 3, big) == EINVAL, "posix_memalign refuses alignment 3");
	a = aligned_alloc(4096, big);
	CHECK(a && ((uintptr_t)a & 4095) == 0 && in_segment(a), "aligned_alloc");
	free(a);
	a = memalign(1 << 21, big);
	CHECK(a && ((uintptr_t)a & ((1 << 21) - 1)) == 0 && in_segment(a), "memalign 2 MiB");
	free(a);
	a = valloc(big);
	CHECK(a && ((uintptr_t)a & 4095) == 0 && in_segment(a), "valloc");
	free(a);
	OK("calloc, posix_memalign, aligned_alloc, memalign, valloc");

	/* freed and reused: the same range comes back zeroed by calloc */
	for (int i = 0; i < 50; i++) {
		q = malloc(big);
		memset(q, 0xff, big);
		free(q);
		q = calloc(1, big);
		CHECK(all_zero((unsigned char *)q, big), "calloc after a dirty free gives zeros");
		free(q);
	}
	OK("reuse: calloc over freed, dirty memory gives zeros");
}

static sigjmp_buf fault_jmp;

static void on_segv(int sig)
{
	(void)sig;
	siglongjmp(fault_jmp, 1);
}

static void test_mmap(void)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 64 * page;
	struct sigaction sa = { .sa_handler = on_segv }, old;
	unsigned char *volatile p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	unsigned char *q;
	volatile int faulted = 0;

	CHECK(p != MAP_FAILED && in_segment(p) && all_zero(p, n), "anonymous mmap: a segment, zeros");
	memset(p, 7, n);
	CHECK(madvise(p, page, MADV_DONTNEED) == 0 && all_zero(p, page) && p[page] == 7,
	      "MADV_DONTNEED gives zeros, as for private memory");
	/* munmap of the middle: the rest stays, the hole faults */
	CHECK(munmap(p + 8 * page, 8 * page) == 0, "munmap of a part");
	CHECK(p[7 * page] == 7 && p[16 * page] == 7, "the rest of the mapping stays");
	sigaction(SIGSEGV, &sa, &old);
	if (sigsetjmp(fault_jmp, 1) == 0)
		(void)*(volatile unsigned char *)(p + 8 * page);
	else
		faulted = 1;
	sigaction(SIGSEGV, &old, NULL);
	CHECK(faulted, "an unmapped part faults");
	CHECK(munmap(p, n) == 0, "munmap of the rest");
	OK("mmap, madvise(MADV_DONTNEED), munmap of a part and of the rest");

	p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(p, 9, n);
	q = mremap(p, n, 4 * n, MREMAP_MAYMOVE);
	CHECK(q != MAP_FAILED && in_segment(q) && q[n - 1] == 9 && all_zero(q + n, 3 * n),
	      "mremap grows by moving, keeps the contents, zeros beyond");
	CHECK(mremap(q, 4 * n, 8 * n, 0) == MAP_FAILED && errno == ENOMEM, "no growth in place");
	CHECK(mremap(q, 4 * n, n, 0) == q && q[n - 1] == 9, "mremap shrinks in place");
	CHECK(munmap(q, n) == 0, "munmap");
	p = mmap(NULL, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED && p[0] == 0, "a read-only anonymous mapping");
	CHECK(munmap(p, n) == 0, "munmap");
	q = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(q != MAP_FAILED && !in_segment(q), "a small mapping stays the kernel's");
	munmap(q, 2 * page);
	OK("mremap, PROT_READ, small mappings");
}

/* After fork, neither side sees the other's writes; both keep the old data. */
static void test_fork(void)
{
	const size_t n = 4 << 20;
	char *p = malloc(n);
	unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int to_child[2], to_parent[2], st;
	char b;
	pid_t pid;

	CHECK(p && m != MAP_FAILED && in_segment(p) && in_segment(m), "segments");
	memset(p, 'a', n);
	memset(m, 'a', n);
	CHECK(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipes");
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		/* wait for the parent's write, then check and write ourselves */
		if (read(to_child[0], &b, 1) != 1)
			_exit(2);
		if (p[0] != 'a' || m[0] != 'a' || p[n - 1] != 'a')
			_exit(3);                   /* saw the parent's write */
		p[1] = 'c';
		m[1] = 'c';
		if (!in_segment(p))
			_exit(4);                   /* the child's copy is a segment too */
		if (write(to_parent[1], "x", 1) != 1)
			_exit(5);
		_exit(0);
	}
	close(to_child[0]);
	close(to_parent[1]);             /* so that a child that dies gives EOF */
	p[0] = 'P';
	m[0] = 'P';
	CHECK(write(to_child[1], "x", 1) == 1, "write");
	(void)!read(to_parent[0], &b, 1);
	CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child saw none of the parent's writes "
	      "(status %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	CHECK(p[1] == 'a' && m[1] == 'a', "the parent sees none of the child's writes");
	CHECK(p[0] == 'P' && m[0] == 'P', "the parent keeps its own");
	close(to_child[1]);
	close(to_parent[0]);
	free(p);
	munmap(m, n);
	OK("fork: private both ways, malloc and mmap");
}

static void *churn(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;
	void *held[16] = { 0 };

	for (int i = 0; i < 20000; i++) {
		unsigned k = (unsigned)rand_r(&seed) % 16;
		size_t n = ((size_t)rand_r(&seed) % 8 + 1) * 24576;

		if (held[k]) {
			CHECK(*(unsigned *)held[k] == k + seed * 0, "a block kept its contents");
			free(held[k]);
			held[k] = NULL;
		} else {
			held[k] = malloc(n);
			CHECK(held[k], "malloc in a thread");
			*(unsigned *)held[k] = k;
		}
	}
	for (int k = 0; k < 16; k++)
		free(held[k]);
	return NULL;
}

static void test_threads(void)
{
	pthread_t t[4];

	for (int i = 0; i < 4; i++)
		CHECK(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1)) == 0, "thread");
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	OK("4 threads, 20,000 allocations and frees each");
}

/* free() leaves errno alone (POSIX.1-2024), even when it gives pages back */
static void test_errno(void)
{
	for (int i = 0; i < 100; i++) {
		char *p = malloc(16 << 20);

		CHECK(p, "malloc");
		memset(p, 1, 16 << 20);
		errno = 1234;
		free(p);
		CHECK(errno == 1234, "free kept errno (now %d)", errno);
	}
	OK("free() keeps errno");
}

/*
 * A program that closes every fd (a daemon's close_range) and opens a file
 * that gets the chunk's old fd number: giving pages back must not punch the
 * file, and a child must get its own copy of the memory, not the file's bytes.
 */
static void test_closed_fds(void)
{
	const size_t n = 4 << 20, page = (size_t)sysconf(_SC_PAGESIZE);
	char path[] = "/tmp/preload-alloc.XXXXXX", buf[256];
	unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *p = malloc(n);
	int fd, st;
	pid_t pid;

	CHECK(m != MAP_FAILED && p && in_segment(m) && in_segment(p), "segments");
	memset(m, 'm', n);
	memset(p, 'p', n);
	CHECK(syscall(SYS_close_range, 3, ~0U, 0) == 0, "close_range");
	fd = mkstemp(path);
	CHECK(fd >= 0, "mkstemp");
	unlink(path);
	memset(buf, 'F', sizeof(buf));
	for (size_t off = 0; off < n; off += sizeof(buf))
		CHECK(write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf), "write the file");
	CHECK(munmap(m + page, 4 * page) == 0 && madvise(m + 8 * page, page, MADV_DONTNEED) == 0,
	      "munmap and MADV_DONTNEED after the fds were closed");
	CHECK(lseek(fd, 0, SEEK_HOLE) == (off_t)n, "the program's file has no hole punched in it");
	pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0)
		_exit(p[0] == 'p' && p[n - 1] == 'p' && m[0] == 'm' && m[8 * page] == 0 &&
		      in_segment(p) ? 0 : 1);
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "the child has its own copy of the memory, not the file");
	CHECK(pread(fd, buf, 1, 0) == 1 && buf[0] == 'F', "the file is intact");
	close(fd);
	free(p);
	munmap(m, n);
	OK("close_range and a reused fd number: no file punched, the child's copy right");
}

/* What runtimes do with mappings: reserve PROT_NONE, commit with MAP_FIXED, remap. */
static void test_mapping_patterns(void)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE), n = 64 * page;
	unsigned char *r = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	unsigned char *m, *q;

	CHECK(r != MAP_FAILED && !in_segment(r), "a PROT_NONE reservation stays the kernel's");
	CHECK(mmap(r, 8 * page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
	      == r && (r[0] = 1), "commit inside it with MAP_FIXED");
	munmap(r, n);

	m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED && in_segment(m), "a segment");
	memset(m, 5, n);
	CHECK(mmap(m + 4 * page, 4 * page, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
		   -1, 0) == m + 4 * page, "MAP_FIXED anonymous over our own mapping");
	CHECK(all_zero(m + 4 * page, 4 * page) && m[4 * page - 1] == 5 && m[8 * page] == 5,
	      "fresh zeros there, the rest kept");
	CHECK(mmap(m, page, PROT_READ, MAP_FIXED | MAP_SHARED | MAP_ANONYMOUS, -1, 0) == MAP_FAILED &&
	      errno == EINVAL, "MAP_FIXED of another kind over a segment is refused");
	CHECK(madvise(m + 1, page, MADV_DONTNEED) == -1 && errno == EINVAL,
	      "a misaligned MADV_DONTNEED is EINVAL, as the kernel says");
	CHECK(mremap(m, n, n / 2, 0) == m, "shrink");
	q = mremap(m, n / 2, 2 * n, MREMAP_MAYMOVE);
	CHECK(q != MAP_FAILED && q[0] == 5 && q[n / 2 - 1] == 5 && all_zero(q + n / 2, n),
	      "grow after a shrink, by moving");
	munmap(q, 2 * n);
	q = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(q, 6, n);
	CHECK(mprotect(q, n, PROT_NONE) == 0, "mprotect");
	m = mremap(q, n, 2 * n, MREMAP_MAYMOVE);
	CHECK(m != MAP_FAILED, "mremap of a PROT_NONE mapping moves");
	CHECK(mprotect(m, 2 * n, PROT_READ) == 0 && m[n - 1] == 6, "its contents came along");
	munmap(m, 2 * n);
	OK("PROT_NONE reservations, MAP_FIXED, misaligned madvise, mremap after a shrink and of PROT_NONE");
}

/*
 * fork() while other threads allocate (new chunks among them): every fork
 * returns, in the parent and the child, and the child can allocate. A lock
 * order between the fork handlers and an allocation that is making a chunk
 * would hang here (meson's timeout).
 */
static atomic_bool stop_churn;

static void *big_churn(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;

	while (!atomic_load(&stop_churn)) {
		size_t n = ((size_t)rand_r(&seed) % 64 + 1) << 16;     /* 64 KiB .. 4 MiB */
		char *p = malloc(n);

		CHECK(p, "malloc in a thread");
		p[0] = p[n - 1] = 1;
		free(p);
	}
	return NULL;
}

static void test_fork_under_load(void)
{
	pthread_t t[3];
	int st;

	for (int i = 0; i < 3; i++)
		CHECK(pthread_create(&t[i], NULL, big_churn, (void *)(uintptr_t)(i + 7)) == 0, "thread");
	for (int i = 0; i < 40; i++) {
		pid_t pid = fork();

		CHECK(pid >= 0, "fork");
		if (pid == 0) {
			char *p = malloc(1 << 20);

			_exit(p && in_segment(p) ? 0 : 1);
		}
		CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "a child forked under load allocates in a segment");
	}
	atomic_store(&stop_churn, true);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	OK("40 forks while 3 threads allocate");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1 && strcmp(argv[1], "--unpreloaded") == 0) {
		void *p = malloc(16 << 20);
		void *m = mmap(NULL, 16 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		CHECK(p && !in_segment(p) && m != MAP_FAILED && !in_segment(m),
		      "without the preload, nothing is in a segment");
		OK("off: malloc and mmap are the C library's and the kernel's");
		return 0;
	}
	if (argc > 1 && strcmp(argv[1], "--min-size") == 0) {
		/* ODPD_PRELOAD_MIN_SIZE=2M */
		void *p = malloc(1 << 20), *q = malloc(2 << 20);

		CHECK(p && !in_segment(p) && q && in_segment(q), "below 2M in the heap, 2M in a segment");
		OK("ODPD_PRELOAD_MIN_SIZE");
		return 0;
	}
	test_allocators();
	test_mmap();
	test_fork();
	test_threads();
	test_errno();
	test_closed_fds();
	test_mapping_patterns();
	test_fork_under_load();
	printf("preload-alloc: %u passed\n", n_ok);
	return 0;
}
