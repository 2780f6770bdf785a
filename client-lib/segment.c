/* SPDX-License-Identifier: MIT */
/*
 * segment.c - segments: sealed memfds that the daemon maps too.
 *
 * odpd_alloc() and odpd_attach(fd, NULL, 0) let the daemon pick the address
 * and map the file at that same address here (MAP_FIXED_NOREPLACE), so that
 * iova == address on both sides. If the address is taken here, the segment
 * is detached, mapped anywhere, and attached again at that address.
 * odpd_attach(fd, addr, length) attaches a mapping the caller made.
 * segment_populate() faults a range in here before a pinned registration,
 * in parallel chunks when it is large; odpd_populate() does it on request.
 */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "libodpd-private.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
/* Linux 5.14; older headers lack them (older kernels answer EINVAL). */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define SEALS_REQUIRED (F_SEAL_SHRINK | F_SEAL_GROW)

/* What the daemon said about an attached segment. */
struct seg_reply {
	uint64_t handle;
	uint64_t addr;
	uint64_t length;
};

/* ---------------------------------------------------------------- requests */

static int detach_request(struct odpd_conn *c, const char *what, uint64_t handle)
{
	Odpd__DetachSegment d = ODPD__DETACH_SEGMENT__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;

	d.has_segment = true;
	d.segment = handle;
	req.body_case = ODPD__REQUEST__BODY_DETACH_SEGMENT;
	req.detach_segment = &d;
	return conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY__NOT_SET, NULL);
}

/*
 * odpd maps its own view of [@addr, @addr + @length) of @seg, which this
 * process has just faulted in (MapSegment), so that registrations there do
 * not wait for it. A hint: a daemon older than libodpd 1.4 (EOPNOTSUPP) or
 * any other refusal changes nothing for the caller.
 */
static void map_request(struct odpd_segment *seg, const char *what, const void *addr, size_t length)
{
	Odpd__MapSegment m = ODPD__MAP_SEGMENT__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	struct odpd_conn *c = seg->conn;

	m.has_segment = m.has_offset = m.has_length = true;
	m.segment = seg->handle;
	m.offset = (uintptr_t)addr - (uintptr_t)seg->addr;
	m.length = length;
	req.body_case = ODPD__REQUEST__BODY_MAP_SEGMENT;
	req.map_segment = &m;
	pthread_mutex_lock(&c->lock);
	conn_call(c, what, &req, NULL, 0, ODPD__REPLY__BODY__NOT_SET, NULL);   /* checks c first */
	pthread_mutex_unlock(&c->lock);
	errmsg_clear();
}

/* Check what the daemon answered; a bad answer is detached again. */
static int attach_reply(struct odpd_conn *c, const char *what, const Odpd__SegmentReply *s,
			uint64_t client_addr, struct seg_reply *ret)
{
	uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
	bool ok = s->has_addr && s->addr != 0 && s->addr % page == 0 &&
		  s->has_length && s->length != 0 &&
		  (client_addr == 0 || s->addr == client_addr);

	if (!s->has_segment)
		return errmsg_set(-EIO, "%s: the daemon's reply names no segment", what);
	if (!ok) {
		detach_request(c, what, s->segment);
		return errmsg_set(-EIO, "%s: the daemon's reply has an invalid address or length", what);
	}
	ret->handle = s->segment;
	ret->addr = s->addr;
	ret->length = s->length;
	return 0;
}

static int attach_request(struct odpd_conn *c, const char *what, int fd, uint64_t client_addr,
			  uint64_t file_offset, uint64_t length, struct seg_reply *ret)
{
	Odpd__AttachSegment a = ODPD__ATTACH_SEGMENT__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *reply = NULL;
	int r;

	a.has_client_addr = a.has_file_offset = a.has_length = true;
	a.client_addr = client_addr;
	a.file_offset = file_offset;
	a.length = length;
	req.body_case = ODPD__REQUEST__BODY_ATTACH_SEGMENT;
	req.attach_segment = &a;
	r = conn_call(c, what, &req, &fd, 1, ODPD__REPLY__BODY_SEGMENT, &reply);
	if (r < 0)
		return r;
	r = attach_reply(c, what, reply->segment, client_addr, ret);
	conn_reply_free(c, reply);
	return r;
}

