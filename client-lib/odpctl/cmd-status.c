/* SPDX-License-Identifier: MIT */
/* cmd-status.c - odpctl status and odpctl mrs. */
#include "odpctl.h"

static int client_cmp(const void *a, const void *b)
{
	const Odpd__ClientInfo *x = *(Odpd__ClientInfo *const *)a, *y = *(Odpd__ClientInfo *const *)b;

	return x->id < y->id ? -1 : x->id > y->id;
}

/* Status, for the commands that show a part of it; its clients sorted by id. */
Odpd__Reply *status_call(int sock)
{
	Odpd__Status body = ODPD__STATUS__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;
	Odpd__Reply *rep;

	req.has_id = true;
	req.id = 2;
	req.body_case = ODPD__REQUEST__BODY_STATUS;
	req.status = &body;
	rep = call(sock, &req, "status", ODPD__REPLY__BODY_STATUS_REPLY);
	if (rep && rep->status_reply->n_clients > 1)
		qsort(rep->status_reply->clients, rep->status_reply->n_clients,
		      sizeof(rep->status_reply->clients[0]), client_cmp);
	return rep;
}

int cmd_status(int sock, const struct options *o)
{
	Odpd__Reply *rep = status_call(sock);

	if (!rep)
		return EXIT_FAILURE;
	if (o->json)
		print_json(rep->status_reply);
	else
		print_human(rep->status_reply);
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}

/* One page of ListMrs (the filters of @o) after @after (none: the first),
 * or NULL after printing why. */
Odpd__Reply *list_mrs(int sock, const struct options *o, uint64_t id, const uint64_t *after,
			     const char *what)
{
	Odpd__ListMrs body = ODPD__LIST_MRS__INIT;
	Odpd__Request req = ODPD__REQUEST__INIT;

	body.has_pid = o->has_pid;
	body.pid = o->pid;
	body.pd = (char *)o->pd;
	body.has_after = after != NULL;
	body.after = after ? *after : 0;
	req.has_id = true;
	req.id = id;
	req.body_case = ODPD__REQUEST__BODY_LIST_MRS;
	req.list_mrs = &body;
	return call(sock, &req, what, ODPD__REPLY__BODY_MRS);
}

/*
 * Ask for the page of MRs after @after (none: the first page) and add its
 * MRs to @t or, with --json, to @list. Returns the reply (the caller frees
 * it), or NULL after printing why.
 */
static Odpd__Reply *mrs_page(int sock, const struct options *o, uint64_t id, const uint64_t *after,
			     struct table *t, json_object *list)
{
	Odpd__Reply *rep = list_mrs(sock, o, id, after, "mrs");

	if (!rep)
		return NULL;
	for (size_t i = 0; i < rep->mrs->n_mrs; i++) {
		if (list)
			json_object_array_add(list, json_mr(rep->mrs->mrs[i]));
		else
			mrs_row(t, rep->mrs->mrs[i]);
	}
	return rep;
}

/* ListMrs page by page (after = the last id while more), then one table or
 * one JSON object {"mrs": [...]}. */
int cmd_mrs(int sock, const struct options *o)
{
	struct table t = { .ncols = MRS_COLS };
	json_object *list = NULL;
	uint64_t id = 2, after = 0;
	bool have_after = false, more = true;

	if (o->json) {
		list = json_object_new_array();
		if (!list)
			oom();
	} else {
		mrs_header(&t);
	}
	while (more) {
		Odpd__Reply *rep = mrs_page(sock, o, id++, have_after ? &after : NULL, &t, list);
		const Odpd__MrsReply *m;

		if (!rep)
			goto fail;
		m = rep->mrs;
		more = m->more;
		/* A page that does not move the cursor would be asked for forever. */
		if (more && (m->n_mrs == 0 || (have_after && m->mrs[m->n_mrs - 1]->id <= after))) {
			fail("mrs", EBADMSG, "odpd announces more MRs but its page does not "
			     "go past id %" PRIu64, after);
			odpd__reply__free_unpacked(rep, NULL);
			goto fail;
		}
		if (more) {
			after = m->mrs[m->n_mrs - 1]->id;
			have_after = true;
		}
		odpd__reply__free_unpacked(rep, NULL);
	}

	if (list) {
		json_object *root = json_obj();

		json_object_object_add(root, "mrs", list);
		json_print(root);
	} else {
		table_print(&t, "MRs");
	}
	return EXIT_SUCCESS;

fail:
	json_object_put(list);
	table_clear(&t);
	return EXIT_FAILURE;
}
