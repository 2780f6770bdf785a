/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The witness view: odpd's second, read-only mapping of a segment, whose
 * pages tell whether a hole was punched under a pinned MR since its pin
 * (a punch zaps them; PAGEMAP_SCAN or /proc/self/pagemap tells). Also
 * the mapping of odpd's view ahead of registrations (MapSegment).
 *
 * Owns: mr->witnessed, witness_epoch, ctime_ns/ctime_ok (set at the pin),
 * map->witness_epoch, registry->pagemap_fd/pagemap_scan.
 * Invariants: workers only, under map->witness_lock, except
 * witness_present (the loop); an MR's witness ends before it leaves its
 * tree; a page a punch zapped that fault-around could bring back moves the
 * epoch first, so no MR pinned before proves current again.
 * Callers: reg.c (witness_begin/end around the pin), batch.c (witness_end
 * at deregistration), lookup.c (witness_present).
 */

#include "internal.h"

bool ctime_settled(const struct timespec *ts);
bool mapped_already(struct odpd_registry *r, const void *addr, uint64_t length);
bool mapped_now(struct odpd_registry *r, const void *addr, uint64_t length);
bool cached_now(const void *addr, uint64_t length);
void witness_begin(struct odpd_registry *r, struct odpd_mr *mr);
/* witness_begin where the caller has seen every witness page of @mr present
 * (under witness_lock): no scan, nothing to put back. */
void witness_begin_present(struct odpd_mr *mr);
void witness_end(struct odpd_mr *mr);
bool witness_present(struct odpd_registry *r, const struct odpd_mr *mr);
