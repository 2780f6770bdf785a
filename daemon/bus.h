/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * odpd on D-Bus (sd-bus, the system bus): bus name org.odpd1.
 *
 *   /org/odpd1                  org.odpd1.Manager  the daemon's counters (read-only
 *                                                  properties, no change signals) and
 *                                                  Flush() -> (u mrs, t bytes)
 *   /org/odpd1/client/ID        org.odpd1.Client   one connected client
 *   /org/odpd1/device/NAME      org.odpd1.Device   one present device
 *
 * The connection lives on the event loop (its fd, events and timeout as a
 * libevent event) and never blocks it: the name is requested
 * asynchronously, and Flush() checks its caller's credentials with an
 * asynchronous GetConnectionCredentials call before it does anything (the
 * policy file lets only root call it; the check repeats that, and adds the
 * admin group). Without a system bus odpd serves on without D-Bus.
 */

#include <stdio.h>

struct odpd_manager;

/* Connect (DBUS_SYSTEM_BUS_ADDRESS or the system bus) and publish. A bus
 * that cannot be reached is logged and not an error. */
int odpd_bus_start(struct odpd_manager *m);
/* After the last job's completion ran (pending Flush() calls are answered). */
void odpd_bus_stop(struct odpd_manager *m);

/* odpd --bus-introspect: the introspection XML of the three interfaces, made
 * by sd-bus itself over an in-process connection pair. 0 or -errno. */
int odpd_bus_introspect(FILE *out);
