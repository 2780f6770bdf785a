/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Holders and references: who asks (struct odpd_holder, embedded in the
 * connection's state, but knowing nothing of it) and what it holds (struct
 * odpd_ref, one per handle a client got back). A reference is the only
 * thing that keeps an MR live; its last drop makes the MR relaxed (if it
 * may be cached) or invalidated.
 *
 * Owns: holder->refs, the handle index (ref_index), mr->holders, mr->refs
 * (references of holders; a verify's own reference is verifyjob.c's).
 * Invariants: every reference is on both lists and in the index; a holder's
 * release leaves no reference, no hit table and no PD membership behind.
 * Callers: reg.c (ref_new), hits.c (a revocation drops the reference), the
 * public odpd_holder_init / odpd_holder_release / odpd_registry_release.
 */

#include "internal.h"

struct odpd_ref *ref_new(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mr *mr,
				const struct odpd_reg_req *q);
void ref_drop(struct odpd_registry *r, struct odpd_ref *ref, bool relaxed, struct odpd_mr **dereg);
