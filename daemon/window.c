/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "log.h"
#include "window.h"

/* Free extents, sorted by address, never adjacent (merged on release). */
struct extent {
	uintptr_t start, end;
	struct extent *next;
};

struct odpd_window {
	uintptr_t base;
	size_t size;
	struct extent *free;
};

static const int reserve_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

/*
 * Where the window goes when odpd may choose: a fixed place, low in the
 * address space, below where the kernel puts libraries and mmap()s (its
 * mmap base moves by up to a TiB with every exec). The next odpd of a
 * restart must reserve the window where the last one had it (the segments'
 * addresses are the clients' iovas), which a place the kernel chose would
 * often not allow. Elsewhere if it is taken (or the address space is small).
 */
#define WINDOW_HINT (UINT64_C(32) << 40)     /* (above ASan's shadow, which ends at 16 TiB) */

int odpd_window_new(size_t size, struct odpd_window **ret)
{
	if (sizeof(void *) == 8 && odpd_window_new_at((uintptr_t)WINDOW_HINT, size, ret) == 0)
		return 0;
	return odpd_window_new_at(0, size, ret);
}

int odpd_window_new_at(uintptr_t base, size_t size, struct odpd_window **ret)
{
	struct odpd_window *w = calloc(1, sizeof(*w));
	struct extent *e = calloc(1, sizeof(*e));
	void *p;

	if (!w || !e)
		goto nomem;
	p = mmap((void *)base, size, PROT_NONE, reserve_flags | (base ? MAP_FIXED_NOREPLACE : 0), -1, 0);
	if (p != MAP_FAILED && base && (uintptr_t)p != base) {
		munmap(p, size);                 /* a kernel without MAP_FIXED_NOREPLACE */
		p = MAP_FAILED;
		errno = EEXIST;
	}
	if (p == MAP_FAILED) {
		int r = -errno;
		free(w);
		free(e);
		return r;
	}
	w->base = (uintptr_t)p;
	w->size = size;
	e->start = w->base;
	e->end = w->base + size;
	w->free = e;
	*ret = w;
	return 0;
nomem:
	free(w);
	free(e);
	return -ENOMEM;
}

void odpd_window_free(struct odpd_window *w)
{
	if (!w)
		return;
	while (w->free) {
		struct extent *n = w->free->next;
		free(w->free);
		w->free = n;
	}
	munmap((void *)w->base, w->size);
	free(w);
}

void *odpd_window_alloc(struct odpd_window *w, size_t length, size_t align)
{
	for (struct extent **pe = &w->free; *pe; pe = &(*pe)->next) {
		struct extent *e = *pe;
		uintptr_t a = (e->start + align - 1) & ~(uintptr_t)(align - 1);
		if (a < e->start || a > e->end || e->end - a < length)
			continue;
		if (a > e->start && a + length < e->end) {
			/* carve from the middle: split into two extents */
			struct extent *tail = malloc(sizeof(*tail));
			if (!tail)
				return NULL;
			tail->start = a + length;
			tail->end = e->end;
			tail->next = e->next;
			e->end = a;
			e->next = tail;
		} else if (a == e->start && a + length == e->end) {
			*pe = e->next;
			free(e);
		} else if (a == e->start) {
			e->start += length;
		} else {
			e->end = a;
		}
		return (void *)a;
	}
	return NULL;
}

void odpd_window_unmap(void *addr, size_t length)
{
	if (mmap(addr, length, PROT_NONE, reserve_flags | MAP_FIXED, -1, 0) == MAP_FAILED)
		log_errno(LOG_ERR, errno, "window: cannot restore reservation at %p", addr);
}

void odpd_window_release(struct odpd_window *w, void *addr, size_t length)
{
	odpd_window_unmap(addr, length);
	odpd_window_put(w, addr, length);
}

void odpd_window_put(struct odpd_window *w, void *addr, size_t length)
{
	uintptr_t s = (uintptr_t)addr, end = s + length;
	struct extent **pe = &w->free, *prev = NULL;

	while (*pe && (*pe)->start < s) {
		prev = *pe;
		pe = &(*pe)->next;
	}
	struct extent *next = *pe;
	if (prev && prev->end == s) {
		prev->end = end;
		if (next && next->start == end) {
			prev->end = next->end;
			prev->next = next->next;
			free(next);
		}
		return;
	}
	if (next && next->start == end) {
		next->start = s;
		return;
	}
	struct extent *e = malloc(sizeof(*e));
	if (!e) {
		log_error("window: out of memory, %zu bytes at %p stay reserved", length, addr);
		return;
	}
	e->start = s;
	e->end = end;
	e->next = next;
	*pe = e;
}

int odpd_window_take(struct odpd_window *w, void *addr, size_t length)
{
	uintptr_t s = (uintptr_t)addr, end = s + length;

	for (struct extent **pe = &w->free; *pe; pe = &(*pe)->next) {
		struct extent *e = *pe;

		if (s < e->start || s >= e->end)
			continue;
		if (end > e->end || end < s)
			return -EEXIST;
		if (s > e->start && end < e->end) {
			struct extent *tail = malloc(sizeof(*tail));

			if (!tail)
				return -ENOMEM;
			tail->start = end;
			tail->end = e->end;
			tail->next = e->next;
			e->end = s;
			e->next = tail;
		} else if (s > e->start) {
			e->end = s;
		} else if (end < e->end) {
			e->start = end;
		} else {
			*pe = e->next;
			free(e);
		}
		return 0;
	}
	return -EEXIST;
}

uintptr_t odpd_window_base(const struct odpd_window *w, size_t *ret_size)
{
	*ret_size = w->size;
	return w->base;
}

int odpd_window_contains(const struct odpd_window *w, const void *addr, size_t length)
{
	uintptr_t a = (uintptr_t)addr;

	return a >= w->base && length <= w->size && a - w->base <= w->size - length;
}
