/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/types.h>
#include <time.h>

#include "itree.h"

static inline uint64_t max3(uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t m = a > b ? a : b;

	return m > c ? m : c;
}

/* ========================================================== interval tree */

/*
 * A treap: in (start, seq) order as a search tree, and in priority order as
 * a heap (a parent's priority above its children's). The priority is a
 * bijective mix of seq and a random key, so priorities are distinct, and
 * independent of the order and the ranges clients register: the tree's
 * expected depth is O(log n) (about 2 ln n), and no client can make it
 * deeper on purpose without learning the key. Insert splits the subtree
 * where the new node's priority places it; remove merges the node's two
 * subtrees into its place. Both recurse only along one root-to-leaf path
 * (split and merge each along the spine they cut or join), fixing max_end
 * on the way back up, so every value is exact after each operation. The
 * randomized test checks the order, the heap and every max_end after every
 * operation.
 */

static uint64_t itree_secret(void)
{
	static _Atomic uint64_t secret;
	uint64_t s = atomic_load_explicit(&secret, memory_order_relaxed);

	if (s)
		return s;
	if (getrandom(&s, sizeof(s), GRND_NONBLOCK) != (ssize_t)sizeof(s)) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);  /* no entropy yet (early boot): still varied */
		s = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)ts.tv_sec ^
		    (uint64_t)(uintptr_t)&s;
	}
	s |= 1;                                   /* 0 means "not yet" */
	atomic_store_explicit(&secret, s, memory_order_relaxed);
	return s;
}

/* A bijection of 64-bit values (splitmix64's finaliser): distinct seqs,
 * distinct priorities. */
