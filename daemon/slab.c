/* SPDX-License-Identifier: MIT */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "slab.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLAB_BY_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SLAB_BY_MALLOC 1
#endif
#endif

struct slab_free {
	struct slab_free *next;
};

struct odpd_slab_block {
	struct odpd_slab_block *next, *prev;    /* in s->partial while it has room */
	struct slab_free *free;                  /* freed objects */
	unsigned used;                           /* objects handed out */
	unsigned carved;                         /* objects ever handed out from fresh space */
	/* objects follow, from offsetof(objects) rounded up to 16 */
};

#define HEADER (((sizeof(struct odpd_slab_block)) + 15) & ~(size_t)15)

static inline struct odpd_slab_block *block_of(const void *p)
{
	return (struct odpd_slab_block *)((uintptr_t)p & ~(uintptr_t)(ODPD_SLAB_BLOCK - 1));
}

void odpd_slab_init(struct odpd_slab *s, size_t size)
{
	memset(s, 0, sizeof(*s));
	s->size = (size + 7) & ~(size_t)7;
	s->per_block = (unsigned)((ODPD_SLAB_BLOCK - HEADER) / s->size);
}

static void partial_add(struct odpd_slab *s, struct odpd_slab_block *b)
{
	b->prev = NULL;
	b->next = s->partial;
	if (s->partial)
		s->partial->prev = b;
	s->partial = b;
}

static void partial_del(struct odpd_slab *s, struct odpd_slab_block *b)
{
	if (b->prev)
		b->prev->next = b->next;
	else
		s->partial = b->next;
	if (b->next)
		b->next->prev = b->prev;
	b->next = b->prev = NULL;
}

#ifdef SLAB_BY_MALLOC
void *odpd_slab_zalloc(struct odpd_slab *s)
{
	void *p = calloc(1, s->size);

	if (p)
		s->objects++;
	return p;
}

void odpd_slab_free(struct odpd_slab *s, void *p)
{
	if (p)
		s->objects--;
	free(p);
}
#else
void *odpd_slab_zalloc(struct odpd_slab *s)
{
	struct odpd_slab_block *b;
	void *p;

	b = s->partial;
	if (!b) {
		if (s->spare) {
			b = s->spare;
			s->spare = NULL;
		} else {
			b = aligned_alloc(ODPD_SLAB_BLOCK, ODPD_SLAB_BLOCK);
			if (!b)
				return NULL;
			s->blocks++;
			b->free = NULL;
			b->used = b->carved = 0;
		}
		partial_add(s, b);
	}
	if (b->free) {
		p = b->free;
		b->free = b->free->next;
	} else {
		p = (char *)b + HEADER + (size_t)b->carved++ * s->size;
	}
	if (++b->used == s->per_block)
		partial_del(s, b);                 /* full */
	s->objects++;
	return memset(p, 0, s->size);
}

void odpd_slab_free(struct odpd_slab *s, void *p)
{
	struct odpd_slab_block *b;
	struct slab_free *f = p;

	if (!p)
		return;
	s->objects--;
	b = block_of(p);
	if (b->used-- == s->per_block)
		partial_add(s, b);                 /* was full: has room again */
	f->next = b->free;
	b->free = f;
	if (b->used)
		return;
	partial_del(s, b);                         /* empty: kept as the spare, or given back */
	if (s->spare) {
		free(b);
		s->blocks--;
		return;
	}
	b->free = NULL;
	b->carved = 0;
	s->spare = b;
}
#endif

void odpd_slab_fini(struct odpd_slab *s)
{
	while (s->partial) {
		struct odpd_slab_block *b = s->partial;

		partial_del(s, b);
		free(b);
	}
	free(s->spare);
	s->spare = NULL;
	s->blocks = 0;
}
