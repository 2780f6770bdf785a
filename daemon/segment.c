/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include "log.h"
#include "odpd-wire.h"
#include "keep.h"
#include "segment.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

int odpd_memfd_fs(int fd, size_t *ret_page, bool *ret_hugetlb)
{
	struct statfs sf;

	if (fstatfs(fd, &sf) < 0)
		return -errno;
	if ((sf.f_type != TMPFS_MAGIC && sf.f_type != HUGETLBFS_MAGIC) || sf.f_bsize < 4096 ||
	    (sf.f_bsize & (sf.f_bsize - 1)))
		return -EINVAL;
	*ret_page = (size_t)sf.f_bsize;
	*ret_hugetlb = sf.f_type == HUGETLBFS_MAGIC;
	return 0;
}

int odpd_segment_validate(int fd, uint64_t max_size, struct odpd_seginfo *ret, struct odpd_err *err)
{
	const int need = F_SEAL_SHRINK | F_SEAL_GROW;
	struct stat st;
	size_t page;
	bool hugetlb;
	int seals, fl, r;

	seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		if (errno == EINVAL)
			return err_set(err, EINVAL, "segment fd is not a memfd (F_GET_SEALS refused it): "
				       "create segments with memfd_create(MFD_ALLOW_SEALING)");
		return err_set(err, errno, "F_GET_SEALS on segment fd: %s", strerror(errno));
	}
	if ((seals & need) != need) {
		if (seals & F_SEAL_SEAL)
			return err_set(err, EINVAL, "segment memfd was created without MFD_ALLOW_SEALING "
				       "or sealed without F_SEAL_SHRINK|F_SEAL_GROW; it can never carry them");
		return err_set(err, EINVAL, "segment memfd lacks seals%s%s: add them with "
			       "fcntl(F_ADD_SEALS, F_SEAL_SHRINK|F_SEAL_GROW)",
			       seals & F_SEAL_SHRINK ? "" : " F_SEAL_SHRINK",
			       seals & F_SEAL_GROW ? "" : " F_SEAL_GROW");
	}
	/* What the kernel maps: whole pages of the file system (a hugetlb
	 * mapping is rounded up to its huge page, and only whole ones unmap). */
	r = odpd_memfd_fs(fd, &page, &hugetlb);      /* a hugetlb segment is fine (doc/design.md §2) */
	if (r == -EINVAL)
		return err_set(err, EINVAL, "segment fd is a sealable file but neither shmem nor hugetlbfs "
			       "(fstatfs)");
	if (r < 0)
		return err_set(err, -r, "fstatfs on segment fd: %s", strerror(-r));
	if (fstat(fd, &st) < 0)
		return err_set(err, errno, "fstat on segment fd: %s", strerror(errno));
	if (!S_ISREG(st.st_mode))
		return err_set(err, EINVAL, "segment fd is not a regular file");
	if (st.st_size <= 0)
		return err_set(err, EINVAL, "segment is empty (size 0)");
	if ((uint64_t)st.st_size > max_size)
		return err_set(err, EFBIG, "segment of %lld bytes exceeds the limit of %" PRIu64 " bytes",
			       (long long)st.st_size, max_size);
	fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return err_set(err, errno, "F_GETFL on segment fd: %s", strerror(errno));
	if ((fl & O_ACCMODE) == O_WRONLY)
		return err_set(err, EACCES, "segment fd is write-only; it must be readable");

	ret->dev = st.st_dev;
	ret->ino = st.st_ino;
	ret->size = (uint64_t)st.st_size;
	ret->page_size = page;
	ret->map_len = (ret->size + page - 1) & ~(uint64_t)(page - 1);
	ret->writable = (fl & O_ACCMODE) == O_RDWR &&
			!(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
	return 0;
}

static size_t mapping_bucket(size_t n_buckets, dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)ino ^ ((uint64_t)dev << 40)) * 0x9e3779b97f4a7c15ull;

	return (size_t)(h >> 32) & (n_buckets - 1);
}