static inline uint64_t prio(const struct odpd_itree *t, const struct odpd_inode *n)
{
	uint64_t z = n->seq ^ t->key;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline uint64_t inode_max(const struct odpd_inode *n)
{
	return n ? n->max_end : 0;
}

/* Recompute n->max_end from n and its children. */
static inline void inode_augment(struct odpd_inode *n)
{
	n->max_end = max3(n->end, inode_max(n->left), inode_max(n->right));
}

static int inode_cmp(const struct odpd_inode *a, const struct odpd_inode *b)
{
	if (a->start != b->start)
		return a->start < b->start ? -1 : 1;
	return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Split the subtree @p into the nodes before @x (*@l) and after it (*@r);
 * @x is not in it. */
static void split(struct odpd_inode *p, const struct odpd_inode *x, struct odpd_inode **l,
		  struct odpd_inode **r)
{
	if (!p) {
		*l = *r = NULL;
		return;
	}
	if (inode_cmp(p, x) < 0) {
		split(p->right, x, &p->right, r);
		*l = p;
	} else {
		split(p->left, x, l, &p->left);
		*r = p;
	}
	inode_augment(p);
}

/* Join subtrees @a and @b, every node of @a before every node of @b. */
static struct odpd_inode *merge(const struct odpd_itree *t, struct odpd_inode *a, struct odpd_inode *b)
{
	if (!a)
		return b;
	if (!b)
		return a;
	if (prio(t, a) > prio(t, b)) {
		a->right = merge(t, a->right, b);
		inode_augment(a);
		return a;
	}
	b->left = merge(t, a, b->left);
	inode_augment(b);
	return b;
}

void odpd_itree_init(struct odpd_itree *t)
{
	t->root = NULL;
	t->key = itree_secret();
	t->next_seq = 0;
	t->count = 0;
}

void odpd_itree_insert(struct odpd_itree *t, struct odpd_inode *n)
{
	struct odpd_inode **link = &t->root, *p;
	uint64_t pn;

	if (n->seq < t->next_seq)
		abort();                    /* a caller's bug: order and uniqueness would break */
	t->next_seq = n->seq + 1;
	pn = prio(t, n);
	/* Down to where n's priority places it; the nodes above gain n. */
	while ((p = *link) && prio(t, p) > pn) {
		if (p->max_end < n->end)
			p->max_end = n->end;
		link = inode_cmp(n, p) < 0 ? &p->left : &p->right;
	}
	split(p, n, &n->left, &n->right);
	inode_augment(n);
	*link = n;
	t->count++;
}

/* @n out of the subtree @p (it is in it); the subtree's new root. */
static struct odpd_inode *remove_from(const struct odpd_itree *t, struct odpd_inode *p,
				      struct odpd_inode *n)
{
	if (!p)
		abort();                    /* a caller's bug: n is not in the tree */
	if (p == n)
		return merge(t, n->left, n->right);
	if (inode_cmp(n, p) < 0)
		p->left = remove_from(t, p->left, n);
	else
		p->right = remove_from(t, p->right, n);
	inode_augment(p);
	return p;
}

void odpd_itree_remove(struct odpd_itree *t, struct odpd_inode *n)
{
	t->root = remove_from(t, t->root, n);
	n->left = n->right = NULL;
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
		struct odpd_inode *r = covering(n->left, s, e, fn, arg);

		if (r)
			return r;
		if (n->start > s)
			return NULL;
		if (n->end >= e && fn(n, arg))
			return n;
		n = n->right;
	}
	return NULL;
}

static struct odpd_inode *overlapping(struct odpd_inode *n, uint64_t s, uint64_t e,
				      bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	while (n && n->max_end > s) {
		struct odpd_inode *r = overlapping(n->left, s, e, fn, arg);

		if (r)
			return r;
		if (n->start >= e)
			return NULL;
		if (n->end > s && fn(n, arg))
			return n;
		n = n->right;
	}
	return NULL;
}

struct odpd_inode *odpd_itree_find_covering(struct odpd_itree *t, uint64_t s, uint64_t e,
					     bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	return covering(t->root, s, e, fn, arg);
}

struct odpd_inode *odpd_itree_find_overlapping(struct odpd_itree *t, uint64_t s, uint64_t e,
						bool (*fn)(struct odpd_inode *n, void *arg), void *arg)
{
	return overlapping(t->root, s, e, fn, arg);
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
	if (!overlapping(t->root, s, e, uncovered_visit, u) && u->pos < e) {
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
	struct odpd_inode *n = t->root;

	while (n && n->left)
		n = n->left;
	return n;
}

struct odpd_inode *odpd_itree_next(struct odpd_itree *t, struct odpd_inode *n)
{
	struct odpd_inode *p = t->root, *next = NULL;

	while (p) {
		if (inode_cmp(n, p) < 0) {
			next = p;
			p = p->left;
		} else {
			p = p->right;
		}
	}
	return next;
}

/* Order, heap order and max_end of the subtree @n, whose nodes must lie
 * strictly between @lo and @hi (NULL: unbounded) and below priority @top;
 * counts its nodes into *@count. */
static bool inode_check(const struct odpd_itree *t, const struct odpd_inode *n,
			const struct odpd_inode *lo, const struct odpd_inode *hi, const uint64_t *top,
			unsigned *count)
{
	uint64_t pn;

	if (!n)
		return true;
	pn = prio(t, n);
	if (n->start >= n->end || n->seq >= t->next_seq || (top && pn >= *top) ||
	    (lo && inode_cmp(lo, n) >= 0) || (hi && inode_cmp(n, hi) >= 0) ||
	    n->max_end != max3(n->end, inode_max(n->left), inode_max(n->right)))
		return false;
	++*count;
	return inode_check(t, n->left, lo, n, &pn, count) && inode_check(t, n->right, n, hi, &pn, count);
}

bool odpd_itree_check(const struct odpd_itree *t)
{
	unsigned count = 0;

	return inode_check(t, t->root, NULL, NULL, NULL, &count) && count == t->count;
}

static unsigned inode_depth(const struct odpd_inode *n)
{
	unsigned l, r;

	if (!n)
		return 0;
	l = inode_depth(n->left);
	r = inode_depth(n->right);
	return 1 + (l > r ? l : r);
}

unsigned odpd_itree_depth(const struct odpd_itree *t)
{
	return inode_depth(t->root);
}
