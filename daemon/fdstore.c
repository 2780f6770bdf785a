/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
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
	bool known;                         /* max is the unit's (0 then: no store at all) */
	unsigned long long refused;
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

/* $FDSTORE, as systemd 254 and later set it (only when the unit's
 * FileDescriptorStoreMax= is above 0): 0, or -errno if unset or not a number. */
static int store_max_env(unsigned *ret)
{
	const char *e = getenv("FDSTORE");
	unsigned long v;
	char *end;

	if (!e || !*e)
		return -ENOENT;
	if (*e < '0' || *e > '9')
		return -EINVAL;
	errno = 0;
	v = strtoul(e, &end, 10);
	if (errno || *end || v > UINT32_MAX)
		return -EINVAL;
	*ret = (unsigned)v;
	return 0;
}

struct max_query {
	bool done;
	int r;
	uint32_t max;
};

static int max_got(sd_bus_message *reply, void *userdata, sd_bus_error *ret_error)
{
	struct max_query *q = userdata;
	const sd_bus_error *e;

	(void)ret_error;
	q->done = true;
	e = sd_bus_message_get_error(reply);
	if (e) {
		q->r = -sd_bus_error_get_errno(e);
		if (q->r >= 0)
			q->r = -EIO;
		log_debug("fd store: FileDescriptorStoreMax= not known: %s", e->message ? e->message : e->name);
		return 1;
	}
	q->r = sd_bus_message_read(reply, "v", "u", &q->max);
	return 1;
}

/* systemd 252 (no $FDSTORE): the unit's FileDescriptorStoreMax property,
 * asked before anything is stored or restored (a restart is when the store
 * is fullest), within 2 s all told: sd-bus's own authentication timeout is
 * 90 s, so the connection is driven here, to a deadline. 0 or -errno. */
static int store_max_bus(unsigned *ret)
{
	const char *addr = secure_getenv("DBUS_SYSTEM_BUS_ADDRESS");
	struct max_query q = { 0 };
	char *unit = NULL, *path = NULL;
	sd_bus *bus = NULL;
	struct timespec ts;
	uint64_t deadline, now;
	int r;

	r = sd_pid_get_unit(0, &unit);
	if (r < 0)
		return r;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	deadline = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000 + 2 * 1000000;
	r = sd_bus_new(&bus);
	if (r >= 0)
		r = sd_bus_set_address(bus, addr && *addr ? addr : "unix:path=/run/dbus/system_bus_socket");
	if (r >= 0)
		r = sd_bus_set_bus_client(bus, 1);
	if (r >= 0)
		r = sd_bus_start(bus);
	if (r >= 0)
		r = sd_bus_path_encode("/org/freedesktop/systemd1/unit", unit, &path);
	if (r >= 0)
		r = sd_bus_call_method_async(bus, NULL, "org.freedesktop.systemd1", path,
					     "org.freedesktop.DBus.Properties", "Get", max_got, &q, "ss",
					     "org.freedesktop.systemd1.Service", "FileDescriptorStoreMax");
	while (r >= 0 && !q.done) {
		r = sd_bus_process(bus, NULL);
		if (r != 0)
			continue;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		now = (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
		r = now >= deadline ? -ETIMEDOUT : sd_bus_wait(bus, deadline - now);
	}
	if (r >= 0)
		r = q.r;
	if (r < 0)
		log_info("fd store: FileDescriptorStoreMax= of %s not known (%s): what does not fit is closed "
			 "by systemd unseen", unit, strerror(-r));
	sd_bus_close_unref(bus);
	free(path);
	free(unit);
	if (r < 0)
		return r;
	*ret = q.max;
	return 0;
}

void odpd_fdstore_usage(struct odpd_fdstore_usage *u)
{
	pthread_mutex_lock(&S.lock);
	*u = (struct odpd_fdstore_usage){ .stored = S.stored, .max = S.max, .known = S.known, .refused = S.refused };
	pthread_mutex_unlock(&S.lock);
}

int odpd_fdstore_collect(struct odpd_fdstore *s, bool ask_bus)
{
	char **names = NULL;
	unsigned max;
	int n = sd_listen_fds_with_names(1, &names);

	*s = (struct odpd_fdstore){ .listen_fd = -1 };
	if (odpd_fdstore_available() &&
	    (store_max_env(&max) == 0 || (ask_bus && store_max_bus(&max) == 0))) {
		pthread_mutex_lock(&S.lock);
		S.max = max;
		S.known = true;
		pthread_mutex_unlock(&S.lock);
		if (!max)
			log_info("fd store: FileDescriptorStoreMax=0, no store: nothing is kept across a restart");
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
		    !(in_use && in_use(s->fds[i].name + strlen(STORED_PREFIX), arg)) &&
		    odpd_fdstore_remove(s->fds[i].name + strlen(STORED_PREFIX)) < 0)
			log_warning("fd store: cannot remove %s", s->fds[i].name);
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
	bool none;

	pthread_mutex_lock(&S.lock);
	none = S.known && !S.max;               /* FileDescriptorStoreMax=0 */
	pthread_mutex_unlock(&S.lock);
	return e && *e && !none;
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

/* The places at the end of the store that @name may not take: a PD's
 * context leaves the journal and the limbo 2 (a rewrite holds two
 * journals for a moment), a connection, a hit table or a segment 4 (what
 * it would keep is lost at a restart, but nothing else is); the journal
 * and the limbo none. */
static unsigned reserve_for(const char *name)
{
	if (strncmp(name, "journal-", 8) == 0 || strncmp(name, "limbo-", 6) == 0)
		return 0;
	if (strncmp(name, "ctx-", 4) == 0)
		return ODPD_FDSTORE_RESERVED / 2;
	return ODPD_FDSTORE_RESERVED;
}

int odpd_fdstore_put(const char *name, int fd)
{
	char msg[96], full[64];
	int r;

	snprintf(full, sizeof(full), STORED_PREFIX "%s", name);
	snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s\nFDPOLL=0", full);
	pthread_mutex_lock(&S.lock);
	if (S.known && !*name_slot(full) && S.stored + reserve_for(name) >= S.max) {
		/* systemd would close it: the caller keeps what it has (a
		 * journal its old one) and knows this one is not stored */
		S.refused++;
		say_full_locked(full);
		pthread_mutex_unlock(&S.lock);
		return -EXFULL;
	}
	/* (under the lock: two stores at the last place cannot both pass) */
	r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
	if (r > 0) {
		name_add_locked(full);
		if (S.known && S.max >= 10 && S.stored >= S.max - S.max / 10 && !S.nearly_said) {
			log_warning("systemd's fd store is nearly full: %u of FileDescriptorStoreMax=%u; the "
				    "last %u places are for odpd's journal (PD contexts may take %u of them), and "
				    "what odpd cannot store is not kept across a restart; raise "
				    "FileDescriptorStoreMax= in a drop-in (odpd(8), RESTART)", S.stored, S.max,
				    ODPD_FDSTORE_RESERVED, ODPD_FDSTORE_RESERVED / 2);
			S.nearly_said = true;
		}
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
