/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Asynchronous events to clients. Domain modules (hotplug, the registry)
 * never include the connection's header: what a client must be told
 * without having asked goes through this interface, which the connection
 * layer implements (client.c, odpd_client_notify_init) and the manager
 * hands to the modules that raise events. Only the connection layer sends.
 */

struct odpd_holder;

struct odpd_notify {
	/* Device @device went away; holder @h had @mrs MRs on it (or a PD or
	 * a client context there). */
	void (*device_gone)(void *ctx, struct odpd_holder *h, const char *device, unsigned mrs);
	void *ctx;
};
