/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Devices that come and go while odpd runs. odpd keeps one context open per
 * present device (its probe's, odpd_device.watch) and reads its async
 * events on the loop: IBV_EVENT_DEVICE_FATAL, which the kernel sends to
 * every context of a device being unregistered (`rdma link delete`, a
 * driver unbind, a fatal hardware error), makes that device's MRs dead
 * (registry.h), closes every context odpd has on it (the kernel waits for
 * that before the device can go) and tells the clients that had anything
 * on it (DeviceEvent). A device that appears (again) is found by a rescan:
 * 200 ms after a uverbs node appears in /dev/infiniband (inotify), and when
 * a request names a device odpd does not have, or asks for the first one
 * and none is left (at most once a second).
 */

#include <event2/event.h>

#include "device.h"
#include "error.h"
#include "notify.h"

struct odpd_registry;

/* What hotplug works on; the manager's, set before odpd_hotplug_start.
 * Hotplug knows no connection: clients are told through @notify. */
struct odpd_hotplug {
	struct event_base *base;
	struct odpd_devices *devices;
	struct odpd_registry *registry;
	const struct odpd_notify *notify;
};

/* Watch every present device. */
int odpd_hotplug_start(struct odpd_hotplug *hp);
void odpd_hotplug_stop(struct odpd_hotplug *hp);

/* The present device @name ("" or NULL: the first present one), rescanning
 * for it if need be; NULL with ENODEV in @err. */
struct odpd_device *odpd_hotplug_device(struct odpd_hotplug *hp, const char *name, struct odpd_err *err);
