/* SPDX-License-Identifier: MIT */
/* cmd-clients.c - odpctl clients. */
#include "odpctl.h"

int cmd_clients(int sock, const struct options *o)
{
	Odpd__Reply *rep = status_call(sock);
	const Odpd__StatusReply *st;

	if (!rep)
		return EXIT_FAILURE;
	st = rep->status_reply;
	if (o->json) {
		json_object *list = json_object_new_array();

		if (!list)
			oom();
		for (size_t i = 0; i < st->n_clients; i++)
			json_object_array_add(list, json_client(st->clients[i]));
		json_print(list);
	} else {
		print_clients(st);
	}
	odpd__reply__free_unpacked(rep, NULL);
	return EXIT_SUCCESS;
}
