/* SPDX-License-Identifier: MIT */
/*
 * alloc.c - the program's large allocations, in segments odpd can map.
 *
 * odpd registers only memory it can map itself, which means memfd segments
 * (doc/design.md §2); a program under odpd-run allocates with malloc and
 * its family. So every allocation of ODPD_PRELOAD_MIN_SIZE bytes or more is
 * served by jemalloc, from an arena of its own whose extent hooks take
 * memory from *chunks*: each a sealed memfd (F_SEAL_SHRINK | F_SEAL_GROW),
 * mapped MAP_SHARED at an address inside a window this library reserves at
 * start. A registration of such a buffer is then an attachment of its chunk
 * (once) and a registration: nothing is copied, and the address is the one
 * the program already holds. Smaller allocations go to the C library's own
 * malloc (__libc_malloc and its kin), as before; free() tells the two apart
 * by the window. jemalloc does the allocator's work (size classes, splitting
 * and coalescing, decay); we only hand it chunks and give pages back
 * (FALLOC_FL_PUNCH_HOLE: a shared mapping's pages are the file's, so
 * MADV_DONTNEED would free nothing). doc/design.md says why jemalloc.
 *
 * Chunks are never unmapped: their address space is jemalloc's to reuse.
 * An MR odpd holds over a range the program freed keeps its pages until it
 * is deregistered (the kernel's rule for any MR); a range that is freed,
 * purged and reused is the same segment with new pages, and odpd notices the
 * punched hole (the inode's ctime) before it serves a cached MR there.
 *
 * fork(): the chunks are MAP_SHARED, so a child would share writes with its
 * parent. The child therefore replaces each chunk with a private copy before
 * fork() returns in it (the data ranges of the old memfd, SEEK_DATA, into a
 * new memfd mapped at the same address), and the parent waits until it has.
 * posix_spawn and vfork children (system(), popen()) run no fork handlers
 * and copy nothing; they exec at once.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <jemalloc/jemalloc.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "preload.h"

/* The C library's allocator, which the program would have used. */
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

#define PUBLIC __attribute__((visibility("default")))
#define CHUNKS_MAX 4096                 /* a chunk is 2 MiB or more */
#define CHUNK_ALIGN ((uintptr_t)2 << 20)
#define DEFAULT_MIN_SIZE ((size_t)32 << 10)
#define DEFAULT_WINDOW ((size_t)1 << 40)

enum { INIT_NOT, INIT_RUNNING, INIT_DONE };

static struct {
	_Atomic int init;
	bool on;
	size_t min_size;                /* SIZE_MAX until the arena exists */
	uintptr_t base, size;           /* the window; size 0: none */
	uintptr_t next;                 /* first free address in it, under lock */
	int flags;                      /* mallocx flags: our arena, no tcache */
	pthread_mutex_t lock;           /* chunk creation */
	_Atomic unsigned n;             /* chunks published */
	struct preload_chunk chunks[CHUNKS_MAX];
	int fork_pipe[2];               /* the child says it has copied */
	atomic_bool fixed_logged;
} P = {
	.min_size = SIZE_MAX,
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.fork_pipe = { -1, -1 },
};

/* The program's anonymous mappings in chunks (see "anonymous private mmap" below). */
struct anon {
	uintptr_t base;
	size_t size;                    /* bytes, whole pages */
	int prot;
	size_t mapped;                  /* pages still mapped */
	uint64_t *gone;                 /* a bit per page unmapped */
};

static struct {
	pthread_mutex_t lock;
	struct anon *v;                 /* sorted by base */
	unsigned n, cap;
} A = { .lock = PTHREAD_MUTEX_INITIALIZER };

/*
 * Set while this thread is inside jemalloc: jemalloc maps its own metadata
 * and default arena with mmap(), which is ours below; those calls must go to
 * the kernel, never back into jemalloc.
 */
static _Thread_local int in_je __attribute__((tls_model("initial-exec")));

static inline void *je_alloc(size_t n, int flags)
{
	void *p;

	in_je++;
	p = mallocx(n, flags);
	in_je--;
	return p;
}

static inline void *je_realloc(void *p, size_t n, int flags)
{
	in_je++;
	p = rallocx(p, n, flags);
	in_je--;
	return p;
}

static inline void je_free(void *p)
{
	int e = errno;                  /* free() leaves errno alone (POSIX.1-2024) */

	in_je++;
	dallocx(p, MALLOCX_TCACHE_NONE);
	in_je--;
	errno = e;
}

static inline size_t je_size(void *p)
{
	size_t n;

	in_je++;
	n = sallocx(p, 0);
	in_je--;
	return n;
}

static void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);

	return r < 0 && r > -4096 ? MAP_FAILED : (void *)r;
}

/* ---------------------------------------------------------------- logging */

