/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Hit slots: a holder's hit table (hittab.h) lets its client library serve
 * repeat registrations in-process. This part gives a reference a slot,
 * takes it back, invalidates the slots of an MR that left the cache, and
 * revokes references the library keeps unused (the hit timer, and a flush).
 *
 * Owns: ref->slot/ticket/claimed/last_use, registry->hit_timer, hit_cursor,
 * n_hit_tables, n_hit_pinned.
 * Invariants: a slot's ticket is unique (registry->generation); a revoked
 * slot stays quarantined until the client has seen the revocation; the hit
 * timer runs while any holder has a table.
 * Callers: holder.c (ref_new / ref_drop), lookup.c and core.c
 * (mr_hits_invalidate), relaxed.c (a flush revokes first).
 */

#include "internal.h"

void ref_hit_slot(struct odpd_registry *r, struct odpd_holder *h, struct odpd_ref *ref,
			 const struct odpd_reg_req *q);
void ref_slot_end(struct odpd_registry *r, struct odpd_ref *ref, bool put);
void mr_hits_invalidate(struct odpd_mr *mr);
unsigned holder_revoke(struct odpd_registry *r, struct odpd_holder *h, bool idle,
			      struct odpd_mr **list);
/*
 * The periodic looks at hit tables (unused references here, holes in
 * lookup.c) take at most this many holders per tick, round-robin from where
 * the last tick stopped: with 10,000 clients a tick costs the loop what one
 * with 256 does, and each table is looked at every ceil(holders / 256)
 * ticks instead of every tick.
 */
#define ODPD_LOOK_HOLDERS 256
/* The next holder to look at from *@cursor (registry->hit_cursor or
 * hole_cursor; NULL: the head), and the cursor past it. */
struct odpd_holder *look_next(struct odpd_registry *r, struct odpd_holder **cursor);
void on_hit_timer(evutil_socket_t fd, short what, void *arg);
void timer_every(struct event *ev, bool on, uint64_t ms);
void hits_arm(struct odpd_registry *r);
