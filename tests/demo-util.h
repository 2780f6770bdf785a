/* SPDX-License-Identifier: MIT */
/* demo-util.h - what the demo programs share: a CRC of a buffer, running a command. */
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

/* CRC-32 (zlib's polynomial, as odpd_verify returns) of @n bytes at @p. */
static inline uint32_t crc_of(const void *p, size_t n)
{
	return (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)n);
}

/* Run @argv (argv[0] looked up in PATH) and wait: its exit status, or -1. */
static inline int run_command(char **argv)
{
	int st;
	pid_t pid = fork();

	if (pid == 0) {
		execvp(argv[0], argv);
		perror(argv[0]);
		_exit(127);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
