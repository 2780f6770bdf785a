/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-login.h>
#include "fdstore.h"
#include "log.h"

/* The socket unit's fds are named after the unit; stored ones by odpd. */
#define STORED_PREFIX "odpd-"

static bool stored_name(const char *name)
{
	return name && strncmp(name, STORED_PREFIX, strlen(STORED_PREFIX)) == 0;
}

/*
 * What is in systemd's store under odpd's names, counted against the unit's
 * FileDescriptorStoreMax= (fdstore.h: what is refused, what is counted).
 * Beyond it systemd closes the fd and says so in its own log, not to odpd.
 * A name removed that was never stored changes nothing: the names are
 * kept, hashed (the loop and the workers both store).
 */
struct name_node {
	struct name_node *next;
	char name[];
};

#define NAME_BUCKETS 1024
static struct {
	pthread_mutex_t lock;
	struct name_node *bucket[NAME_BUCKETS];
	unsigned stored, max;
	unsigned long long refused, over;
	bool nearly_said, full_said;
} S = { .lock = PTHREAD_MUTEX_INITIALIZER };

static struct name_node **name_slot(const char *name)
{
	unsigned h = 2166136261u;                /* FNV-1a */
	struct name_node **p;

	for (const char *c = name; *c; c++)
		h = (h ^ (unsigned char)*c) * 16777619u;
	for (p = &S.bucket[h % NAME_BUCKETS]; *p; p = &(*p)->next)
		if (strcmp((*p)->name, name) == 0)
			break;
	return p;
}

/* @name (with the prefix) is in the store now. Lock held. */
static void name_add_locked(const char *name)
{
	struct name_node **p = name_slot(name), *n;
	size_t len = strlen(name) + 1;

	if (*p)
		return;
	n = malloc(sizeof(*n) + len);
	if (!n)
		return;                         /* uncounted: the limit is then a little late */
	memcpy(n->name, name, len);
	n->next = NULL;
	*p = n;
	S.stored++;
}

static void name_del_locked(const char *name)
{
	struct name_node **p = name_slot(name), *n = *p;

	if (!n)
		return;
	*p = n->next;
	free(n);
	S.stored--;
}

static void name_del(const char *name)
{
	pthread_mutex_lock(&S.lock);
	name_del_locked(name);
	pthread_mutex_unlock(&S.lock);
}

/* The unit's FileDescriptorStoreMax=, 0 if not known. */
static unsigned store_max(void)
{
	const char *e = getenv("FDSTORE");      /* systemd 254 and later */
	sd_bus_error err = SD_BUS_ERROR_NULL;
	char *unit = NULL, *path = NULL;
	sd_bus *bus = NULL;
	uint32_t max = 0;
	int r;

	if (e && *e) {
		char *end;
		unsigned long v = strtoul(e, &end, 10);

		return *end || v > UINT32_MAX ? 0 : (unsigned)v;
	}
	/* systemd 252: the property of odpd's own unit */
	r = sd_pid_get_unit(0, &unit);
	if (r < 0)
		return 0;
	r = sd_bus_open_system(&bus);
	if (r >= 0)
		r = sd_bus_set_method_call_timeout(bus, 2 * 1000000ull);
	if (r >= 0)
		r = sd_bus_path_encode("/org/freedesktop/systemd1/unit", unit, &path);
	if (r >= 0)
		r = sd_bus_get_property_trivial(bus, "org.freedesktop.systemd1", path,
						"org.freedesktop.systemd1.Service", "FileDescriptorStoreMax", &err,
						'u', &max);
	if (r < 0)
		log_debug("fd store: FileDescriptorStoreMax= of %s not known: %s", unit,
			  err.message ? err.message : strerror(-r));
	sd_bus_error_free(&err);
	sd_bus_flush_close_unref(bus);
	free(path);
	free(unit);
	return r < 0 ? 0 : max;
}

void odpd_fdstore_usage(struct odpd_fdstore_usage *u)
{
	pthread_mutex_lock(&S.lock);
	*u = (struct odpd_fdstore_usage){ .stored = S.stored, .max = S.max, .refused = S.refused, .over = S.over };
	pthread_mutex_unlock(&S.lock);
}

int odpd_fdstore_collect(struct odpd_fdstore *s)
{
	char **names = NULL;
	int n = sd_listen_fds_with_names(1, &names);

	*s = (struct odpd_fdstore){ .listen_fd = -1 };
	if (odpd_fdstore_available()) {
		unsigned max = store_max();

		pthread_mutex_lock(&S.lock);
		S.max = max;
		pthread_mutex_unlock(&S.lock);
	}
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
		else {
			pthread_mutex_lock(&S.lock);
			name_add_locked(name);       /* in the store until odpd says otherwise */
			pthread_mutex_unlock(&S.lock);
		}
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
			else
				name_del(s->fds[i].name);
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

/* Once: the store is full, and what that costs. Lock held. */
static void say_full_locked(const char *full)
{
	if (S.full_said)
		return;
	S.full_said = true;
	log_warning("systemd's fd store is full (FileDescriptorStoreMax=%u, the last %u places kept for the "
		    "journal): %s was not stored, and what odpd cannot store from now on is not kept across a "
		    "restart; raise FileDescriptorStoreMax= in a drop-in (odpd(8), RESTART)",
		    S.max, ODPD_FDSTORE_RESERVED, full);
}

int odpd_fdstore_put(const char *name, int fd)
{
	bool vital = strncmp(name, "journal-", 8) == 0 || strncmp(name, "limbo-", 6) == 0 ||
		     strncmp(name, "ctx-", 4) == 0;
	char msg[96], full[64];
	bool known, fits;
	int r;

	snprintf(full, sizeof(full), STORED_PREFIX "%s", name);
	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s\nFDPOLL=0", full);
	pthread_mutex_lock(&S.lock);
	known = *name_slot(full) != NULL;
	if (S.max && !known && !vital && S.stored + ODPD_FDSTORE_RESERVED >= S.max) {
		S.refused++;
		say_full_locked(full);
		pthread_mutex_unlock(&S.lock);
		return -EXFULL;
	}
	fits = !S.max || S.stored < S.max || known;
	r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
	if (r > 0 && fits) {
		name_add_locked(full);
		if (S.max >= 10 && S.stored >= S.max - S.max / 10 && !S.nearly_said) {
			log_warning("systemd's fd store is nearly full: %u of FileDescriptorStoreMax=%u; at the "
				    "last %u odpd stores only its journal and PD contexts, and what it cannot store "
				    "is not kept across a restart; raise FileDescriptorStoreMax= in a drop-in "
				    "(odpd(8), RESTART)", S.stored, S.max, ODPD_FDSTORE_RESERVED);
			S.nearly_said = true;
		}
	} else if (r > 0) {
		S.over++;
		say_full_locked(full);
	}
	pthread_mutex_unlock(&S.lock);
	return r > 0 ? 0 : r < 0 ? r : -ENOTCONN;
}

int odpd_fdstore_remove(const char *name)
{
	char msg[96], full[64];
	int r;

	snprintf(full, sizeof(full), STORED_PREFIX "%s", name);
	snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", full);
	r = sd_notify(0, msg);
	if (r > 0)
		name_del(full);
	return r > 0 ? 0 : r < 0 ? r : -ENOTCONN;
}

int odpd_fdstore_sync(void)
{
	return sd_notify_barrier(0, 5 * 1000000ull);
}
