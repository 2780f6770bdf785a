/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Client-PD mode: the device contexts a holder's client handed over (its
 * cmd_fd), imported once per connection and shared by that connection's
 * MRs, and an MR's import of the client's PD.
 *
 * Owns: holder->cctxs and the list's reference to each context; an MR's
 * struct odpd_import (mr->imp, not implicit).
 * Invariants: at most ODPD_MAX_CLIENT_CTXS contexts a holder; a context no
 * MR and no request uses is dropped at once (odpd keeps no copy of a
 * client's fd it does not need); a last reference closes on a worker.
 * Callers: reg.c (a registration takes a context), batch.c (a batch drops
 * an MR's import), holder.c (a holder's end), core.c (device removal).
 */

#include "internal.h"

void import_drop(struct odpd_import **pimp);
struct odpd_client_ctx *mr_cctx(const struct odpd_mr *mr);
void holder_unlink_client_ctx(struct odpd_registry *r, struct odpd_holder *h,
				     struct odpd_client_ctx *c);
void cctx_drop(struct odpd_registry *r, struct odpd_holder *h, struct odpd_client_ctx *c);
struct odpd_client_ctx *holder_client_ctx(struct odpd_registry *r, struct odpd_holder *h, int fd,
						 struct odpd_err *err);
void holder_drop_client_ctxs(struct odpd_registry *r, struct odpd_holder *h);