void preload_log(const char *fmt, ...)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "odpd-preload[%d]: ", (int)getpid());
	va_list ap;

	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(line))
		n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line) - 1)
		n = (int)sizeof(line) - 2;
	line[n++] = '\n';
	for (char *p = line; n > 0;) {
		ssize_t w = write(STDERR_FILENO, p, (size_t)n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		p += w;
		n -= (int)w;
	}
}

bool preload_parse_size(const char *s, size_t *ret)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	if (!s || !*s || *s == '-')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return false;
	switch (*end) {
	case 'k': case 'K': shift = 10; end++; break;
	case 'm': case 'M': shift = 20; end++; break;
	case 'g': case 'G': shift = 30; end++; break;
	case 't': case 'T': shift = 40; end++; break;
	}
	if (*end == 'i' && shift)
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || (shift && v > (SIZE_MAX >> shift)))
		return false;
	*ret = (size_t)v << shift;
	return true;
}

/* ---------------------------------------------------------------- chunks */

static inline bool in_window(const void *p)
{
	return (uintptr_t)p - P.base < P.size;
}

struct preload_chunk *preload_chunk_find(uintptr_t addr, size_t length)
{
	unsigned lo = 0, hi = atomic_load_explicit(&P.n, memory_order_acquire);

	if (!in_window((void *)addr))
		return NULL;
	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;
		struct preload_chunk *k = &P.chunks[mid];

		if (addr < k->base)
			hi = mid;
		else if (addr - k->base >= k->length)
			lo = mid + 1;
		else
			return length <= k->length - (addr - k->base) ? k : NULL;
	}
	return NULL;
}

bool preload_alloc_on(void)
{
	return atomic_load_explicit(&P.init, memory_order_acquire) == INIT_DONE && P.on;
}

size_t preload_min_size(void)
{
	return P.min_size;
}