/* ---------------------------------------------------------------- the table */

static void segment_insert(struct odpd_conn *c, struct odpd_segment *seg)
{
	seg->conn = c;
	tables_lock(c);
	link_add_tail(&c->segments, &seg->link);
	tables_unlock(c);
}

static void segment_free(struct odpd_segment *seg)
{
	if (seg->owns_map)
		munmap(seg->addr, seg->length);
	if (seg->owns_fd)
		close(seg->fd);
	free(seg);
}

void segments_release_all(struct odpd_conn *c)
{
	struct odpd_link *l, *tmp;

	link_for_each_safe(l, tmp, &c->segments) {
		link_del(l);
		segment_free(container_of(l, struct odpd_segment, link));
	}
}

int segment_lookup(struct odpd_conn *c, const char *what, const void *addr, size_t length,
		   struct odpd_segment **ret_seg)
{
	uintptr_t a = (uintptr_t)addr;
	struct odpd_link *l;

	if (length == 0)
		return errmsg_set(-EINVAL, "%s: length is 0", what);
	if (a + length < a)
		return errmsg_set(-EINVAL, "%s: %p + %zu overflows", what, addr, length);
	for (l = c->segments.next; l != &c->segments; l = l->next) {
		struct odpd_segment *s = container_of(l, struct odpd_segment, link);
		uintptr_t start = (uintptr_t)s->addr;

		if (a >= start && a + length <= start + s->length) {
			*ret_seg = s;
			return 0;
		}
	}
	return errmsg_set(-EINVAL, "%s: [%p, %p) is not inside a segment of this connection: "
			  "allocate the buffer with odpd_alloc() or attach its memfd with "
			  "odpd_attach() (libodpd never copies)", what, addr, (void *)(a + length));
}

/* ---------------------------------------------------------------- populate */

static int populate_one(void *start, size_t length, int advice)
{
	int r;

	do
		r = madvise(start, length, advice);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : 0;
}

/*
 * Faulting pages in is mostly zeroing them, which scales with CPUs: a range
 * of twice POPULATE_CHUNK_MIN or more is split into parts of at least
 * POPULATE_CHUNK_MIN, at most populate_threads() of them, each on a thread
 * of its own (this one runs the first).
 */
#define POPULATE_CHUNK_MIN (8ul << 20)
#define POPULATE_THREADS_MAX 8u

/* CPUs in the calling thread's affinity mask (sched_getaffinity(2) of tid
 * 0), for any number of CPUs; 1 if unknown. */
static unsigned thread_cpus(void)
{
	for (size_t ncpu = 1024; ncpu <= (1u << 20); ncpu *= 4) {
		cpu_set_t *set = CPU_ALLOC(ncpu);
		size_t size = CPU_ALLOC_SIZE(ncpu);
		int n = -1;

		if (!set)
			return 1;
		if (sched_getaffinity(0, size, set) == 0)
			n = CPU_COUNT_S(size, set);
		CPU_FREE(set);
		if (n >= 0)
			return n > 0 ? (unsigned)n : 1;
		if (errno != EINVAL)            /* EINVAL: the mask is larger */
			return 1;
	}
	return 1;
}

/*
 * How many parts (threads, this one included) a large range may be split
 * into now: ODPD_POPULATE_THREADS=N if set (1: never split), else the CPUs
 * the calling thread may run on, at most 8. Asked at each call: an MPI rank
 * pinned to one core splits nothing, and the helper threads, which inherit
 * the caller's mask, run on its CPUs only.
 */
unsigned populate_threads(void)
{
	const char *env = getenv("ODPD_POPULATE_THREADS");
	unsigned n;

	if (env && *env) {
		char *end;
		unsigned long v = strtoul(env, &end, 10);

		if (!*end && v >= 1)
			return v < 64 ? (unsigned)v : 64;
	}
	n = thread_cpus();
	return n < POPULATE_THREADS_MAX ? n : POPULATE_THREADS_MAX;
}

