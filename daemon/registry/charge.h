/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Charges and quotas: who pays for an MR's pinned pages. Each account that
 * holds an MR has one struct odpd_charge on it (charge0 in place, more by
 * next); the daemon counts distinct pinned pages once (mr->counted), an
 * account once per page however many of its MRs overlap there (both
 * measured from the segment's interval tree, odpd_itree_uncovered).
 *
 * Owns: mr->charge0 and its chain, mr->counted, registry->pinned, and the
 * quota decision (quota_check) with the relaxed MRs it may evict.
 * Invariants: an MR's charge is added before its pages count and dropped
 * after they stop counting, so that the "uncovered" arithmetic of the
 * others stays right; a relaxed MR keeps one charge (refs 0) of its last
 * holder's account.
 * Callers: reg.c (charge on registration and hit), holder.c (a reference's
 * drop), mrlife.c (mr_strip drops all).
 */

#include "internal.h"

struct odpd_charge *charge_find(const struct odpd_mr *mr, const struct odpd_account *a);
int charge_add(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_account *a,
		      struct odpd_charge **ret);
void charge_drop(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_charge *c);
void global_charge(struct odpd_registry *r, struct odpd_mr *mr);
void global_uncharge(struct odpd_registry *r, struct odpd_mr *mr);
int quota_check(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mapping *map,
		       uint64_t s, uint64_t e, bool pinned, bool need_global, bool may_evict,
		       struct odpd_mr **evict, struct odpd_err *err);
