/* SPDX-License-Identifier: MIT */
#pragma once

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "error.h"
#include "itree.h"
#include "pool.h"
#include "window.h"

/* What validation learned about a segment fd. */
struct odpd_seginfo {
	dev_t dev;
	ino_t ino;
	uint64_t size;          /* bytes */
	size_t page_size;       /* the file system's (fstatfs f_bsize): the page size of
				 * shmem, or the huge page size of a hugetlb memfd */
	uint64_t map_len;       /* what the kernel maps for the whole file: size rounded
				 * up to page_size (mapped, unmapped and charged as such) */
	bool writable;          /* opened O_RDWR and no write seal */
};

/*
 * Validate a client's segment fd, cheapest and non-blocking first:
 * F_GET_SEALS (the kernel answers EINVAL for anything but shmem/hugetlbfs, so
 * no other file system ever sees a request), the required seals
 * F_SEAL_SHRINK | F_SEAL_GROW, then fstatfs (shmem or hugetlbfs, and its
 * page size: a hugetlb mapping is always whole huge pages, and st_blksize
 * says 2 MiB for shmem too where transparent huge pages are on), fstat,
 * size limits and access mode.
 */
int odpd_segment_validate(int fd, uint64_t max_size, struct odpd_seginfo *ret, struct odpd_err *err);

/*
 * The file system of @fd, a memfd that F_GET_SEALS accepted: 0 with its
 * page size (fstatfs f_bsize, what every mapping of it is rounded to) and
 * whether it is hugetlbfs (MFD_HUGETLB); -EINVAL if it is neither shmem
 * nor hugetlbfs; else -errno.
 */
int odpd_memfd_fs(int fd, size_t *ret_page, bool *ret_hugetlb);

/*
 * Mappings (VMAs, against vm.max_map_count) an attached segment may take in
 * odpd: its mapping, the piece of the window reservation it splits off, and
 * its witness view. Charged to the user per attach (struct odpd_cseg).
 */
#define ODPD_SEGMENT_MAPPINGS 3

/* One daemon mapping of a segment inode, shared by every client that attaches it. */
struct odpd_mapping {
	dev_t dev;
	ino_t ino;
	int fd;                 /* owned; its number never changes (workers fstat it) */
	uint8_t *addr;          /* file offset 0 in odpd */
	size_t size;            /* bytes mapped (struct odpd_seginfo.map_len), and unmapped */
	size_t page_size;       /* the file's: 4 KiB, or a hugetlb page size */
	bool writable;
	bool in_window;
	unsigned save_id;               /* its id in the journal and the fd store ("seg-ID"; 0: none) */
	unsigned refs;                  /* client attachments and MRs */
	/* The registry's MRs over this mapping, of every PD, by file range
	 * (struct odpd_mr.node): the registration cache's lookups, the
	 * distinct pinned bytes of the daemon and of each account, and the
	 * witness coverage. Changed by the loop only, under tree_lock, which
	 * workers take to walk it (never across a system call). */
	struct odpd_itree mrs;
	pthread_mutex_t tree_lock;
	/*
	 * The witness view: a second, read-only mapping of the file that
	 * nothing faults in but odpd, just before it pins pages that no
	 * other pinned MR relies on (those in mrs whose witnessed flag is set,
	 * which workers change under witness_lock). A hole
	 * punched into the file zaps its page table entries, and nothing
	 * puts them back while an MR relies on them: an MR whose witness
	 * pages are all present pins the file's current pages. Workers only,
	 * under witness_lock.
	 */
	uint8_t *witness;
	/* Moves when a registration found witness pages of other MRs zapped
	 * and put them back: MRs pinned before never prove current again. */
	_Atomic uint32_t witness_epoch;
	pthread_mutex_t witness_lock;
	/* Under witness_lock: the file's ctime as last read for a
	 * registration's baseline, settled when read, and the second of the
	 * coarse clock it was read in (0: never). A baseline older than the
	 * pin is safe, only less often useful: witness_begin reads it again
	 * once a second at most. */
	uint64_t base_ctime_ns;
	int64_t base_ctime_at;
	/* The registry's hole check (loop thread): its ctime, read once a pass. */
	uint64_t hole_pass;
	struct timespec hole_ctime;
	bool hole_have_ctime;
	struct odpd_mapping *next;
	struct odpd_job unmap;          /* embedded: the last put never allocates */
	struct odpd_segtable *table;
};

struct odpd_segtable {
	struct odpd_window *window;
	struct odpd_pool *pool;         /* unmapping runs on a worker */
	/* Mapped, and findable: a hash table of chains by inode (a power of
	 * two of buckets, grown to hold one mapping per bucket on average;
	 * freed when the last mapping leaves it). */
	struct odpd_mapping **buckets;
	size_t n_buckets;
	size_t n_listed;
	unsigned count;                 /* mapped, including those being unmapped */
	uint64_t bytes;
	unsigned unmapping;             /* unmap jobs in flight */
};

/*
 * Find the mapping of @info's inode or create it. @fd is consumed (kept by a
 * new mapping, closed otherwise). @want_addr: where file offset 0 should lie
 * (the client's address minus its file offset), or 0 to take an address from
 * the window. A wanted address that is taken in odpd falls back to the window.
 * Takes a reference.
 */
int odpd_mapping_get(struct odpd_segtable *t, int fd, const struct odpd_seginfo *info,
		     uintptr_t want_addr, struct odpd_mapping **ret, struct odpd_err *err);
/* A restart: map stored segment @fd at @addr again, in the window or where
 * it was outside it. No reference yet: the first odpd_mapping_ref takes one.
 * @fd is consumed. 0 or -errno (-EEXIST: something else lies there). */
int odpd_mapping_restore(struct odpd_segtable *t, int fd, uintptr_t addr, bool in_window,
			 struct odpd_mapping **ret, struct odpd_err *err);
/* One more reference (an MR over the mapping). */
void odpd_mapping_ref(struct odpd_mapping *m);
/* Drop a reference. The last one unmaps the segment on a worker (a
 * populated 256 MiB segment takes tens of ms to unmap) and then frees it on
 * the loop; meanwhile a new attach of the inode maps it anew. */
void odpd_mapping_put(struct odpd_segtable *t, struct odpd_mapping *m);
/* Call @fn for every mapping in @t. */
void odpd_mapping_each(struct odpd_segtable *t, void (*fn)(struct odpd_mapping *m, void *arg), void *arg);
/* The segment's inode ctime (fstat): hole punching changes it. */
int odpd_mapping_ctime(const struct odpd_mapping *m, struct timespec *ret);

/*
 * Check, in the text of /proc/PID/maps, that [addr, addr + length) is mapped
 * MAP_SHARED from inode (dev, ino) at file offset @offset, possibly across
 * several adjacent VMAs.
 */
int odpd_maps_check(FILE *maps, uintptr_t addr, uint64_t length, uint64_t offset,
		    dev_t dev, ino_t ino, struct odpd_err *err);

/* Is the process of @pidfd still running (so that its pid, read before,
 * still names it)? True for @pidfd < 0 (no pidfd: cannot tell). */
bool odpd_pidfd_alive(int pidfd);

/* The same for a live process: reads /proc/@pid/maps, then proves with
 * @pidfd that @pid was not reused meanwhile. */
int odpd_client_mapping_check(pid_t pid, int pidfd, uintptr_t addr, uint64_t length,
			      uint64_t offset, dev_t dev, ino_t ino, struct odpd_err *err);
