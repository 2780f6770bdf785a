/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * Pinning quotas. Pinned bytes are charged to accounts, one per uid, and
 * counted as distinct pages of each segment: overlapping MRs are not
 * counted twice. The registry works out how many bytes an MR's charge adds
 * or frees (from the MRs over the segment charged to the account, its
 * mapping's interval tree); the daemon as a whole counts distinct pages the
 * same way.
 *
 * A client's limit is fixed at connect: the rule of odpd.conf that matches
 * its user, group or cgroup, else default-pinned, whose default is the
 * client's own RLIMIT_MEMLOCK (read from /proc/PID/limits, checked against
 * its pidfd), or no limit if it holds CAP_IPC_LOCK (it could pin anything
 * itself). The account is checked against the limit of the client that
 * asks.
 */

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "conf.h"
#include "error.h"

struct odpd_mapping;

struct odpd_account {
	LIST_ENTRY(odpd_account) link;
	uid_t uid;
	unsigned refs;              /* clients + MR charges */
	uint64_t pinned;            /* bytes: distinct pages */
	unsigned mrs;               /* MRs charged */
	uint64_t held[ODPD_N_UL];   /* what the user's clients hold: connections, segments,
				     * mapped bytes, MR references, implicit requests waiting
				     * for a registrar (struct odpd_limit.max) */
	unsigned refusing;          /* its connections refused, not closed yet */
	uint64_t limit;             /* of the client that asked last */
	char rule[80];              /* where that limit came from */
};

struct odpd_quota {
	LIST_HEAD(, odpd_account) accounts;
	unsigned n_accounts;
};

/* What a client may pin, and what its user may hold, worked out at connect. */
struct odpd_limit {
	uint64_t max_pinned;        /* bytes, ODPD_UNLIMITED */
	char rule[80];              /* "[user alice]", "memlock", "default-pinned" */
	uint64_t max[ODPD_N_UL];    /* per user (conf.h); ODPD_UNLIMITED */
	char src[ODPD_N_UL][96];    /* "[user alice] max-connections", "default-connections" */
	bool remote_access;         /* a rule's remote-access = yes: client-PD MRs may be remote */
};

/*
 * The limit of the client (@pid, @pidfd, @uid, @gid, @groups): a rule of
 * @conf, else default-pinned, else its RLIMIT_MEMLOCK soft limit; and its
 * user's limits (a rule's, else [limits]'s; default-mapped "window" is a
 * quarter of @window_size).
 * -ESRCH if the process is gone (its pidfd says so) or its limits cannot be
 * read.
 */
int odpd_limit_for_client(const struct odpd_conf *conf, pid_t pid, int pidfd, uid_t uid, gid_t gid,
			  const gid_t *groups, unsigned n_groups, uint64_t window_size,
			  struct odpd_limit *ret);

/*
 * May @a's user take @n more of @l under @lim? 0, or the errno (EMFILE for
 * connections and segments, ENOSPC for mapped bytes, EDQUOT for MRs,
 * EAGAIN for registrar waits) with
 * @err naming the limit. Taking and giving back: odpd_account_hold().
 */
int odpd_account_may(const struct odpd_account *a, const struct odpd_limit *lim, enum odpd_user_limit l,
		     uint64_t n, struct odpd_err *err);
void odpd_account_hold(struct odpd_account *a, enum odpd_user_limit l, int64_t n);

/* Parse the "Max locked memory" soft limit out of the text of /proc/PID/limits.
 * ODPD_UNLIMITED for "unlimited". -EINVAL if absent. */
int odpd_parse_memlock(const char *limits_text, uint64_t *ret);

/* The account of @uid (made on first use), with one more reference. NULL: ENOMEM. */
struct odpd_account *odpd_account_get(struct odpd_quota *q, uid_t uid);
void odpd_account_put(struct odpd_quota *q, struct odpd_account *a);

/* Charge one MR to @a: @added bytes it pins that @a had not pinned yet (0
 * for an ODP MR). Takes a reference on @a. */
void odpd_account_charge(struct odpd_account *a, uint64_t added);
/* Undo a charge: @freed bytes @a no longer pins. Drops the reference (and
 * may free @a: pass @q). */
void odpd_account_uncharge(struct odpd_quota *q, struct odpd_account *a, uint64_t freed);
