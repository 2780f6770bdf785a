/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * PDs: the domains (one per PD and device, struct odpd_domain), the named
 * shared PDs that holders join, the implicit-ODP registrar a domain may
 * have, and the export of a PD to a client (daemon-PD mode).
 *
 * Owns: registry->domains, registry->shared, the domain close jobs,
 * holder->domains[] and holder->spd membership counts.
 * Invariants: a domain closes (on a worker) only when no member, no MR and
 * no job is left; a shared PD goes when no member and no domain is left; a
 * registrar is stopped before its domain closes.
 * Callers: reg.c (holder_domain), holder.c (domain_leave), mrlife.c,
 * verifyjob.c, advise.c (domain_maybe_close after their use), core.c.
 */

#include "internal.h"

void domain_maybe_close(struct odpd_registry *r, struct odpd_domain *d, bool keep_spd);
void shared_maybe_free(struct odpd_registry *r, struct odpd_shared_pd *spd);
struct odpd_domain *holder_domain(struct odpd_registry *r, struct odpd_holder *h, unsigned i);
void domain_leave(struct odpd_registry *r, struct odpd_domain *d, struct odpd_mr **list);
