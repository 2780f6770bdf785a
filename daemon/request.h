/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "error.h"
#include "handler.h"
#include "odpd-wire.h"

/* Decode and act on one packet of @c. Consumes @pkt's fds on every path. */
void odpd_request_handle(struct odpd_client *c, const uint8_t *buf, size_t len, struct odpd_packet *pkt);
