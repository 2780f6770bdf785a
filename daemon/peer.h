/* SPDX-License-Identifier: MIT */
#pragma once

/*
 * The peer of a Unix socket, as the connection layer (client.c) needs to
 * know it: its pidfd, its supplementary groups, and whether its process
 * has exited. Knows nothing of odpd's objects.
 */

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* What /proc/PID/stat says of a process (proc(5)). */
struct odpd_peer_stat {
	char state;                     /* R, S, D, Z, X, ... */
	unsigned long flags;            /* PF_*: PF_EXITING 0x4 */
	unsigned long long starttime;
	int exit_code;                  /* as waitpid(2) reports it; 0 unless odpd may ptrace it */
};

/* A pidfd of the peer of socket @fd (process @pid), or -1. */
int odpd_peer_pidfd(int fd, pid_t pid);
/* 0, or -errno. */
int odpd_peer_stat_read(pid_t pid, struct odpd_peer_stat *ret);
/*
 * Has the process (@pidfd, or -1; @pid, started at @starttime, 0 unknown)
 * exited, or is it exiting (its fds, the socket among them, close before
 * it is a zombie)? Then true, and @buf says how, with the signal or exit
 * status where odpd may read it: "its process was killed by SIGKILL", "its
 * process exited with status 3", "its process exited".
 */
bool odpd_peer_exit_text(int pidfd, pid_t pid, unsigned long long starttime, char *buf, size_t len);
/* The peer's supplementary groups (SO_PEERGROUPS): 0, or -errno. */
int odpd_peer_groups(int fd, gid_t **ret, unsigned *ret_n);
