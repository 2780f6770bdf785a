/* SPDX-License-Identifier: MIT */
/* peer.c - who is at the other end of a Unix socket, and whether its process is gone. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "log.h"
#include "peer.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* A pidfd names the peer process even after its pid is reused. */
int odpd_peer_pidfd(int fd, pid_t pid)
{
	int pidfd = -1;
	socklen_t len = sizeof(pidfd);

	if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0)
		return pidfd;
	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pidfd < 0 && errno == ENOSYS)          /* before Linux 5.3: say so, once */
		log_ratelimited(LOG_WARNING, "no pidfd in this kernel: a connection whose process "
				"exited is ended only when its socket closes (a forked child may keep it)");
	return pidfd;
}

#define PF_EXITING 0x00000004UL

int odpd_peer_stat_read(pid_t pid, struct odpd_peer_stat *ret)
{
	char path[32], buf[1024], *p;
	unsigned field = 3;
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return n < 0 ? -errno : -ESRCH;
	buf[n] = 0;
	p = strrchr(buf, ')');           /* comm may hold spaces and parentheses */
	if (!p || p[1] != ' ')
		return -EINVAL;
	*ret = (struct odpd_peer_stat){ .state = p[2] };
	for (p += 2; (p = strchr(p, ' ')); field++) {
		p++;
		if (field + 1 == 9)
			ret->flags = strtoul(p, NULL, 10);
		else if (field + 1 == 22)
			ret->starttime = strtoull(p, NULL, 10);
		else if (field + 1 == 52)
			ret->exit_code = (int)strtol(p, NULL, 10);
	}
	return 0;
}

/*
 * Has the client's process exited (or is it exiting: its fds, the socket
 * among them, close before it is a zombie)? Then true, and @buf says how,
 * with the signal or exit status where odpd may read it: "its process was
 * killed by SIGKILL", "its process exited with status 3", "its process
 * exited".
 */
bool odpd_peer_exit_text(int pidfd, pid_t pid, unsigned long long starttime, char *buf, size_t len)
{
	struct pollfd pfd = { .fd = pidfd, .events = POLLIN };
	bool gone = pidfd >= 0 && poll(&pfd, 1, 0) == 1;
	struct odpd_peer_stat st;
	int r = odpd_peer_stat_read(pid, &st);

	if (r == 0 && starttime && st.starttime != starttime)
		r = -ESRCH;                     /* its pid is another process's now */
	if (r == -ENOENT || r == -ESRCH)
		gone = true;
	else if (r == 0 && (st.state == 'Z' || st.state == 'X' || (st.flags & PF_EXITING)))
		gone = true;
	if (!gone)
		return false;
	if (r == 0 && st.exit_code && WIFSIGNALED(st.exit_code))
		snprintf(buf, len, "its process was killed by SIG%s%s", sigabbrev_np(WTERMSIG(st.exit_code)) ?
			 sigabbrev_np(WTERMSIG(st.exit_code)) : "?",
			 WCOREDUMP(st.exit_code) ? " (core dumped)" : "");
	else if (r == 0 && st.exit_code && WIFEXITED(st.exit_code))
		snprintf(buf, len, "its process exited with status %d", WEXITSTATUS(st.exit_code));
	else
		snprintf(buf, len, "its process exited");
	return true;
}

/* The peer's supplementary groups (SO_PEERGROUPS), sized by the kernel. */
int odpd_peer_groups(int fd, gid_t **ret, unsigned *ret_n)
{
	socklen_t len = 0;
	gid_t *groups;

	/* SO_PEERGROUPS with no room answers ERANGE and the size it needs. */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, NULL, &len) < 0 && errno != ERANGE)
		return -errno;
	groups = malloc(len ? len : 1);
	if (!groups)
		return -ENOMEM;
	if (len && getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) {
		int r = -errno;
		free(groups);
		return r;
	}
	*ret = groups;
	*ret_n = (unsigned)(len / sizeof(gid_t));
	return 0;
}
