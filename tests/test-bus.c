/* SPDX-License-Identifier: MIT */
/*
 * test-bus (host, and VM where a device makes the MR counters move): odpd
 * on a real dbus-daemon, driven with busctl. The bus runs with a small
 * system-bus configuration of the test's own that includes odpd's real
 * policy file (systemd/org.odpd1.conf), plus one test rule: uid 1 may send
 * Flush(), so that odpd's own check of the caller is reached.
 *   - odpd owns org.odpd1; its properties equal the Status reply's numbers;
 *   - per-client and per-device objects;
 *   - Flush(): root may; uid 65534 is stopped by the policy; uid 1 by odpd
 *     (and allowed with --admin-group of its group);
 *   - the bus going away leaves odpd serving; no bus at all too;
 *   - odpd --bus-introspect prints the interfaces busctl sees.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <json.h>

#include "harness.h"
#include "odpd.h"

#define KIB (1ull << 10)

/* busctl --address=BUS ARGS... (NULL-terminated) as @uid. */
static int busctl(uid_t uid, char *out, size_t cap, ...)
{
	const char *argv[16];
	char addr[192];
	va_list ap;
	int n = 0;

	snprintf(addr, sizeof(addr), "--address=%s", bus_addr);
	argv[n++] = "busctl";
	argv[n++] = addr;
	argv[n++] = "--no-pager";
	va_start(ap, cap);
	for (const char *a; n < 15 && (a = va_arg(ap, const char *)); )
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	return run_tool(uid, out, cap, argv);
}

/* Flush() through dbus-send as @uid: unlike busctl, it prints the error's
 * own message, which tells the bus's refusal from odpd's. */
static int dbus_send_flush(uid_t uid, char *out, size_t cap)
{
	char addr[192];
	const char *argv[] = { "dbus-send", addr, "--print-reply", "--dest=org.odpd1", "/org/odpd1",
			       "org.odpd1.Manager.Flush", NULL };

	snprintf(addr, sizeof(addr), "--bus=%s", bus_addr);
	return run_tool(uid, out, cap, argv);
}

/* A Manager property as busctl prints it ("t 42"): its number. */
static uint64_t bus_counter(const char *name)
{
	char out[256];
	unsigned long long v;

	assert_int_equal(busctl(0, out, sizeof(out), "get-property", "org.odpd1", "/org/odpd1",
				"org.odpd1.Manager", name, NULL), 0);
	assert_int_equal(sscanf(out, "t %llu", &v), 1);
	return v;
}

/* odpd requests its name asynchronously: wait until it owns it. */
static void wait_for_name(void)
{
	char out[512];

	for (int i = 0; i < 200; i++) {
		if (busctl(0, out, sizeof(out), "get-property", "org.odpd1", "/org/odpd1",
			   "org.odpd1.Manager", "Version", NULL) == 0)
			return;
		usleep(50000);
	}
	fail_msg("odpd did not take org.odpd1: %s", out);
}

/* The relaxed MRs these tests leave stay queued until flushed. */
#define CONF "[limits]\nrelaxed-window-ms = 600000\n"

