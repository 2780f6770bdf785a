/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The MR's life: invalidation (out of the cache for good, a new generation,
 * into a batch or deferred to its verifies), stripping (charges, pins and
 * PD released once the kernel's MR is gone) and the one place an MR is
 * freed.
 *
 * Owns: mr->state changes out of LIVE/RELAXED into INVALIDATING, and the
 * MR's memory (the mr_slab object).
 * Invariants: an MR is freed only by mr_free; a stripped MR holds nothing
 * but its struct (and, if dead, its holders' references).
 * Callers: every part that ends an MR's use.
 */

#include "internal.h"

void mr_invalidate(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_mr **list);
void mr_strip(struct odpd_registry *r, struct odpd_mr *mr);
void mr_free(struct odpd_registry *r, struct odpd_mr *mr);
