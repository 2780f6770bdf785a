/* SPDX-License-Identifier: MIT */
/* access.c - IBV_ACCESS_* flags to the wire's Access bits and back. */
#include <infiniband/verbs.h>

#include "libodpd-private.h"

static const struct {
	unsigned ibv;
	uint32_t wire;
} access_map[] = {
	{ IBV_ACCESS_LOCAL_WRITE, ODPD__ACCESS__ACCESS_LOCAL_WRITE },
	{ IBV_ACCESS_REMOTE_READ, ODPD__ACCESS__ACCESS_REMOTE_READ },
	{ IBV_ACCESS_REMOTE_WRITE, ODPD__ACCESS__ACCESS_REMOTE_WRITE },
	{ IBV_ACCESS_REMOTE_ATOMIC, ODPD__ACCESS__ACCESS_REMOTE_ATOMIC },
};

#define ACCESS_N (sizeof(access_map) / sizeof(access_map[0]))

int access_to_wire(const char *what, unsigned ibv_access, uint32_t *ret_access,
		   Odpd__MrKind *ret_kind)
{
	unsigned known = IBV_ACCESS_ON_DEMAND;
	uint32_t wire = 0;

	for (size_t i = 0; i < ACCESS_N; i++) {
		known |= access_map[i].ibv;
		if (ibv_access & access_map[i].ibv)
			wire |= access_map[i].wire;
	}
	if (ibv_access & ~known)
		return errmsg_set(-EINVAL, "%s: access flags 0x%x not supported (only LOCAL_WRITE, "
				  "REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC and ON_DEMAND)",
				  what, ibv_access & ~known);
	if ((ibv_access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(ibv_access & IBV_ACCESS_LOCAL_WRITE))
		return errmsg_set(-EINVAL, "%s: IBV_ACCESS_REMOTE_WRITE and IBV_ACCESS_REMOTE_ATOMIC "
				  "need IBV_ACCESS_LOCAL_WRITE too (as with ibv_reg_mr)", what);

	*ret_access = wire;
	*ret_kind = (ibv_access & IBV_ACCESS_ON_DEMAND) ? ODPD__MR_KIND__MR_ODP : ODPD__MR_KIND__MR_PINNED;
	return 0;
}

unsigned access_from_wire(uint32_t access, Odpd__MrKind kind)
{
	unsigned ibv = 0;

	for (size_t i = 0; i < ACCESS_N; i++)
		if (access & access_map[i].wire)
			ibv |= access_map[i].ibv;
	if (kind == ODPD__MR_KIND__MR_ODP || kind == ODPD__MR_KIND__MR_IMPLICIT_ODP)
		ibv |= IBV_ACCESS_ON_DEMAND;
	return ibv;
}
