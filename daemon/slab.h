/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Fixed-size objects (the registry's MRs and references) packed in blocks
 * of their own, 64 KiB each, aligned to their size so that an object finds
 * its block by its address. No per-object header, and no holes where the
 * allocations of requests in flight sat between the objects a cache keeps
 * (with two clients registering at once, malloc left about 70 bytes of
 * holes per cached MR). A block that empties is given back, but one.
 *
 * Every object in use can be walked (odpd_slab_next): the registry needs
 * no list of its MRs of its own. Loop thread only (no locking). Built with AddressSanitizer, objects come
 * from calloc() one by one, so that a use after free is still caught; under
 * valgrind they are its heap blocks (VALGRIND_MALLOCLIKE_BLOCK) where
 * <valgrind/memcheck.h> was found at build time.
 */

#include <stdbool.h>
#include <stddef.h>
#include <sys/queue.h>

/* Built with AddressSanitizer (gcc defines __SANITIZE_ADDRESS__; clang 14
 * only answers __has_feature): odpd frees what it would keep for reuse, so
 * that a use after the end is reported. */
#if defined(__SANITIZE_ADDRESS__)
#define ODPD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ODPD_ASAN 1
#endif
#endif

/* Then objects come from calloc() (slab.c). */
#ifdef ODPD_ASAN
#define ODPD_SLAB_BY_MALLOC 1
#endif

/* One freed object of a kind, kept in *@spare for the next allocation of
 * that kind (loop thread only): a request's path then neither frees nor
 * allocates it. Take: the kept object, or NULL. Keep: true if kept, else
 * the caller frees @p (one is kept already; always with ASan). */
static inline void *odpd_spare_take(void **spare)
{
	void *p = *spare;

	*spare = NULL;
	return p;
}

static inline bool odpd_spare_keep(void **spare, void *p)
{
#ifdef ODPD_ASAN
	(void)spare;
	(void)p;
	return false;
#else
	if (*spare)
		return false;
	*spare = p;
	return true;
#endif
}

struct odpd_slab_block;

struct odpd_slab_obj;

struct odpd_slab {
	size_t size;                        /* bytes per object, rounded to 8 */
	size_t header;                      /* bytes before a block's first object */
	unsigned per_block;
	LIST_HEAD(, odpd_slab_block) partial;   /* blocks with room, most recently used first */
	LIST_HEAD(, odpd_slab_block) all;   /* blocks with objects in use */
	struct odpd_slab_block *spare;      /* one empty block kept */
	LIST_HEAD(, odpd_slab_obj) objs;    /* by malloc: every object in use */
	unsigned blocks;                    /* held, the spare included */
	size_t objects;                     /* in use */
};

#define ODPD_SLAB_BLOCK ((size_t)64 << 10)

/* @size: bytes per object, 1 to a quarter of a block (else abort()); objects
 * are 8-byte aligned. */
void odpd_slab_init(struct odpd_slab *s, size_t size);
/* A zeroed object, or NULL (ENOMEM). */
void *odpd_slab_zalloc(struct odpd_slab *s);
/* Give back an object of @s (NULL: nothing). */
void odpd_slab_free(struct odpd_slab *s, void *p);
/*
 * Walk the objects in use: the first (@prev NULL) or the one after @prev, in
 * no particular order; NULL at the end. Objects allocated during a walk may
 * be missed; the walker may free @prev only after taking its next.
 */
void *odpd_slab_next(const struct odpd_slab *s, const void *prev);
/* Free every block; every object must have been freed. */
void odpd_slab_fini(struct odpd_slab *s);
