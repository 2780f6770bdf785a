/* SPDX-License-Identifier: MIT */
/* cmd-admin.c - odpctl flush, verify and reload. */
#include "odpctl.h"

/* Flush: all without a filter, else pid and/or pd. A barrier: the reply
 * comes when every selected MR is deregistered, hence the long timeout. */
int cmd_flush(int sock, const struct options *o)
{
	Odpd__Flush body = ODPD__FLUSH__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;
	char b[HUMAN_LEN];

	body.has_all = !o->has_pid && !o->pd;
	body.all = body.has_all;
	body.has_pid = o->has_pid;
	body.pid = o->pid;
	body.pd = (char *)o->pd;
	req.has_id = true;
	req.id = 2;
	req.body_case = ODPD__REQUEST__BODY_FLUSH;
	req.flush = &body;

	if (set_reply_timeout(sock, FLUSH_TIMEOUT_SEC) < 0)
		return EXIT_FAILURE;
	rep = call(sock, &req, "flush", ODPD__REPLY__BODY_FLUSH);
	if (!rep)
		return EXIT_FAILURE;
	if (o->json) {
		json_object *root = json_obj();

		put_u64(root, "mrs", rep->flush->mrs);
		put_u64_str(root, "bytes", rep->flush->bytes);
		json_print(root);
	} else {
		printf("flushed %" PRIu32 " MRs, %s\n", rep->flush->mrs, human_bytes(rep->flush->bytes, b));
	}
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}

/*
 * Verify: every live (held) MR of a daemon PD that --pid/--pd select, read
 * back through the MR by the HCA (odpd's verify: RDMA READ, or WRITE from
 * the lkey for local-only MRs); prints each one's CRC-32, or why it could
 * not be read. Fails (status 1) if any could not.
 */
int cmd_verify(int sock, const struct options *o)
{
	struct table t = { .ncols = 6 };
	json_object *list = o->json ? json_object_new_array() : NULL;
	uint64_t after = 0, id = 10;
	bool more = true, first = true;
	unsigned failed = 0, done = 0;

	if (o->json && !list)
		oom();
	table_add(&t, "ID");
	table_add(&t, "IOVA");
	table_add(&t, "LENGTH");
	table_add(&t, "KIND");
	table_add(&t, "CRC32");
	table_add(&t, "HOW");
	if (set_reply_timeout(sock, FLUSH_TIMEOUT_SEC) < 0)
		goto fail;
	while (more) {
		Odpd__Reply *page = list_mrs(sock, o, ++id, first ? NULL : &after, "verify: list");

		if (!page)
			goto fail;
		for (size_t i = 0; i < page->mrs->n_mrs; i++) {
			const Odpd__MrInfo *m = page->mrs->mrs[i];
			Odpd__AdminVerify vb = ODPD__ADMIN_VERIFY__INIT;
			Odpd__Request vr = ODPD__REQUEST__INIT;
			Odpd__Reply *rep;
			char what[64], crc[16] = "-", how[160];

			after = m->id;
			if ((m->state != ODPD__MR_STATE__MR_STATE_LIVE && m->state != ODPD__MR_STATE__MR_STATE_KEPT) ||
			    m->kind == ODPD__MR_KIND__MR_IMPLICIT_ODP)
				continue;
			vb.has_mr_id = true;
			vb.mr_id = m->id;
			vr.has_id = true;
			vr.id = ++id;
			vr.body_case = ODPD__REQUEST__BODY_ADMIN_VERIFY;
			vr.admin_verify = &vb;
			snprintf(what, sizeof(what), "verify MR %" PRIu64, m->id);
			rep = call(sock, &vr, what, ODPD__REPLY__BODY_VERIFY);
			done++;
			if (rep) {
				snprintf(crc, sizeof(crc), "%08" PRIx32, rep->verify->crc32);
				snprintf(how, sizeof(how), "%s", rep->verify->method ? rep->verify->method : "");
			} else {
				failed++;
				if (fail_status == EXIT_DENIED || fail_status == EXIT_NOT_RUNNING) {
					odpd__reply__free_unpacked(page, NULL);
					goto fail;
				}
				snprintf(how, sizeof(how), "failed (see above)");
			}
			if (list) {
				json_object *e = json_obj();

				put_u64_str(e, "id", m->id);
				put_hex(e, "iova", m->iova);
				put_u64_str(e, "length", m->length);
				put_str(e, "kind", mr_kind_name(m->kind));
				put_str(e, "crc32", rep ? crc : "");
				put_str(e, "method", rep ? how : "");
				put_bool(e, "ok", rep != NULL);
				json_object_array_add(list, e);
			} else {
				char b1[48], b2[HUMAN_LEN];

				table_add(&t, "%" PRIu64, m->id);
				table_add(&t, "%s", iova_range(m->iova, m->length, b1));
				table_add(&t, "%s", human_bytes(m->length, b2));
				table_add(&t, "%s", mr_kind_name(m->kind));
				table_add(&t, "%s", crc);
				table_add(&t, "%s", how);
			}
			odpd__reply__free_unpacked(rep, NULL);
		}
		more = page->mrs->more;
		first = false;
		odpd__reply__free_unpacked(page, NULL);
	}
	if (list) {
		json_print(list);
		table_clear(&t);                 /* its header only */
	} else {
		table_print(&t, "Verified MRs");
	}
	if (!o->json)
		printf("%u MR(s) read back, %u failed\n", done - failed, failed);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
fail:
	table_clear(&t);
	json_object_put(list);                   /* NULL: nothing */
	return EXIT_FAILURE;
}

/* Reload: odpd reads its configuration file again. */
int cmd_reload(int sock, const struct options *o)
{
	Odpd__Reload body = ODPD__RELOAD__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	req.has_id = true;
	req.id = 2;
	req.body_case = ODPD__REQUEST__BODY_RELOAD;
	req.reload = &body;
	rep = call(sock, &req, "reload", ODPD__REPLY__BODY_RELOAD);
	if (!rep)
		return EXIT_FAILURE;
	if (o->json) {
		json_object *root = json_obj();

		put_str(root, "summary", rep->reload->summary);
		json_print(root);
	} else {
		printf("reloaded %s\n", rep->reload->summary ? rep->reload->summary : "");
	}
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}
