/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The hit table of one connection: how libodpd answers a registration of a
 * range it already holds, and reuses a reference it released relaxed,
 * without asking the daemon (proto/odpd.proto, OpenHitTable).
 *
 * Two arrays of 64-bit words, one slot per MR reference of the connection:
 *  - the generation table, made here and written only by odpd. The client
 *    gets a read-only file description of the memfd (a new open through
 *    /proc/self/fd, not a dup) and maps it read-only: from that fd no
 *    writable shared mapping can be made, nor seals added, and the memfd
 *    is 0600, odpd's uid's, so another uid cannot reopen it read-write.
 *    The memfd is sealed against resizing only, not against writes, and
 *    odpd keeps its read-write fd (odpd_hittab_fd): after a crash, the
 *    next odpd finds it in systemd's fd store and retires the table
 *    (odpd_hittab_retire_fd), which a table sealed F_SEAL_FUTURE_WRITE
 *    would forbid. Slot s holds the reference's
 *    ticket while it is valid, ticket | ODPD_HIT_INVALID once its MR was
 *    invalidated, 0 when free or revoked. Two header slots are never
 *    handed to a reference: slot 0, how many references were revoked;
 *    slot 1 (ODPD_HIT_EVENTS_SLOT, HitTableReply.events_slot), the events
 *    word: how many events (id-0 replies with a body, e.g. DeviceEvent)
 *    the daemon has sent on this connection since it connected. It is
 *    stored (release) before the event is queued for sending, so a client
 *    that can read an event sees the word counting it; a client whose own
 *    count of events received equals the word has none to read, and skips
 *    the non-blocking receive it would otherwise make before each request.
 *  - the use table, the client's memfd (sealed against shrinking), mapped
 *    read-only here: the client writes the ticket while it uses the
 *    reference, any other value while it keeps it unused.
 *
 * With a release ring (OpenHitTable.release_ring, since 1.4.5), both
 * tables go on after the slots: in the use table, word [slots] is the
 * ring's tail (how many releases the client has written) and word
 * [slots + 1 + i % ring] release i, the handle of one of its MR references
 * that it released without a request (a DeregMr.no_reply written instead
 * of sent); in the generation table, word [slots] is how many of them odpd
 * has taken (odpd_hittab_ring_take). The client never writes more than
 * ring entries ahead of that count, and writes an entry before the tail.
 *
 * Revoking an unused reference races with the client taking it back; both
 * sides store, fence, then load the other's word (Dekker), so at least one
 * sees the other: the client's claim fails, or the revocation is abandoned.
 * A revoked slot is reused only after the client said (Request.
 * revocations_seen) that it has dropped what it knew about it.
 *
 * Loop thread only.
 */

#include <stdbool.h>
#include <stdint.h>

#include "error.h"

#define ODPD_HIT_SLOTS_MIN 2u          /* header slots only: no reference gets one */
#define ODPD_HIT_EVENTS_SLOT 1u
#define ODPD_HIT_HEADER_SLOTS 2u        /* slot 0 (revocations) and 1 (events) */
#define ODPD_HIT_SLOTS_MAX 65536u
/* Entries of a release ring, at most (OpenHitTable.release_ring). */
#define ODPD_HIT_RING_MAX 64u
#define ODPD_HIT_INVALID (UINT64_C(1) << 63)
#define ODPD_HIT_REVOKING (UINT64_C(1) << 62)
/* Tickets come from the registry's generation counter: far below this. */
#define ODPD_HIT_TICKET_LIMIT (UINT64_C(1) << 61)
/* The events word of a table a restart could not keep (doc/design.md §12):
 * the library then opens a new one. No count of events reaches it. */
#define ODPD_HIT_RETIRED UINT64_MAX

struct odpd_hittab;

