/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>
#include <stdint.h>

/*
 * The address window: a large PROT_NONE reservation in odpd's address space
 * from which segments made by the client library's allocation helper get
 * their address. The client maps the segment at the same address, so
 * iova == address on both sides. Placing a segment replaces part of the
 * reservation (MAP_FIXED); releasing it puts PROT_NONE back, so nothing
 * else in odpd can ever land there.
 */
struct odpd_window;

int odpd_window_new(size_t size, struct odpd_window **ret);
/* The same at @base exactly (a restart: the segments' addresses are the
 * clients' iovas); -EEXIST where something else lies there already. */
int odpd_window_new_at(uintptr_t base, size_t size, struct odpd_window **ret);
/* Where the window lies, and its size in bytes. */
uintptr_t odpd_window_base(const struct odpd_window *w, size_t *ret_size);
/* Take [addr, addr + length) out of the free ranges (a restart puts a
 * segment back where it was). 0, -EEXIST if any of it is taken, -ENOMEM. */
int odpd_window_take(struct odpd_window *w, void *addr, size_t length);
void odpd_window_free(struct odpd_window *w);

/* Find @length bytes aligned to @align (a power of two, >= page size).
 * Returns the address or NULL (window full). */
void *odpd_window_alloc(struct odpd_window *w, size_t length, size_t align);

/* Give [addr, addr + length) back and make it PROT_NONE again. */
void odpd_window_release(struct odpd_window *w, void *addr, size_t length);
/* The two halves of odpd_window_release: unmap makes the range PROT_NONE
 * again (any thread: it is what costs, for a populated segment), put gives
 * it back to the allocator (the thread that owns @w, after unmap). */
void odpd_window_unmap(void *addr, size_t length);
void odpd_window_put(struct odpd_window *w, void *addr, size_t length);

/* Does the window contain [addr, addr + length)? */
int odpd_window_contains(const struct odpd_window *w, const void *addr, size_t length);