static struct odpd_mapping *mapping_find(struct odpd_segtable *t, dev_t dev, ino_t ino)
{
	if (!t->n_buckets)
		return NULL;
	for (struct odpd_mapping *m = t->buckets[mapping_bucket(t->n_buckets, dev, ino)]; m; m = m->next)
		if (m->dev == dev && m->ino == ino)
			return m;
	return NULL;
}

/* Room for one more mapping: -ENOMEM only if there is no table at all (a
 * table that cannot grow takes longer chains). */
static int mapping_reserve(struct odpd_segtable *t)
{
	size_t n = t->n_buckets ? t->n_buckets * 2 : 64;
	struct odpd_mapping **b;

	if (t->n_listed < t->n_buckets)
		return 0;
	b = calloc(n, sizeof(*b));
	if (!b)
		return t->n_buckets ? 0 : -ENOMEM;
	for (size_t i = 0; i < t->n_buckets; i++)
		while (t->buckets[i]) {
			struct odpd_mapping *m = t->buckets[i];
			size_t k = mapping_bucket(n, m->dev, m->ino);

			t->buckets[i] = m->next;
			m->next = b[k];
			b[k] = m;
		}
	free(t->buckets);
	t->buckets = b;
	t->n_buckets = n;
	return 0;
}

/* No mapping listed: no table either. */
static void mapping_table_trim(struct odpd_segtable *t)
{
	if (t->n_listed)
		return;
	free(t->buckets);
	t->buckets = NULL;
	t->n_buckets = 0;
}

static void mapping_unlist(struct odpd_segtable *t, struct odpd_mapping *m)
{
	for (struct odpd_mapping **pm = &t->buckets[mapping_bucket(t->n_buckets, m->dev, m->ino)]; *pm;
	     pm = &(*pm)->next)
		if (*pm == m) {
			*pm = m->next;
			break;
		}
	t->n_listed--;
	mapping_table_trim(t);
}

static void mapping_install(struct odpd_segtable *t, struct odpd_mapping *m);

/* Map the file at @want (MAP_FIXED_NOREPLACE), or in the window. */
static int mapping_place(struct odpd_segtable *t, struct odpd_mapping *m, uintptr_t want,
			 size_t align, struct odpd_err *err)
{
	int prot = PROT_READ | (m->writable ? PROT_WRITE : 0);
	void *p;

	if (want && !odpd_window_contains(t->window, (void *)want, m->size)) {
		p = mmap((void *)want, m->size, prot, MAP_SHARED | MAP_FIXED_NOREPLACE, m->fd, 0);
		if (p == (void *)want) {
			m->addr = p;
			return 0;
		}
		if (p != MAP_FAILED)
			munmap(p, m->size);      /* a kernel that ignores the flag */
		else if (errno != EEXIST && errno != ENOMEM && errno != EINVAL && errno != EPERM)
			return err_set(err, errno, "mmap of segment: %s", strerror(errno));
		log_debug("segment: %#" PRIxPTR " is taken in odpd, using the window", want);
	}
	p = odpd_window_alloc(t->window, m->size, align);
	if (!p)
		return err_set(err, ENOMEM, "odpd's segment address window is full");
	if (mmap(p, m->size, prot, MAP_SHARED | MAP_FIXED, m->fd, 0) == MAP_FAILED) {
		int e = errno;
		odpd_window_release(t->window, p, m->size);
		return err_set(err, e, "mmap of segment: %s", strerror(e));
	}
	m->addr = p;
	m->in_window = true;
	return 0;
}

/* A core dump of odpd must not contain clients' data. */
static void mapping_dontdump(const struct odpd_mapping *m)
{
	if (madvise(m->addr, m->size, MADV_DONTDUMP) < 0)
		log_errno(LOG_WARNING, errno, "madvise(MADV_DONTDUMP) on segment");
}

