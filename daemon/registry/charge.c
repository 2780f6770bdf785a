/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "odpd.pb-c.h"
#include "implicit.h"
#include "verify.h"
#include "charge.h"
#include "relaxed.h"
#include "internal.h"

/* ---------------------------------------------------------------- charges */

/* An MR's charges: charge0 in place (acct NULL: free), then charge0.next. */
struct odpd_charge *charge_find(const struct odpd_mr *mr, const struct odpd_account *a)
{
	if (mr->charge0.acct == a && a)
		return (struct odpd_charge *)&mr->charge0;
	for (struct odpd_charge *c = mr->charge0.next; c; c = c->next)
		if (c->acct == a)
			return c;
	return NULL;
}

/*
 * Distinct pinned bytes, from the MRs over a segment (map->mrs): what of
 * [s, e) no other pinned MR charged to an account, or counted by the
 * daemon, covers. An MR asks before its own charge or count is set, and
 * after it is cleared.
 */
static bool charged_to(const struct odpd_inode *n, const void *acct)
{
	const struct odpd_mr *mr = (const struct odpd_mr *)n;

	return mr->pinned && charge_find(mr, acct);
}

static bool counted(const struct odpd_inode *n, const void *arg)
{
	(void)arg;
	return ((const struct odpd_mr *)n)->counted;
}

static uint64_t account_uncovered(struct odpd_mapping *map, const struct odpd_account *a, uint64_t s, uint64_t e)
{
	return odpd_itree_uncovered(&map->mrs, s, e, charged_to, a);
}

static uint64_t mr_uncovered(struct odpd_mr *mr, bool (*pred)(const struct odpd_inode *n, const void *arg),
			     const void *arg)
{
	return odpd_itree_uncovered(&mr->map->mrs, mr->node.start, mr->node.end, pred, arg);
}

/* Charge @a for @mr's pages (once per account and MR). */
int charge_add(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_account *a,
		      struct odpd_charge **ret)
{
	struct odpd_charge *c = mr->charge0.acct ? calloc(1, sizeof(*c)) : &mr->charge0;

	(void)r;
	if (!c)
		return -ENOMEM;
	c->refs = 0;
	odpd_account_charge(a, mr->pinned ? mr_uncovered(mr, charged_to, a) : 0);
	c->acct = a;
	if (c != &mr->charge0) {
		c->next = mr->charge0.next;
		mr->charge0.next = c;
	}
	*ret = c;
	return 0;
}

void charge_drop(struct odpd_registry *r, struct odpd_mr *mr, struct odpd_charge *c)
{
	struct odpd_account *a = c->acct;

	/* out of the MR's charges first: its pages then count as uncovered */
	if (c == &mr->charge0)
		c->acct = NULL;
	else
		for (struct odpd_charge **pc = &mr->charge0.next; *pc; pc = &(*pc)->next)
			if (*pc == c) {
				*pc = c->next;
				break;
			}
	odpd_account_uncharge(&r->quota, a, mr->pinned ? mr_uncovered(mr, charged_to, a) : 0);
	if (c != &mr->charge0)
		free(c);
}

/* The daemon's own count of distinct pinned pages. */
void global_charge(struct odpd_registry *r, struct odpd_mr *mr)
{
	if (!mr->pinned || mr->counted)
		return;
	r->pinned += mr_uncovered(mr, counted, NULL);
	mr->counted = true;
}

void global_uncharge(struct odpd_registry *r, struct odpd_mr *mr)
{
	if (!mr->counted)
		return;
	mr->counted = false;
	r->pinned -= mr_uncovered(mr, counted, NULL);
}

/* ---------------------------------------------------------------- quotas */

static bool match_account(const struct odpd_mr *mr, const void *arg)
{
	const struct odpd_charge *c = odpd_mr_first_charge(mr);

	return c && c->acct == arg;   /* a relaxed MR has one charge */
}

/*
 * Can @h's account take @mr's pages (@need_global: a new MR, so the daemon's
 * limits too)? 0, or -EDQUOT / -ENOMEM with @err; *@evict: relaxed MRs whose
 * invalidation would make room (moved into it).
 */
int quota_check(struct odpd_registry *r, struct odpd_holder *h, struct odpd_mapping *map,
		       uint64_t s, uint64_t e, bool pinned, bool need_global, bool may_evict,
		       struct odpd_mr **evict, struct odpd_err *err)
{
	const struct odpd_conf *conf = r->conf;
	struct odpd_account *a = h->acct;
	uint64_t want = pinned ? account_uncovered(map, a, s, e) : 0;
	uint64_t gwant = pinned && need_global ? odpd_itree_uncovered(&map->mrs, s, e, counted, NULL) : 0;

	a->limit = h->limit.max_pinned;
	if (strcmp(a->rule, h->limit.rule) != 0)   /* (no formatting per registration) */
		snprintf(a->rule, sizeof(a->rule), "%s", h->limit.rule);
	if (want && (want > h->limit.max_pinned || a->pinned > h->limit.max_pinned - want)) {
		/* (relaxed MRs a verify still reads are deregistered after it:
		 * they make no room yet) */
		if (may_evict && collect_relaxed(r, match_account, a, evict) && *evict)
			return 0;
		/* EDQUOT also means a connection's or a user's MR count (mr.c,
		 * quota.c): the message says which limit it is */
		return err_set(err, EDQUOT, "pinning quota: pinning %" PRIu64 " more bytes would pass uid "
			       "%u's limit of %" PRIu64 " bytes (%s; %" PRIu64 " pinned): release MRs, or "
			       "raise it with a rule in odpd.conf", want, h->uid, h->limit.max_pinned,
			       h->limit.rule, a->pinned);
	}
	if (!need_global)
		return 0;
	if ((gwant && (gwant > conf->max_pinned || r->pinned > conf->max_pinned - gwant)) ||
	    r->n_mrs >= conf->max_mrs) {
		if (may_evict && collect_relaxed(r, match_all, NULL, evict) && *evict)
			return 0;
		/* ENOMEM also means out of memory (odpd's, or the kernel's pin):
		 * the message names the daemon-wide limit */
		if (r->n_mrs >= conf->max_mrs)
			return err_set(err, ENOMEM, "daemon-wide limit: odpd holds its limit of %" PRIu64
				       " MRs (max-mrs in odpd.conf), for all users together; not a lack of "
				       "memory", conf->max_mrs);
		return err_set(err, ENOMEM, "daemon-wide limit: pinning %" PRIu64 " more bytes would pass "
			       "odpd's max-pinned of %" PRIu64 " bytes (%" PRIu64 " pinned, all users "
			       "together; max-pinned in odpd.conf); not a lack of memory", gwant,
			       conf->max_pinned, r->pinned);
	}
	return 0;
}
