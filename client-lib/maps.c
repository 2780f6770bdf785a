/* SPDX-License-Identifier: MIT */
/* maps.c - find the mapping behind an address in /proc/self/maps. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "libodpd-private.h"

int maps_parse_line(const char *line, struct maps_entry *ret)
{
	struct maps_entry e = { 0 };
	int n;

	/* start-end perms offset major:minor inode [path] */
	n = sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %" SCNx64 " %x:%x %" SCNu64,
		   &e.start, &e.end, e.perms, &e.offset, &e.dev_major, &e.dev_minor, &e.inode);
	if (n != 7 || e.start >= e.end || strlen(e.perms) != 4)
		return -EINVAL;
	e.shared = e.perms[3] == 's';
	*ret = e;
	return 0;
}

/* Does @next continue @cur: the same file, mapped on from where @cur ends? */
static bool maps_continues(const struct maps_entry *cur, const struct maps_entry *next)
{
	return next->start == cur->end &&
	       next->dev_major == cur->dev_major && next->dev_minor == cur->dev_minor &&
	       next->inode == cur->inode && next->shared == cur->shared &&
	       next->offset == cur->offset + (cur->end - cur->start);
}

/* Feed one entry to the search. 1: done (found), 0: read on, <0: failed. */
static int maps_step(bool *found, struct maps_entry *cur, const struct maps_entry *e,
		     uintptr_t addr, uintptr_t end)
{
	if (!*found) {
		if (e->end <= addr)
			return 0;
		if (e->start > addr)
			return -ENOENT;         /* the lines are sorted: a hole */
		*found = true;
		*cur = *e;
	} else if (maps_continues(cur, e)) {
		cur->end = e->end;
	} else {
		return -ERANGE;
	}
	return end <= cur->end ? 1 : 0;
}

int maps_find(FILE *f, uintptr_t addr, size_t length, struct maps_entry *ret)
{
	uintptr_t end = addr + length;
	struct maps_entry cur = { 0 }, e;
	bool found = false;
	char *line = NULL;
	size_t cap = 0;
	int r = 0;

	if (end < addr)
		return -ERANGE;
	while (r == 0 && getline(&line, &cap, f) >= 0) {
		if (maps_parse_line(line, &e) < 0)
			r = -EIO;
		else
			r = maps_step(&found, &cur, &e, addr, end);
	}
	free(line);
	if (r == 0)
		r = ferror(f) ? -EIO : found ? -ERANGE : -ENOENT;
	if (r < 0)
		return r;
	*ret = cur;
	return 0;
}
