/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "odpd-envelope.h"
#include "odpd-wire.h"

int odpd_wire_send_buf(int sock, const void *buf, size_t len, const int *fds, unsigned nfds, int flags)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * ODPD_MAX_FDS)];
	} control;
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (len > ODPD_MAX_PACKET || nfds > ODPD_MAX_FDS)
		return -EMSGSIZE;
	if (nfds > 0) {
		memset(&control, 0, sizeof(control));
		mh.msg_control = control.buf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
	}
	do
		n = sendmsg(sock, &mh, flags | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	return 0;
}

int odpd_wire_send(int sock, const ProtobufCMessage *msg, const int *fds, unsigned nfds, int flags)
{
	uint8_t buf[ODPD_MAX_PACKET];
	size_t len = odpd_envelope_pack(msg, buf, sizeof(buf));

	if (len > sizeof(buf))
		return -EMSGSIZE;
	return odpd_wire_send_buf(sock, buf, len, fds, nfds, flags);
}

int odpd_poll(struct pollfd *p, unsigned n, int timeout_ms)
{
	struct timespec now, end;
	int r, left = timeout_ms;
	long long ns;

	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += timeout_ms / 1000;
	end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	for (;;) {
		r = poll(p, n, left);
		if (r >= 0)
			return r;
		if (errno != EINTR)
			return -errno;
		if (timeout_ms <= 0)        /* look once again, or wait on */
			continue;
		clock_gettime(CLOCK_MONOTONIC, &now);
		ns = (long long)(end.tv_sec - now.tv_sec) * 1000000000LL + (end.tv_nsec - now.tv_nsec);
		if (ns <= 0)
			return 0;
		left = (int)((ns + 999999) / 1000000);    /* never before the deadline */
	}
}

/* recvmsg returned 0: an empty record, or the peer shut down? */
static bool peer_shut_down(int sock)
{
	struct pollfd p = { .fd = sock, .events = POLLIN | POLLRDHUP };

	if (odpd_poll(&p, 1, 0) < 0)
		return true;
	return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

int odpd_wire_recv(int sock, uint8_t *buf, size_t cap, struct odpd_packet *ret, int flags)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int) * ODPD_MAX_FDS)];
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = cap };
	struct msghdr mh = {
		.msg_iov = &iov, .msg_iovlen = 1,
		.msg_control = control.buf, .msg_controllen = sizeof(control.buf),
	};
	ssize_t n;

	memset(ret, 0, sizeof(*ret));
	do
		n = recvmsg(sock, &mh, flags | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;

	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		unsigned k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int got[ODPD_MAX_FDS];
		memcpy(got, CMSG_DATA(c), k * sizeof(int));
		for (unsigned i = 0; i < k; i++) {
			if (ret->nfds < ODPD_MAX_FDS)
				ret->fds[ret->nfds++] = got[i];
			else
				close(got[i]);
		}
	}
	ret->len = (size_t)n;
	ret->truncated = (mh.msg_flags & MSG_TRUNC) != 0;
	ret->ctrunc = (mh.msg_flags & MSG_CTRUNC) != 0;
	ret->eof = n == 0 && peer_shut_down(sock);
	return 0;
}

int odpd_wire_sockaddr(const char *path, struct sockaddr_un *ret)
{
	size_t len = strlen(path);

	if (len == 0)
		return -EINVAL;
	if (len >= sizeof(ret->sun_path))
		return -ENAMETOOLONG;
	memset(ret, 0, sizeof(*ret));
	ret->sun_family = AF_UNIX;
	memcpy(ret->sun_path, path, len);
	return 0;
}

int odpd_wire_connect_to(int fd, const struct sockaddr_un *sa)
{
	int r;

	do
		r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : 0;
}

int odpd_wire_connect(const char *path)
{
	struct sockaddr_un sa;
	int fd, r = odpd_wire_sockaddr(path, &sa);

	if (r < 0)
		return r;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	r = odpd_wire_connect_to(fd, &sa);
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

void odpd_packet_close_fds(struct odpd_packet *p)
{
	for (unsigned i = 0; i < p->nfds; i++)
		close(p->fds[i]);
	p->nfds = 0;
}

const char *odpd_request_name(Odpd__Request__BodyCase c)
{
	switch (c) {
	case ODPD__REQUEST__BODY_HELLO: return "hello";
	case ODPD__REQUEST__BODY_ATTACH_SEGMENT: return "attach_segment";
	case ODPD__REQUEST__BODY_DETACH_SEGMENT: return "detach_segment";
	case ODPD__REQUEST__BODY_MAP_SEGMENT: return "map_segment";
	case ODPD__REQUEST__BODY_REG_MR: return "reg_mr";
	case ODPD__REQUEST__BODY_DEREG_MR: return "dereg_mr";
	case ODPD__REQUEST__BODY_VERIFY: return "verify";
	case ODPD__REQUEST__BODY_STATUS: return "status";
	case ODPD__REQUEST__BODY_JOIN_PD: return "join_pd";
	case ODPD__REQUEST__BODY_FLUSH: return "flush";
	case ODPD__REQUEST__BODY_LIST_MRS: return "list_mrs";
	case ODPD__REQUEST__BODY_IMPORT_PD: return "import_pd";
	case ODPD__REQUEST__BODY_ADVISE_MR: return "advise_mr";
	case ODPD__REQUEST__BODY_RELOAD: return "reload";
	case ODPD__REQUEST__BODY_ADMIN_VERIFY: return "admin_verify";
	case ODPD__REQUEST__BODY_OPEN_HIT_TABLE: return "open_hit_table";
	default: return "unknown";
	}
}