static void test_properties_equal_status(void **state)
{
	struct test_daemon d = { 0 };
	char conf[128];
	Odpd__Reply *reply = NULL;
	Odpd__StatusReply *st;
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *mr;
	char out[8192], tree[8192], path[128];
	int admin, n_paths, with_segment = 0;

	(void)state;
	bus_start();
	daemon_start_conf(&d, conf, sizeof(conf), "bus", CONF, NULL, NULL);
	wait_for_name();
	admin = raw_connect_hello(d.sock);
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	s = odpd_alloc(c, 256 * KIB, 0);
	assert_non_null(s);
	mr = odpd_reg(c, odpd_segment_addr(s), 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
	/* no device on the host: an error reply, counted */
	if (mr)
		assert_int_equal(odpd_dereg_relaxed(mr), 0);
	st = status_get(admin, &reply);
	assert_int_equal(bus_counter("Segments"), st->segments);
	assert_int_equal(bus_counter("SegmentBytes"), st->segment_bytes);
	assert_int_equal(bus_counter("MRs"), st->mrs);
	assert_int_equal(bus_counter("PinnedBytes"), st->pinned_bytes);
	assert_int_equal(bus_counter("Registrations"), st->registrations);
	assert_int_equal(bus_counter("Deregistrations"), st->deregistrations);
	assert_int_equal(bus_counter("Errors"), st->errors);
	assert_int_equal(bus_counter("Devices"), st->n_devices);
	assert_int_equal(bus_counter("CacheMisses"), st->cache->misses);
	assert_int_equal(bus_counter("RelaxedPending"), st->cache->relaxed_pending);
	assert_int_equal(bus_counter("OdpMRs"), st->odp->mrs);
	assert_int_equal(bus_counter("Segments"), 1);
	assert_int_equal(bus_counter("SegmentBytes"), 256 * KIB);
	assert_true(bus_counter("Errors") >= (mr ? 0 : 1));
	assert_int_equal(bus_counter("LocalHits"), st->cache->local_hits);
	assert_int_equal(bus_counter("Revoked"), st->cache->revoked);
	/* the counters comparable with UCX's rcache (odpctl(8)) */
	assert_int_equal(bus_counter("Gets"), st->cache->gets);
	/* the odpd_reg above; refused before the cache without a device (host) */
	assert_int_equal(bus_counter("Gets"), mr ? 1 : 0);
	assert_int_equal(bus_counter("InvalidatedFlush"), st->cache->invalidated_flush);
	assert_int_equal(bus_counter("InvalidatedEviction"), st->cache->invalidated_eviction);
	assert_int_equal(bus_counter("InvalidatedHole"), st->cache->replaced);
	assert_int_equal(bus_counter("InvalidatedDevice"), st->cache->invalidated_device);
	assert_int_equal(bus_counter("InvalidatedExpired"), st->cache->invalidated_expired);
	assert_int_equal(bus_counter("RegisteredBytes"), st->cache->registered_bytes);
	assert_int_equal(st->cache->n_registration_sizes, 20);
	assert_int_equal(bus_counter("Registrations64K"), st->cache->registration_sizes[4]);
	assert_int_equal(bus_counter("RegistrationsOver1G"), st->cache->registration_sizes[19]);
	if (mr) {                                        /* VM: a device */
		struct odpd_stats ls;

		assert_int_equal(bus_counter("Registrations"), 1);
		assert_int_equal(bus_counter("Registrations64K"), 1);   /* 64 KiB: its bucket */
		assert_int_equal(bus_counter("Registrations32K"), 0);
		assert_int_equal(bus_counter("Registrations128K"), 0);
		assert_int_equal(bus_counter("RegisteredBytes"), 64 * KIB);
		/* the library keeps the released MR itself: the daemon's queue is empty */
		assert_int_equal(odpd_stats(c, &ls, sizeof(ls)), 0);
		assert_int_equal(ls.cached_mrs, 1);
		assert_int_equal(bus_counter("RelaxedPending"), 0);
	}
	odpd__reply__free_unpacked(reply, NULL);

	/* the clients' objects (c and the admin connection), with their own
	 * numbers: exactly one has the segment, and it is ours */
	assert_int_equal(busctl(0, tree, sizeof(tree), "tree", "org.odpd1", NULL), 0);
	n_paths = 0;
	for (char *p = strstr(tree, "/org/odpd1/client/"); p; p = strstr(p + 1, "/org/odpd1/client/")) {
		sscanf(p, "%127s", path);
		assert_int_equal(busctl(0, out, sizeof(out), "get-property", "org.odpd1", path,
					"org.odpd1.Client", "Segments", NULL), 0);
		if (strcmp(out, "t 1\n") == 0) {
			with_segment++;
			assert_int_equal(busctl(0, out, sizeof(out), "get-property", "org.odpd1", path,
						"org.odpd1.Client", "Pid", NULL), 0);
			assert_int_equal(strtoull(out + 2, NULL, 10), (unsigned long long)getpid());
		}
		n_paths++;
	}
	assert_int_equal(n_paths, 2);
	assert_int_equal(with_segment, 1);
	/* a client that is gone has no object */
	assert_int_not_equal(busctl(0, out, sizeof(out), "get-property", "org.odpd1",
				    "/org/odpd1/client/999999", "org.odpd1.Client", "Pid", NULL), 0);
	/* devices: one object per present device, none on the host */
	assert_int_equal(busctl(0, out, sizeof(out), "tree", "org.odpd1", NULL), 0);
	if (mr) {
		char *dev = strstr(out, "/org/odpd1/device/");
		char dpath[128];
		assert_non_null(dev);
		sscanf(dev, "%127s", dpath);
		assert_int_equal(busctl(0, out, sizeof(out), "get-property", "org.odpd1", dpath,
					"org.odpd1.Device", "MRs", NULL), 0);
		assert_string_equal(out, "t 1\n");              /* the relaxed one */
	} else {
		assert_null(strstr(out, "/org/odpd1/device/"));
	}
	/* anyone may read: uid 65534 too */
	assert_int_equal(busctl(65534, out, sizeof(out), "get-property", "org.odpd1", "/org/odpd1",
				"org.odpd1.Manager", "Segments", NULL), 0);
	assert_string_equal(out, "t 1\n");

	assert_int_equal(odpd_detach(s), 0);
	odpd_disconnect(c);
	close(admin);
	daemon_stop(&d);
	unlink(conf);
	bus_stop();
}

static void test_flush_who_may(void **state)
{
	const char *args[] = { "--admin-group", "daemon", NULL };
	struct test_daemon d = { 0 };
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *mr;
	char out[1024], conf[128];

	(void)state;
	bus_start();
	daemon_start_conf(&d, conf, sizeof(conf), "bus", CONF, NULL, NULL);
	wait_for_name();
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	s = odpd_alloc(c, 64 * KIB, 0);
	assert_non_null(s);
	mr = odpd_reg(c, odpd_segment_addr(s), 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
	if (mr)                                          /* VM: something to flush */
		assert_int_equal(odpd_dereg_relaxed(mr), 0);
	/* root: flushed; the answer counts what went */
	assert_int_equal(busctl(0, out, sizeof(out), "call", "org.odpd1", "/org/odpd1", "org.odpd1.Manager",
				"Flush", NULL), 0);
	assert_string_equal(out, mr ? "ut 1 65536\n" : "ut 0 0\n");
	assert_int_equal(bus_counter("RelaxedPending"), 0);
	/* uid 65534: the policy file stops it at the bus */
	assert_int_not_equal(dbus_send_flush(65534, out, sizeof(out)), 0);
	if (!strstr(out, "AccessDenied") || !strstr(out, "Rejected send message"))
		fail_msg("uid 65534's Flush: %s", out);
	/* uid 1: the test policy lets it through, odpd refuses it itself */
	assert_int_not_equal(dbus_send_flush(1, out, sizeof(out)), 0);
	if (!strstr(out, "AccessDenied") || !strstr(out, "root and odpd's admin group only"))
		fail_msg("uid 1's Flush: %s", out);
	odpd_disconnect(c);
	daemon_stop(&d);
	unlink(conf);

	/* with --admin-group daemon, uid 1 (group daemon) may */
	daemon_start(&d, args);
	wait_for_name();
	assert_int_equal(busctl(1, out, sizeof(out), "call", "org.odpd1", "/org/odpd1", "org.odpd1.Manager",
				"Flush", NULL), 0);
	assert_string_equal(out, "ut 0 0\n");
	daemon_stop(&d);
	bus_stop();
}

static void test_bus_goes_away(void **state)
{
	struct test_daemon d = { 0 };
	struct odpd_conn *c;
	int admin;

	(void)state;
	bus_start();
	daemon_start(&d, NULL);
	wait_for_name();
	kill(bus_pid, SIGKILL);
	waitpid(bus_pid, NULL, 0);
	bus_pid = 0;
	/* odpd serves on: a client and an admin request */
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	assert_non_null(odpd_alloc(c, 64 * KIB, 0));
	admin = raw_connect_hello(d.sock);
	close(admin);
	odpd_disconnect(c);
	daemon_stop(&d);                                 /* exit status 0 */
	bus_stop();

	/* and without any bus at all */
	setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/odpd-test-bus", 1);
	daemon_start(&d, NULL);
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	odpd_disconnect(c);
	daemon_stop(&d);
	unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
}

static void test_bus_introspect(void **state)
{
	struct test_daemon d = { 0 };
	static char out[65536];
	const char *bin = getenv("ODPD_TEST_DAEMON");
	char cmd[512];
	size_t n = 0, k;
	FILE *p;

	(void)state;
	snprintf(cmd, sizeof(cmd), "%s --bus-introspect", bin);
	p = popen(cmd, "r");
	assert_non_null(p);
	while (n + 1 < sizeof(out) && (k = fread(out + n, 1, sizeof(out) - 1 - n, p)) > 0)
		n += k;
	out[n] = 0;
	assert_int_equal(pclose(p), 0);
	assert_non_null(strstr(out, "<interface name=\"org.odpd1.Manager\">"));
	assert_non_null(strstr(out, "<interface name=\"org.odpd1.Client\">"));
	assert_non_null(strstr(out, "<interface name=\"org.odpd1.Device\">"));
	assert_non_null(strstr(out, "<method name=\"Flush\">"));
	for (const char *const *q = (const char *const[]){ "Gets", "LocalHits", "CacheHits",
			"CacheMisses", "Registrations", "Deregistrations", "InvalidatedFlush",
			"InvalidatedEviction", "InvalidatedHole", "InvalidatedDevice", "InvalidatedExpired",
			"RegisteredBytes", "Registrations4K", "Registrations1M", "Registrations1G",
			"RegistrationsOver1G", NULL }; *q; q++) {
		char prop[96];

		snprintf(prop, sizeof(prop), "<property name=\"%s\" type=\"t\" access=\"read\">", *q);
		if (!strstr(out, prop))
			fail_msg("odpd --bus-introspect lists no %s", prop);
	}
	/* what the running daemon publishes says the same */
	bus_start();
	daemon_start(&d, NULL);
	wait_for_name();
	assert_int_equal(busctl(0, out, sizeof(out), "introspect", "--xml-interface", "org.odpd1",
				"/org/odpd1", NULL), 0);
	assert_non_null(strstr(out, "<interface name=\"org.odpd1.Manager\">"));
	assert_non_null(strstr(out, "<property name=\"PinnedBytes\" type=\"t\" access=\"read\">"));
	assert_non_null(strstr(out, "<property name=\"RegistrationsOver1G\" type=\"t\" access=\"read\">"));
	daemon_stop(&d);
	bus_stop();
}

/* odpctl ARGS... (NULL-terminated) as @uid: its exit status, output in @out. */
static int odpctl(uid_t uid, const char *sock, char *out, size_t cap, ...)
{
	const char *argv[16];
	va_list ap;
	int n = 0;

	argv[n++] = getenv("ODPD_TEST_ODPCTL");
	argv[n++] = "--socket";
	argv[n++] = sock;
	va_start(ap, cap);
	for (const char *a; n < 15 && (a = va_arg(ap, const char *)); )
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	assert_non_null(argv[0]);
	return run_tool(uid, out, cap, argv);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

/* "cache_hits" -> "CacheHits", "odp_mrs" -> "OdpMRs", "registrations_4k"
 * -> "Registrations4K" (the D-Bus names: a size's unit in capitals). */
static void camel(const char *key, char *out)
{
	char *start = out, *p;
	bool up = true, size = false;

	for (; *key; key++) {
		if (*key == '_') {
			up = true;
			continue;
		}
		if (up)
			size = *key >= '0' && *key <= '9';
		*out++ = (up || size) && *key >= 'a' && *key <= 'z' ? (char)(*key - 'a' + 'A') : *key;
		up = false;
	}
	*out = 0;
	p = strstr(start, "Mrs");             /* MR is written in capitals there */
	if (p)
		memcpy(p, "MRs", 3);
}

/*
 * odpctl: stats --json (every counter a string) equals the D-Bus
 * properties; stats --prometheus parses with the Prometheus client
 * library's parser and says the same; odpctl is not listed among the
 * clients, and counted as a monitor; clients --json; exit statuses:
 * 2 for usage, 4 for a non-admin, 3 with no daemon; reload.
 */
static void test_odpctl(void **state)
{
	static char out[65536];
	struct test_daemon d = { 0 };
	struct odpd_conn *c;
	json_object *root, *v;
	char conf[128], name[64], cmd[1024];
	struct odpd_segment *s1, *s2;
	struct odpd_mr *mr;
	int n = 0;

	(void)state;
	bus_start();
	daemon_start_conf(&d, conf, sizeof(conf), "odpctl", CONF, NULL, NULL);
	wait_for_name();
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	s1 = odpd_alloc(c, 64 * KIB, 0);
	assert_non_null(s1);

	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "stats", "--json", NULL), 0);
	root = json_tokener_parse(out);
	assert_non_null(root);
	json_object_object_foreach(root, key, val) {
		assert_true(json_object_is_type(val, json_type_string));
		camel(key, name);
		if (bus_counter(name) != strtoull(json_object_get_string(val), NULL, 10))
			fail_msg("%s: odpctl %s, D-Bus %s %llu", key, json_object_get_string(val), name,
				 (unsigned long long)bus_counter(name));
		n++;
	}
	assert_true(n >= 25);
	assert_true(json_object_object_get_ex(root, "clients", &v));
	assert_string_equal(json_object_get_string(v), "1");     /* c; not odpctl itself */
	json_object_put(root);

	/* Prometheus: the client library's own parser reads it */
	snprintf(cmd, sizeof(cmd), "%s --socket %s stats --prometheus | /usr/bin/python3 -c '"
		 "import sys\n"
		 "from prometheus_client.parser import text_string_to_metric_families as p\n"
		 "m = {s.name: s.value for f in p(sys.stdin.read()) for s in f.samples}\n"
		 "assert m[\"odpd_segments\"] == 1, m\n"
		 "assert m[\"odpd_segment_bytes\"] == 65536, m\n"
		 "assert \"odpd_registrations_total\" in m, m\n"
		 "assert m[\"odpd_gets_total\"] == 0, m\n"
		 "assert \"odpd_registrations_over_1g_total\" in m, m\n"
		 "assert m[\"odpd_registration_size_bytes_count\"] == m[\"odpd_registrations_total\"], m\n"
		 "print(len(m))'", getenv("ODPD_TEST_ODPCTL"), d.sock);
	{
		FILE *p = popen(cmd, "r");
		size_t k = fread(out, 1, sizeof(out) - 1, p);

		out[k] = 0;
		if (pclose(p) != 0)
			fail_msg("the Prometheus parser refused odpctl's output: %s", out);
		assert_true(atoi(out) >= 25);
	}

	/* clients: c only, its segment; status counts odpctl as a monitor */
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "clients", "--json", NULL), 0);
	root = json_tokener_parse(out);
	assert_non_null(root);
	assert_int_equal(json_object_array_length(root), 1);
	v = json_object_array_get_idx(root, 0);
	assert_string_equal(json_object_get_string(json_object_object_get(v, "segment_bytes")), "65536");
	json_object_put(root);
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "status", "--json", NULL), 0);
	root = json_tokener_parse(out);
	assert_non_null(root);
	assert_int_equal(json_object_array_length(json_object_object_get(root, "clients")), 1);
	assert_int_equal(json_object_get_int(json_object_object_get(json_object_object_get(root, "totals"),
								    "monitors")), 1);
	json_object_put(root);

	/* verify: every live MR read back by the HCA, the same CRC as the
	 * client's own odpd_verify (VM: a device) */
	mr = odpd_reg(c, odpd_segment_addr(s1), 64 * KIB, IBV_ACCESS_LOCAL_WRITE);
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "verify", "--json", NULL), 0);
	root = json_tokener_parse(out);
	assert_non_null(root);
	assert_int_equal(json_object_array_length(root), mr ? 1 : 0);
	if (mr) {
		uint32_t crc;
		char want[16];

		memset(odpd_segment_addr(s1), 0x3c, 64 * KIB);
		json_object_put(root);
		assert_int_equal(odpd_verify(mr, NULL, 0, &crc), 0);
		assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "verify", "--json", NULL), 0);
		root = json_tokener_parse(out);
		v = json_object_array_get_idx(root, 0);
		snprintf(want, sizeof(want), "%08x", crc);
		assert_string_equal(json_object_get_string(json_object_object_get(v, "crc32")), want);
		assert_true(json_object_get_boolean(json_object_object_get(v, "ok")));
		assert_int_equal(odpctl(65534, d.sock, out, sizeof(out), "verify", NULL), 4);
		assert_int_equal(odpd_dereg(mr), 0);
	}
	json_object_put(root);

	/* exit statuses */
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "frobnicate", NULL), 2);
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "status", "--prometheus", NULL), 2);
	assert_int_equal(odpctl(65534, d.sock, out, sizeof(out), "stats", NULL), 4);
	assert_non_null(strstr(out, "Operation not permitted"));
	assert_int_equal(odpctl(0, "/nonexistent/odpd.sock", out, sizeof(out), "status", NULL), 3);

	/* reload: the same file again; non-admins may not */
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "reload", NULL), 0);
	assert_non_null(strstr(out, "reloaded"));
	assert_int_equal(odpctl(65534, d.sock, out, sizeof(out), "reload", NULL), 4);
	/* SIGHUP applies a new limit to the connected client: one segment */
	write_file(conf, CONF "default-segments = 1\n");
	kill(d.pid, SIGHUP);
	for (int i = 0; i < 100 && (s2 = odpd_alloc(c, 64 * KIB, 0)); i++) {
		assert_int_equal(odpd_detach(s2), 0);         /* not yet reloaded */
		usleep(20000);
	}
	assert_null(odpd_alloc(c, 64 * KIB, 0));
	assert_int_equal(errno, EMFILE);
	/* a broken file: refused with file:line, the limit in use stays */
	write_file(conf, CONF "default-segments = lots\n");
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "reload", NULL), 1);
	if (!strstr(out, conf) || !strstr(out, ":3") || !strstr(out, "in use stays"))
		fail_msg("broken config: %s", out);
	assert_null(odpd_alloc(c, 64 * KIB, 0));
	/* back: the client (still connected) may attach again */
	write_file(conf, CONF);
	assert_int_equal(odpctl(0, d.sock, out, sizeof(out), "reload", NULL), 0);
	assert_non_null(s2 = odpd_alloc(c, 64 * KIB, 0));

	odpd_disconnect(c);
	daemon_stop(&d);
	unlink(conf);
	bus_stop();
}

