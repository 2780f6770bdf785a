/* SPDX-License-Identifier: MIT */
/* demo-util.h - what the demo programs share: their arguments, a CRC of a buffer, running a command. */
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* "@name [--socket PATH] [--size BYTES] [-- CMD...]": 0, or 2 after printing
 * the usage. *@sock, *@size and *@cmd keep their defaults unless given. */
static inline int demo_args(int argc, char **argv, const char *name, const char **sock, size_t *size,
			    char ***cmd)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
			*sock = argv[++i];
		} else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
			*size = strtoull(argv[++i], NULL, 0);
		} else if (strcmp(argv[i], "--") == 0 && i + 1 < argc) {
			*cmd = &argv[i + 1];
			break;
		} else {
			fprintf(stderr, "usage: %s [--socket PATH] [--size BYTES] [-- CMD...]\n", name);
			return 2;
		}
	}
	return 0;
}