struct populate_part {
	uint8_t *start;
	size_t length;
	int advice, r;
	pthread_t thread;
	bool started;
};

static void *populate_thread(void *arg)
{
	struct populate_part *p = arg;

	p->r = populate_one(p->start, p->length, p->advice);
	return NULL;
}

/* [start, start + length) (whole pages) with @advice, in parts on helper
 * threads (signals blocked there: the application's handlers never run on
 * them) and this one. The first error of any part. */
static int populate(void *start, size_t length, int advice)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = length / page, per;
	unsigned n = populate_threads();
	struct populate_part parts[64];
	sigset_t all, old;
	int r = 0;

	if (length / POPULATE_CHUNK_MIN < n)
		n = (unsigned)(length / POPULATE_CHUNK_MIN);
	if (n <= 1)
		return populate_one(start, length, advice);
	per = (pages + n - 1) / n;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (unsigned i = 0; i < n; i++) {
		size_t first = per * i, count = first >= pages ? 0 : pages - first < per ? pages - first : per;

		parts[i] = (struct populate_part){ .start = (uint8_t *)start + first * page,
						   .length = count * page, .advice = advice };
		/* part 0 runs here; a thread that cannot start runs here too */
		if (i > 0 && count)
			parts[i].started = pthread_create(&parts[i].thread, NULL, populate_thread,
							  &parts[i]) == 0;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	for (unsigned i = 0; i < n; i++) {
		if (parts[i].started)
			pthread_join(parts[i].thread, NULL);
		else if (parts[i].length)
			populate_thread(&parts[i]);
		if (!r && parts[i].r)
			r = parts[i].r;
	}
	return r;
}

/*
 * Is every page of [start, start + length) in the segment's page cache
 * already (mincore(2) reports that for shared file mappings)? Then nobody
 * needs to fault it in: a registration of memory already used, or a cache
 * hit, skips the walk (for 256 MiB of present pages MADV_POPULATE_WRITE
 * cost more than odpd's whole cache hit).
 */
static bool range_resident(uintptr_t start, size_t length, uintptr_t page)
{
	unsigned char vec[4096];

	while (length) {
		size_t n = length / page < sizeof(vec) ? length : sizeof(vec) * page;
		size_t pages = n / page;

		if (mincore((void *)start, n, vec) < 0)
			return false;
		for (size_t i = 0; i < pages; i++)
			if (!(vec[i] & 1))
				return false;
		start += n;
		length -= n;
	}
	return true;
}

int segment_populate(const struct odpd_segment *seg, const char *what, const void *addr,
		     size_t length)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(page - 1);
	/* Inside a mapping of the segment (whole pages): no overflow. */
	uintptr_t end = ((uintptr_t)addr + length + page - 1) & ~(page - 1);
	int advice = seg->writable ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
	int r;

	if (range_resident(start, end - start, page))
		return 0;
	r = populate((void *)start, end - start, advice);
	/* Made read-only since (mprotect): read is what can be done. */
	if (r == -EINVAL && advice == MADV_POPULATE_WRITE) {
		advice = MADV_POPULATE_READ;
		r = populate((void *)start, end - start, advice);
	}
	/* A kernel before 5.14, or a mapping madvise cannot populate. */
	if (r == -EINVAL)
		return 0;
	if (r < 0)
		return errmsg_set(r, "%s: faulting in [%p, %p) with %s: %m%s", what,
				  (void *)start, (void *)end,
				  advice == MADV_POPULATE_WRITE ? "MADV_POPULATE_WRITE" : "MADV_POPULATE_READ",
				  r == -ENOMEM ? " (out of memory, over the memory cgroup's limit, or part of "
				  "the range is no longer mapped)" :
				  r == -EFAULT ? " (SIGBUS: no memory behind the mapping, e.g. no free huge pages)" :
				  r == -EHWPOISON ? " (a page has a hardware memory error)" : "");
	return 0;
}

