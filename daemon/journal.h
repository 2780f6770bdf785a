/* SPDX-License-Identifier: MIT */
#pragma once
/*
 * The journal: odpd's state kept current in systemd's fd store, so that a
 * crash (kill -9, a fault) loses nothing a client was told (doc/design.md
 * §12, proto/odpd-state.proto's Record). While it runs:
 *  - every device context, segment memfd, connection socket and hit table
 *    that a restart could keep goes into the fd store as it is made
 *    ("ctx-ID", "seg-ID", "conn-ID", "hit-ID"), and out as it goes;
 *  - every change of a PD, segment, MR, reference or connection is written
 *    into a record, and the record is committed (published in the journal
 *    memfd's header) before any reply leaves: a client never sees an effect
 *    the journal lacks. With the record goes the connection's reply, so that
 *    a request done but not answered at a crash is answered, not done twice.
 *  - Grown past twice its last snapshot, the journal is rewritten as one
 *    snapshot into a new memfd ("journal-N+1"), which replaces the old one.
 * Off (every call a no-op) without systemd's fd store, with
 * --no-live-restart, or where a device cannot import.
 *
 * Loop thread only.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "odpd-state.pb-c.h"

struct odpd_manager;
struct odpd_domain;
struct odpd_mapping;
struct odpd_mr;
struct odpd_cseg;
struct odpd_hittab;

/* A connection as the journal writes it (Client without segments and refs). */
struct odpd_keep_client {
	uint64_t id;
	const char *name;
	const char *shared;                 /* the shared PD it joined, or NULL */
	bool registered;
	uint64_t next_handle;
	uint64_t local_hits, events;
	uint64_t starttime;
	const char *unkeepable;             /* NULL, or why a restart cannot keep it */
	uint32_t hit_slots;                 /* its hit table's (0: none) */
	/* The last request whose effect a commit held, and its packed answer
	 * (NULL: not kept): written again with an event's commit. */
	uint64_t last_id;
	const void *last_reply;
	size_t last_len;
};

/* Makes a full state of @m into @st (restart.c), fields allocated as
 * protobuf-c frees them; @clean: the stop's own (ctime proofs, nothing in
 * flight). 0 or -errno. */
typedef int odpd_state_build_fn(struct odpd_manager *m, OdpdState__State *st, bool clean);

/* Is a journal kept (odpd_journal_start succeeded)? */
bool odpd_journal_on(void);
/* Start one: a new journal memfd (journal-@epoch+1), stored, with a
 * snapshot of @m as it is (after a restore: what was taken back; what it
 * did not take leaves the store with odpd_fdstore_release_unused), and its
 * limbo; PD ids from @max_domain on, segment ids from @max_mapping on. 0 or
 * -errno (then no journal: a crash drops everything, as before). */
int odpd_journal_start(struct odpd_manager *m, odpd_state_build_fn *build, uint64_t epoch,
		       uint32_t max_domain, uint32_t max_mapping);
/* The limbo (keep.h, any thread): enter an MR @handle made in @d's PD
 * (its slot; 0: not tracked), and leave once it is deregistered. */
uint32_t odpd_limbo_enter(struct odpd_domain *d, uint32_t handle);
void odpd_limbo_set(uint32_t slot, struct odpd_domain *d, uint32_t handle);
void odpd_limbo_leave(uint32_t slot);
/* Before a restore: the limbo (keep.h) as journal-@epoch's, so that the MRs
 * taken back are in it; ids of PDs from @max_domain on. 0 or -errno. */
int odpd_journal_prepare(uint64_t epoch, uint32_t max_domain);
/* Is @name (without "odpd-") the journal's or the limbo's own? */
bool odpd_journal_owns(const char *name);
/* The entries of a stored limbo @fd (not taken): *@ret (free it), each
 * PD id << 32 | MR handle. 0 or -errno. */
int odpd_limbo_read(int fd, uint64_t **ret, size_t *ret_n);
/* A plain stop: forget the journal and everything stored. */
void odpd_journal_stop(void);
/* A stop that hands over: @st (clean) as the last snapshot; the journal
 * stays in the store. 0 or -errno. */
int odpd_journal_hand_over(const OdpdState__State *st);

/* Ids (and fd store entries) of what records name: made on first use. 0
 * when it cannot be stored. */
uint32_t odpd_journal_domain_id(struct odpd_domain *d);
uint32_t odpd_journal_mapping_id(struct odpd_mapping *map);

/* A connection said Hello and can be kept: store its socket. false: not
 * stored (no journal, or a full fd store): it is not kept. */
bool odpd_journal_client_new(const struct odpd_keep_client *c, int fd);
/* Its hit table's generation table (read-write fd, not taken). */
void odpd_journal_client_hits(uint64_t id, int fd);
void odpd_journal_client_gone(uint64_t id, bool had_hits);
void odpd_journal_segment(uint64_t client, const struct odpd_cseg *s);
void odpd_journal_segment_gone(uint64_t client, uint64_t handle);
void odpd_journal_shared(const char *name, uint32_t creator_uid);

/*
 * Before a reply to connection @c's request @id leaves: commit what changed,
 * with @c's header and, when something did, the packed reply @data (@len;
 * not kept when it carries an fd, @has_fd). Id 0 (an event): commit only.
 */
void odpd_journal_commit(const struct odpd_keep_client *c, uint64_t id, const void *data, size_t len,
			 bool has_fd);
/* Is anything waiting to be committed? */
bool odpd_journal_pending(void);

/* Does the journal keep @mr (a pinned MR of odpd's PDs, live or relaxed)? */
bool odpd_journal_mr_kept(const struct odpd_mr *mr);
/* Fill @pm from @mr (charges allocated; the caller frees them with
 * odpd_journal_mr_clear). Its ctime proof is the MR's own. */
int odpd_journal_fill_mr(OdpdState__Mr *pm, const struct odpd_mr *mr);
void odpd_journal_mr_clear(OdpdState__Mr *pm);

/*
 * At start: fold the newest journal among the stored fds into one state, as
 * a stopping odpd would have written it (domains and mappings numbered from
 * 1, their fd names kept). *@ret_crashed: the journal did not end with a
 * clean hand-over. *@ret_epoch: its number (journal-N). NULL if it does
 * not read (said in the log).
 */
OdpdState__State *odpd_journal_read(int fd, bool *ret_crashed, uint64_t *ret_epoch);
/* Free what a state builder (odpd_state_build_fn) allocated in @st. */
void odpd_journal_state_free_built(OdpdState__State *st);
/* Free a state odpd_journal_read returned. */
void odpd_journal_state_free(OdpdState__State *st);
