/* SPDX-License-Identifier: MIT */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "log.h"
#include "slab.h"

struct slab_free {
	struct slab_free *next;
};

struct odpd_slab_block {
	LIST_ENTRY(odpd_slab_block) plink;      /* in s->partial while it has room */
	LIST_ENTRY(odpd_slab_block) alink;      /* in s->all while used */
	struct slab_free *free;                  /* freed objects */
	unsigned used;                           /* objects handed out */
	unsigned carved;                         /* objects ever handed out from fresh space */
	uint64_t in_use[];                       /* a bit per object: handed out */
	/* objects follow, from s->header on, each s->size bytes (a multiple of 8) */
};

static size_t header_for(unsigned per_block)
{
	size_t h = sizeof(struct odpd_slab_block) + (per_block + 63) / 64 * sizeof(uint64_t);

	return (h + 15) & ~(size_t)15;
}

/* (per_block also with malloc: the tests count as if in blocks) */
void odpd_slab_init(struct odpd_slab *s, size_t size)
{
	if (size == 0 || size > ODPD_SLAB_BLOCK / 4)
		abort();                            /* the caller's bug (slab.h) */
	memset(s, 0, sizeof(*s));
	s->size = (size + 7) & ~(size_t)7;
	s->per_block = (unsigned)((ODPD_SLAB_BLOCK - header_for(0)) / s->size);
	while (header_for(s->per_block) + s->per_block * s->size > ODPD_SLAB_BLOCK)
		s->per_block--;
	s->header = header_for(s->per_block);
}

static void slab_check_empty(const struct odpd_slab *s)
{
	if (s->objects)
		log_error("slab of %zu-byte objects: %zu still in use at exit", s->size, s->objects);
}

#ifdef ODPD_SLAB_BY_MALLOC

/* Before each object: the links of s->objs. */
struct odpd_slab_obj {
	LIST_ENTRY(odpd_slab_obj) link;
};

#define OBJ_HEADER ((sizeof(struct odpd_slab_obj) + 15) & ~(size_t)15)

void *odpd_slab_zalloc(struct odpd_slab *s)
{
	struct odpd_slab_obj *o = calloc(1, OBJ_HEADER + s->size);

	if (!o)
		return NULL;
	s->objects++;
	LIST_INSERT_HEAD(&s->objs, o, link);
	return (char *)o + OBJ_HEADER;
}

void odpd_slab_free(struct odpd_slab *s, void *p)
{
	struct odpd_slab_obj *o;

	if (!p)
		return;
	s->objects--;
	o = (struct odpd_slab_obj *)((char *)p - OBJ_HEADER);
	LIST_REMOVE(o, link);
	free(o);
}

void *odpd_slab_next(const struct odpd_slab *s, const void *prev)
{
	const struct odpd_slab_obj *o =
		prev ? LIST_NEXT((const struct odpd_slab_obj *)((const char *)prev - OBJ_HEADER), link) :
		       LIST_FIRST(&s->objs);

	return o ? (char *)o + OBJ_HEADER : NULL;
}

void odpd_slab_fini(struct odpd_slab *s)
{
	slab_check_empty(s);
}
#else
/* Under valgrind, objects are its heap blocks (use after free, leaks). */
#if defined(__has_include)
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#endif
#endif
#ifndef VALGRIND_MALLOCLIKE_BLOCK
#define VALGRIND_MALLOCLIKE_BLOCK(p, size, redzone, zeroed) ((void)0)
#define VALGRIND_FREELIKE_BLOCK(p, redzone) ((void)0)
#define VALGRIND_MAKE_MEM_DEFINED(p, size) ((void)0)
#endif

/*
 * Blocks are mappings of their own, aligned to their size: twice the size
 * mapped, the ends trimmed. (aligned_alloc() of 64 KiB aligned to 64 KiB
 * leaves up to 64 KiB around each block in malloc's heap, which the
 * allocations of requests then fragment: worse than no slab at all.)
 */
