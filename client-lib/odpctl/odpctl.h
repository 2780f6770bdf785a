/* SPDX-License-Identifier: MIT */
/* odpctl.h - what the parts of odpctl share: options, formatting and tables
 * (format.c), human and JSON printers (human.c, json.c), talking to odpd
 * (talk.c), and the commands (cmd-*.c) that odpctl.c dispatches to. */
#pragma once

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <json.h>

#include "config.h"
#include "odpd-wire.h"

/* How long to wait for the daemon to answer one request. */
#define TIMEOUT_SEC 10
/* ... and a Flush, which is answered only when every MR it selected is
 * deregistered. */
#define FLUSH_TIMEOUT_SEC 120

/* Exit statuses (odpctl(8), EXIT STATUS). */
#define EXIT_REFUSED 1          /* odpd answered with an error, or another failure */
#define EXIT_USAGE 2            /* bad command line */
#define EXIT_NOT_RUNNING 3      /* no odpd at the socket (ENOENT, ECONNREFUSED), or it went away */
#define EXIT_DENIED 4           /* not allowed: the socket (EACCES) or odpd (EPERM, EACCES) */

/* What fail() saw last: the exit status of a failed run. */
extern int fail_status;

/* Longest shared PD name (JoinPd.name: 1..63 bytes of [A-Za-z0-9._:@-]). */
#define PD_NAME_MAX 63

struct command;

struct options {
	const char *socket;
	bool json;
	bool has_pid;                /* --pid */
	int32_t pid;
	const char *pd;              /* --pd, NULL if not given */
	bool prometheus;             /* stats --prometheus */
	const struct command *cmd;
};

/* Room for human_bytes(), human_age(), limit_text(). */
#define HUMAN_LEN 24

struct bit_name {
	uint32_t bit;
	const char *name;
};

/* A shared PD's name, or "(private)" for the empty name of a private PD:
 * parentheses never occur in a PD name. Tables and JSON alike. */
#define PRIVATE_PD "(private)"

/*
 * Cells are added row by row, the first row usually being the header;
 * columns are as wide as their widest cell, two spaces apart. Control
 * characters in cells (names come from clients) are shown as '?'.
 */
#define TABLE_MAX_COLS 16

struct table {
	size_t ncols;                /* 1 .. TABLE_MAX_COLS */
	size_t ncells;
	char **cells;
};

/* The registration size histogram (CacheStats.registration_sizes): bucket
 * i counts registrations of at most 4 KiB << i, the last one the larger. */
#define N_SIZE_BUCKETS 20
extern const char *const size_keys[N_SIZE_BUCKETS];

/* The columns of the mrs table. */
#define MRS_COLS 14

void oom(void);
__attribute__((format(printf, 3, 4)))
void fail(const char *what, int err, const char *fmt, ...);
const char *human_bytes(uint64_t v, char buf[static HUMAN_LEN]);
const char *odp_caps(uint32_t caps, char buf[static 64]);
const char *support_name(Odpd__Support s);
const char *support_text(Odpd__Support s, int err, char buf[static 48]);
const char *yes_no(bool b);
const char *access_text(uint32_t access, char buf[static 48]);
const char *mr_state_name(Odpd__MrState s);
const char *mr_kind_name(Odpd__MrKind k);
const char *pd_text(const char *name);
const char *human_age(uint64_t ms, char buf[static HUMAN_LEN]);
const char *limit_text(uint64_t v, char buf[static HUMAN_LEN]);
const char *user_name(uint32_t uid);
__attribute__((format(printf, 2, 3)))
void table_add(struct table *t, const char *fmt, ...);
void table_clear(struct table *t);
void table_print(struct table *t, const char *title);
void print_clients(const Odpd__StatusReply *st);
uint64_t size_bucket(const Odpd__CacheStats *c, size_t i);
void print_human(const Odpd__StatusReply *st);
const char *iova_range(uint64_t iova, uint64_t length, char buf[static 48]);
void mrs_header(struct table *t);
void mrs_row(struct table *t, const Odpd__MrInfo *m);
json_object *json_obj(void);
void put_u64(json_object *o, const char *key, uint64_t v);
void put_u64_str(json_object *o, const char *key, uint64_t v);
void put_hex(json_object *o, const char *key, uint64_t v);
void put_str(json_object *o, const char *key, const char *v);
void put_bool(json_object *o, const char *key, bool v);
json_object *json_client(const Odpd__ClientInfo *c);
json_object *json_mr(const Odpd__MrInfo *m);
void json_print(json_object *root);
void print_json(const Odpd__StatusReply *st);
int set_reply_timeout(int sock, int sec);
int connect_daemon(const char *path);
Odpd__Reply *call(int sock, Odpd__Request *req, const char *what,
			 Odpd__Reply__BodyCase want);
int hello(int sock);
Odpd__Reply *status_call(int sock);
int cmd_status(int sock, const struct options *o);
Odpd__Reply *list_mrs(int sock, const struct options *o, uint64_t id, const uint64_t *after,
			     const char *what);
int cmd_mrs(int sock, const struct options *o);
int cmd_flush(int sock, const struct options *o);
int cmd_verify(int sock, const struct options *o);
int cmd_reload(int sock, const struct options *o);
int cmd_clients(int sock, const struct options *o);
int cmd_stats(int sock, const struct options *o);
