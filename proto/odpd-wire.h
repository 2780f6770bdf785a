/* SPDX-License-Identifier: MIT */
/*
 * odpd-wire.h - framing shared by odpd, libodpd, odpctl and the tests.
 *
 * One protobuf-c message per SOCK_SEQPACKET packet, file descriptors in
 * SCM_RIGHTS beside it. Internal: not installed, not part of libodpd's ABI.
 */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/types.h>
#include <protobuf-c/protobuf-c.h>

#include "odpd.pb-c.h"

/* The protocol version this tree speaks, and the range the daemon accepts. */
#define ODPD_PROTOCOL_VERSION 1u
#define ODPD_PROTOCOL_VERSION_MIN 1u
#define ODPD_PROTOCOL_VERSION_MAX 1u

/* Largest packet either side sends or accepts, in bytes. Receivers read into
 * ODPD_MAX_PACKET + 1 bytes so that an oversized packet shows up as MSG_TRUNC. */
#define ODPD_MAX_PACKET (64u * 1024u)

/* Most fds one packet may carry; more is a protocol error (MSG_CTRUNC). */
#define ODPD_MAX_FDS 4u

/* The same values as in the public odpd.h (identical redefinitions are allowed). */
#define ODPD_SOCKET_DEFAULT "/run/odpd/odpd.sock"
#define ODPD_SOCKET_ENV "ODPD_SOCKET"

struct odpd_packet {
	size_t len;                  /* bytes received (<= cap - 1 unless truncated) */
	int fds[ODPD_MAX_FDS];
	unsigned nfds;
	bool truncated;              /* MSG_TRUNC: the packet was larger than cap */
	bool ctrunc;                 /* MSG_CTRUNC: fds were dropped by the kernel */
	bool eof;                    /* the peer has shut down (not a zero-length record) */
};

/*
 * Pack @msg and send it as one packet with @nfds fds (may be 0).
 * @flags: extra send flags (MSG_DONTWAIT); MSG_NOSIGNAL is always added.
 * Returns 0, or a negative errno: -EMSGSIZE if the packed message exceeds
 * ODPD_MAX_PACKET, -EAGAIN on a full non-blocking socket, or send's errno.
 */
int odpd_wire_send(int sock, const ProtobufCMessage *msg, const int *fds, unsigned nfds, int flags);
/* The same for an already packed message of @len bytes. */
int odpd_wire_send_buf(int sock, const void *buf, size_t len, const int *fds, unsigned nfds, int flags);

/*
 * poll(2) @p for at most @timeout_ms milliseconds in all (0: look once, <0:
 * no limit). A signal does not end the wait or start it over (poll answers
 * EINTR when one is pending and nothing is ready, even with a timeout of 0).
 * Returns what poll returns (>0 ready, 0 timed out) or a negative errno.
 */
int odpd_poll(struct pollfd *p, unsigned n, int timeout_ms);

/*
 * Receive one packet into @buf of @cap bytes (pass ODPD_MAX_PACKET + 1).
 * Fds arrive with MSG_CMSG_CLOEXEC and are returned in @ret->fds; the caller
 * owns them (odpd_packet_close_fds). A return of 0 with ret->len == 0 and
 * !ret->eof is a zero-length record.
 * Returns 0 or a negative errno (-EAGAIN when nothing is queued).
 */
int odpd_wire_recv(int sock, uint8_t *buf, size_t cap, struct odpd_packet *ret, int flags);

struct sockaddr_un;

/* Fill @ret with the address of the socket at @path.
 * Returns 0, -EINVAL (empty path) or -ENAMETOOLONG. */
int odpd_wire_sockaddr(const char *path, struct sockaddr_un *ret);

/* connect(2) the AF_UNIX socket @fd to @sa: 0 or a negative errno. A
 * signal does not make it fail (a connect waiting for room in a full listen
 * queue that a signal interrupts has queued nothing, and is made again). */
int odpd_wire_connect_to(int fd, const struct sockaddr_un *sa);

/* A blocking SOCK_SEQPACKET | SOCK_CLOEXEC socket connected to @path, or a
 * negative errno (that of socket(2) or connect(2), or odpd_wire_sockaddr's). */
int odpd_wire_connect(const char *path);

/* Close every fd in @p and forget them. */
void odpd_packet_close_fds(struct odpd_packet *p);

/* Name of a Request body case, for logs ("hello", "reg_mr", ...). */
const char *odpd_request_name(Odpd__Request__BodyCase c);
