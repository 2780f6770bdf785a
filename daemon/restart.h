/* SPDX-License-Identifier: MIT */
#pragma once
/*
 * A restart that keeps every MR (doc/design.md §12). A stopping odpd under
 * systemd waits until no request or job is in flight, writes its state (PDs,
 * MRs, segments, connections and their references; proto/odpd-state.proto)
 * into a memfd and hands it, with the fds it names, to systemd's fd store;
 * the next odpd imports the device contexts, PDs and MRs by handle, maps the
 * segments where they were and takes the connections back. What it cannot
 * keep is dropped as a stop drops it: the client gets ENOTCONN, the kernel
 * objects go with their fds.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "fdstore.h"

struct odpd_manager;

/* The state's format: this odpd writes ODPD_STATE_FORMAT and reads every
 * format from ODPD_STATE_FORMAT_MIN on (odpd-state.proto says the rule). */
#define ODPD_STATE_FORMAT 1u
#define ODPD_STATE_FORMAT_MIN 1u

/* The state a previous odpd left, read at start (NULL: none). */
struct odpd_restart;

/* At start, before the address window is reserved: read the state in @st, if
 * any (taken from it). Returns NULL when there is none or it cannot be used
 * (said in the log, and in @m's restart_* for odpctl status). */
struct odpd_restart *odpd_restart_read(struct odpd_manager *m, struct odpd_fdstore *st);
/* Where the previous odpd's window lay (0: anywhere). */
uintptr_t odpd_restart_window(const struct odpd_restart *rs, size_t size);
/* Once devices, registry and segments are up, before the first accept: take
 * back what @rs describes, from the fds in @st; frees @rs. */
void odpd_restart_restore(struct odpd_manager *m, struct odpd_restart *rs, struct odpd_fdstore *st);
void odpd_restart_free(struct odpd_restart *rs);
/* @rs cannot be used at all: say so in odpctl status (all dropped), and free it. */
void odpd_restart_drop(struct odpd_manager *m, struct odpd_restart *rs);

/* Once restored (or at a start without a state): keep a journal, so that a
 * crash too keeps the MRs (journal.h). */
void odpd_restart_journal_start(struct odpd_manager *m);
/* Is the stored fd @name (without "odpd-") one odpd keeps storing? */
bool odpd_restart_in_use(const char *name, void *arg);

/* SIGTERM: can this stop hand its state over (systemd's notify socket, every
 * device able to import)? Why not, else NULL. */
const char *odpd_restart_unavailable(const struct odpd_manager *m);
/* Begin a stop that hands the state over: read no more requests, drop what
 * cannot be kept, and once nothing runs, store everything and end the loop
 * (m->handed_over). Falls back to a plain stop (@plain_stop) if it cannot. */
void odpd_restart_begin(struct odpd_manager *m, void (*plain_stop)(struct odpd_manager *m));