static struct odpd_slab_block *block_new(void)
{
	uint8_t *m = mmap(NULL, 2 * ODPD_SLAB_BLOCK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t a;

	if (m == MAP_FAILED)
		return NULL;
	a = ((uintptr_t)m + ODPD_SLAB_BLOCK - 1) & ~(uintptr_t)(ODPD_SLAB_BLOCK - 1);
	if (a > (uintptr_t)m)
		munmap(m, a - (uintptr_t)m);
	munmap((uint8_t *)a + ODPD_SLAB_BLOCK, (uintptr_t)m + 2 * ODPD_SLAB_BLOCK - a - ODPD_SLAB_BLOCK);
	return (struct odpd_slab_block *)a;
}

static void block_free(struct odpd_slab_block *b)
{
	if (b)
		munmap(b, ODPD_SLAB_BLOCK);
}

static inline struct odpd_slab_block *block_of(const void *p)
{
	return (struct odpd_slab_block *)((uintptr_t)p & ~(uintptr_t)(ODPD_SLAB_BLOCK - 1));
}



static inline unsigned index_of(const struct odpd_slab *s, const struct odpd_slab_block *b, const void *p)
{
	return (unsigned)(((uintptr_t)p - (uintptr_t)b - s->header) / s->size);
}

void *odpd_slab_zalloc(struct odpd_slab *s)
{
	struct odpd_slab_block *b;
	unsigned i;
	void *p;

	b = LIST_FIRST(&s->partial);
	if (!b) {
		if (s->spare) {
			b = s->spare;
			s->spare = NULL;
		} else {
			b = block_new();
			if (!b)
				return NULL;
			s->blocks++;
			b->free = NULL;
			b->used = b->carved = 0;
			memset(b->in_use, 0, s->header - sizeof(*b));
		}
		LIST_INSERT_HEAD(&s->partial, b, plink);
	}
	if (b->free) {
		p = b->free;
		VALGRIND_MAKE_MEM_DEFINED(p, sizeof(struct slab_free));
		b->free = b->free->next;
	} else {
		p = (char *)b + s->header + (size_t)b->carved++ * s->size;
	}
	i = index_of(s, b, p);
	b->in_use[i / 64] |= (uint64_t)1 << (i % 64);
	if (b->used == 0)
		LIST_INSERT_HEAD(&s->all, b, alink);
	if (++b->used == s->per_block)
		LIST_REMOVE(b, plink);                     /* full */
	s->objects++;
	VALGRIND_MALLOCLIKE_BLOCK(p, s->size, 0, 0);
	return memset(p, 0, s->size);
}

void odpd_slab_free(struct odpd_slab *s, void *p)
{
	struct odpd_slab_block *b;
	struct slab_free *f = p;
	unsigned i;

	if (!p)
		return;
	s->objects--;
	b = block_of(p);
	i = index_of(s, b, p);
	b->in_use[i / 64] &= ~((uint64_t)1 << (i % 64));
	if (b->used-- == s->per_block)
		LIST_INSERT_HEAD(&s->partial, b, plink);  /* was full: has room again */
	f->next = b->free;
	b->free = f;
	VALGRIND_FREELIKE_BLOCK(p, 0);
	if (b->used)
		return;
	LIST_REMOVE(b, alink);
	LIST_REMOVE(b, plink);                     /* empty: kept as the spare, or given back */
	if (s->spare) {
		block_free(b);
		s->blocks--;
		return;
	}
	b->free = NULL;
	b->carved = 0;
	s->spare = b;
}

void *odpd_slab_next(const struct odpd_slab *s, const void *prev)
{
	const struct odpd_slab_block *b = prev ? block_of(prev) : LIST_FIRST(&s->all);
	unsigned i = prev ? index_of(s, b, prev) + 1 : 0;

	for (; b; b = LIST_NEXT(b, alink), i = 0) {
		while (i < b->carved) {
			uint64_t w = b->in_use[i / 64] >> (i % 64);

			if (w) {
				i += (unsigned)__builtin_ctzll(w);
				if (i < b->carved)
					return (char *)b + s->header + (size_t)i * s->size;
				break;
			}
			i = (i / 64 + 1) * 64;
		}
	}
	return NULL;
}

void odpd_slab_fini(struct odpd_slab *s)
{
	slab_check_empty(s);
	while (!LIST_EMPTY(&s->partial)) {
		struct odpd_slab_block *b = LIST_FIRST(&s->partial);

		LIST_REMOVE(b, plink);
		block_free(b);
	}
	block_free(s->spare);
	s->spare = NULL;
	s->blocks = 0;
}
#endif
