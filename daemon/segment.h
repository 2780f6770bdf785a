/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "error.h"
#include "window.h"

/* What validation learned about a segment fd. */
struct odpd_seginfo {
	dev_t dev;
	ino_t ino;
	uint64_t size;          /* bytes */
	size_t page_size;       /* 4 KiB, or the huge page size of a hugetlb memfd */
	bool writable;          /* opened O_RDWR and no write seal */
};

/*
 * Validate a client's segment fd, cheapest and non-blocking first:
 * F_GET_SEALS (the kernel answers EINVAL for anything but shmem/hugetlbfs, so
 * no other file system ever sees a request), the required seals
 * F_SEAL_SHRINK | F_SEAL_GROW, then fstat, size limits and access mode.
 */
int odpd_segment_validate(int fd, uint64_t max_size, struct odpd_seginfo *ret, struct odpd_err *err);

/* One daemon mapping of a segment inode, shared by every client that attaches it. */
struct odpd_mapping {
	dev_t dev;
	ino_t ino;
	int fd;                 /* owned */
	uint8_t *addr;          /* file offset 0 in odpd */
	size_t size;            /* bytes mapped (the file size, page rounded) */
	bool writable;
	bool in_window;
	unsigned refs;
	struct odpd_mapping *next;
};

struct odpd_segtable {
	struct odpd_window *window;
	struct odpd_mapping *list;
	unsigned count;
	uint64_t bytes;
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
void odpd_mapping_put(struct odpd_segtable *t, struct odpd_mapping *m);

/*
 * Check, in the text of /proc/PID/maps, that [addr, addr + length) is mapped
 * MAP_SHARED from inode (dev, ino) at file offset @offset, possibly across
 * several adjacent VMAs.
 */
int odpd_maps_check(FILE *maps, uintptr_t addr, uint64_t length, uint64_t offset,
		    dev_t dev, ino_t ino, struct odpd_err *err);

/* The same for a live process: reads /proc/@pid/maps, then proves with
 * @pidfd that @pid was not reused meanwhile. */
int odpd_client_mapping_check(pid_t pid, int pidfd, uintptr_t addr, uint64_t length,
			      uint64_t offset, dev_t dev, ino_t ino, struct odpd_err *err);
