/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Asynchronous events to clients. Domain modules (hotplug, the registry)
 * never include the connection's header: what a client must be told
 * without having asked goes through this interface, which the connection
 * layer implements (client.c, odpd_client_notify_init) and the manager
 * hands to the modules that raise events. Only the connection layer sends.
 */

#include <stdbool.h>
#include <stdint.h>

struct odpd_holder;
struct odpd_out;
struct odpd_conn_view;

struct odpd_notify {
	/* Device @device went away; holder @h had @mrs MRs on it (or a PD or
	 * a client context there). */
	void (*device_gone)(void *ctx, struct odpd_holder *h, const char *device, unsigned mrs);
	/* Request @id of connection @conn, which a handler left pending,
	 * ends: send @o's answer if the connection is still there (drop it
	 * if not), and read from it again. Takes @o's answer. (handler.h,
	 * odpd_complete) */
	void (*complete)(void *ctx, uint64_t conn, uint64_t id, struct odpd_out *o);
	/* Is connection @conn still connected? */
	bool (*connected)(void *ctx, uint64_t conn);
	/* Fill @v (room for @cap) with the connected clients that are not
	 * monitors, newest first; count the monitors in @monitors. Returns
	 * how many it filled. (handler.h, odpd_admin_status) */
	unsigned (*clients)(void *ctx, struct odpd_conn_view *v, unsigned cap, unsigned *monitors);
	void *ctx;
};