/* busctl ARGS... as root: 0 if it succeeded; its output in @out. */
#define BUSCTL(out, ...) busctl(0, out, sizeof(out), __VA_ARGS__, NULL)

/* @path answers nothing: busctl says the object is unknown, or refuses the path. */
static void assert_no_object(const char *path, const char *iface)
{
	char out[1024];

	if (BUSCTL(out, "call", "org.odpd1", path, "org.freedesktop.DBus.Properties", "GetAll", "s",
		   iface) == 0)
		fail_msg("GetAll on %s answered: %s", path, out);
	if (!strstr(out, "Unknown object") && !strstr(out, "Invalid object path") &&
	    !strstr(out, "Invalid argument"))
		fail_msg("GetAll on %s: %s", path, out);
}

/*
 * What a hostile or careless D-Bus caller can send (issue 23, section 4):
 *  - one object, one name: a client's object answers only at the path the
 *    node enumerator lists (sd_bus_path_encode of its id), not at the
 *    other spellings that decode to the same id ("/org/odpd1/client/1" for
 *    ".../_31", a leading zero or blank, "+1", "-18446744073709551615"),
 *    which odpd used to answer as well; so for devices;
 *  - odd object paths: empty, non-numeric, overflowing and very long ids,
 *    deeper paths;
 *  - wrong signatures, unknown members and interfaces, Set of a
 *    read-only property;
 *  - many callers at once while clients come and go, each looked up as it
 *    disconnects;
 * each gets an error (or its answer), and odpd serves on and exits cleanly.
 */
