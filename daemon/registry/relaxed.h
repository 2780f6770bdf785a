/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The relaxed queue: MRs no reference holds that may still be hit, oldest
 * first, and the flushes that empty it (by age, by count or bytes, on
 * quota pressure, or asked for: odpd_registry_flush).
 *
 * Owns: registry->relaxed, n_relaxed, relaxed_bytes, relaxed_timer, and
 * mr->relaxed_ms/pid/by while RELAXED.
 * Invariants: an MR is on the queue iff its state is RELAXED; the timer is
 * due when the oldest passes the relaxed window; a flush returns (its
 * callback) only after every selected MR and every batch before it is
 * deregistered.
 * Callers: holder.c (a relaxed release queues), reg.c (a hit dequeues),
 * charge.c (eviction), pds.c (a PD nobody can hit anymore), mrlife.c.
 */

#include "internal.h"

void relaxed_remove(struct odpd_registry *r, struct odpd_mr *mr);
unsigned collect_relaxed(struct odpd_registry *r, bool (*match)(const struct odpd_mr *, const void *),
				const void *arg, struct odpd_mr **list);
bool match_all(const struct odpd_mr *mr, const void *arg);
/* Invalidate the whole relaxed queue (one batch); returns how many MRs. */
unsigned flush_queue(struct odpd_registry *r, const char *why);
void on_relaxed_timer(evutil_socket_t fd, short what, void *arg);
void relaxed_arm(struct odpd_registry *r);
