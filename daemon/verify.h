/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "domain.h"
#include "error.h"

/*
 * verify: read an MR back with the HCA. A loopback RC QP pair on the
 * client's PD and a bounce buffer (a memfd of the client's, not odpd heap:
 * the context can be exported to the client), made when a verify needs them
 * and as large as it needs, up to @max_buf (odpd --verify-buffer). Runs on a
 * worker; one verify at a time per verifier. The registry keeps an idle
 * verifier for --verify-idle-ms and then frees it (registry/verifyjob.c).
 */
struct odpd_verifier;

/* The CQ and the connected QP pair; the bounce buffer comes with the first verify. */
int odpd_verifier_new(struct odpd_domain *dom, size_t max_buf, struct odpd_verifier **ret,
		      struct odpd_err *err);
void odpd_verifier_free(struct odpd_verifier *v);

/*
 * CRC-32 of [iova, iova + length) of the MR with keys @k as the HCA reads it, in chunks of
 * at most the bounce buffer (made, or replaced by a larger one, to hold the
 * range in one chunk, up to max_buf). With @use_rkey, RDMA READ from the MR (iova as
 * remote address, rkey); else RDMA WRITE from the MR (iova as local address,
 * lkey) into the bounce buffer. Returns the method's name in *ret_method.
 * @pages_end (0: off): transfer whole, page-aligned pages around the range,
 * up to @pages_end (the MR's end; the MR starts on a page), and CRC only the
 * range's bytes: rxe copies
 * each packet to or from the start of its page of an ODP MR, ignoring the
 * offset within the page (odpd(8), KNOWN LIMITATIONS).
 */
struct odpd_keys {
	uint32_t lkey, rkey;
};

int odpd_verify_mr(struct odpd_verifier *v, const struct odpd_keys *k, uint64_t iova, uint64_t length,
		   bool use_rkey, uint64_t pages_end, uint32_t *ret_crc, const char **ret_method,
		   struct odpd_err *err);
