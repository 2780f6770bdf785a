/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Prefetch jobs (ibv_advise_mr) on a holder's ODP MRs: odpd_registry_advise()
 * checks every range against the MRs the holder holds, runs the verb on a
 * worker, and counts the outcome (prefetch_count, also for REG_PREFETCH).
 *
 * Owns: struct advise_op, from submit to its completion.
 * Invariants: an advise job holds its PD open (d->jobs) until advise_done;
 * a failure is counted and logged, never hidden.
 * Callers: the public odpd_registry_advise(); prefetch_count() from reg.c.
 */

#include "internal.h"

void prefetch_count(struct odpd_registry *r, const struct odpd_device *dev, int rc, uint64_t bytes);
