/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <systemd/sd-daemon.h>
#include "fdstore.h"
#include "log.h"

/* The socket unit's fds are named after the unit; stored ones by odpd. */
#define STORED_PREFIX "odpd-"

static bool stored_name(const char *name)
{
	return name && strncmp(name, STORED_PREFIX, strlen(STORED_PREFIX)) == 0;
}

int odpd_fdstore_collect(struct odpd_fdstore *s)
{
	char **names = NULL;
	int n = sd_listen_fds_with_names(1, &names);

	*s = (struct odpd_fdstore){ .listen_fd = -1 };
	if (n <= 0) {
		free(names);
		return n < 0 ? n : 0;
	}
	s->fds = calloc((size_t)n, sizeof(*s->fds));
	if (!s->fds) {
		for (int i = 0; i < n; i++) {
			close(SD_LISTEN_FDS_START + i);
			free(names ? names[i] : NULL);
		}
		free(names);
		return -ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		int fd = SD_LISTEN_FDS_START + i;
		char *name = names ? names[i] : NULL;

		if (!stored_name(name) && s->listen_fd < 0) {
			s->listen_fd = fd;
			s->listen_name = name;
			continue;
		}
		if (!stored_name(name))
			log_warning("systemd passed a second socket (%s): closed", name ? name : "?");
		s->fds[s->n++] = (struct odpd_stored_fd){ .name = name, .fd = fd };
	}
	free(names);
	return 0;
}

int odpd_fdstore_take(struct odpd_fdstore *s, const char *name)
{
	char full[64];

	snprintf(full, sizeof(full), STORED_PREFIX "%s", name);
	for (unsigned i = 0; i < s->n; i++)
		if (s->fds[i].fd >= 0 && s->fds[i].name && strcmp(s->fds[i].name, full) == 0) {
			int fd = s->fds[i].fd;

			s->fds[i].fd = -1;
			return fd;
		}
	return -1;
}

void odpd_fdstore_release(struct odpd_fdstore *s)
{
	odpd_fdstore_release_unused(s, NULL, NULL);
}

void odpd_fdstore_release_unused(struct odpd_fdstore *s, bool (*in_use)(const char *name, void *arg), void *arg)
{
	for (unsigned i = 0; i < s->n; i++) {
		if (s->fds[i].name && stored_name(s->fds[i].name) &&
		    !(in_use && in_use(s->fds[i].name + strlen(STORED_PREFIX), arg))) {
			char msg[96];

			snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", s->fds[i].name);
			if (sd_notify(0, msg) <= 0)
				log_warning("fd store: cannot remove %s", s->fds[i].name);
		}
		if (s->fds[i].fd >= 0)
			close(s->fds[i].fd);
		free(s->fds[i].name);
	}
	free(s->fds);
	free(s->listen_name);
	s->fds = NULL;
	s->n = 0;
	s->listen_name = NULL;
}

bool odpd_fdstore_available(void)
{
	const char *e = getenv("NOTIFY_SOCKET");

	return e && *e;
}

int odpd_fdstore_put(const char *name, int fd)
{
	char msg[96];
	int r;

	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=" STORED_PREFIX "%s\nFDPOLL=0", name);
	r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
	return r > 0 ? 0 : r < 0 ? r : -ENOTCONN;
}

int odpd_fdstore_remove(const char *name)
{
	char msg[96];
	int r;

	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=" STORED_PREFIX "%s", name);
	r = sd_notify(0, msg);
	return r > 0 ? 0 : r < 0 ? r : -ENOTCONN;
}

int odpd_fdstore_sync(void)
{
	return sd_notify_barrier(0, 5 * 1000000ull);
}