/* ---------------------------------------------------------------- mapping */

/* Map @fd at exactly @addr, never over a mapping: 0, -EEXIST if taken. */
static int map_noreplace(void *addr, size_t length, int prot, int fd)
{
	void *p = mmap(addr, length, prot, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	if (p != addr) {
		/* A kernel before 4.17 took the flag for a hint. */
		munmap(p, length);
		return -EEXIST;
	}
	return 0;
}

/* The daemon's address is taken here: map anywhere, attach at that address. */
static int segment_move(struct odpd_conn *c, const char *what, int fd, int prot,
			struct seg_reply *s)
{
	struct seg_reply moved = { 0 };
	void *p;
	int r;

	r = detach_request(c, what, s->handle);
	if (r < 0)
		return r;
	p = mmap(NULL, s->length, prot, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return errmsg_set(-errno, "%s: mmap: %m", what);
	r = attach_request(c, what, fd, (uintptr_t)p, 0, s->length, &moved);
	if (r < 0) {
		munmap(p, s->length);
		return r;
	}
	*s = moved;
	return 0;
}

/* Attach the whole file at an address the daemon picks, and map it there. */
static int segment_map_whole(struct odpd_conn *c, const char *what, int fd, uint64_t size,
			     int prot, struct odpd_segment *seg)
{
	struct seg_reply s = { 0 };
	int r;

	r = attach_request(c, what, fd, 0, 0, 0, &s);
	if (r < 0)
		return r;
	if (s.length != size) {
		detach_request(c, what, s.handle);
		return errmsg_set(-EIO, "%s: the daemon attached %llu bytes of a %llu-byte file", what,
				  (unsigned long long)s.length, (unsigned long long)size);
	}
	r = map_noreplace((void *)(uintptr_t)s.addr, s.length, prot, fd);
	if (r == -EEXIST) {
		r = segment_move(c, what, fd, prot, &s);
	} else if (r < 0) {
		detach_request(c, what, s.handle);
		r = errmsg_set(r, "%s: mapping the segment at 0x%llx: %m", what,
			       (unsigned long long)s.addr);
	}
	if (r < 0)
		return r;
	seg->handle = s.handle;
	seg->addr = (uint8_t *)(uintptr_t)s.addr;
	seg->length = s.length;
	seg->fd = fd;
	seg->owns_map = true;
	seg->writable = prot & PROT_WRITE;
	return 0;
}

/* ---------------------------------------------------------------- odpd_alloc */

static int segment_detach(struct odpd_segment *seg);

#define ALLOC_FLAGS_KNOWN (ODPD_ALLOC_HUGETLB | ODPD_ALLOC_POPULATE | ODPD_ALLOC_NO_POPULATE)

/* @length rounded up to the (huge) page size of the memfd @fd. */
static int alloc_round(const char *what, int fd, size_t length, bool huge, size_t *ret)
{
	size_t unit = (size_t)sysconf(_SC_PAGESIZE);
	struct stat st;

	/* hugetlbfs reports its huge page size as the block size. */
	if (huge) {
		if (fstat(fd, &st) < 0)
			return errmsg_set(-errno, "%s: fstat: %m", what);
		if ((size_t)st.st_blksize > unit)
			unit = (size_t)st.st_blksize;
	}
	if (length > (size_t)INT64_MAX - unit)
		return errmsg_set(-ENOMEM, "%s: %zu bytes: too large", what, length);
	*ret = (length + unit - 1) / unit * unit;
	return 0;
}

/* A sealed memfd of @length bytes (rounded up): its fd and size. */
static int alloc_memfd(const char *what, size_t length, unsigned flags, int *ret_fd, size_t *ret_size)
{
	bool huge = flags & ODPD_ALLOC_HUGETLB;
	size_t size = 0;
	int fd = -1, r;

	fd = memfd_create("odpd-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0));
	if (fd < 0)
		return errmsg_set(-errno, "%s: memfd_create: %m", what);
	r = alloc_round(what, fd, length, huge, &size);
	if (r >= 0 && ftruncate(fd, (off_t)size) < 0)
		r = errmsg_set(-errno, "%s: ftruncate to %zu bytes: %m", what, size);
	if (r >= 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
		r = errmsg_set(-errno, "%s: sealing the memfd: %m", what);
	if (r < 0) {
		close(fd);
		return r;
	}
	*ret_fd = fd;
	*ret_size = size;
	return 0;
}

static int segment_alloc(struct odpd_conn *c, size_t length, unsigned flags,
			 struct odpd_segment **ret)
{
	const char *what = "odpd_alloc";
	struct odpd_segment *seg;
	size_t size = 0;
	int fd = -1, r;

	if (length == 0 || (flags & ~ALLOC_FLAGS_KNOWN))
		return errmsg_set(-EINVAL, "%s: %s", what, length == 0 ? "length is 0" : "unknown flags");
	if ((flags & ODPD_ALLOC_POPULATE) && (flags & ODPD_ALLOC_NO_POPULATE))
		return errmsg_set(-EINVAL, "%s: ODPD_ALLOC_POPULATE and ODPD_ALLOC_NO_POPULATE together",
				  what);
	seg = calloc(1, sizeof(*seg));
	if (!seg)
		return errmsg_set(-ENOMEM, "%s: %m", what);
	r = alloc_memfd(what, length, flags, &fd, &size);
	if (r < 0) {
		free(seg);
		return r;
	}

	pthread_mutex_lock(&c->lock);
	r = segment_map_whole(c, what, fd, size, PROT_READ | PROT_WRITE, seg);
	if (r >= 0) {
		seg->owns_fd = true;
		seg->no_populate = flags & ODPD_ALLOC_NO_POPULATE;
		segment_insert(c, seg);
	}
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		close(fd);
		free(seg);
		return r;
	}
	/* Policy "on attach": every page now, outside the connection's lock
	 * (nobody else knows @seg yet). */
	if ((flags & ODPD_ALLOC_POPULATE) && (r = segment_populate(seg, what, seg->addr, seg->length)) < 0) {
		char msg[512];

		snprintf(msg, sizeof(msg), "%s", odpd_errmsg());
		if (segment_detach(seg) < 0) {
			/* a lost connection: the daemon's side is gone with it */
			tables_lock(c);
			link_del(&seg->link);
			tables_unlock(c);
			segment_free(seg);
		}
		return errmsg_set(r, "%s", msg);
	}
	if (flags & ODPD_ALLOC_POPULATE)
		map_request(seg, what, seg->addr, seg->length);
	*ret = seg;
	return 0;
}

_public_ struct odpd_segment *odpd_alloc(struct odpd_conn *conn, size_t length, unsigned flags)
{
	struct odpd_segment *seg = NULL;
	int r;

	errmsg_clear();
	if (!conn)
		r = errmsg_set(-EINVAL, "odpd_alloc: no connection");
	else
		r = segment_alloc(conn, length, flags, &seg);
	return public_ptr(r, seg);
}

/* ---------------------------------------------------------------- odpd_attach */

/* @fd must be a memfd sealed against shrinking and growing. */
static int check_memfd(const char *what, int fd, struct stat *ret_st, int *ret_seals)
{
	int seals;

	if (fd < 0 || fstat(fd, ret_st) < 0)
		return errmsg_set(fd < 0 ? -EBADF : -errno, "%s: fd %d: %m", what, fd);
	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return errmsg_set(-EINVAL, "%s: fd %d is not a memfd (F_GET_SEALS failed): create it "
				  "with memfd_create(..., MFD_ALLOW_SEALING)", what, fd);
	if ((seals & SEALS_REQUIRED) != SEALS_REQUIRED)
		return errmsg_set(-EINVAL, "%s: fd %d is not sealed with F_SEAL_SHRINK | F_SEAL_GROW: "
				  "create it with MFD_ALLOW_SEALING and add them with "
				  "fcntl(fd, F_ADD_SEALS, ...)", what, fd);
	if (ret_st->st_size <= 0)
		return errmsg_set(-EINVAL, "%s: fd %d is an empty file", what, fd);
	*ret_seals = seals;
	return 0;
}

/* Read-only where the fd or its seals forbid writing through a shared mapping. */
static int prot_for(int fd, int seals)
{
	int fl = fcntl(fd, F_GETFL);

	if ((fl >= 0 && (fl & O_ACCMODE) == O_RDONLY) ||
	    (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
		return PROT_READ;
	return PROT_READ | PROT_WRITE;
}

static int maps_error(const char *what, int r, const void *addr, size_t length)
{
	const char *end = (const char *)addr + length;

	switch (r) {
	case -ENOENT:
		return errmsg_set(-EINVAL, "%s: %p is not mapped in this process", what, addr);
	case -ERANGE:
		return errmsg_set(-EINVAL, "%s: [%p, %p) is not inside one mapping of the file",
				  what, addr, (const void *)end);
	default:
		return errmsg_set(r, "%s: reading /proc/self/maps: %m", what);
	}
}

/* The mapping of this process that holds [@addr, @addr + @length). */
static int find_mapping(const char *what, const void *addr, size_t length, struct maps_entry *ret)
{
	FILE *f = fopen("/proc/self/maps", "re");
	int r;

	if (!f)
		return errmsg_set(-errno, "%s: opening /proc/self/maps: %m", what);
	r = maps_find(f, (uintptr_t)addr, length, ret);
	fclose(f);
	return r < 0 ? maps_error(what, r, addr, length) : 0;
}

/* The mapping must be MAP_SHARED, of @fd's file, and inside the file. */
static int check_mapping(const char *what, int fd, const struct stat *st, const void *addr,
			 size_t length, const struct maps_entry *e, uint64_t *ret_offset)
{
	uint64_t off = e->offset + ((uintptr_t)addr - e->start);

	if (!e->shared)
		return errmsg_set(-EINVAL, "%s: the mapping at %p is MAP_PRIVATE: refused, because the "
				  "HCA would never see this process's writes (they go to private "
				  "copies of the pages); map the memfd MAP_SHARED", what, addr);
	if (e->inode != (uint64_t)st->st_ino || e->dev_major != major(st->st_dev) ||
	    e->dev_minor != minor(st->st_dev))
		return errmsg_set(-EINVAL, "%s: the mapping at %p is not of fd %d", what, addr, fd);
	if (length > (uint64_t)st->st_size || off > (uint64_t)st->st_size - length)
		return errmsg_set(-EINVAL, "%s: [%p, +%zu) runs past the end of fd %d's file", what,
				  addr, length, fd);
	*ret_offset = off;
	return 0;
}

/* Attach [@addr, @addr + @length), a mapping of @fd the caller made. */
static int segment_attach_mapped(struct odpd_conn *c, const char *what, int fd, const struct stat *st,
				 void *addr, size_t length, struct odpd_segment *seg)
{
	struct maps_entry e;
	struct seg_reply s = { 0 };
	uint64_t off = 0;
	int r;

	r = find_mapping(what, addr, length, &e);
	if (r >= 0)
		r = check_mapping(what, fd, st, addr, length, &e, &off);
	if (r >= 0)
		r = attach_request(c, what, fd, (uintptr_t)addr, off, length, &s);
	if (r < 0)
		return r;
	seg->handle = s.handle;
	seg->addr = addr;
	seg->length = length;
	seg->fd = fd;
	seg->writable = e.perms[1] == 'w';
	return 0;
}

static int attach_args(const char *what, void *addr, size_t length)
{
	uintptr_t a = (uintptr_t)addr;

	if (!addr)
		return length == 0 ? 0 : errmsg_set(-EINVAL, "%s: with addr NULL, length must be 0 "
						     "(the whole file)", what);
	if (length == 0)
		return errmsg_set(-EINVAL, "%s: length is 0", what);
	if (a % (uintptr_t)sysconf(_SC_PAGESIZE) != 0)
		return errmsg_set(-EINVAL, "%s: %p is not page aligned", what, addr);
	if (a + length < a)
		return errmsg_set(-EINVAL, "%s: %p + %zu overflows", what, addr, length);
	return 0;
}

static int segment_attach(struct odpd_conn *c, int fd, void *addr, size_t length,
			  struct odpd_segment **ret)
{
	const char *what = "odpd_attach";
	struct odpd_segment *seg;
	struct stat st;
	int seals = 0, r;

	r = attach_args(what, addr, length);
	if (r >= 0)
		r = check_memfd(what, fd, &st, &seals);
	if (r < 0)
		return r;
	seg = calloc(1, sizeof(*seg));
	if (!seg)
		return errmsg_set(-ENOMEM, "%s: %m", what);

	pthread_mutex_lock(&c->lock);
	r = conn_check(c, what);
	if (r >= 0 && addr)
		r = segment_attach_mapped(c, what, fd, &st, addr, length, seg);
	else if (r >= 0)
		r = segment_map_whole(c, what, fd, (uint64_t)st.st_size, prot_for(fd, seals), seg);
	if (r >= 0)
		segment_insert(c, seg);
	pthread_mutex_unlock(&c->lock);
	if (r < 0) {
		free(seg);
		return r;
	}
	*ret = seg;
	return 0;
}

_public_ struct odpd_segment *odpd_attach(struct odpd_conn *conn, int fd, void *addr, size_t length)
{
	struct odpd_segment *seg = NULL;
	int r;

	errmsg_clear();
	if (!conn)
		r = errmsg_set(-EINVAL, "odpd_attach: no connection");
	else
		r = segment_attach(conn, fd, addr, length, &seg);
	return public_ptr(r, seg);
}

/* ---------------------------------------------------------------- odpd_detach */

static int segment_detach(struct odpd_segment *seg)
{
	const char *what = "odpd_detach";
	struct odpd_conn *c = seg->conn;
	int r;

	pthread_mutex_lock(&c->lock);
	r = conn_check(c, what);
	if (r >= 0)
		r = hit_trim(c, what, false, seg);   /* what the cache keeps there goes first */
	if (r >= 0 && seg->n_mrs > 0)
		r = errmsg_set(-EBUSY, "%s: %u MRs over the segment are still registered: "
			       "deregister them first", what, seg->n_mrs);
	if (r >= 0)
		r = detach_request(c, what, seg->handle);
	if (r >= 0) {
		tables_lock(c);
		link_del(&seg->link);
		tables_unlock(c);
	}
	pthread_mutex_unlock(&c->lock);
	if (r >= 0)
		segment_free(seg);
	return r;
}

_public_ int odpd_detach(struct odpd_segment *seg)
{
	errmsg_clear();
	if (!seg)
		return public_int(errmsg_set(-EINVAL, "odpd_detach: segment is NULL"));
	return public_int(segment_detach(seg));
}

_public_ int odpd_populate(struct odpd_segment *seg, void *addr, size_t length)
{
	const char *what = "odpd_populate";
	int r;

	errmsg_clear();
	if (!seg)
		r = errmsg_set(-EINVAL, "%s: segment is NULL", what);
	else if (length == 0 || (uintptr_t)addr < (uintptr_t)seg->addr ||
		 (uintptr_t)addr - (uintptr_t)seg->addr > seg->length ||
		 length > seg->length - ((uintptr_t)addr - (uintptr_t)seg->addr))
		r = errmsg_set(-EINVAL, "%s: [%p, +%zu) is not inside the segment [%p, +%zu)", what, addr,
			       length, (void *)seg->addr, seg->length);
	else if ((r = segment_populate(seg, what, addr, length)) >= 0)
		map_request(seg, what, addr, length);
	return public_int(r);
}

_public_ void *odpd_segment_addr(const struct odpd_segment *seg)
{
	return seg ? seg->addr : NULL;
}

_public_ size_t odpd_segment_length(const struct odpd_segment *seg)
{
	return seg ? seg->length : 0;
}

_public_ int odpd_segment_fd(const struct odpd_segment *seg)
{
	return seg ? seg->fd : -1;
}