static int new_memfd(size_t size)
{
	int fd = memfd_create("odpd-preload", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -1;
	if (ftruncate(fd, (off_t)size) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* A new chunk of @size bytes at an address aligned to @align, or NULL. */
/* The next @size bytes of the window at @align, or 0. Caller holds P.lock. */
static uintptr_t window_take(size_t size, size_t align)
{
	uintptr_t a = (P.next + align - 1) & ~(uintptr_t)(align - 1);

	if (a < P.next || a - P.base > P.size || size > P.size - (a - P.base))
		return 0;
	return a;
}

bool preload_chunk_fd_ok(const struct preload_chunk *k)
{
	struct stat st;
	int e = errno;
	bool ok = fstat(k->fd, &st) == 0 && (uint64_t)st.st_ino == k->ino &&
		  (uint64_t)st.st_dev == k->dev;

	errno = e;
	return ok;
}

static void *chunk_new(size_t size, size_t align)
{
	struct preload_chunk *k;
	uintptr_t a;
	struct stat st;
	void *p = NULL;
	int fd;

	if (align < CHUNK_ALIGN)
		align = CHUNK_ALIGN;
	pthread_mutex_lock(&P.lock);
	a = window_take(size, align);
	if (atomic_load_explicit(&P.n, memory_order_relaxed) >= CHUNKS_MAX || !a)
		goto out;
	fd = new_memfd(size);
	if (fd < 0)
		goto out;
	if (fstat(fd, &st) < 0 ||
	    mmap((void *)a, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		close(fd);
		goto out;
	}
	k = &P.chunks[atomic_load_explicit(&P.n, memory_order_relaxed)];
	*k = (struct preload_chunk){ .base = a, .length = size, .fd = fd, .ino = st.st_ino,
				     .dev = st.st_dev };
	atomic_fetch_add_explicit(&P.n, 1, memory_order_release);
	P.next = a + size;
	p = (void *)a;
out:
	pthread_mutex_unlock(&P.lock);
	return p;
}

static struct preload_chunk *chunk_of(const void *addr)
{
	return preload_chunk_find((uintptr_t)addr, 1);
}

/* Give the pages of [@addr, +@length) back: the next read sees zeros. */
/* Give the pages of [@addr, +@length) back: the next read sees zeros. Through
 * the mapping (MADV_REMOVE punches the memfd), not the fd, which the program
 * may have closed; errno is left as it was. true on failure. */
static bool chunk_punch(void *addr, size_t length)
{
	struct preload_chunk *k = chunk_of(addr);
	int e = errno;
	bool failed;

	if (!k || length > k->length - ((uintptr_t)addr - k->base))
		return true;
	failed = syscall(SYS_madvise, addr, length, MADV_REMOVE) != 0;
	errno = e;
	return failed;
}

/* ---------------------------------------------------------------- jemalloc's extent hooks */

/*
 * jemalloc keeps an arena's own metadata (its "base": extent records,
 * bitmaps, the arena's mutexes) in blocks it asks the same hooks for. Those
 * must not be in a chunk: a chunk is shared with a child until the child's
 * fork handler has copied it, and jemalloc's own child handler, which runs
 * first, rewrites its mutexes. jemalloc 5.3 (src/base.c, base_map) asks for
 * base blocks aligned to a huge page and for every extent of data at page
 * alignment (src/extent.c, extent_grow_retained, with opt.retain, the
 * default on Linux), so a request aligned to 2 MiB or more is metadata and
 * gets private anonymous memory. alloc_start() checks the version and that
 * opt.retain is on.
 */
static void *meta_alloc(size_t size, size_t align)
{
	uintptr_t a;
	void *p = NULL;

	/* in the window too, so that free() knows it as jemalloc's (retain's
	 * fallback may put data here), but private: a child gets it by COW */
	pthread_mutex_lock(&P.lock);
	a = window_take(size, align);
	if (a && sys_mmap((void *)a, size, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
		P.next = a + size;
		p = (void *)a;
	}
	pthread_mutex_unlock(&P.lock);
	return p;
}

static void *hook_alloc(extent_hooks_t *h, void *new_addr, size_t size, size_t align,
			bool *zero, bool *commit, unsigned arena)
{
	void *p;

	(void)h; (void)arena;
	if (new_addr)                   /* growing in place: the next chunk is not contiguous */
		return NULL;
	p = align >= CHUNK_ALIGN ? meta_alloc(size, align) : chunk_new(size, align);
	if (p) {
		*zero = true;           /* new memfd or anonymous pages read as zeros */
		*commit = true;
	}
	return p;
}

/* Opt out: the chunk stays, jemalloc keeps the extent for reuse (retained). */
static bool hook_dalloc(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned arena)
{
	(void)h; (void)addr; (void)size; (void)committed; (void)arena;
	return true;
}

static void hook_destroy(extent_hooks_t *h, void *addr, size_t size, bool committed, unsigned arena)
{
	(void)h; (void)committed; (void)arena;
	chunk_punch(addr, size);
}

static bool hook_commit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len,
			unsigned arena)
{
	(void)h; (void)addr; (void)size; (void)off; (void)len; (void)arena;
	return false;                   /* always committed */
}

static bool hook_decommit(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len,
			  unsigned arena)
{
	(void)h; (void)addr; (void)size; (void)off; (void)len; (void)arena;
	return true;                    /* not supported: stays committed */
}

static bool hook_purge(extent_hooks_t *h, void *addr, size_t size, size_t off, size_t len,
		       unsigned arena)
{
	(void)h; (void)size; (void)arena;
	return chunk_punch((char *)addr + off, len);
}

static bool hook_split(extent_hooks_t *h, void *addr, size_t size, size_t size_a, size_t size_b,
		       bool committed, unsigned arena)
{
	(void)h; (void)addr; (void)size; (void)size_a; (void)size_b; (void)committed; (void)arena;
	return false;                   /* an extent lies in one chunk, and so do its parts */
}

/* Merge only inside one chunk: a registration must find its range in one segment. */
static bool hook_merge(extent_hooks_t *h, void *addr_a, size_t size_a, void *addr_b, size_t size_b,
		       bool committed, unsigned arena)
{
	(void)h; (void)size_a; (void)size_b; (void)committed; (void)arena;
	return !chunk_of(addr_a) || chunk_of(addr_a) != chunk_of(addr_b);
}

static extent_hooks_t hooks = {
	.alloc = hook_alloc,
	.dalloc = hook_dalloc,
	.destroy = hook_destroy,
	.commit = hook_commit,
	.decommit = hook_decommit,
	.purge_lazy = hook_purge,
	.purge_forced = hook_purge,
	.split = hook_split,
	.merge = hook_merge,
};

/* ---------------------------------------------------------------- fork */

/*
 * No chunk is half made while fork() runs: chunks are made only inside
 * jemalloc, whose own fork handler (registered by its constructor, before
 * ours, so run after ours) waits for every allocation in progress. P.lock is
 * not taken here: a thread that holds one of jemalloc's locks may be waiting
 * for it in chunk_new(). jemalloc's metadata is not in the chunks
 * (meta_alloc), so its child handler, which runs before ours, writes only
 * the child's own memory.
 */
static void fork_prepare(void)
{
	preload_verbs_lock();
	pthread_mutex_lock(&A.lock);
	if (atomic_load_explicit(&P.n, memory_order_acquire) > 0 &&
	    pipe2(P.fork_pipe, O_CLOEXEC) < 0)
		P.fork_pipe[0] = P.fork_pipe[1] = -1;
}

static void fork_parent(void)
{
	char b;

	if (P.fork_pipe[1] >= 0) {
		/* EOF once the child has copied its chunks (or died) */
		close(P.fork_pipe[1]);
		while (read(P.fork_pipe[0], &b, 1) < 0 && errno == EINTR)
			;
		close(P.fork_pipe[0]);
		P.fork_pipe[0] = P.fork_pipe[1] = -1;
	}
	pthread_mutex_unlock(&A.lock);
	preload_verbs_unlock();
}

/* Copy the data of @old (holes stay holes) into @new, both @length bytes. */
static int copy_data(int old, int new, size_t length)
{
	off_t off = 0;
	static char buf[1 << 16];

	for (;;) {
		off_t d = lseek(old, off, SEEK_DATA), h;

		if (d < 0)
			return errno == ENXIO ? 0 : -1;
		if ((size_t)d >= length)
			return 0;
		h = lseek(old, d, SEEK_HOLE);
		if (h < 0 || (size_t)h > length)
			h = (off_t)length;
		while (d < h) {
			size_t want = (size_t)(h - d) < sizeof(buf) ? (size_t)(h - d) : sizeof(buf);
			ssize_t n = pread(old, buf, want, d);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0 || pwrite(new, buf, (size_t)n, d) != n)
				return -1;
			d += n;
		}
		off = h;
	}
}

/* In the child: chunk @k becomes a private copy at the same address, same fd number. */
/* Copy what the mapping of @k holds, page by page where mincore() says there
 * is a page (holes stay holes), into @new. For a chunk whose fd the program
 * closed; pages it made unreadable are not copied. */
static int copy_mapped(const struct preload_chunk *k, int new)
{
	static unsigned char vec[4096];
	const size_t page = (size_t)sysconf(_SC_PAGESIZE), step = sizeof(vec) * page;

	for (size_t off = 0; off < k->length; off += step) {
		size_t n = k->length - off < step ? k->length - off : step;

		if (mincore((void *)(k->base + off), n, vec) < 0)
			return -1;
		for (size_t i = 0; i < (n + page - 1) / page; i++) {
			ssize_t w;

			if (!(vec[i] & 1))
				continue;
			w = pwrite(new, (void *)(k->base + off + i * page), page, (off_t)(off + i * page));
			if (w < 0 && errno != EFAULT)
				return -1;
		}
	}
	return 0;
}

/* In the child: chunk @k becomes a private copy at the same address (and, if
 * its fd is still the chunk's, the same fd number). If that fails, the chunk
 * is taken away from the child (an access faults) rather than shared. */
static void chunk_privatize(struct preload_chunk *k)
{
	struct stat st;
	int fd = memfd_create("odpd-preload", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	bool fd_ok = preload_chunk_fd_ok(k);

	if (fd < 0 || ftruncate(fd, (off_t)k->length) < 0 ||
	    (fd_ok ? copy_data(k->fd, fd, k->length) : copy_mapped(k, fd)) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
	    fstat(fd, &st) < 0 ||
	    sys_mmap((void *)k->base, k->length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0)
	    == MAP_FAILED)
		goto fail;
	if (fd_ok && dup3(fd, k->fd, O_CLOEXEC) >= 0) {
		close(fd);
		fd = k->fd;
	}
	k->fd = fd;
	k->ino = st.st_ino;
	k->dev = st.st_dev;
	return;
fail:
	preload_log("fork: could not give the child its own copy of [%p, +%zu) (%s): the child "
		    "loses it (an access faults) rather than share it with its parent",
		    (void *)k->base, k->length, strerror(errno));
	if (fd >= 0)
		close(fd);
	sys_mmap((void *)k->base, k->length, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	k->length = 0;                  /* no longer a chunk: nothing is found in it */
}

/* In the child: what the program unmapped or protected in its mappings stays so. */
static void anon_reprotect(void)
{
	const size_t page = (size_t)sysconf(_SC_PAGESIZE);

	for (unsigned i = 0; i < A.n; i++) {
		struct anon *a = &A.v[i];

		if (a->prot != (PROT_READ | PROT_WRITE))
			mprotect((void *)a->base, a->size, a->prot);
		for (size_t k = 0; k < a->size / page; k++)
			if (a->gone[k / 64] & ((uint64_t)1 << (k % 64)))
				mprotect((void *)(a->base + k * page), page, PROT_NONE);
	}
}

static void fork_child(void)
{
	unsigned n = atomic_load_explicit(&P.n, memory_order_relaxed);

	for (unsigned i = 0; i < n; i++) {
		chunk_privatize(&P.chunks[i]);
		P.chunks[i].seg = P.chunks[i].seg_conn = NULL;   /* the connection is the parent's */
	}
	anon_reprotect();
	if (P.fork_pipe[1] >= 0) {
		close(P.fork_pipe[0]);
		close(P.fork_pipe[1]);
		P.fork_pipe[0] = P.fork_pipe[1] = -1;
	}
	pthread_mutex_init(&P.lock, NULL);
	pthread_mutex_unlock(&A.lock);
	preload_verbs_fork_child();
}

/* ---------------------------------------------------------------- start */

static void alloc_start(void)
{
	const char *s = getenv("ODPD_PRELOAD"), *min = getenv("ODPD_PRELOAD_MIN_SIZE"),
		   *win = getenv("ODPD_PRELOAD_WINDOW");
	size_t min_size = DEFAULT_MIN_SIZE, window = DEFAULT_WINDOW, sz;
	extent_hooks_t *hp = &hooks;
	const char *version = NULL;
	bool retain = false;
	unsigned arena;
	void *w;
	int r;

	if (s && strcmp(s, "0") == 0)
		return;
	if (min && !preload_parse_size(min, &min_size)) {
		preload_log("ODPD_PRELOAD_MIN_SIZE=%s is not a size (bytes, or with K, M, G); "
			    "using %zu", min, DEFAULT_MIN_SIZE);
		min_size = DEFAULT_MIN_SIZE;
	}
	if (win && (!preload_parse_size(win, &window) || window < CHUNK_ALIGN)) {
		preload_log("ODPD_PRELOAD_WINDOW=%s is not a size of 2M or more; using 1T", win);
		window = DEFAULT_WINDOW;
	}
	window &= ~(CHUNK_ALIGN - 1);
	w = mmap(NULL, window + CHUNK_ALIGN, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (w == MAP_FAILED) {
		preload_log("cannot reserve %zu bytes of address space for segments (%s): "
			    "allocations stay in the C library's heap", window, strerror(errno));
		return;
	}
	P.base = P.next = ((uintptr_t)w + CHUNK_ALIGN - 1) & ~(CHUNK_ALIGN - 1);
	P.size = window;
	sz = sizeof(version);
	in_je++;
	r = mallctl("version", &version, &sz, NULL, 0);
	in_je--;
	if (r != 0 || strncmp(version, "5.3.", 4) != 0) {
		preload_log("jemalloc %s is not 5.3, whose hooks this library knows (meta_alloc): "
			    "allocations stay in the C library's heap", r ? "?" : version);
		P.size = 0;
		return;
	}
	sz = sizeof(retain);
	in_je++;
	r = mallctl("opt.retain", &retain, &sz, NULL, 0);
	in_je--;
	if (r != 0 || !retain) {
		preload_log("jemalloc runs without opt.retain (MALLOC_CONF?), which its hooks here "
			    "need (meta_alloc): allocations stay in the C library's heap");
		P.size = 0;
		return;
	}
	sz = sizeof(arena);
	in_je++;
	r = mallctl("arenas.create", &arena, &sz, &hp, sizeof(hp));
	in_je--;
	if (r != 0) {
		preload_log("jemalloc could not make an arena: allocations stay in the C library's heap");
		P.size = 0;
		return;
	}
	P.flags = (int)(MALLOCX_ARENA(arena) | MALLOCX_TCACHE_NONE);
	/*
	 * jemalloc purges a freed extent of 8 MiB or more at once (its
	 * oversize_threshold), ignoring decay: here a punched hole, so the next
	 * 16 MiB buffer faults every page again, in the program and in odpd's
	 * view, and odpd's cached MR over it can no longer be served. Our arena
	 * leaves that to decay, as it does smaller extents (bench/run-preload:
	 * a steady 16 MiB registration 33.9 -> 7.3 ms, malloc+free 28 ms -> 49 us).
	 */
	{
		char name[64];
		size_t never = SIZE_MAX;

		snprintf(name, sizeof(name), "arena.%u.oversize_threshold", arena);
		in_je++;
		if (mallctl(name, NULL, NULL, &never, sizeof(never)) != 0)
			preload_log("jemalloc: %s could not be set: large buffers are purged "
				    "at free", name);
		in_je--;
	}
	if (pthread_atfork(fork_prepare, fork_parent, fork_child) != 0) {
		preload_log("pthread_atfork failed: allocations stay in the C library's heap");
		return;
	}
	P.min_size = min_size ? min_size : 1;
	P.on = true;
}

/* true once the arena is ready; false while starting (a call from inside the start) */
static bool ready(void)
{
	int st = atomic_load_explicit(&P.init, memory_order_acquire);
	int want = INIT_NOT;

	if (st == INIT_DONE)
		return P.on;
	if (st == INIT_RUNNING ||
	    !atomic_compare_exchange_strong(&P.init, &want, INIT_RUNNING))
		return false;
	alloc_start();
	atomic_store_explicit(&P.init, INIT_DONE, memory_order_release);
	return P.on;
}

__attribute__((constructor)) static void alloc_constructor(void)
{
	ready();
}

/* ---------------------------------------------------------------- the C library's calls */

static inline bool big(size_t n)
{
	return n >= P.min_size && ready();
}

PUBLIC void *malloc(size_t n)
{
	if (big(n)) {
		void *p = je_alloc(n, P.flags);

		if (p)
			return p;
	}
	return __libc_malloc(n);
}

PUBLIC void free(void *p)
{
	if (in_window(p))
		je_free(p);
	else
		__libc_free(p);
}

PUBLIC void *calloc(size_t a, size_t b)
{
	size_t n;

	if (__builtin_mul_overflow(a, b, &n)) {
		errno = ENOMEM;
		return NULL;
	}
	if (big(n)) {
		void *p = je_alloc(n, P.flags | MALLOCX_ZERO);

		if (p)
			return p;
	}
	return __libc_calloc(a, b);
}

static size_t (*libc_usable_size)(void *);

static size_t libc_usable(void *p)
{
	if (!libc_usable_size)
		libc_usable_size = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
	return libc_usable_size ? libc_usable_size(p) : 0;
}

PUBLIC size_t malloc_usable_size(void *p)
{
	if (!p)
		return 0;
	return in_window(p) ? je_size(p) : libc_usable(p);
}

PUBLIC void *realloc(void *p, size_t n)
{
	void *q;

	if (!p)
		return malloc(n);
	if (n == 0) {
		free(p);
		return NULL;
	}
	if (in_window(p)) {
		q = je_realloc(p, n, P.flags);
		if (!q)
			errno = ENOMEM;
		return q;
	}
	if (big(n) && (q = je_alloc(n, P.flags))) {
		size_t old = libc_usable(p);

		memcpy(q, p, old < n ? old : n);
		__libc_free(p);
		return q;
	}
	return __libc_realloc(p, n);
}

PUBLIC void *reallocarray(void *p, size_t a, size_t b)
{
	size_t n;

	if (__builtin_mul_overflow(a, b, &n)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, n);
}

static inline bool power_of_two(size_t a)
{
	return a && !(a & (a - 1));
}

PUBLIC void *memalign(size_t align, size_t n)
{
	if (big(n) && power_of_two(align)) {
		void *p = je_alloc(n, P.flags | (int)MALLOCX_ALIGN(align));

		if (p)
			return p;
	}
	return __libc_memalign(align, n);
}

PUBLIC void *aligned_alloc(size_t align, size_t n)
{
	return memalign(align, n);
}

PUBLIC int posix_memalign(void **ret, size_t align, size_t n)
{
	void *p;

	if (!power_of_two(align) || align % sizeof(void *))
		return EINVAL;
	p = memalign(align, n);
	if (!p && n)
		return ENOMEM;
	*ret = p;
	return 0;
}

PUBLIC void *valloc(size_t n)
{
	if (big(n))
		return memalign((size_t)sysconf(_SC_PAGESIZE), n);
	return __libc_valloc(n);
}

PUBLIC void *pvalloc(size_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), r;

	if (__builtin_add_overflow(n, page - 1, &r)) {
		errno = ENOMEM;
		return NULL;
	}
	r &= ~(page - 1);
	if (big(r))
		return memalign(page, r);
	return __libc_pvalloc(n);
}

/* ---------------------------------------------------------------- anonymous private mmap */

/*
 * An anonymous private mapping of ODPD_PRELOAD_MIN_SIZE bytes or more is an
 * allocation of our arena too (page aligned, zeroed), so that it can be
 * registered like a malloc'd buffer. What the program then does to it keeps
 * the meaning it has for a private anonymous mapping:
 *   munmap     of any part: its pages are given back (punched) and made
 *              PROT_NONE, so that a later access faults as it would; once
 *              every page is unmapped, the allocation goes back to jemalloc;
 *   mremap     moves (MREMAP_MAYMOVE) by a new mapping and a copy; shrinks in
 *              place; does not grow in place (ENOMEM, as when the kernel
 *              finds no room);
 *   madvise    MADV_DONTNEED, MADV_FREE and MADV_REMOVE give the pages back
 *              (the next read sees zeros, as for private anonymous memory;
 *              on a shared mapping MADV_DONTNEED alone would keep the data).
 * Every other mapping goes to the kernel unchanged (a syscall, so that no
 * lookup of the next symbol is needed this early), as do jemalloc's own.
 */

static size_t page_size(void)
{
	static size_t page;

	if (!page)
		page = (size_t)sysconf(_SC_PAGESIZE);
	return page;
}


/* The mapping record holding @addr, or NULL. Caller holds A.lock. */
static struct anon *anon_find(uintptr_t addr, unsigned *ret_i)
{
	unsigned lo = 0, hi = A.n;

	while (lo < hi) {
		unsigned mid = lo + (hi - lo) / 2;

		if (addr < A.v[mid].base)
			hi = mid;
		else if (addr - A.v[mid].base >= A.v[mid].size)
			lo = mid + 1;
		else {
			if (ret_i)
				*ret_i = mid;
			return &A.v[mid];
		}
	}
	if (ret_i)
		*ret_i = lo;
	return NULL;
}

static bool anon_add(uintptr_t base, size_t size, int prot)
{
	size_t pages = size / page_size(), words = (pages + 63) / 64;
	uint64_t *gone = __libc_calloc(words, sizeof(*gone));
	unsigned i;
	bool ok = false;

	if (!gone)
		return false;
	pthread_mutex_lock(&A.lock);
	if (A.n == A.cap) {
		unsigned cap = A.cap ? A.cap * 2 : 64;
		struct anon *v = __libc_realloc(A.v, cap * sizeof(*v));

		if (!v)
			goto out;
		A.v = v;
		A.cap = cap;
	}
	anon_find(base, &i);
	memmove(&A.v[i + 1], &A.v[i], (A.n - i) * sizeof(*A.v));
	A.v[i] = (struct anon){ .base = base, .size = size, .prot = prot, .mapped = pages, .gone = gone };
	A.n++;
	ok = true;
out:
	pthread_mutex_unlock(&A.lock);
	if (!ok)
		__libc_free(gone);
	return ok;
}

static void *anon_map(size_t len, int prot, int flags)
{
	size_t page = page_size(), size = (len + page - 1) & ~(page - 1);
	void *p;

	if (size < len)
		return NULL;
	p = je_alloc(size, P.flags | (int)MALLOCX_ALIGN(page) | MALLOCX_ZERO);
	if (!p)
		return NULL;
	if (!anon_add((uintptr_t)p, size, prot)) {
		je_free(p);
		return NULL;
	}
	if (prot != (PROT_READ | PROT_WRITE))
		mprotect(p, size, prot);
	if ((flags & MAP_POPULATE) && (prot & PROT_WRITE))
		madvise(p, size, MADV_POPULATE_WRITE);
	return p;
}

/* Unmap [@start, @end) of @a (page aligned, inside it). Caller holds A.lock;
 * returns the allocation to free once nothing of it is mapped, else NULL. */
static void *anon_unmap(struct anon *a, unsigned i, uintptr_t start, uintptr_t end)
{
	size_t page = page_size();
	void *whole = NULL;

	for (uintptr_t p = start; p < end; p += page) {
		size_t k = (p - a->base) / page;

		if (!(a->gone[k / 64] & ((uint64_t)1 << (k % 64)))) {
			a->gone[k / 64] |= (uint64_t)1 << (k % 64);
			a->mapped--;
		}
	}
	chunk_punch((void *)start, end - start);
	if (a->mapped > 0) {
		mprotect((void *)start, end - start, PROT_NONE);
		return NULL;
	}
	/* all gone: back to jemalloc, readable and writable as it expects */
	mprotect((void *)a->base, a->size, PROT_READ | PROT_WRITE);
	whole = (void *)a->base;
	__libc_free(a->gone);
	memmove(&A.v[i], &A.v[i + 1], (A.n - i - 1) * sizeof(*A.v));
	A.n--;
	return whole;
}

/*
 * MAP_FIXED over [@addr, +@len) inside the window: an anonymous private
 * mapping over one of the program's own mappings here (a runtime committing
 * what it reserved) gets fresh zeroed pages with @prot, as the kernel would
 * give; anything else would put memory the preload does not know inside a
 * chunk, and is refused (EINVAL).
 */
static void *anon_fixed(void *addr, size_t len, int prot, int flags)
{
	size_t page = page_size();
	uintptr_t start = (uintptr_t)addr, end = (start + len + page - 1) & ~(page - 1);
	struct anon *a;

	if ((start & (page - 1)) || !len || end < start) {
		errno = EINVAL;
		return MAP_FAILED;
	}
	pthread_mutex_lock(&A.lock);
	a = anon_find(start, NULL);
	if (!a || end - a->base > a->size || !(flags & MAP_ANONYMOUS) ||
	    (flags & MAP_TYPE) != MAP_PRIVATE || (flags & MAP_FIXED_NOREPLACE)) {
		pthread_mutex_unlock(&A.lock);
		errno = a && (flags & MAP_FIXED_NOREPLACE) ? EEXIST : EINVAL;
		if (errno == EINVAL && !atomic_exchange(&P.fixed_logged, true))
			preload_log("mmap(MAP_FIXED) over the preload's segments, other than an anonymous "
				    "private mapping over the program's own: refused (EINVAL)");
		return MAP_FAILED;
	}
	chunk_punch(addr, end - start);
	for (uintptr_t p = start; p < end; p += page) {
		size_t k = (p - a->base) / page;

		if (a->gone[k / 64] & ((uint64_t)1 << (k % 64))) {
			a->gone[k / 64] &= ~((uint64_t)1 << (k % 64));
			a->mapped++;
		}
	}
	mprotect(addr, end - start, prot);
	pthread_mutex_unlock(&A.lock);
	return addr;
}

static void *preload_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	const int special = MAP_FIXED | MAP_FIXED_NOREPLACE | MAP_HUGETLB | MAP_GROWSDOWN |
			    MAP_STACK | MAP_LOCKED | MAP_32BIT;

	if (in_je)
		return sys_mmap(addr, len, prot, flags, fd, off);
	if ((flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) && P.size &&
	    (uintptr_t)addr < P.base + P.size && (uintptr_t)addr + len > P.base)
		return anon_fixed(addr, len, prot, flags);
	/* PROT_NONE is a reservation (a runtime's heap to come), never a buffer */
	if (!addr && (flags & MAP_ANONYMOUS) && (flags & MAP_TYPE) == MAP_PRIVATE &&
	    !(flags & special) && prot != PROT_NONE && big(len)) {
		void *p = anon_map(len, prot, flags);

		if (p)
			return p;
	}
	return sys_mmap(addr, len, prot, flags, fd, off);
}

/* mmap and mmap64 (the same call on 64-bit; <sys/mman.h> may rename one to the other) */
PUBLIC void *preload_mmap_sym(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__asm__("mmap");
PUBLIC void *preload_mmap_sym(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return preload_mmap(addr, len, prot, flags, fd, off);
}

PUBLIC void *preload_mmap64_sym(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__asm__("mmap64");
PUBLIC void *preload_mmap64_sym(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return preload_mmap(addr, len, prot, flags, fd, off);
}

PUBLIC int munmap(void *addr, size_t len)
{
	uintptr_t start = (uintptr_t)addr, end;
	size_t page = page_size();
	struct anon *a;
	void *whole;
	unsigned i;

	if (in_je || !in_window(addr))
		return (int)syscall(SYS_munmap, addr, len);
	end = (start + len + page - 1) & ~(page - 1);
	if ((start & (page - 1)) || !len || end < start) {
		errno = EINVAL;
		return -1;
	}
	pthread_mutex_lock(&A.lock);
	a = anon_find(start, &i);
	if (!a || end - a->base > a->size) {
		pthread_mutex_unlock(&A.lock);
		/* not a mapping of the program's: leave the allocator's memory alone */
		errno = EINVAL;
		return -1;
	}
	whole = anon_unmap(a, i, start, end);
	pthread_mutex_unlock(&A.lock);
	if (whole)
		je_free(whole);
	return 0;
}

/* The protection the kernel has for the page at @addr now (the program may
 * have changed it with mprotect), else @dflt. */
static int current_prot(uintptr_t addr, int dflt)
{
	FILE *f = fopen("/proc/self/maps", "re");
	char line[512], perms[8];
	unsigned long s, e;
	int prot = dflt;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "%lx-%lx %7s", &s, &e, perms) == 3 && addr >= s && addr < e) {
			prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
			       (perms[2] == 'x' ? PROT_EXEC : 0);
			break;
		}
	if (f)
		fclose(f);
	return prot;
}

PUBLIC void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	size_t page = page_size(), n = (new_len + page - 1) & ~(page - 1), old_n;
	void *fixed = NULL, *q;
	struct anon *a;
	bool ok;
	int prot;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		fixed = va_arg(ap, void *);
		va_end(ap);
	}
	if (in_je || !in_window(old))
		return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, fixed);
	old_n = (old_len + page - 1) & ~(page - 1);
	pthread_mutex_lock(&A.lock);
	a = anon_find((uintptr_t)old, NULL);
	ok = a && a->base == (uintptr_t)old && old_n <= a->size && old_len && new_len &&
	     !(flags & (MREMAP_FIXED | MREMAP_DONTUNMAP));
	for (size_t k = 0; ok && k < old_n / page; k++)
		ok = !(a->gone[k / 64] & ((uint64_t)1 << (k % 64)));   /* all still mapped */
	prot = ok ? a->prot : 0;
	pthread_mutex_unlock(&A.lock);
	if (!ok) {
		errno = EINVAL;
		return MAP_FAILED;
	}
	if (n <= old_n) {
		if (n < old_n && munmap((char *)old + n, old_n - n) < 0)
			return MAP_FAILED;
		return old;
	}
	if (!(flags & MREMAP_MAYMOVE)) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	q = anon_map(new_len, PROT_READ | PROT_WRITE, 0);
	if (!q) {
		errno = ENOMEM;
		return MAP_FAILED;
	}
	prot = current_prot((uintptr_t)old, prot);
	if (!(prot & PROT_READ))
		mprotect(old, old_n, PROT_READ);
	memcpy(q, old, old_len);
	if (prot != (PROT_READ | PROT_WRITE))
		mprotect(q, n, prot);
	munmap(old, old_len);
	return q;
}

PUBLIC int madvise(void *addr, size_t len, int advice)
{
	if (!in_je && in_window(addr) &&
	    (advice == MADV_DONTNEED || advice == MADV_FREE || advice == MADV_REMOVE)) {
		struct preload_chunk *k = chunk_of(addr);
		size_t page = page_size(), n = (len + page - 1) & ~(page - 1);

		if ((uintptr_t)addr & (page - 1)) {
			errno = EINVAL;         /* as the kernel says */
			return -1;
		}
		if (k && n >= len && n <= k->length - ((uintptr_t)addr - k->base)) {
			if (chunk_punch(addr, n)) {
				errno = EINVAL;
				return -1;
			}
			return 0;
		}
	}
	return (int)syscall(SYS_madvise, addr, len, advice);
}