/*
 * The mapping was made from a read-only fd and a client now brings a
 * writable one: map the same file writable at the same address. The shmem
 * pages are the same, so MRs over the old mapping keep their pages.
 * Consumes @fd.
 */
static int mapping_make_writable(struct odpd_mapping *m, int fd, struct odpd_err *err)
{
	if (mmap(m->addr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
		int e = errno;
		close(fd);
		return err_set(err, e, "remapping the segment writable: %s", strerror(e));
	}
	mapping_dontdump(m);
	/* The same fd number, now of the writable file: workers may fstat()
	 * m->fd meanwhile (a registration's ctime), so it is never closed
	 * under them. */
	if (dup3(fd, m->fd, O_CLOEXEC) < 0) {
		int e = errno;
		close(fd);
		return err_set(err, e, "replacing the segment's fd: %s", strerror(e));
	}
	close(fd);
	m->writable = true;
	return 0;
}

int odpd_mapping_get(struct odpd_segtable *t, int fd, const struct odpd_seginfo *info,
		     uintptr_t want_addr, struct odpd_mapping **ret, struct odpd_err *err)
{
	struct odpd_mapping *m = mapping_find(t, info->dev, info->ino);
	size_t align = info->page_size > (2u << 20) ? info->page_size : (2u << 20);
	int r;

	if (m) {
		if (info->writable && !m->writable) {
			r = mapping_make_writable(m, fd, err);
			if (r < 0)
				return r;
		} else {
			close(fd);
		}
		m->refs++;
		*ret = m;
		return 0;
	}
	m = mapping_reserve(t) == 0 ? calloc(1, sizeof(*m)) : NULL;
	if (!m) {
		close(fd);
		return err_set(err, ENOMEM, "out of memory");
	}
	m->dev = info->dev;
	m->ino = info->ino;
	m->fd = fd;
	m->size = info->map_len;
	m->page_size = info->page_size;
	m->writable = info->writable;
	r = mapping_place(t, m, want_addr, align, err);
	if (r < 0) {
		close(fd);
		free(m);
		mapping_table_trim(t);           /* (the table mapping_reserve made) */
		return r;
	}
	mapping_install(t, m);
	*ret = m;
	return 0;
}

/* A mapping placed: its witness view, and into the table. */
static void mapping_install(struct odpd_segtable *t, struct odpd_mapping *m)
{
	int fd = m->fd;

	mapping_dontdump(m);
	odpd_itree_init(&m->mrs);
	pthread_mutex_init(&m->tree_lock, NULL);
	pthread_mutex_init(&m->witness_lock, NULL);
	/* Without a witness view pinned MRs over the segment are never served
	 * from the cache after its ctime changed. */
	m->witness = mmap(NULL, m->size, PROT_READ, MAP_SHARED, fd, 0);
	if (m->witness == MAP_FAILED) {
		log_errno(LOG_WARNING, errno, "witness view of a segment");
		m->witness = NULL;
	} else if (madvise(m->witness, m->size, MADV_DONTDUMP) < 0) {
		log_errno(LOG_WARNING, errno, "madvise(MADV_DONTDUMP) on a witness view");
	}
	m->refs = 1;
	{
		size_t k = mapping_bucket(t->n_buckets, m->dev, m->ino);

		m->next = t->buckets[k];
		t->buckets[k] = m;
		t->n_listed++;
	}
	t->count++;
	t->bytes += m->size;
}

int odpd_mapping_restore(struct odpd_segtable *t, int fd, uintptr_t addr, bool in_window,
			 struct odpd_mapping **ret, struct odpd_err *err)
{
	struct odpd_seginfo info;
	struct odpd_mapping *m;
	int prot, r;
	void *p;

	r = odpd_segment_validate(fd, UINT64_MAX, &info, err);
	if (r < 0) {
		close(fd);
		return r;
	}
	if (mapping_find(t, info.dev, info.ino)) {
		close(fd);
		return err_set(err, EEXIST, "the segment is mapped already");
	}
	m = mapping_reserve(t) == 0 ? calloc(1, sizeof(*m)) : NULL;
	if (!m) {
		close(fd);
		return err_set(err, ENOMEM, "out of memory");
	}
	m->dev = info.dev;
	m->ino = info.ino;
	m->fd = fd;
	m->size = info.map_len;
	m->page_size = info.page_size;
	m->writable = info.writable;
	prot = PROT_READ | (m->writable ? PROT_WRITE : 0);
	if (in_window) {
		r = odpd_window_contains(t->window, (void *)addr, m->size) ?
		    odpd_window_take(t->window, (void *)addr, m->size) : -EEXIST;
		p = r < 0 ? MAP_FAILED : mmap((void *)addr, m->size, prot, MAP_SHARED | MAP_FIXED, fd, 0);
		if (r == 0 && p == MAP_FAILED) {
			r = -errno;
			odpd_window_release(t->window, (void *)addr, m->size);
		}
	} else {
		p = mmap((void *)addr, m->size, prot, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
		r = p == MAP_FAILED ? -errno : 0;
		if (p != MAP_FAILED && (uintptr_t)p != addr) {
			munmap(p, m->size);
			r = -EEXIST;
		}
	}
	if (r < 0) {
		close(fd);
		free(m);
		mapping_table_trim(t);
		return err_set(err, -r, "mapping the segment at %#" PRIxPTR " again: %s", addr, strerror(-r));
	}
	m->addr = (uint8_t *)addr;
	m->in_window = in_window;
	mapping_install(t, m);
	m->refs = 0;                         /* its attachments and MRs take theirs */
	*ret = m;
	return 0;
}

void odpd_mapping_each(struct odpd_segtable *t, void (*fn)(struct odpd_mapping *m, void *arg), void *arg)
{
	for (size_t i = 0; i < t->n_buckets; i++)
		for (struct odpd_mapping *m = t->buckets[i], *next; m; m = next) {
			next = m->next;
			fn(m, arg);
		}
}

void odpd_mapping_ref(struct odpd_mapping *m)
{
	m->refs++;
}

static struct odpd_mapping *unmap_mapping(struct odpd_job *job)
{
	return (struct odpd_mapping *)((char *)job - offsetof(struct odpd_mapping, unmap));
}

static void unmap_run(struct odpd_job *job)
{
	struct odpd_mapping *m = unmap_mapping(job);

	if (m->witness)
		munmap(m->witness, m->size);
	if (m->in_window)
		odpd_window_unmap(m->addr, m->size);   /* replaces the mapping */
	else
		munmap(m->addr, m->size);
	close(m->fd);
}

static void unmap_done(struct odpd_job *job)
{
	struct odpd_mapping *m = unmap_mapping(job);
	struct odpd_segtable *t = m->table;

	if (m->in_window)
		odpd_window_put(t->window, m->addr, m->size);
	t->count--;
	t->bytes -= m->size;
	t->unmapping--;
	pthread_mutex_destroy(&m->tree_lock);    /* (mrs is empty: each MR held a reference) */
	pthread_mutex_destroy(&m->witness_lock);
	free(m);
}

void odpd_mapping_put(struct odpd_segtable *t, struct odpd_mapping *m)
{
	if (--m->refs > 0)
		return;
	keep_mapping_gone(m);
	mapping_unlist(t, m);
	m->table = t;
	m->unmap.run = unmap_run;
	m->unmap.done = unmap_done;
	t->unmapping++;
	if (t->pool) {
		odpd_pool_submit(t->pool, &m->unmap);
	} else {                              /* unit tests: no pool */
		unmap_run(&m->unmap);
		unmap_done(&m->unmap);
	}
}

int odpd_mapping_ctime(const struct odpd_mapping *m, struct timespec *ret)
{
	struct stat st;

	if (fstat(m->fd, &st) < 0)
		return -errno;
	*ret = st.st_ctim;
	return 0;
}

int odpd_maps_check(FILE *maps, uintptr_t addr, uint64_t length, uint64_t offset,
		    dev_t dev, ino_t ino, struct odpd_err *err)
{
	uintptr_t want = addr;            /* next address that must be covered */
	const uintptr_t end = addr + length;
	size_t cap = 0;
	char *line = NULL;
	int r = 0;

	/* getline: a path chosen by the client can make a line of any length,
	 * and its tail must never be read as a line of its own. */
	while (want < end && getline(&line, &cap, maps) > 0) {
		unsigned long long start, stop, off, inode;
		unsigned maj, min;
		char perms[8];

		if (sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &start, &stop, perms, &off,
			   &maj, &min, &inode) != 7)
			continue;
		if (stop <= want)
			continue;
		if (start > want)
			break;                    /* a hole */
		if (inode != ino || maj != major(dev) || min != minor(dev)) {
			r = err_set(err, EINVAL, "address %#" PRIxPTR " is not a mapping of the "
				    "segment fd you sent", want);
			break;
		}
		if (perms[3] != 's') {
			r = err_set(err, EINVAL, "address %#" PRIxPTR " is a MAP_PRIVATE mapping: the "
				    "HCA would never see your writes; map the segment MAP_SHARED", want);
			break;
		}
		if (off + (want - start) != offset + (want - addr)) {
			r = err_set(err, EINVAL, "mapping at %#" PRIxPTR " is of file offset %#llx, "
				    "not the offset you sent", want, off + (want - start));
			break;
		}
		want = stop;
	}
	free(line);
	if (r == 0 && want < end)
		r = err_set(err, EINVAL, "[%#" PRIxPTR ", +%" PRIu64 ") is not mapped in your process",
			    addr, length);
	return r;
}

int odpd_client_mapping_check(pid_t pid, int pidfd, uintptr_t addr, uint64_t length,
			      uint64_t offset, dev_t dev, ino_t ino, struct odpd_err *err)
{
	char path[64];
	FILE *f;
	int r;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
	f = fopen(path, "re");
	if (!f && errno == EACCES) {
		/*
		 * odpd runs as a user of its own without CAP_SYS_PTRACE (the
		 * hardened unit): another user's memory map is closed to it.
		 * The check only protects the client from itself (an MR whose
		 * iova is not where the segment is mapped, or a MAP_PRIVATE
		 * mapping the HCA never sees): go on without it.
		 */
		int e = errno;         /* log_ratelimited may write before it reads its arguments */

		log_ratelimited(LOG_INFO, "cannot read pid %d's memory map (%s): its attach at "
				"%#" PRIxPTR " is not checked against it", (int)pid, strerror(e), addr);
		return odpd_pidfd_alive(pidfd) ? 0 : err_set(err, ESRCH, "client process is gone");
	}
	if (!f)
		return err_set(err, ESRCH, "cannot read your process's memory map: %s", strerror(errno));
	r = odpd_maps_check(f, addr, length, offset, dev, ino, err);
	fclose(f);
	if (r == 0 && !odpd_pidfd_alive(pidfd))
		return err_set(err, ESRCH, "client process is gone");
	return r;
}

bool odpd_pidfd_alive(int pidfd)
{
	struct pollfd p = { .fd = pidfd, .events = POLLIN };
	int r;

	if (pidfd < 0)
		return true;
	/* A pidfd becomes readable when its process exits. A signal says
	 * nothing about the process (odpd_poll asks again); a poll that fails
	 * otherwise proves nothing either: say gone (the pid may name another
	 * process now). */
	r = odpd_poll(&p, 1, 0);
	return r == 0 || (r > 0 && !(p.revents & (POLLIN | POLLHUP | POLLNVAL | POLLERR)));
}
