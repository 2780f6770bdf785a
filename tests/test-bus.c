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
 *   - the bus lost while a Flush() waits for a verify, or before odpd
 *     has even checked its caller (VM);
 *   - odpd --bus-introspect prints the interfaces busctl sees.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/sockios.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include <json.h>
#include <zlib.h>

#include "harness.h"
#include "odpd.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)

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

/* A bus, an odpd on it (configuration CONF, written to @conf) and a
 * client of it with a segment of @len bytes. */
static void start_with_client(struct test_daemon *d, char *conf, size_t cap, struct odpd_conn **c,
			      struct odpd_segment **s, size_t len)
{
	bus_start();
	daemon_start_conf(d, conf, cap, "bus", CONF, NULL, NULL);
	wait_for_name();
	*c = odpd_connect(d->sock, NULL);
	assert_non_null(*c);
	*s = odpd_alloc(*c, len, 0);
	assert_non_null(*s);
}

/* A release libodpd wrote into its ring, with no request since: a D-Bus
 * read of the counters finds it done, as odpctl status does (1.4.6; before,
 * the MR counted until the connection's next request or the hit timer,
 * here 10 minutes away). */
static void test_properties_take_rings(void **state)
{
	struct test_daemon d = { 0 };
	char conf[128];
	struct odpd_conn *c;
	struct odpd_segment *s;
	struct odpd_mr *mr;

	(void)state;
	start_with_client(&d, conf, sizeof(conf), &c, &s, 64 * KIB);
	memset(odpd_segment_addr(s), 1, 64 * KIB);
	mr = odpd_reg(c, odpd_segment_addr(s), 4 * KIB, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {                                      /* the host: no device, no ring to take */
		assert_int_equal(errno, ENODEV);
		odpd_disconnect(c);
		daemon_stop(&d);
		unlink(conf);
		bus_stop();
		skip();
	}
	assert_int_equal(bus_counter("MRs"), 1);
	assert_int_equal(bus_counter("PinnedBytes"), 4 * KIB);
	assert_int_equal(bus_counter("RingReleases"), 0);
	assert_int_equal(odpd_dereg(mr), 0);            /* into the ring: no request */
	assert_int_equal(bus_counter("MRs"), 0);
	assert_int_equal(bus_counter("PinnedBytes"), 0);
	assert_int_equal(bus_counter("RingReleases"), 1);
	assert_int_equal(bus_counter("Deregistrations"), 1);
	assert_int_equal(odpd_detach(s), 0);
	odpd_disconnect(c);
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
	start_with_client(&d, conf, sizeof(conf), &c, &s, 64 * KIB);
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

/* ---------------------------------------------------------------- the bus lost mid-Flush */

/*
 * A verify of this many bytes reads them through the PD's 1 MiB bounce
 * buffer: seconds under the VM's TCG, the window in which the test's
 * Flush() waits for it. Measured: the flush is in the registry after 1-2 s,
 * the second caller refused by 3.5 s, the verify's reply at 9-12 s (15 s
 * with the sanitizers).
 */
#define LOST_MR_BYTES (256 * MIB)

/* busctl call ... Flush as root, in the background (the bus's timeout well
 * beyond the verify): its pid, its stdout and stderr on *@ret_fd. */
static pid_t flush_bg(int *ret_fd)
{
	char addr[192];
	int pfd[2];
	pid_t pid;

	snprintf(addr, sizeof(addr), "--address=%s", bus_addr);
	assert_int_equal(pipe(pfd), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(pfd[1], 1);
		dup2(pfd[1], 2);
		close(pfd[0]);
		execlp("busctl", "busctl", addr, "--no-pager", "--timeout=600", "call", "org.odpd1",
		       "/org/odpd1", "org.odpd1.Manager", "Flush", (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	*ret_fd = pfd[0];
	return pid;
}

/* Has the busctl of flush_bg ended? (Not waited for.) */
static bool flush_bg_ended(pid_t pid)
{
	siginfo_t si = { 0 };

	assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT), 0);
	return si.si_pid == pid;
}

/* Wait for it: its exit status, its output in @out. */
static int flush_bg_end(pid_t pid, int fd, char *out, size_t cap)
{
	size_t len = 0;
	ssize_t k;
	int st;

	while (len + 1 < cap && (k = read(fd, out + len, cap - 1 - len)) > 0)
		len += (size_t)k;
	out[len] = 0;
	close(fd);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Bytes waiting to be read on @pid's sockets: each of its socket fds,
 * duplicated here (pidfd_getfd, root), asked with SIOCINQ. (ss could tell
 * too, but the VM's kernel has no unix_diag.) */
static long unix_recvq(pid_t pid)
{
	char dir[64], path[320], link[64];
	long total = 0;
	struct dirent *e;
	int pidfd;
	DIR *dp;

	pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	assert_true(pidfd >= 0);
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	dp = opendir(dir);
	assert_non_null(dp);
	while ((e = readdir(dp))) {
		ssize_t n;
		int fd, q;

		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		n = readlink(path, link, sizeof(link) - 1);
		if (n <= 0)
			continue;
		link[n] = 0;
		if (strncmp(link, "socket:", 7) != 0)
			continue;
		fd = (int)syscall(SYS_pidfd_getfd, pidfd, atoi(e->d_name), 0);
		if (fd < 0)
			continue;                    /* closed meanwhile */
		if (ioctl(fd, SIOCINQ, &q) == 0 && q > 0)   /* (a listening socket: EINVAL) */
			total += q;
		close(fd);
	}
	closedir(dp);
	close(pidfd);
	return total;
}

struct recvq_want {
	pid_t pid;
	bool nonempty;
};

static bool recvq_is(void *arg)
{
	const struct recvq_want *w = arg;

	return (unix_recvq(w->pid) > 0) == w->nonempty;
}

struct fds_want {
	pid_t pid;
	int n;
};

static bool fds_are(void *arg)
{
	const struct fds_want *w = arg;

	return fd_count(w->pid) == w->n;
}

/* Fail if odpd @d exited (or was killed), saying how. */
static void daemon_alive(struct test_daemon *d)
{
	int st;

	if (waitpid(d->pid, &st, WNOHANG) != d->pid)
		return;
	d->pid = 0;
	fail_msg("odpd died: %s %d", WIFSIGNALED(st) ? "signal" : "exit status",
		 WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* A device to register on (the VM)? Without one (the host) the caller
 * skips, unless the VM tier requires one. */
static bool have_device(int admin)
{
	Odpd__Reply *r;
	Odpd__StatusReply *sr = status_get(admin, &r);
	bool dev = sr->n_devices > 0;

	odpd__reply__free_unpacked(r, NULL);
	if (!dev && test_require_device())
		fail_msg("no RDMA device");
	return dev;
}

static Odpd__StatusReply *status_now(int admin, Odpd__Reply **r)
{
	Odpd__StatusReply *sr = status_get(admin, r);

	assert_non_null(sr->cache);
	return sr;
}

static uint64_t reg_raw(int conn, uint64_t id, uint64_t addr, uint64_t len, uint32_t *ret_slot,
			uint64_t *ret_ticket)
{
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__RegMr rm = ODPD__REG_MR__INIT;
	Odpd__Reply *r;
	uint64_t handle;

	rm.has_addr = rm.has_length = rm.has_access = 1;
	rm.addr = addr;
	rm.length = len;
	rm.access = ODPD__ACCESS__ACCESS_LOCAL_WRITE;
	req.body_case = ODPD__REQUEST__BODY_REG_MR;
	req.reg_mr = &rm;
	r = raw_call(conn, id, &req, NULL, 0);
	if (r->status != 0)
		fail_msg("RegMr: %s: %s", strerror(r->status), r->message ? r->message : "");
	handle = r->mr->handle;
	if (ret_slot)
		*ret_slot = r->mr->has_slot ? r->mr->slot : 0;
	if (ret_ticket)
		*ret_ticket = r->mr->has_ticket ? r->mr->ticket : 0;
	odpd__reply__free_unpacked(r, NULL);
	return handle;
}

/*
 * The bus lost while a Flush() waits (issue 23, section 4): a Flush() is
 * answered only once what it invalidated is deregistered, and an MR a
 * verify reads through is deregistered only after that verify. So: a
 * client verifies a large MR (seconds under TCG) that its hit table says
 * it keeps unused; root calls Flush() over the bus, which takes the
 * reference back (the relaxed window, thus the hit timer's look, is 600 s:
 * only the flush revokes) and invalidates the MR, and waits. The flush is
 * known to be in the registry (the hit table's revocation shows) and still
 * waiting (no verify reply yet, the MR still in the kernel, busctl not
 * answered) when dbus-daemon is SIGKILLed; a verify that ended first fails
 * the test as having tested nothing. Then:
 *  - a new dbus-daemon at the same address: odpd does not come back on it
 *    (it gives a lost bus up until it restarts, odpd(8)); a second Flush()
 *    caller there, while the first flush still waits, is told the name has
 *    no owner;
 *  - the first caller gets an error from its own bus library, no answer;
 *  - odpd runs on; the verify reads every byte right; the MR leaves the
 *    kernel once the flush is done (its answer is dropped: nobody to send
 *    it to);
 *  - clients are served: a new registration, and odpd_flush_relaxed();
 *  - odpd exits 0 (under the sanitizers: no leak, e.g. of the call's
 *    state, which bus_drop keeps for the registry's answer).
 */
static void test_bus_lost_mid_flush(void **state)
{
	const uint64_t len = LOST_MR_BYTES;
	struct test_daemon d = { 0 };
	Odpd__Verify v = ODPD__VERIFY__INIT;
	Odpd__StatusReply *sr;
	Odpd__Reply *r;
	struct pollfd pfd;
	struct timespec t0;
	struct kernel_want kw;
	_Atomic uint64_t *use;
	const _Atomic uint64_t *gen;
	char conf[128], out[4096];
	int admin, conn, use_fd, gen_fd = -1, seg_fd, flush_fd, rc;
	uint64_t base, handle, ticket;
	uint32_t slot, crc;
	double pending_at, killed_at, second_at, replied_at;
	pid_t flusher;
	uint8_t *p;

	(void)state;
	bus_start();
	daemon_start_conf(&d, conf, sizeof(conf), "buslost", CONF, NULL, NULL);
	wait_for_name();
	admin = raw_connect_hello(d.sock);
	if (!have_device(admin)) {
		close(admin);
		daemon_stop(&d);
		unlink(conf);
		bus_stop();
		skip();
	}
	conn = raw_connect_hello(d.sock);
	/* the hit table: the client's use words, the daemon's generations */
	raw_open_hit_table(conn, 2, 64, &use_fd, &use, &gen_fd, &gen);

	/* one large MR over known bytes */
	seg_fd = sealed_memfd(len);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
	assert_true(p != MAP_FAILED);
	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)(i * 7 + (i >> 12));
	crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, (uInt)len);
	base = raw_attach(conn, 3, seg_fd);
	handle = reg_raw(conn, 4, base, len, &slot, &ticket);
	assert_true(slot > 0 && ticket > 0);
	kw = (struct kernel_want){ d.pid, 2 };
	assert_int_equal(kernel_mr_count(d.pid), 1);

	/* the verify, on a worker once its PD's bounce buffer is registered */
	v.has_handle = 1;
	v.handle = handle;
	raw_verify_begin(conn, 5, &v, &kw, &t0);
	/* kept unused by the client's library, as it were: a flush takes it back */
	atomic_store(&use[slot], ticket + 1);

	/* Flush() over the bus: in the registry once the reference is revoked */
	flusher = flush_bg(&flush_fd);
	if (!wait_until(hit_revoked, (void *)gen))
		fail_msg("Flush() did not take the unused reference back");
	sr = status_now(admin, &r);
	assert_int_equal(sr->cache->revoked, 1);
	assert_int_equal(sr->cache->relaxed_pending, 0);  /* invalidated by the flush */
	odpd__reply__free_unpacked(r, NULL);
	/* and still waiting: the verify has not replied (the flush answers after
	 * it), the MR is registered, the caller has no answer */
	pending_at = secs_since(&t0);
	pfd = (struct pollfd){ .fd = conn, .events = POLLIN };
	if (poll(&pfd, 1, 0) != 0 || flush_bg_ended(flusher) || kernel_mr_count(d.pid) != 2)
		fail_msg("the verify (or the flush) ended before the bus was killed (%.3f s): nothing was "
			 "tested; make LOST_MR_BYTES larger", pending_at);

	kill(bus_pid, SIGKILL);
	waitpid(bus_pid, NULL, 0);
	bus_pid = 0;
	killed_at = secs_since(&t0);

	/* a new bus at the same address; a second Flush() caller there, while
	 * the first flush still waits: odpd is not on it */
	bus_restart();
	rc = busctl(0, out, sizeof(out), "call", "org.odpd1", "/org/odpd1", "org.odpd1.Manager", "Flush",
		    NULL);
	second_at = secs_since(&t0);
	if (rc == 0 || !strstr(out, "The name org.odpd1 was not provided"))
		fail_msg("a Flush() on the new bus: status %d: %s", rc, out);
	pfd = (struct pollfd){ .fd = conn, .events = POLLIN };
	if (poll(&pfd, 1, 0) != 0)
		fail_msg("the verify ended (before %.3f s) before the second Flush() caller was "
			 "refused: make LOST_MR_BYTES larger", second_at);

	/* the first caller: no answer, an error from its bus library */
	rc = flush_bg_end(flusher, flush_fd, out, sizeof(out));
	if (rc == 0 || strstr(out, "ut "))
		fail_msg("busctl's Flush() across the lost bus: status %d: %s", rc, out);

	/* the verify: every byte right */
	pfd = (struct pollfd){ .fd = conn, .events = POLLIN };
	for (int i = 0; i < 300 && poll(&pfd, 1, 1000) == 0; i++)
		;
	replied_at = secs_since(&t0);
	daemon_alive(&d);
	r = raw_recv(conn);
	assert_int_equal(r->id, 5);
	if (r->status != 0)
		fail_msg("verify: %s: %s", strerror(r->status), r->message ? r->message : "");
	assert_int_equal(r->body_case, ODPD__REPLY__BODY_VERIFY);
	assert_int_equal(r->verify->length, len);
	assert_int_equal(r->verify->crc32, crc);
	odpd__reply__free_unpacked(r, NULL);
	fprintf(stderr, "bus_lost_mid_flush: %llu MiB; flush pending at %.3f s, bus killed at %.3f s, "
		"second caller refused at %.3f s, verify replied at %.3f s\n",
		(unsigned long long)(len / MIB), pending_at, killed_at, second_at, replied_at);

	/* then the flush finishes: the MR leaves the kernel (the bounce buffer stays) */
	kw.mrs = 1;
	if (!wait_until(kernel_holds, &kw)) {
		daemon_alive(&d);
		fail_msg("after the verify odpd holds %d MRs in the kernel (want 1: the bounce buffer)",
			 kernel_mr_count(d.pid));
	}
	daemon_alive(&d);
	sr = status_now(admin, &r);
	assert_int_equal(sr->mrs, 0);
	assert_int_equal(sr->cache->relaxed_pending, 0);
	odpd__reply__free_unpacked(r, NULL);

	/* clients are served: a registration, a relaxed release, a flush */
	{
		struct odpd_conn *c = odpd_connect(d.sock, NULL);
		struct odpd_segment *seg;
		struct odpd_mr *mr;

		assert_non_null(c);
		seg = odpd_alloc(c, MIB, 0);
		assert_non_null(seg);
		mr = odpd_reg(c, odpd_segment_addr(seg), MIB, IBV_ACCESS_LOCAL_WRITE);
		if (!mr)
			fail_msg("odpd_reg after the bus was lost: %s: %s", strerror(errno), odpd_errmsg());
		assert_int_equal(kernel_mr_count(d.pid), 2);
		assert_int_equal(odpd_dereg_relaxed(mr), 0);
		assert_int_equal(odpd_flush_relaxed(c), 0);
		assert_int_equal(kernel_mr_count(d.pid), 1);      /* gone once flushed */
		assert_int_equal(odpd_detach(seg), 0);
		odpd_disconnect(c);
	}

	/* odpd never came back on the new bus (it has had seconds to) */
	assert_int_equal(busctl(0, out, sizeof(out), "call", "org.freedesktop.DBus", "/org/freedesktop/DBus",
				"org.freedesktop.DBus", "NameHasOwner", "s", "org.odpd1", NULL), 0);
	assert_string_equal(out, "b false\n");

	munmap(p, len);
	munmap(use, 4096);
	munmap((void *)gen, 4096);
	close(seg_fd);
	close(use_fd);
	close(gen_fd);
	close(conn);
	wait_idle(admin);
	close(admin);
	daemon_stop(&d);                                 /* exit status 0: no sanitizer report */
	unlink(conf);
	bus_stop();
}

/*
 * The bus lost before a Flush() reaches the registry, at each of its steps
 * (the processes stopped and continued so that each message waits unread,
 * as seen in the sockets' queues):
 *  0. the call waits in odpd's socket when the bus dies: odpd reads it,
 *     then cannot ask the bus who is calling;
 *  1. odpd asked the bus who is calling (GetConnectionCredentials waits in
 *     the stopped dbus-daemon's socket) when the bus dies: that question
 *     ends unanswered;
 *  2. the bus's answer (root) waits in odpd's socket when the bus dies:
 *     odpd flushes (nothing: the flush is over at once, within the bus's
 *     own callback) and its answer goes nowhere.
 * In 0 and 1 nothing is flushed (the relaxed MR stays queued: the caller was
 * never checked). Each time odpd gives the connection up (one fd fewer),
 * serves on, and exits 0.
 */
static void test_bus_lost_before_flush(void **state)
{
	struct test_daemon d = { 0 };
	Odpd__StatusReply *sr;
	Odpd__Reply *r;
	struct recvq_want rq;
	struct fds_want fw;
	char conf[128], out[4096];
	int admin, conn, seg_fd, flush_fd;
	pid_t flusher;
	bool relaxed;

	(void)state;
	bus_start();
	for (int step = 0; step < 3; step++) {
		if (step)
			bus_restart();
		daemon_start_conf(&d, conf, sizeof(conf), "buslost", CONF, NULL, NULL);
		wait_for_name();
		admin = raw_connect_hello(d.sock);
		/* a relaxed MR in odpd's queue (a raw client keeps none itself);
		 * none on the host (no device) nor in step 2 */
		relaxed = have_device(admin) && step < 2;
		conn = raw_connect_hello(d.sock);
		seg_fd = sealed_memfd(MIB);
		if (relaxed) {
			Odpd__Request req = ODPD__REQUEST__INIT;
			Odpd__DeregMr dm = ODPD__DEREG_MR__INIT;

			dm.has_handle = dm.has_relaxed = 1;
			dm.handle = reg_raw(conn, 2, raw_attach(conn, 1, seg_fd), MIB, NULL, NULL);
			dm.relaxed = 1;
			req.body_case = ODPD__REQUEST__BODY_DEREG_MR;
			req.dereg_mr = &dm;
			r = raw_call(conn, 3, &req, NULL, 0);
			assert_int_equal(r->status, 0);
			odpd__reply__free_unpacked(r, NULL);
		}
		sr = status_now(admin, &r);
		assert_int_equal(sr->cache->relaxed_pending, relaxed);
		odpd__reply__free_unpacked(r, NULL);
		fw = (struct fds_want){ d.pid, fd_count(d.pid) - 1 };   /* without the bus */

		/* the Flush() call, unread in the stopped odpd's socket */
		assert_int_equal(unix_recvq(d.pid), 0);
		kill(d.pid, SIGSTOP);
		flusher = flush_bg(&flush_fd);
		rq = (struct recvq_want){ d.pid, true };
		if (!wait_until(recvq_is, &rq))
			fail_msg("step %d: the Flush() call never reached odpd's socket", step);
		if (step >= 1) {
			/* odpd reads it and asks the stopped bus who is calling */
			kill(bus_pid, SIGSTOP);
			kill(d.pid, SIGCONT);
			rq = (struct recvq_want){ d.pid, false };
			if (!wait_until(recvq_is, &rq))
				fail_msg("step %d: odpd did not read the Flush() call", step);
			rq = (struct recvq_want){ bus_pid, true };
			if (!wait_until(recvq_is, &rq))
				fail_msg("step %d: odpd did not ask the bus who called Flush()", step);
		}
		if (step == 2) {
			/* the bus answers the stopped odpd */
			kill(d.pid, SIGSTOP);
			kill(bus_pid, SIGCONT);
			rq = (struct recvq_want){ d.pid, true };
			if (!wait_until(recvq_is, &rq))
				fail_msg("step 2: the bus did not answer odpd who called Flush()");
		}
		kill(bus_pid, SIGKILL);
		waitpid(bus_pid, NULL, 0);
		bus_pid = 0;
		if (step != 1)
			kill(d.pid, SIGCONT);
		if (flush_bg_end(flusher, flush_fd, out, sizeof(out)) == 0)
			fail_msg("step %d: busctl's Flush() across the lost bus succeeded: %s", step, out);
		daemon_alive(&d);
		if (!wait_until(fds_are, &fw))
			fail_msg("step %d: odpd kept its connection to the lost bus: %d fds (want %d)", step,
				 fd_count(d.pid), fw.n);
		/* nothing flushed; odpd serves on */
		sr = status_now(admin, &r);
		assert_int_equal(sr->cache->relaxed_pending, relaxed);
		odpd__reply__free_unpacked(r, NULL);
		{
			struct odpd_conn *c = odpd_connect(d.sock, NULL);

			assert_non_null(c);
			assert_int_equal(odpd_flush_relaxed(c), 0);   /* its own: none */
			odpd_disconnect(c);
		}
		close(conn);
		close(seg_fd);
		wait_idle(admin);
		close(admin);
		daemon_stop(&d);                         /* exit status 0 */
		unlink(conf);
	}
	bus_stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_properties_equal_status),
		cmocka_unit_test(test_properties_take_rings),
		cmocka_unit_test(test_flush_who_may),
		cmocka_unit_test(test_bus_goes_away),
		cmocka_unit_test(test_bus_lost_mid_flush),
		cmocka_unit_test(test_bus_lost_before_flush),
		cmocka_unit_test(test_bus_hostile_calls),
		cmocka_unit_test(test_bus_introspect),
		cmocka_unit_test(test_odpctl),
	};

	if (getenv("ODPD_TEST_FILTER"))
		cmocka_set_test_filter(getenv("ODPD_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
