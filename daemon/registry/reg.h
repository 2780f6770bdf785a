/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Registration jobs: odpd_registry_reg() finds a hit (lookup.c) or makes a
 * new MR and registers it on a worker (pinned: witness, then pin; ODP;
 * client-PD: import first; implicit ODP: through the domain's registrar),
 * and answers through the caller's callback. Requests for an MR being
 * registered join it instead of making another.
 *
 * Owns: struct reg_op from submit to its answer, mr->joiners while
 * REGISTERING, and the REGISTERING -> LIVE change.
 * Invariants: quotas are reserved before the worker runs, so that requests
 * in flight cannot overbook them; a failed registration frees what it made
 * and answers every joiner; the command fd is consumed on every path.
 * Callers: the public odpd_registry_reg() only.
 */

#include "internal.h"


