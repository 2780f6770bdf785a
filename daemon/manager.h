/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>
#include <event2/event.h>

#include "conf.h"
#include "fdstore.h"
#include "device.h"
#include "hotplug.h"
#include "notify.h"
#include "pool.h"
#include "quota.h"
#include "registry.h"
#include "segment.h"

struct odpd_client;
struct odpd_bus;

struct odpd_config {
	const char *socket_path;
	bool foreground;
	char **devices;                 /* --device, may be empty */
	unsigned n_devices;
	unsigned workers;
	uint64_t max_segment_size;      /* bytes */
	uint64_t window_size;           /* bytes */
	uint64_t verify_buffer;         /* bytes: the largest bounce buffer of a verifier */
	unsigned verify_idle_ms;        /* a verifier idle that long is freed; 0: after each verify */
	unsigned max_clients;
	unsigned max_segments;          /* per client */
	unsigned max_mrs;               /* per client */
	bool has_admin_gid;
	gid_t admin_gid;
	int log_level;
	const char *config_path;        /* --config, or ODPD_CONF_DEFAULT */
	bool config_given;              /* --config: the file must exist */
	bool no_bus;                    /* --no-bus: no D-Bus even where there is a system bus */
	bool live_restart;              /* SIGTERM under systemd keeps the MRs (--no-live-restart: not) */
	bool check_config;              /* --check-config: read the configuration file and exit */
};

/* What a request's handler may ask of the daemon as a whole: handlers call
 * no function of the manager's (the manager sets these up at start). */
struct odpd_control {
	/* odpd_manager_reload */
	int (*reload)(void *ctx, char *msg, size_t len);
	void *ctx;
};

struct odpd_stats {
	uint64_t registrations;
	uint64_t deregistrations;
	uint64_t errors;                /* error replies */
};

/* The daemon's state; owned by the event loop thread. */
/*
 * Where the loop decodes one request at a time (client.c, client_request):
 * protobuf-c's allocations for it are carved from @buf and all dropped at
 * once when the request has been handled, for nothing a handler keeps (a
 * job copies what it needs). What does not fit goes to malloc.
 */
#define ODPD_ARENA_SIZE (16u * 1024u)
struct odpd_arena {
	uint8_t *buf;                       /* ODPD_ARENA_SIZE bytes */
	size_t used;
	unsigned spilled;                   /* allocations that went to malloc */
	bool oom;                           /* one of those failed */
	bool busy;                          /* a request is decoded in it */
};

struct odpd_restart;

struct odpd_manager {
	struct event_base *base;
	struct odpd_config cfg;
	struct odpd_devices devices;
	struct odpd_segtable segs;
	struct odpd_pool *pool;
	struct odpd_conf conf;              /* odpd.conf */
	struct odpd_registry registry;      /* every MR */
	LIST_HEAD(, odpd_client) clients;   /* connected */
	LIST_HEAD(, odpd_client) reap;      /* disconnected, torn down by ev_reap */
	LIST_HEAD(, odpd_client) conn_ids[64]; /* every client until freed, by id % 64 */
	struct event *ev_reap;
	unsigned n_clients;                 /* connected or still being torn down */
	unsigned n_refused;                 /* of those, refused (over their user's limit) */
	uint64_t next_client_id;
	struct odpd_stats stats;
	uint8_t *rbuf;                      /* ODPD_MAX_PACKET + 1: the receive buffer */
	struct odpd_arena arena;            /* where a request is decoded (client.c) */
	int listen_fd;
	bool unlink_socket;                 /* we created it (not socket activation) */
	struct event *ev_listen;
	struct event *ev_signals[2];
	struct event *ev_stop;              /* while stopping: is everything released? */
	bool stopping;
	/* A stop that hands its state to the next odpd (restart.c): no
	 * request is read any more, and the loop waits for what runs. */
	bool quiescing;
	bool handed_over;                   /* stored in systemd's fd store: exit, release nothing */
	struct event *ev_quiesce;
	int quiesce_ticks;
	struct odpd_fdstore *restore_fds;   /* at start: what systemd passed */
	struct odpd_fdstore fdstore;
	struct odpd_restart *restart;
	unsigned restart_kept_clients, restart_kept_mrs;        /* by the last restart */
	unsigned restart_dropped_clients, restart_dropped_mrs;
	char restart_from[32];              /* the previous odpd's version; "" without a restart */
	uint64_t restart_epoch;             /* the journal taken over (journal-N); 0: none */
	bool restart_crashed;               /* ... of an odpd that crashed */
	unsigned restart_swept_mrs;         /* MRs of its limbo deregistered */
	void (*plain_stop)(struct odpd_manager *m);
	/* $ODPD_TEST_IMPLICIT_ODP=1, for odpd's tests on devices without the
	 * cap: implicit ODP requests go on to the registrar, and the kernel
	 * refuses them there. */
	bool implicit_without_cap;
	/* $ODPD_TEST_CRASH_BEFORE_ANSWER=NAME (a request's name, as the log
	 * writes it: reg_mr, dereg_mr, ...), for tests: odpd kills itself
	 * (SIGKILL) once the journal has taken the answer to the first request
	 * of that kind on a kept connection, before it is sent. */
	const char *test_crash_kind;
	uint64_t test_crash_id;             /* that request's id, client test_crash_conn's */
	uint64_t test_crash_conn;
	uint64_t nofile;                    /* RLIMIT_NOFILE soft limit, after raising it */
	struct odpd_budget budget;          /* what users share (quota.h): fds, mappings, window */
	struct event *ev_listen_resume;     /* accept4 failed: listening paused until then */
	struct odpd_bus *bus;               /* D-Bus (bus.h), or NULL */
	struct odpd_notify notify;          /* events to clients: the connection layer's (notify.h) */
	struct odpd_control control;        /* what handlers ask of the daemon as a whole */
	struct odpd_hotplug hotplug;        /* devices that come and go (hotplug.h) */
	/* systemd's watchdog: WATCHDOG=1 only while the workers make progress. */
	struct event *ev_watchdog;
	struct odpd_job wd_ping;            /* a no-op job per tick: done proves a worker runs */
	bool wd_ping_pending;
	unsigned long wd_completed;         /* the pool's count at the last tick */
	struct event *ev_wedge;             /* ODPD_TEST_WEDGE=1: SIGUSR1 blocks every worker */
	struct event *ev_hup;               /* SIGHUP: reload the configuration */
	struct event *ev_stages;            /* SIGUSR2, -Drequest_stages=true only (stages.h) */
	long long resolve_last_ms;          /* CLOCK_MONOTONIC of the last odpd_manager_resolve_names round */
};

int odpd_manager_start(struct odpd_manager *m);
/* accept4 is out of fds or memory: stop listening for @ms. */
void odpd_manager_pause_listening(struct odpd_manager *m, int ms);
void odpd_manager_finish(struct odpd_manager *m);
/* Read the configuration file again; in use from the next request on, for
 * every connection. On an error the configuration in use stays and @msg
 * (and the log) says why. 0 or -errno. */
int odpd_manager_reload(struct odpd_manager *m, char *msg, size_t len);
/* Look the configuration's unresolved user and group names up again (at
 * most once a second), before a new client's limits are worked out. */
void odpd_manager_resolve_names(struct odpd_manager *m);
/* A client is gone for good: stop the loop if we are shutting down and it was the last. */
void odpd_manager_client_released(struct odpd_manager *m);