static void test_bus_hostile_calls(void **state)
{
	static char tree[65536];
	struct test_daemon d = { 0 };
	struct odpd_conn *c;
	char out[4096], path[160], alias[256], longid[400];
	unsigned long long id;
	const char *p;

	(void)state;
	bus_start();
	daemon_start(&d, NULL);
	wait_for_name();
	c = odpd_connect(d.sock, NULL);
	assert_non_null(c);
	assert_int_equal(BUSCTL(tree, "tree", "org.odpd1"), 0);
	p = strstr(tree, "/org/odpd1/client/");
	assert_non_null(p);
	assert_int_equal(sscanf(p, "%159s", path), 1);
	/* the canonical name: its id's first digit escaped (_3N) */
	assert_int_equal(sscanf(path, "/org/odpd1/client/_3%1llu", &id), 1);
	{
		const char *digits = path + strlen("/org/odpd1/client/_3");
		char idtext[192];

		snprintf(idtext, sizeof(idtext), "%llu%s", id, digits + 1);
		assert_int_equal(BUSCTL(out, "get-property", "org.odpd1", path, "org.odpd1.Client", "Pid"), 0);
		/* the other spellings of the same id */
		const char *const spellings[] = {       /* before the id */
			"/org/odpd1/client/", "/org/odpd1/client/_30", "/org/odpd1/client/_20",
			"/org/odpd1/client/_2b", "/org/odpd1/client/_300",
		};
		for (size_t i = 0; i < sizeof(spellings) / sizeof(spellings[0]); i++) {
			snprintf(alias, sizeof(alias), "%s%s", spellings[i], idtext);
			assert_no_object(alias, "org.odpd1.Client");
		}
		if (strcmp(idtext, "1") == 0)           /* strtoull: 1 - 2^64 wraps to 1 */
			assert_no_object("/org/odpd1/client/_2d18446744073709551615", "org.odpd1.Client");
	}
	/* odd paths */
	memset(longid, '9', sizeof(longid) - 1);
	longid[sizeof(longid) - 1] = 0;
	snprintf(alias, sizeof(alias), "/org/odpd1/client/_3%.200s", longid);
	const char *const odd[] = {
		"/org/odpd1/client/", "/org/odpd1/client/abc", "/org/odpd1/client/_2d1",
		"/org/odpd1/client/_318446744073709551616", "/org/odpd1/client/_31/_32", alias,
		"/org/odpd1/client/_3", "/org/odpd1/device/", "/org/odpd1/device/nosuch",
		"/org/odpd1/device/_2e_2e", "/org/odpd1/nothing",
	};
	for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++)
		assert_no_object(odd[i], strstr(odd[i], "/device") ? "org.odpd1.Device" : "org.odpd1.Client");
	/* a device by another spelling of its name: the VM's rxe0 as rxe_30 */
	if (strstr(tree, "/org/odpd1/device/rxe0"))
		assert_no_object("/org/odpd1/device/rxe_30", "org.odpd1.Device");

	/* wrong signatures, unknown members and interfaces, a read-only property */
	assert_int_not_equal(BUSCTL(out, "call", "org.odpd1", "/org/odpd1", "org.odpd1.Manager", "Flush",
				    "s", "now"), 0);
	assert_int_not_equal(BUSCTL(out, "call", "org.odpd1", "/org/odpd1", "org.odpd1.Manager",
				    "Frobnicate"), 0);
	assert_int_not_equal(BUSCTL(out, "call", "org.odpd1", "/org/odpd1", "org.odpd1.Nothing", "Flush"), 0);
	assert_int_not_equal(BUSCTL(out, "call", "org.odpd1", "/org/odpd1", "org.freedesktop.DBus.Properties",
				    "Get", "s", "org.odpd1.Manager"), 0);
	assert_int_not_equal(BUSCTL(out, "call", "org.odpd1", "/org/odpd1", "org.freedesktop.DBus.Properties",
				    "Get", "ss", "org.odpd1.Manager", "NoSuchCounter"), 0);
	assert_int_not_equal(BUSCTL(out, "call", "org.odpd1", path, "org.freedesktop.DBus.Properties",
				    "Get", "ss", "org.odpd1.Client", "NoSuchCounter"), 0);
	assert_int_not_equal(BUSCTL(out, "set-property", "org.odpd1", "/org/odpd1", "org.odpd1.Manager",
				    "MRs", "t", "0"), 0);
	assert_int_not_equal(BUSCTL(out, "call", "org.odpd1", "/org/odpd1", "org.freedesktop.DBus.Properties",
				    "GetAll", "u", "7"), 0);

	/* many callers at once, while clients connect and go: each one's
	 * object looked up (GetAll) by several callers as it disconnects */
	{
		pid_t callers[16];

		for (unsigned i = 0; i < 16; i++) {
			callers[i] = fork();
			assert_true(callers[i] >= 0);
			if (callers[i] == 0) {
				char o[8192], t[8192], q[160];

				for (int k = 0; k < 15; k++) {
					char *x;

					/* (busctl's tree fails when a node it listed is
					 * gone by the time it introspects it) */
					if (busctl(0, t, sizeof(t), "tree", "org.odpd1", NULL) != 0 &&
					    !strstr(t, "Unknown object")) {
						fprintf(stderr, "busctl tree: %s\n", t);
						_exit(1);
					}
					for (x = strstr(t, "/org/odpd1/client/"); x;
					     x = strstr(x + 1, "/org/odpd1/client/")) {
						sscanf(x, "%159[A-Za-z0-9_/]", q);
						/* answered, or gone meanwhile: never a hang or a crash */
						if (busctl(0, o, sizeof(o), "call", "org.odpd1", q,
							   "org.freedesktop.DBus.Properties", "GetAll", "s",
							   "org.odpd1.Client", NULL) != 0 &&
						    !strstr(o, "Unknown object")) {
							fprintf(stderr, "GetAll on %s: %s\n", q, o);
							_exit(2);
						}
					}
				}
				_exit(0);
			}
		}
		for (unsigned k = 0; k < 40; k++) {
			struct odpd_conn *e = odpd_connect(d.sock, NULL);

			assert_non_null(e);
			assert_non_null(odpd_alloc(e, 64 * KIB, 0));
			usleep(k % 4 * 5000);
			odpd_disconnect(e);
		}
		for (unsigned i = 0; i < 16; i++) {
			int st;

			assert_int_equal(waitpid(callers[i], &st, 0), callers[i]);
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
				fail_msg("caller %u: status %#x", i, st);
		}
	}
	/* odpd serves on, on the bus and on its socket */
	assert_int_equal(BUSCTL(out, "get-property", "org.odpd1", path, "org.odpd1.Client", "Pid"), 0);
	assert_int_equal(bus_counter("Clients"), 1);
	odpd_disconnect(c);
	daemon_stop(&d);                                 /* exit status 0 */
	bus_stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_properties_equal_status),
		cmocka_unit_test(test_flush_who_may),
		cmocka_unit_test(test_bus_goes_away),
		cmocka_unit_test(test_bus_hostile_calls),
		cmocka_unit_test(test_bus_introspect),
		cmocka_unit_test(test_odpctl),
	};

	if (getenv("ODPD_TEST_FILTER"))
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
