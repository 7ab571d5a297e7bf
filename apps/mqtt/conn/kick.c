/*
 * kick.c - asking a connection's task to end (a session take-over, a shutdown), and the one
 * wait that must hear it: a nap holding nothing but the connection (a CONNECT waiting for its
 * password's turn, login.c).
 *
 * A kick records its reason (the first one stays) and shuts the socket for reading, so a task
 * in a read, or about to read, sees the end of its input; a napping task reads nothing, so it
 * is woken. The napper says it naps (napping) before it looks for a kick, and the kicker
 * records the kick before it looks for a napper, both sequentially consistent: of two such
 * stores each followed by a load of the other's, at least one load sees the other store, so
 * either the napper sees the kick and does not sleep, or the kicker sees the napper and wakes
 * it, under the lock the napper holds from its look to its sleep. Rejected: a condition per
 * connection (the cost of one on every connection for a wait few ever make), and a signal
 * through the socket (a napper has finished reading, and a kick must not cost a take-over a
 * system call per napper).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <weft.h>

#include "conn_public.h"
#include "records.h"

/* Connections napping (conn_nap_until) wait on this one condition, and conn_kick wakes them only
 * when the connection it kicks naps: take-overs kick connections that read, and take no lock
 * here; a shutdown kicks every connection, and wakes the nappers with the first that naps. */
static weft_mutex nap_lock = WEFT_MUTEX_INIT;
static weft_cond nap_kicked = WEFT_COND_INIT;

void conn_kick(conn *c, int reason)
{
	int zero = 0;
	atomic_compare_exchange_strong(&c->kick_rc, &zero, reason);
	shutdown(c->fd, SHUT_RD); /* its read ends; writes still go out */
	/* kick_rc before napping here, napping before kick_rc in conn_nap_until (both sequentially
	 * consistent): one of the two sees the other's */
	if (atomic_load(&c->napping))
		WEFT_WITH_LOCK(&nap_lock)
			weft_cond_broadcast(&nap_kicked);
}

/* Wait until `until` (weft_now's clock), holding nothing of the broker but the connection,
 * unless it is kicked or its task cancelled: 0, or -1 when it is to end. */
int conn_nap_until(conn *c, int64_t until)
{
	int r = 0;
	atomic_store(&c->napping, true);
	WEFT_WITH_LOCK(&nap_lock)
		while (!atomic_load(&c->kick_rc) &&
		       (r = weft_cond_wait_until(&nap_kicked, &nap_lock, until)) == 0)
			;
	atomic_store(&c->napping, false);
	return atomic_load(&c->kick_rc) || r == -ECANCELED ? -1 : 0;
}

