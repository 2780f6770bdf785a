/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * An interval tree over byte ranges [start, end) of one segment: a binary
 * search tree of caller-embedded nodes (the MRs over one segment), ordered
 * by (start, seq) and augmented with each subtree's largest end, so that
 * "which nodes cover [s, e)?" visits only subtrees that can hold one:
 * O(log n + k). Nodes may overlap and repeat. The same walk measures what
 * the union of some of the nodes leaves uncovered: distinct pinned pages
 * (overlapping MRs are not counted twice) and the witness coverage.
 *
 * Balanced as a treap: a node's priority is a keyed hash of its seq (the key
 * random per process), so a node is two links and no balance field — an MR
 * in the cache is this node and not much more (issue 11's bytes per cached
 * MR). Expected depth O(log n) whatever order clients register in: they
 * choose the starts but never see the priorities.
 */

#include <stdbool.h>
#include <stdint.h>

struct odpd_inode {
	struct odpd_inode *left, *right;    /* private */
	uint64_t start, end;        /* [start, end), start < end; set before insert, fixed while in */
	uint64_t max_end;           /* private: largest end in this subtree */
	uint64_t seq;               /* the caller's: unique, larger than every seq inserted
				     * before (insertion order, the tie-break); an MR's id */
};

struct odpd_itree {
	struct odpd_inode *root;
	uint64_t key;               /* keys the priorities (process-wide random) */
	uint64_t next_seq;          /* every seq in the tree is below it */
	unsigned count;
};

void odpd_itree_init(struct odpd_itree *t);
void odpd_itree_insert(struct odpd_itree *t, struct odpd_inode *n);
void odpd_itree_remove(struct odpd_itree *t, struct odpd_inode *n);
static inline bool odpd_itree_empty(const struct odpd_itree *t) { return t->count == 0; }

/*
 * Call @fn for nodes with start <= @s and end >= @e (the nodes covering
 * [s, e)), in ascending (start, insertion) order, until @fn returns true;
 * return that node, or NULL. @fn must not change the tree.
 */
struct odpd_inode *odpd_itree_find_covering(struct odpd_itree *t, uint64_t s, uint64_t e,
					     bool (*fn)(struct odpd_inode *n, void *arg), void *arg);

/* Call @fn for every node overlapping [s, e) (start < e && end > s), ascending,
 * until it returns true; return that node or NULL. @fn must not change the tree. */
struct odpd_inode *odpd_itree_find_overlapping(struct odpd_itree *t, uint64_t s, uint64_t e,
						bool (*fn)(struct odpd_inode *n, void *arg), void *arg);

/*
 * Bytes of [s, e) that no node for which @pred holds overlaps: the part of
 * the range the union of those nodes leaves uncovered. One in-order walk of
 * the nodes overlapping [s, e): O(log n + k). This is how distinct bytes are
 * counted (pinned pages: overlapping MRs are not counted twice) without a
 * structure of their own.
 */
uint64_t odpd_itree_uncovered(struct odpd_itree *t, uint64_t s, uint64_t e,
			      bool (*pred)(const struct odpd_inode *n, const void *arg), const void *arg);

/*
 * The same walk, listing those uncovered parts (maximal sub-ranges of
 * [s, e), ascending) into @gaps, at most @max of them; returns how many.
 * *@ret_next is where a next call goes on: e once all were listed, else the
 * end of the last gap listed (which a node then covers). Lets a caller do
 * slow work per gap without holding a lock on the tree meanwhile.
 */
struct odpd_gap {
	uint64_t start, end;
};
unsigned odpd_itree_gaps(struct odpd_itree *t, uint64_t s, uint64_t e,
			 bool (*pred)(const struct odpd_inode *n, const void *arg), const void *arg,
			 struct odpd_gap *gaps, unsigned max, uint64_t *ret_next);

/* First node in (start, insertion) order, and the next (O(log n): a search
 * from the root, nodes have no parent link); NULL at the end. */
struct odpd_inode *odpd_itree_first(struct odpd_itree *t);
struct odpd_inode *odpd_itree_next(struct odpd_itree *t, struct odpd_inode *n);

/* ------------------------------------------------------------- for tests */

/* Check every invariant: (start, insertion) order, the priorities' heap
 * order, each node's max_end, and count. O(n). */
bool odpd_itree_check(const struct odpd_itree *t);
/* Nodes on the longest root-to-leaf path (0: empty). O(n). */
unsigned odpd_itree_depth(const struct odpd_itree *t);
