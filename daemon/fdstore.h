/* SPDX-License-Identifier: MIT */
#pragma once
/*
 * systemd's fd store (doc/design.md §12): what a stopping odpd hands to
 * systemd so that the next odpd finds it again. Every fd is stored under a
 * name of its own (FDNAME=), since systemd hands them back in another order.
 * The main process alone may store (NotifyAccess=main).
 */
#include <stdbool.h>

/* What systemd passed at start (sd_listen_fds_with_names): the listening
 * socket of odpd.socket, and the fds of the store, by name. */
struct odpd_stored_fd {
	char *name;
	int fd;                 /* -1 once taken */
};
struct odpd_fdstore {
	int listen_fd;          /* -1: none passed */
	char *listen_name;
	struct odpd_stored_fd *fds;
	unsigned n;
};

/* Take what systemd passed (unsetting LISTEN_FDS for children), and learn
 * the unit's FileDescriptorStoreMax=, before anything is stored: $FDSTORE
 * (systemd 254 and later set it when the limit is above 0), else with
 * @ask_bus the unit's property over D-Bus (systemd 252, or 0), within 2 s.
 * Where it is not known odpd counts but refuses nothing (systemd still
 * closes what does not fit). 0 or -errno. */
int odpd_fdstore_collect(struct odpd_fdstore *s, bool ask_bus);
/* The stored fd named @name, now the caller's; -1 if there is none. */
int odpd_fdstore_take(struct odpd_fdstore *s, const char *name);
/* Tell systemd to forget every stored fd (taken or not), close those not
 * taken and free @s. Nothing stays in the store once odpd has read it: the
 * next stop stores what is live then. */
void odpd_fdstore_release(struct odpd_fdstore *s);
/* The same, but what @in_use says is in use (its name without "odpd-")
 * stays in systemd's store: what odpd took back and keeps storing. */
void odpd_fdstore_release_unused(struct odpd_fdstore *s, bool (*in_use)(const char *name, void *arg), void *arg);
/* Can odpd store fds: is it systemd's main process with a notify socket,
 * and not FileDescriptorStoreMax=0? */
bool odpd_fdstore_available(void);
/*
 * Store @fd under @name (FDSTORE=1, FDPOLL=0). 0 or -errno. Beyond the
 * unit's FileDescriptorStoreMax= systemd closes the fd and keeps nothing,
 * and a journal that does not fit loses everything at the next start. So
 * where the limit is known nothing goes beyond it (-EXFULL), and the last
 * ODPD_FDSTORE_RESERVED places are the journal's and the limbo's (a rewrite
 * stores the new journal before it removes the old one): a PD's context may
 * take half of them, a connection, a hit table or a segment none. What a
 * refused fd would keep is dropped at a restart (odpd(8), RESTART). odpd
 * says so once at 90 % of the limit and once when it first refuses.
 */
int odpd_fdstore_put(const char *name, int fd);
#define ODPD_FDSTORE_RESERVED 4
/* What odpd has in the store now, the unit's FileDescriptorStoreMax= (if
 * @known), and the stores refused since start. */
struct odpd_fdstore_usage {
	unsigned stored, max;
	bool known;
	unsigned long long refused;
};
void odpd_fdstore_usage(struct odpd_fdstore_usage *u);
/* Tell systemd to forget what is stored under @name (FDSTOREREMOVE=1). 0 or -errno. */
int odpd_fdstore_remove(const char *name);
/* Wait until systemd has read every message sent so far (sd_notify_barrier). */
int odpd_fdstore_sync(void);
