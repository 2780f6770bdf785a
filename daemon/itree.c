/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "itree.h"

/*
 * RB_GENERATE_STATIC spells its attribute "__unused", which libbsd leaves
 * undefined (it clashes with Linux headers' member names): say it here.
 */
#define ITREE_RB_GENERATE(name, type, cmp) \
	RB_GENERATE_INTERNAL(name, type, rb, cmp, __attribute__((__unused__)) static)

static inline uint64_t max3(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t m = a > b ? a : b;

	return m > c ? m : c;
}

/* Red-black shape and parent links of a subtree: its black height, or -1. */
#define RB_CHECK_FN(fname, type)                                                \
static int fname(const struct type *x, const struct type *parent)              \
{                                                                               \
	int l, r;                                                               \
                                                                                \
	if (!x)                                                                 \
		return 1;                                                       \
	if (RB_PARENT(x, rb) != parent)                                         \
		return -1;                                                      \
	if (RB_COLOR(x, rb) == RB_RED &&                                        \
	    ((RB_LEFT(x, rb) && RB_COLOR(RB_LEFT(x, rb), rb) == RB_RED) ||      \
	     (RB_RIGHT(x, rb) && RB_COLOR(RB_RIGHT(x, rb), rb) == RB_RED)))     \
		return -1;                                                      \
	l = fname(RB_LEFT(x, rb), x);                                           \
	r = fname(RB_RIGHT(x, rb), x);                                          \
	if (l < 0 || l != r)                                                    \
		return -1;                                                      \
	return l + (RB_COLOR(x, rb) == RB_BLACK);                               \
}

/* ========================================================== interval tree */

/*
 * Augmentation, kept exact at every step, with RB_AUGMENT(x) recomputing x
 * alone from its own end and its children's max_end (O(1)):
 *  - rotations: <bsd/sys/tree.h> augments the lower node, then the upper
 *    one, each after its children are final; the pair's parent keeps the
 *    same subtree, so nothing above changes;
 *  - insert: RB_INSERT augments only the new leaf's parent, so the descent
 *    below raises max_end along the path first (RB_INSERT then takes the
 *    same path: keys are unique), and every value is exact before the
 *    rebalancing starts;
 *  - remove: the node's own end is first taken out of its max_end and its
 *    ancestors' (as if it were already gone), then RB_REMOVE: when the
 *    node has one child or none, the parent's max_end already is what it
 *    must become; when it has two, the tree re-augments the whole path from
 *    the successor's old parent to the root itself, bottom-up.
 * Insert and remove are O(log n). The randomized test checks every max_end
 * after every operation.
 */

static inline uint64_t inode_max(const struct odpd_inode *n)
{
	return n ? n->max_end : 0;
}

/* Recompute n->max_end from n and its children; true if it changed. */
static inline bool inode_augment(struct odpd_inode *n)
{
	uint64_t m = max3(n->end, inode_max(RB_LEFT(n, rb)), inode_max(RB_RIGHT(n, rb)));

	if (m == n->max_end)
		return false;
	n->max_end = m;
	return true;
}

