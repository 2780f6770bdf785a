/* SPDX-License-Identifier: MIT */
#pragma once

#include <infiniband/verbs.h>

#include "device.h"
#include "error.h"

struct odpd_verifier;

/*
 * A protection domain of one client on one device, in a device context of
 * its own (ibv_open_device), so that the context holds nothing but that
 * client's objects (DESIGN.md §4). Opened and closed on a worker thread.
 */
struct odpd_domain {
	struct odpd_device *dev;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct odpd_verifier *verifier;   /* created on first verify */
};

int odpd_domain_open(struct odpd_device *dev, struct odpd_domain **ret, struct odpd_err *err);
/* Destroys the verifier, the PD and the context. MRs must be gone. */
void odpd_domain_close(struct odpd_domain *d);
