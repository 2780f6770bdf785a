/* SPDX-License-Identifier: MIT */
#pragma once

#include "handler.h"

/*
 * Call the handler of @req (decoded, Hello answered and the fd count
 * checked by the connection layer) for caller @k. @fd, the request's one
 * fd or -1, is consumed on every path. Returns the handler's ODPD_DONE
 * (its answer, if any, in @o) or ODPD_PENDING (handler.h).
 */
int odpd_request_dispatch(const struct odpd_caller *k, const Odpd__Request *req, int fd, struct odpd_out *o);