static int inode_cmp(const struct odpd_inode *a, const struct odpd_inode *b)
{
	if (a->start != b->start)
		return a->start < b->start ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

#undef RB_AUGMENT
#define RB_AUGMENT(x) ((void)inode_augment(x))
ITREE_RB_GENERATE(odpd_itree_rb, odpd_inode, inode_cmp)
#undef RB_AUGMENT
#define RB_AUGMENT(x) do {} while (0)

void odpd_itree_init(struct odpd_itree *t)
{
	RB_INIT(&t->root);
	t->next_seq = 0;
	t->count = 0;
}

void odpd_itree_insert(struct odpd_itree *t, struct odpd_inode *n)
{
	struct odpd_inode *p;

	if (n->seq < t->next_seq)
		abort();                    /* a caller's bug: order and uniqueness would break */
	t->next_seq = n->seq + 1;
	n->max_end = n->end;
	for (p = RB_ROOT(&t->root); p; p = inode_cmp(n, p) < 0 ? RB_LEFT(p, rb) : RB_RIGHT(p, rb))
		if (p->max_end < n->end)
			p->max_end = n->end;
	RB_INSERT(odpd_itree_rb, &t->root, n);
	t->count++;
}

void odpd_itree_remove(struct odpd_itree *t, struct odpd_inode *n)
{
	struct odpd_inode *p;

	n->max_end = max3(0, inode_max(RB_LEFT(n, rb)), inode_max(RB_RIGHT(n, rb)));
	for (p = RB_PARENT(n, rb); p && inode_augment(p); p = RB_PARENT(p, rb))
		;
	RB_REMOVE(odpd_itree_rb, &t->root, n);
	t->count--;
}

/*
 * In order, skipping subtrees whose max_end < e (nothing there ends late
 * enough) and, past a node starting after s, everything to its right.
 * Recurses on left children only: depth <= the tree's height.
 */
static struct odpd_inode *covering(struct odpd_inode *n, uint64_t s, uint64_t e,
				   bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	while (n && n->max_end >= e) {
		struct odpd_inode *r = covering(RB_LEFT(n, rb), s, e, fn, arg);

		if (r)
			return r;
		if (n->start > s)
			return NULL;
		if (n->end >= e && fn(n, arg))
			return n;
		n = RB_RIGHT(n, rb);
	}
	return NULL;
}

static struct odpd_inode *overlapping(struct odpd_inode *n, uint64_t s, uint64_t e,
				      bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	while (n && n->max_end > s) {
		struct odpd_inode *r = overlapping(RB_LEFT(n, rb), s, e, fn, arg);

		if (r)
			return r;
		if (n->start >= e)
			return NULL;
		if (n->end > s && fn(n, arg))
			return n;
		n = RB_RIGHT(n, rb);
	}
	return NULL;
}

struct odpd_inode *odpd_itree_find_covering(struct odpd_itree *t, uint64_t s, uint64_t e,
					     bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	return covering(RB_ROOT(&t->root), s, e, fn, arg);
}

struct odpd_inode *odpd_itree_find_overlapping(struct odpd_itree *t, uint64_t s, uint64_t e,
						bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	return overlapping(RB_ROOT(&t->root), s, e, fn, arg);
}

struct uncovered {
	bool (*pred)(const struct odpd_inode *n, const void *arg);
	const void *arg;
	uint64_t pos, e, gap;               /* covered up to pos; gap: uncovered before it */
	struct odpd_gap *gaps;              /* NULL: count only */
	unsigned n, max;
};

/* A gap [s, e): counted, and listed if asked; true when the list is full. */
static bool uncovered_gap(struct uncovered *u, uint64_t s, uint64_t e)
{
	u->gap += e - s;
	if (!u->gaps)
		return false;
	u->gaps[u->n++] = (struct odpd_gap){ s, e };
	return u->n == u->max;
}

static bool uncovered_visit(struct odpd_inode *n, void *arg)
{
	struct uncovered *u = arg;

	if (u->pos >= u->e)
		return true;                    /* all of it covered: stop */
	if (!u->pred(n, u->arg))
		return false;
	if (n->start > u->pos) {               /* in ascending start order */
		uint64_t to = n->start < u->e ? n->start : u->e;

		if (uncovered_gap(u, u->pos, to)) {
			u->pos = to;
			return true;            /* full: the caller goes on from there */
		}
		u->pos = n->start;
	}
	if (n->end > u->pos)
		u->pos = n->end;
	return false;
}

/* Walk [s, e); afterwards u->pos < u->e only when the list filled up. */
static void uncovered_walk(struct odpd_itree *t, uint64_t s, uint64_t e, struct uncovered *u)
{
	u->pos = s;
	u->e = e;
	if (s >= e)
		return;
	if (!overlapping(RB_ROOT(&t->root), s, e, uncovered_visit, u) && u->pos < e) {
		uncovered_gap(u, u->pos, e);    /* the tail no node covers */
		u->pos = e;
	}
	if (u->pos > e)
		u->pos = e;
}

uint64_t odpd_itree_uncovered(struct odpd_itree *t, uint64_t s, uint64_t e,
			      bool (*pred)(const struct odpd_inode *n, const void *arg), const void *arg)
{
	struct uncovered u = { .pred = pred, .arg = arg };

	uncovered_walk(t, s, e, &u);
	return u.gap;
}

unsigned odpd_itree_gaps(struct odpd_itree *t, uint64_t s, uint64_t e,
			 bool (*pred)(const struct odpd_inode *n, const void *arg), const void *arg,
			 struct odpd_gap *gaps, unsigned max, uint64_t *ret_next)
{
	struct uncovered u = { .pred = pred, .arg = arg, .gaps = gaps, .max = max };

	if (max == 0) {
		*ret_next = s;
		return 0;
	}
	uncovered_walk(t, s, e, &u);
	*ret_next = u.n == max ? u.gaps[max - 1].end : e;
	if (s >= e)
		*ret_next = e;
	return u.n;
}

struct odpd_inode *odpd_itree_first(struct odpd_itree *t)
{
	return RB_MIN(odpd_itree_rb, &t->root);
}

struct odpd_inode *odpd_itree_next(struct odpd_itree *t, struct odpd_inode *n)
{
	(void)t;
	return RB_NEXT(odpd_itree_rb, &t->root, n);
}

RB_CHECK_FN(inode_check_shape, odpd_inode)

/* max_end of every node of the subtree, and start < end. */
static bool inode_check_max(const struct odpd_inode *n)
{
	if (!n)
		return true;
	if (n->start >= n->end ||
	    n->max_end != max3(n->end, inode_max(RB_LEFT(n, rb)), inode_max(RB_RIGHT(n, rb))))
		return false;
	return inode_check_max(RB_LEFT(n, rb)) && inode_check_max(RB_RIGHT(n, rb));
}

bool odpd_itree_check(const struct odpd_itree *t)
{
	const struct odpd_inode *root = RB_ROOT(&t->root), *prev = NULL;
	struct odpd_inode *n;
	unsigned count = 0;

	if (root && RB_COLOR(root, rb) != RB_BLACK)
		return false;
	if (inode_check_shape(root, NULL) < 0 || !inode_check_max(root))
		return false;
	RB_FOREACH(n, odpd_itree_rb, (struct odpd_itree_rb *)&t->root) {
		if (prev && inode_cmp(prev, n) >= 0)
			return false;
		if (n->seq >= t->next_seq)
			return false;
		count++;
		prev = n;
	}
	return count == t->count;
}
