/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Verify jobs: read an MR through the device (verify.h) on a worker, for a
 * holder's reference or for the admin (by MR id), and the idle verifiers
 * kept per PD for verify-idle-ms after their last use.
 *
 * Owns: struct verify_op, mr->busy, domain->verifies and the idle list
 * (registry->idle_verifiers, verifier_timer).
 * Invariants: while busy, the MR is not deregistered: an invalidation or a
 * device removal defers it (batch.c) and the last verify batches it; an
 * admin verify holds a reference of its own meanwhile.
 * Callers: the public odpd_registry_verify / odpd_registry_verify_mr;
 * pds.c (a closing PD leaves the idle list).
 */

#include "internal.h"

void verifier_unlist(struct odpd_registry *r, struct odpd_domain *d);
void on_verifier_timer(evutil_socket_t fd, short what, void *arg);
