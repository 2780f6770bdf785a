/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * What the registry and the segment table tell the journal (journal.h,
 * doc/design.md §12) as their objects change, so that a crash loses nothing
 * a client was told. Like notify.h, an interface the modules call and do not
 * implement: they never include the journal's header. NULL: no journal.
 */

#include <stdbool.h>
#include <stdint.h>

struct odpd_mr;
struct odpd_ref;
struct odpd_domain;
struct odpd_mapping;

struct odpd_keep {
	/* @mr changed (its state, charges, flags): written at the next commit. */
	void (*mr)(void *ctx, struct odpd_mr *mr);
	/* @mr is about to be freed. */
	void (*mr_free)(void *ctx, struct odpd_mr *mr);
	/* Holder @holder took reference @ref (@gone false), or dropped it. */
	void (*ref)(void *ctx, uint64_t holder, const struct odpd_ref *ref, bool gone);
	/* @d changed (exported): written again. */
	void (*domain)(void *ctx, struct odpd_domain *d);
	/* @d is closing: its context goes. */
	void (*domain_gone)(void *ctx, struct odpd_domain *d);
	/* @map is being unmapped. */
	void (*mapping_gone)(void *ctx, struct odpd_mapping *map);
	/* The shared PD @name was freed. */
	void (*shared_gone)(void *ctx, const char *name);
	/*
	 * The limbo (any thread): MRs odpd has in the kernel, in PDs a crash
	 * would keep, whether or not the journal knows them yet: made on a
	 * worker and not yet committed, or invalidated and not yet
	 * deregistered. After a crash the next odpd deregisters those the
	 * journal does not name. Enter before the verb that makes an MR in
	 * @d's PD, with @handle ODPD_LIMBO_PENDING (a crash during the verb
	 * can leave the MR made and its handle never returned: the next odpd
	 * then looks for MRs it does not know in that PD); set the handle
	 * once the verb returned it; leave if the verb failed, or once the MR
	 * is deregistered. Enter returns the slot (0: not tracked).
	 */
	uint32_t (*limbo_enter)(void *ctx, struct odpd_domain *d, uint32_t handle);
	void (*limbo_set)(void *ctx, uint32_t slot, struct odpd_domain *d, uint32_t handle);
	void (*limbo_leave)(void *ctx, uint32_t slot);
	void *ctx;
};

/* The daemon's one journal's hooks, set while it runs (journal.c; before
 * any worker runs a job, cleared after the last): NULL otherwise (and in
 * unit tests). */
extern const struct odpd_keep *odpd_keep;

static inline void keep_mr(struct odpd_mr *mr)
{
	if (odpd_keep)
		odpd_keep->mr(odpd_keep->ctx, mr);
}

static inline void keep_mr_free(struct odpd_mr *mr)
{
	if (odpd_keep)
		odpd_keep->mr_free(odpd_keep->ctx, mr);
}

static inline void keep_ref(uint64_t holder, const struct odpd_ref *ref, bool gone)
{
	if (odpd_keep)
		odpd_keep->ref(odpd_keep->ctx, holder, ref, gone);
}

static inline void keep_domain(struct odpd_domain *d)
{
	if (odpd_keep)
		odpd_keep->domain(odpd_keep->ctx, d);
}

static inline void keep_domain_gone(struct odpd_domain *d)
{
	if (odpd_keep)
		odpd_keep->domain_gone(odpd_keep->ctx, d);
}

static inline void keep_mapping_gone(struct odpd_mapping *map)
{
	if (odpd_keep)
		odpd_keep->mapping_gone(odpd_keep->ctx, map);
}

static inline void keep_shared_gone(const char *name)
{
	if (odpd_keep)
		odpd_keep->shared_gone(odpd_keep->ctx, name);
}

static inline uint32_t keep_limbo_enter(struct odpd_domain *d, uint32_t handle)
{
	return odpd_keep ? odpd_keep->limbo_enter(odpd_keep->ctx, d, handle) : 0;
}

/* A limbo slot's handle while its verb runs (keep.h, limbo_enter). */
#define ODPD_LIMBO_PENDING UINT32_MAX

static inline void keep_limbo_set(uint32_t slot, struct odpd_domain *d, uint32_t handle)
{
	if (odpd_keep && slot)
		odpd_keep->limbo_set(odpd_keep->ctx, slot, d, handle);
}

static inline void keep_limbo_leave(uint32_t slot)
{
	if (odpd_keep && slot)
		odpd_keep->limbo_leave(odpd_keep->ctx, slot);
}
