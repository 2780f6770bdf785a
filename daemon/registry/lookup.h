/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The cache index and lookup: an MR's place in its segment's interval tree
 * (map->mrs, which also measures pinned pages for charge.c), whether a
 * lookup may serve it (mr->cached), and whether a pinned MR still pins the
 * segment's pages (ctime, then its witness pages: witness.c). A pinned MR
 * over a punched hole is retired, found either by a lookup or, for what
 * hit tables serve without asking, by the hole timer.
 *
 * Owns: mr->in_map, mr->cached, registry->hole_timer, hole_pass and
 * hole_cursor.
 * Invariants: an MR enters its tree right after mr_new (its id is the
 * largest) and leaves it when stripped; a retired MR is never a hit again;
 * the lookup's callback never changes the tree (stale MRs are retired
 * after the walk).
 * Callers: reg.c (lookup, insert), mrlife.c (remove on strip), relaxed.c
 * (a flush checks holes first), core.c (device removal unindexes).
 */

#include "internal.h"

struct lookup {
	struct odpd_registry *r;
	const struct odpd_holder *h;
	const struct odpd_domain *dom;      /* MRs of this PD ... */
	uint64_t base;                      /* ... whose iova - offset is this */
	struct odpd_mapping *map;
	uint64_t s, e;
	uint32_t access;
	bool odp;                           /* the kind asked for: ODP or pinned */
	bool ctime_read;                    /* once, before the first witness check */
	bool have_ctime;
	struct timespec ctime;
	struct odpd_mr *stale;              /* pinned MRs over replaced pages, by batch_next */
	struct odpd_mr *registering;        /* the first that will serve it once registered */
};

void map_insert(struct odpd_mr *mr);
void map_remove(struct odpd_mr *mr);
void mr_unindex(struct odpd_mr *mr);
void holes_check(struct odpd_registry *r, struct odpd_holder *h);
void on_hole_timer(evutil_socket_t fd, short what, void *arg);
void holes_arm(struct odpd_registry *r);
struct odpd_mr *cache_lookup(struct odpd_registry *r, struct odpd_domain *d, const struct odpd_reg_req *q,
				    struct lookup *l);
