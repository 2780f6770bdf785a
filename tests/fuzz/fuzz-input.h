/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The input format of fuzz-request, shared with fuzz-seeds: a sequence of
 * records, each one packet a client sends after its Hello:
 *   u8 flags (FUZZ_FD_*: the fds that go with it), u16 length (little
 *   endian), then that many bytes (an odpd.Request, or anything).
 * A record cut short by the end of the input is sent as far as it goes.
 * A record with FUZZ_OP_WRITE or FUZZ_OP_PUNCH in its flags is no packet:
 * what the client does to the memfd it sent last (mapped at
 * FUZZ_CLIENT_ADDR), a segment or a hit table's use table:
 *   FUZZ_OP_WRITE  u16 offset, then the bytes to write there
 *   FUZZ_OP_PUNCH  u16 first page, u16 pages (each modulo the memfd's
 *                  16 pages; 0 pages: 1): a hole punched (MADV_REMOVE, as
 *                  fallocate(PUNCH_HOLE)), which odpd's MRs there must notice
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "odpd-wire.h"

#define FUZZ_FD_MEMFD 0x01          /* a sealed 64 KiB memfd, mapped at FUZZ_CLIENT_ADDR */
#define FUZZ_FD_UNSEALED 0x02       /* a memfd without seals */
#define FUZZ_FD_PIPE 0x04           /* the read end of a pipe */
#define FUZZ_FD_DEVNULL 0x08        /* /dev/null */
#define FUZZ_FD_CMDFD 0x40          /* the cmd_fd of fuzz-request's own device context
				     * (client-PD mode), where there is a device */
#define FUZZ_OP_WRITE 0x10
#define FUZZ_OP_PUNCH 0x20

/*
 * fuzz-request maps each memfd it sends MAP_SHARED at this fixed address
 * (FUZZ_MEMFD_SIZE bytes, replacing the one before): an AttachSegment with
 * client_addr here passes odpd's check of the client's memory map, and a
 * RegMr here finds that segment, so inputs reach registration (on a device,
 * in the VM; ENODEV on a host without one).
 */
#define FUZZ_CLIENT_ADDR 0x7f0000000000ull
#define FUZZ_MEMFD_SIZE (64u * 1024)

/*
 * Where odpd maps a segment itself (AttachSegment without client_addr) is
 * known only from its SegmentReply. fuzz-request rewrites the addresses of
 * a record that decodes as a request before it sends it: a RegMr, Verify or
 * AdviseMr Sge address in [FUZZ_SEGMENT_ADDR, + FUZZ_SEGMENT_SPAN) becomes
 * that offset from the address of the segment odpd answered last, and an
 * Sge lkey FUZZ_LAST_LKEY the lkey of the MR it answered last. Records that
 * need no rewriting are sent byte for byte.
 */
#define FUZZ_SEGMENT_ADDR 0x7e0000000000ull
#define FUZZ_SEGMENT_SPAN (1ull << 30)
#define FUZZ_LAST_LKEY 0xfffffff0u

/* A RegMr client_pd_handle of this value becomes the handle of the PD that
 * fuzz-request allocated in its own device context (FUZZ_FD_CMDFD). */
#define FUZZ_CLIENT_PD_HANDLE 0xfffffff0u

struct fuzz_reader {
	const uint8_t *p;
	size_t left;
};

struct fuzz_record {
	uint8_t flags;
	const uint8_t *data;
	size_t len;
};

static inline bool fuzz_next(struct fuzz_reader *r, struct fuzz_record *rec)
{
	size_t len;

	if (r->left < 3)
		return false;
	rec->flags = r->p[0];
	len = (size_t)r->p[1] | (size_t)r->p[2] << 8;
	r->p += 3;
	r->left -= 3;
	if (len > r->left)
		len = r->left;
	rec->data = r->p;
	rec->len = len;
	r->p += len;
	r->left -= len;
	return true;
}

/* Hello, as libodpd sends it. */
static inline void fuzz_send_hello(int fd)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Hello hello = ODPD__HELLO__INIT;

	hello.has_version = 1;
	hello.version = ODPD_PROTOCOL_VERSION;
	hello.client_name = (char *)"fuzz";
	req.has_id = 1;
	req.id = 1;
	req.body_case = ODPD__REQUEST__BODY_HELLO;
	req.hello = &hello;
	odpd_wire_send(fd, &req.base, NULL, 0, 0);
}