/*
 * Map the client's use table @use_fd (not taken) and make the generation
 * table; *@ret_gen_fd is a read-only description of it for the reply (the
 * caller sends and closes it). @want slots, clamped to [MIN, MAX], and a
 * release ring of @ring entries (at most ODPD_HIT_RING_MAX; 0: none); the
 * use file must hold them. EINVAL: not a memfd, not sealed with F_SEAL_SHRINK,
 * a hugetlb memfd (its mapping would be rounded up to the huge page), too
 * small. The read-only reopen goes through /proc/self/fd: without /proc it
 * fails (its errno), rather than hand out the writable memfd.
 */
int odpd_hittab_open(uint32_t want, uint32_t ring, int use_fd, struct odpd_hittab **ret, int *ret_gen_fd,
		     struct odpd_err *err);
/* Closes the read-write memfd too (a copy in systemd's fd store stays). */
void odpd_hittab_close(struct odpd_hittab *t);
/* The generation table's read-write memfd (the table's own: dup it to keep
 * it), for systemd's fd store. */
int odpd_hittab_fd(const struct odpd_hittab *t);
/*
 * Retire the table: every reference slot that holds a ticket gets
 * ODPD_HIT_INVALID (the ticket kept), then the events word
 * ODPD_HIT_RETIRED (release stores, slots first). The library serves
 * nothing more from it and opens a new table at its next call.
 */
void odpd_hittab_retire(struct odpd_hittab *t);
/*
 * The same on the generation table whose read-write memfd is @fd (not
 * taken): a new odpd does it to a table it found in systemd's fd store
 * after a crash. It maps the file writable (its size from fstat), retires
 * it and unmaps it. EINVAL: not a file of a generation table's size.
 */
int odpd_hittab_retire_fd(int fd, struct odpd_err *err);

uint32_t odpd_hittab_slots(const struct odpd_hittab *t);
/* Mappings a table takes in the daemon: the use and generation tables. */
#define ODPD_HIT_MAPPINGS 2
/* Bytes of the daemon's address space a table opened for @want slots and
 * a ring of @ring entries takes (both mappings). */
uint64_t odpd_hittab_mapped(uint32_t want, uint32_t ring);
/* Entries of its release ring (0: none). */
uint32_t odpd_hittab_ring(const struct odpd_hittab *t);
/*
 * The releases the client wrote into the ring since the last take, oldest
 * first, into @handles (room for odpd_hittab_ring(t)); how many. They are
 * the ring's no more: the count odpd has taken is published for the
 * client. *@bad: the client broke the ring's rule (its tail behind odpd's
 * count or more than a ring ahead): nothing is taken, and odpd's count
 * becomes its tail.
 */
unsigned odpd_hittab_ring_take(struct odpd_hittab *t, uint64_t *handles, bool *bad);
/* Slots held by references (quarantined ones included). */
uint32_t odpd_hittab_used(const struct odpd_hittab *t);

/* A slot for a new reference with @ticket, or 0 if none is free. */
uint32_t odpd_hittab_take(struct odpd_hittab *t, uint64_t ticket);
/* The connection has sent @sent events so far: the events word. */
void odpd_hittab_events(struct odpd_hittab *t, uint64_t sent);
/* The reference was released by the client: its slot is free again. */
void odpd_hittab_put(struct odpd_hittab *t, uint32_t slot);
/* Its MR was invalidated: never served again from the client's cache. */
void odpd_hittab_invalidate(struct odpd_hittab *t, uint32_t slot, uint64_t ticket);
/* What the client wrote into @slot of the use table. */
uint64_t odpd_hittab_use(const struct odpd_hittab *t, uint32_t slot);
/*
 * Take back the unused reference in @slot (@ticket): true if revoked (the
 * slot waits for the client's acknowledgement, the caller drops the
 * reference), false if the client uses it.
 */
bool odpd_hittab_revoke(struct odpd_hittab *t, uint32_t slot, uint64_t ticket);
/* The client has purged every revocation up to @seen. */
void odpd_hittab_seen(struct odpd_hittab *t, uint64_t seen);
