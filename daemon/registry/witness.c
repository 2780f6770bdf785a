/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "odpd.pb-c.h"
#include "implicit.h"
#include "verify.h"
#include "witness.h"
#include "internal.h"

static int scan_absent(int pagemap_fd, uintptr_t start, uintptr_t end,
		       bool (*fn)(uintptr_t s, uintptr_t e, void *arg), void *arg);
static bool pages_present(struct odpd_registry *r, uintptr_t addr, uint64_t length, bool loop);

/* ---------------------------------------------------------------- the witness view */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* Is @ts (a file's ctime) earlier than the current coarse clock, the clock
 * the kernel stamps inodes with? Then any later change stamps a later time. */
bool ctime_settled(const struct timespec *ts)
{
	struct timespec now;

	clock_gettime(CLOCK_REALTIME_COARSE, &now);
	return now.tv_sec > ts->tv_sec || (now.tv_sec == ts->tv_sec && now.tv_nsec > ts->tv_nsec);
}

static void witness_populate(uint64_t s, uint64_t e, void *arg)
{
	struct odpd_mapping *map = arg;

	/* errors leave pages absent: the MR then just never proves current */
	madvise(map->witness + s, e - s, MADV_POPULATE_READ);
}

/*
 * Worker, before the pin: the baseline ctime, then the witness pages of the
 * range that no other MR relies on. A hole punched after this zaps them (and
 * moves ctime), so the MR never proves current again; punched before the pin
 * is the same. Page faults move ctime too (file_update_time on every first
 * write fault of a shared mapping), so ctime alone would make needless
 * misses, and at the clock's tick granularity it could miss a punch.
 */
static bool pages_present(struct odpd_registry *r, uintptr_t addr, uint64_t length, bool loop);
static int scan_absent(int pagemap_fd, uintptr_t start, uintptr_t end,
		       bool (*fn)(uintptr_t s, uintptr_t e, void *arg), void *arg);

/* Workers: is every page of [@addr, +@length) of one of odpd's views mapped
 * already? Only asked where PAGEMAP_SCAN answers in one walk, cheaper than
 * populating pages again; without it: no (populate). */
bool mapped_already(struct odpd_registry *r, const void *addr, uint64_t length)
{
	return r->pagemap_scan && pages_present(r, (uintptr_t)addr, length, false);
}

/* Is every page of the short range [@addr, +@length) of one of odpd's
 * views in the file's page cache (mincore(2), one system call)? */
bool cached_now(const void *addr, uint64_t length)
{
	unsigned char vec[64];
	uint64_t n = (length + PAGE - 1) / PAGE;

	if (n > sizeof(vec) || mincore((void *)addr, length, vec) < 0)
		return false;
	for (uint64_t i = 0; i < n; i++)
		if (!(vec[i] & 1))
			return false;
	return true;
}

/* Is every page of [@addr, +@length) mapped? One system call for a short
 * range, with or without PAGEMAP_SCAN (else pagemap entries are read). */
bool mapped_now(struct odpd_registry *r, const void *addr, uint64_t length)
{
	return pages_present(r, (uintptr_t)addr, length, false);
}

/*
 * A read fault maps the page cache pages around it too (fault-around, up to
 * the page table it lands in; a huge page maps whole), covered witness
 * pages included: one a hole punch zapped from under an MR, whose offset
 * the file has a page for again since, would come back and make that MR
 * look current while it pins the orphan. So before witness pages of [@s,
 * @e) are populated, every covered witness page within that reach must be
 * present; if one is not, the epoch moves first, and no MR pinned before
 * proves current again. Workers, under witness_lock.
 */
struct witness_guard {
	struct odpd_registry *r;
	struct odpd_mapping *map;
	uint64_t at;                        /* start of the covered stretch in view */
	bool absent;
};

static void guard_covered(struct witness_guard *g, uint64_t s, uint64_t e)
{
	if (!g->absent && s < e && !pages_present(g->r, (uintptr_t)(g->map->witness + s), e - s, false))
		g->absent = true;
}

static void guard_gap(uint64_t s, uint64_t e, void *arg)
{
	struct witness_guard *g = arg;

	guard_covered(g, g->at, s);
	g->at = e;
}

/*
 * Witness coverage: the pinned MRs that rely on their witness pages (their
 * witnessed flag), from map->mrs. Workers, under witness_lock, which keeps
 * those flags still: what the loop adds to the tree or takes out of it
 * meanwhile is never witnessed. The tree is locked only while walked.
 */
static bool is_witnessed(const struct odpd_inode *n, const void *arg)
{
	(void)arg;
	return ((const struct odpd_mr *)n)->witnessed;
}

static bool witnessed_visit(struct odpd_inode *n, void *arg)
{
	return is_witnessed(n, arg);
}

/* Does a witnessed MR cover any of [s, e)? (The first one found ends the walk.) */
static bool witness_covers(struct odpd_mapping *map, uint64_t s, uint64_t e)
{
	struct odpd_inode *n;

	pthread_mutex_lock(&map->tree_lock);
	n = odpd_itree_find_overlapping(&map->mrs, s, e, witnessed_visit, NULL);
	pthread_mutex_unlock(&map->tree_lock);
	return n != NULL;
}

/* @fn for each part of [s, e) no witnessed MR covers, ascending; listed a
 * few at a time, the tree unlocked while @fn runs (it may fault pages). */
static void witness_for_each_gap(struct odpd_mapping *map, uint64_t s, uint64_t e,
				 void (*fn)(uint64_t gs, uint64_t ge, void *arg), void *arg)
{
	struct odpd_gap g[16];

	while (s < e) {
		unsigned n;

		pthread_mutex_lock(&map->tree_lock);
		n = odpd_itree_gaps(&map->mrs, s, e, is_witnessed, NULL, g, 16, &s);
		pthread_mutex_unlock(&map->tree_lock);
		for (unsigned i = 0; i < n; i++)
			fn(g[i].start, g[i].end, arg);
	}
}

/* An absent run of witness pages: does an MR's witness cover any of it? */
static bool absent_covered(uintptr_t s, uintptr_t e, void *arg)
{
	struct witness_guard *g = arg;

	return witness_covers(g->map, s - (uintptr_t)g->map->witness, e - (uintptr_t)g->map->witness);
}

static void witness_guard(struct odpd_registry *r, struct odpd_mapping *map, uint64_t s, uint64_t e)
{
	/* Fault-around stays within the page table of the faulting address (a
	 * span of 512 entries of 4 KiB, 2 MiB, aligned in the address space,
	 * not in the file); a huge page maps whole. */
	const uint64_t reach = map->page_size > (PAGE / 8) * PAGE ? map->page_size : (PAGE / 8) * PAGE;
	uintptr_t w = (uintptr_t)map->witness, vlo = (w + s) & ~(uintptr_t)(reach - 1),
		  vhi = (w + e + reach - 1) & ~(uintptr_t)(reach - 1);
	uint64_t lo = vlo < w ? 0 : vlo - w, hi = vhi - w;
	struct witness_guard g = { .r = r, .map = map, .at = lo };
	int k = -1;

	if (hi > map->size)
		hi = map->size;
	/* One walk for the absent runs (PAGEMAP_SCAN), not one per covered stretch. */
	if (r->pagemap_scan)
		k = scan_absent(r->pagemap_fd, (uintptr_t)(map->witness + lo), (uintptr_t)(map->witness + hi),
				absent_covered, &g);
	if (k >= 0) {
		g.absent = k == 1;
	} else {
		witness_for_each_gap(map, lo, hi, guard_gap, &g);
		guard_covered(&g, g.at, hi);
	}
	if (g.absent)
		atomic_fetch_add_explicit(&map->witness_epoch, 1, memory_order_acq_rel);
}

/*
 * The baseline, read before the pin: a change since stamps a later ctime
 * (settled: read after its clock tick ended), so the MR then proves
 * current by its witness pages only. An older baseline is as safe: the
 * file's ctime is read once a second at most for the registrations of a
 * segment, not once each (a system call fewer per registration).
 */
static void ctime_baseline(struct odpd_mr *mr)
{
	struct odpd_mapping *map = mr->map;
	struct timespec now;
	struct stat st;

	clock_gettime(CLOCK_REALTIME_COARSE, &now);
	if (map->base_ctime_at != (int64_t)now.tv_sec && fstat(map->fd, &st) == 0) {
		/* (open while the MR holds the mapping) */
		map->base_ctime_at = ctime_settled(&st.st_ctim) ? (int64_t)now.tv_sec : 0;
		map->base_ctime_ns = ts_ns(&st.st_ctim);
	}
	mr->ctime_ns = map->base_ctime_ns;
	mr->ctime_ok = map->base_ctime_at != 0;
}

void witness_begin_present(struct odpd_mr *mr)
{
	ctime_baseline(mr);
	mr->witness_epoch = atomic_load_explicit(&mr->map->witness_epoch, memory_order_acquire);
	mr->witnessed = true;
}

void witness_begin(struct odpd_registry *r, struct odpd_mr *mr)
{
	struct odpd_mapping *map = mr->map;
	uint8_t *w;

	ctime_baseline(mr);
	if (!map->witness)
		return;
	w = map->witness + mr->node.start;
	/* Every witness page there present (PAGEMAP_SCAN: one walk without
	 * touching the pages, cheaper than populating): nothing to put back. */
	if (!mapped_already(r, w, odpd_mr_length(mr))) {
		witness_guard(r, map, mr->node.start, mr->node.end);
		witness_for_each_gap(map, mr->node.start, mr->node.end, witness_populate, map);
		/* Pages other MRs' witness covers, zapped: a hole was punched
		 * there since their pins. This MR needs them back; a new epoch
		 * keeps the older MRs of the segment from ever proving current
		 * again (witness_guard moved it already where it saw that). */
		if (!pages_present(r, (uintptr_t)w, odpd_mr_length(mr), false)) {
			atomic_fetch_add_explicit(&map->witness_epoch, 1, memory_order_acq_rel);
			madvise(w, odpd_mr_length(mr), MADV_POPULATE_READ);
		}
	}
	mr->witness_epoch = atomic_load_explicit(&map->witness_epoch, memory_order_acquire);
	mr->witnessed = true;
}

/* Resident runs of [@addr, @addr + @length) of a shared file mapping
 * (mincore(2): the page cache), each handed to @fn. */
static void for_each_resident_run(uint8_t *addr, uint64_t length, void (*fn)(uint8_t *a, uint64_t n, void *arg),
				  void *arg)
{
	unsigned char vec[4096];
	uint8_t *run = NULL;

	for (uint64_t done = 0; done < length;) {
		uint64_t n = length - done < sizeof(vec) * PAGE ? length - done : sizeof(vec) * PAGE;

		if (mincore(addr + done, n, vec) < 0)
			memset(vec, 0, sizeof(vec));   /* nothing known resident: nothing mapped */
		for (uint64_t i = 0; i < n / PAGE; i++) {
			uint8_t *pg = addr + done + i * PAGE;

			if ((vec[i] & 1) && !run)
				run = pg;
			else if (!(vec[i] & 1) && run) {
				fn(run, (uint64_t)(pg - run), arg);
				run = NULL;
			}
		}
		done += n;
	}
	if (run)
		fn(run, (uint64_t)(addr + length - run), arg);
}

static void populate_run(uint8_t *a, uint64_t n, void *arg)
{
	int *rc = arg;

	if (madvise(a, n, MADV_POPULATE_READ) < 0 && !*rc)
		*rc = errno;
}

struct ahead {
	struct odpd_mapping *map;
	int rc;
};

static void ahead_gap(uint64_t s, uint64_t e, void *arg)
{
	struct ahead *a = arg;

	for_each_resident_run(a->map->witness + s, e - s, populate_run, &a->rc);
}

/*
 * Worker: map odpd's view of [@start, @start + @length) of @map (file
 * offsets, whole pages) ahead of registrations (MapSegment), and the witness
 * pages there that no MR relies on. Only pages the page cache has (the
 * client faulted them in, as it says): read faults on them allocate
 * nothing, so a client cannot make odpd's cgroup pay. The witness part goes
 * in steps of 16 MiB, each under witness_lock and after witness_guard.
 * 0 or an errno of madvise.
 */
int odpd_registry_map_ahead(struct odpd_registry *r, struct odpd_mapping *map, uint64_t start, uint64_t length)
{
	const uint64_t step = 16u << 20;
	struct ahead a = { .map = map }, w = { .map = map };

	/* mapped already (an earlier MapSegment or MR): one scan says so */
	if (!mapped_already(r, map->addr + start, length))
		for_each_resident_run(map->addr + start, length, populate_run, &a.rc);
	/* the witness only helps: its errors leave pages for the registration */
	for (uint64_t s = start; !a.rc && map->witness && s < start + length; s += step) {
		uint64_t e = start + length - s < step ? start + length : s + step;

		if (mapped_already(r, map->witness + s, e - s))
			continue;
		pthread_mutex_lock(&map->witness_lock);
		witness_guard(r, map, s, e);
		witness_for_each_gap(map, s, e, ahead_gap, &w);
		pthread_mutex_unlock(&map->witness_lock);
	}
	return a.rc;
}

void witness_end(struct odpd_mr *mr)
{
	struct odpd_mapping *map = mr->map;

	if (!mr->witnessed)
		return;
	pthread_mutex_lock(&map->witness_lock);
	mr->witnessed = false;
	pthread_mutex_unlock(&map->witness_lock);
}

/* PAGEMAP_SCAN (Linux 6.7): the kernel finds the first page that is not
 * present, instead of 8 bytes a page read by us. Declared here for older
 * headers. */
#ifndef PAGEMAP_SCAN
struct page_region {
	uint64_t start, end, categories;
};

struct pm_scan_arg {
	uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
	uint64_t category_inverted, category_mask, category_anyof_mask, return_mask;
};

#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PAGE_IS_PRESENT (1 << 3)
#endif

/* 1: every page of [start, end) present, 0: not, -1: no PAGEMAP_SCAN here. */
static int scan_present(int pagemap_fd, uintptr_t start, uintptr_t end)
{
	struct page_region absent;
	struct pm_scan_arg arg = {
		.size = sizeof(arg), .start = start, .end = end,
		.vec = (uintptr_t)&absent, .vec_len = 1, .max_pages = 1,
		.category_inverted = PAGE_IS_PRESENT, .category_mask = PAGE_IS_PRESENT,
		.return_mask = PAGE_IS_PRESENT,
	};
	int n = ioctl(pagemap_fd, PAGEMAP_SCAN, &arg);

	if (n < 0)
		return errno == ENOTTY || errno == EINVAL ? -1 : 0;
	return n == 0 && arg.walk_end == end;
}

/* Each run of absent pages in [start, end), to @fn until it returns true
 * (then true). -1: no PAGEMAP_SCAN here, or it failed. */
static int scan_absent(int pagemap_fd, uintptr_t start, uintptr_t end,
		       bool (*fn)(uintptr_t s, uintptr_t e, void *arg), void *arg)
{
	/* zeroed: valgrind cannot know that the kernel writes them */
	struct page_region runs[64] = { { 0 } };

	while (start < end) {
		struct pm_scan_arg a = {
			.size = sizeof(a), .start = start, .end = end,
			.vec = (uintptr_t)runs, .vec_len = 64,
			.category_inverted = PAGE_IS_PRESENT, .category_mask = PAGE_IS_PRESENT,
			.return_mask = PAGE_IS_PRESENT,
		};
		int n = ioctl(pagemap_fd, PAGEMAP_SCAN, &a);

		if (n < 0 || a.walk_end <= start)
			return -1;
		for (int i = 0; i < n; i++)
			if (fn(runs[i].start, runs[i].end, arg))
				return 1;
		start = a.walk_end;
	}
	return 0;
}

/* Are the witness view's pages of [@addr, +@length) all present? On the
 * loop (@loop) a kernel without PAGEMAP_SCAN is remembered; workers only
 * read that. */
static bool pages_present(struct odpd_registry *r, uintptr_t addr, uint64_t length, bool loop)
{
	uint64_t buf[512];
	uint64_t first = addr / PAGE, n = length / PAGE;

	if (r->pagemap_fd < 0)
		return false;
	if (r->pagemap_scan) {
		int k = scan_present(r->pagemap_fd, addr, addr + length);
		if (k >= 0)
			return k == 1;
		if (loop) {
			r->pagemap_scan = false;         /* an older kernel: read entries */
			log_info("registry: no PAGEMAP_SCAN in this kernel; reading /proc/self/pagemap entries");
		}
	}
	for (uint64_t done = 0; done < n;) {
		size_t k = n - done < 512 ? (size_t)(n - done) : 512;
		ssize_t got = pread(r->pagemap_fd, buf, k * sizeof(buf[0]), (off_t)((first + done) * 8));
		if (got != (ssize_t)(k * sizeof(buf[0])))
			return false;
		for (size_t i = 0; i < k; i++)
			if (!(buf[i] >> 63 & 1))       /* PM_PRESENT */
				return false;
		done += k;
	}
	return true;
}

/* Are all witness pages of @mr present, and none put back since its pin
 * (nothing punched since)? Loop thread. */
bool witness_present(struct odpd_registry *r, const struct odpd_mr *mr)
{
	if (!mr->witnessed ||
	    mr->witness_epoch != atomic_load_explicit(&mr->map->witness_epoch, memory_order_acquire))
		return false;
	return pages_present(r, (uintptr_t)(mr->map->witness + mr->node.start), odpd_mr_length(mr), true);
}
