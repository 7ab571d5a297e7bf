/*
 * select.c - weft_select: wait on several channel operations, fds and task exits at once.
 *
 * Channels follow Go's selectgo. Lock every channel of the cases in address order (each once),
 * pick uniformly at random among the cases possible right now (reservoir sampling) and do it.
 * If none is, queue one node per case, all pointing to the one wait record, unlock and park.
 * The first waker to claim the record wins; the others fail to claim and drop their nodes. On
 * waking, the select unlinks its nodes still queued (taking each such channel's lock alone).
 * A select cannot pair its own send with its own receive: its nodes are queued only while it
 * is parked, and a parked select wakes nobody.
 *
 * FD and JOIN cases publish the same wait record in two more places, each the one its own
 * blocking call uses, so there is no second kind of waiter:
 *  - an FD case links a node into the fd's list of observers, as poll(2) under the shim does
 *    (poll.c, poll_fds), and then asks the kernel what is ready: readiness from before the link
 *    is in that answer, and an edge after it claims the record. Rejected: the fd's reader and
 *    writer slots (poll_wait), which take the edge a reader of the fd is owed, allow one waiter
 *    per direction, and would make "is fd readable" depend on who else reads it;
 *  - a JOIN case holds the task's joiner slot (task.c, "Joiners") from the start of the select
 *    to its end: the exit wakes whatever wait is parked there, and while the slot is held
 *    nobody else joins or frees the task, so the select may look at it after waking. Rejected:
 *    letting the exit join the task for the select, which would consume a join the select
 *    may then not report (another case, or the deadline, won the record).
 * Neither of these wakers does the case: an fd edge or an exit only ends the park, and the
 * select looks again (the kernel for fds, `done` for tasks, the channels under their locks)
 * and picks among what is ready then. So a wake-up that loses to a channel or a deadline
 * changes nothing: the task stays joinable, the fd unread. Only channel wakers complete their
 * case, and they say which node won. The record is armed before anything is looked at, and
 * each publication comes before its look (fds, tasks) or under the lock of its look
 * (channels), so a readiness is either seen by the look or claims the record: no lost wake-up.
 * Whatever the outcome, the select unpublishes every node and gives back every joiner slot
 * before it returns. A select of channel cases only arms nothing before its look
 * (select_chans): Go's select exactly.
 *
 * Invariant: a task (or thread) has one wait record, and wait_begin re-arms that same record,
 * which is what the joiner slots hold; so while a select holds joiner slots it waits on
 * nothing else, or an exit's wake-up would end that other wait instead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>

#include "chan.h"
#include "poll.h"
#include "sched.h"
#include "sched_state.h"
#include "task.h"
#include "wait.h"
#include "weft.h"

static __thread uint32_t sel_rng;

static uint32_t sel_random(void)
{
	uint32_t x = sel_rng;
	if (!x)
		x = (uint32_t)(uintptr_t)&x ^ (uint32_t)weft_now() ^ 0x9e3779b9u;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return sel_rng = x ? x : 1;
}

static bool is_chan(int op)
{
	return op == WEFT_SELECT_SEND || op == WEFT_SELECT_RECV;
}

/* The distinct channels of the cases, in address order: the order they are locked in. */
static int lock_order(const weft_select_case *k, int n, weft_chan **order)
{
	int m = 0;
	for (int i = 0; i < n; i++) {
		weft_chan *c = is_chan(k[i].op) ? k[i].chan : NULL;
		if (!c)
			continue;
		int j = m;
		while (j > 0 && order[j - 1] > c)
			j--;
		if (j > 0 && order[j - 1] == c)
			continue;
		memmove(&order[j + 1], &order[j], (size_t)(m - j) * sizeof *order);
		order[j] = c;
		m++;
	}
	return m;
}

static void lock_all(weft_chan **order, int m)
{
	for (int i = 0; i < m; i++)
		chan_select_lock(order[i]);
}

static void unlock_all(weft_chan **order, int m)
{
	for (int i = m - 1; i >= 0; i--)
		chan_select_unlock(order[i]);
}

static int check_cases(const weft_select_case *k, int n)
{
	if (n < 0 || n > WEFT_SELECT_MAX || (n && !k))
		return -EINVAL;
	for (int i = 0; i < n; i++) {
		if (k[i].op == WEFT_SELECT_FD) {
			if (!(k[i].events & (EPOLLIN | EPOLLOUT)) ||
			    (k[i].events & ~(uint32_t)(EPOLLIN | EPOLLOUT)))
				return -EINVAL;
			continue;
		}
		if (k[i].op == WEFT_SELECT_JOIN)
			continue;
		if (!is_chan(k[i].op))
			return -EINVAL;
		if (!k[i].buf && k[i].len)
			return -EINVAL;
		if (k[i].chan && k[i].op == WEFT_SELECT_SEND && k[i].len > chan_packet_size(k[i].chan))
			return -EMSGSIZE;
	}
	return 0;
}

/* Could case k be done right now? (All its channels are locked.) */
static bool case_ready(const weft_select_case *k)
{
	return chan_ready(k->chan, k->op == WEFT_SELECT_SEND);
}

/* Try case k; 1 when it was done (result stored), 0 when it must wait after all. */
static int case_try(weft_select_case *k, struct waiter **wk)
{
	int r = chan_try(k->chan, k->op == WEFT_SELECT_SEND, k->buf, k->len, wk);
	if (r == -EAGAIN)
		return 0;
	k->result = r;
	return 1;
}

/* One ready case chosen uniformly at random, or -1. ready: which FD and JOIN cases are (NULL:
 * none is looked at). */
static int pick_ready(const weft_select_case *k, int n, const bool *ready)
{
	int pick = -1;
	uint32_t seen = 0;
	for (int i = 0; i < n; i++)
		if ((is_chan(k[i].op) ? k[i].chan && case_ready(&k[i]) : ready && ready[i]) &&
		    sel_random() % ++seen == 0)
			pick = i;
	return pick;
}

/* With every channel locked: pick a ready case and, for a channel, do it. Its index, or -1
 * when none is ready. *wk: as chan_try's. */
static int do_ready(weft_select_case *k, int n, const bool *ready, struct waiter **wk)
{
	int i;
	while ((i = pick_ready(k, n, ready)) >= 0)
		if (!is_chan(k[i].op) || case_try(&k[i], wk))
			return i;
	return -1;
}

/* A channel case done without waiting. */
static int chan_done(weft_select_case *k, int i, struct waiter *wk)
{
	if (wk)
		chan_wake(k[i].chan, wk, 0);
	if (k[i].result == -ENOMEM)
		return -ENOMEM;
	sched_slice(); /* as a send or receive that did not wait */
	return i;
}

/* A node per case, all on w; those of channel cases for their channels (chan_park queues
 * them). */
static void fill_nodes(weft_select_case *k, int n, struct waiter *nodes, struct wait *w,
		       struct waiter **won)
{
	for (int i = 0; i < n; i++) {
		bool send = k[i].op == WEFT_SELECT_SEND;
		nodes[i] = (struct waiter){ .w = w, .len = k[i].len, .won = won,
					    .c = is_chan(k[i].op) ? k[i].chan : NULL, .send = send };
		if (send)
			nodes[i].src = k[i].packet;
		else if (is_chan(k[i].op))
			nodes[i].dst = k[i].buf;
	}
}

/* After chan_park: the index of the channel case a waker completed (its result stored), or
 * -1. */
static int case_won(weft_select_case *k, struct waiter *nodes, struct waiter *won, int r)
{
	if (!won)
		return -1;
	int i = (int)(won - nodes);
	k[i].result = r ? r : k[i].op == WEFT_SELECT_SEND ? 0 : (int)won->got;
	return i;
}

/* Only channel cases: the select of Go. */
static int select_chans(weft_select_case *k, int n, weft_chan **order, int m, int64_t deadline)
{
	lock_all(order, m);
	struct waiter *wk = NULL;
	int i = do_ready(k, n, NULL, &wk), r;
	if (i >= 0) {
		unlock_all(order, m);
		return chan_done(k, i, wk);
	}
	if ((r = chan_may_wait(deadline))) {
		unlock_all(order, m);
		return r;
	}
	struct waiter nodes[n ? n : 1];
	struct waiter *won = NULL;
	struct wait *w = wait_begin("select", k);
	fill_nodes(k, n, nodes, w, &won);
	r = chan_park(nodes, n, order, m, w, deadline, wait_park);
	i = case_won(k, nodes, won, r);
	return i >= 0 ? i : r;
}

/* ---- FD and JOIN cases ------------------------------------------------------------------ */

struct sel {
	weft_select_case *k;
	int n, m, nfd;
	weft_chan **order;
	struct pollfd *pfd;      /* the FD cases, in the order of the cases */
	int *fdcase;             /* pfd[j] is for case fdcase[j] */
	struct poll_node *pnode; /* pnode[j] links pfd[j]'s fd */
	weft_task **rec;         /* JOIN case i: its task's record, its joiner slot held; else NULL */
	bool *ready;             /* which FD and JOIN cases are ready */
};

/* Take the joiner slot of every JOIN case for w. On failure, gives back those it took. */
static int joins_enter(struct sel *s, struct wait *w)
{
	for (int i = 0; i < s->n; i++) {
		s->rec[i] = NULL;
		if (s->k[i].op != WEFT_SELECT_JOIN || !s->k[i].task)
			continue;
		int r = task_join_enter(s->k[i].task, w, &s->rec[i]);
		if (r) {
			s->rec[i] = NULL;
			for (int j = 0; j < i; j++)
				if (s->rec[j])
					task_join_leave(s->rec[j], false);
			return r;
		}
	}
	return 0;
}

/* Give the slots back; the task of case `taken` (if a JOIN case) is joined. */
static void joins_leave(struct sel *s, int taken)
{
	for (int i = 0; i < s->n; i++)
		if (s->rec[i])
			task_join_leave(s->rec[i], i == taken);
}

/* w armed: publish the FD cases, then look at fds and tasks (s->ready). 0, or -errno with
 * nothing left to wait for. *linked: as poll_link_all's. */
static int look_others(struct sel *s, struct wait *w, struct poll_node **pwon, int *linked)
{
	/* before any weft_run, nobody polls: an FD case is only looked at (weft.h) */
	int err = 0;
	*linked = 0;
	if (poll_started())
		err = poll_link_all(s->pfd, s->nfd, s->pnode, w, pwon, linked);
	if (err && err != -EBADF)
		return err;
	int r = s->nfd ? poll_look(s->pfd, s->nfd) : 0;
	if (r < 0)
		return r;
	if (err && !r) /* an fd that is not open shows as POLLNVAL; it did not: it raced */
		return err;
	for (int i = 0; i < s->n; i++)
		s->ready[i] = s->rec[i] && task_join_ready(s->rec[i]);
	for (int j = 0; j < s->nfd; j++)
		s->ready[s->fdcase[j]] = s->pfd[j].revents != 0;
	return 0;
}

/* The result of a ready FD case. */
static int fd_result(const struct pollfd *p)
{
	if (p->revents & POLLNVAL)
		return -EBADF;
	return p->revents & (POLLIN | POLLOUT | POLLERR | POLLHUP);
}

static int fd_index(const struct sel *s, int i)
{
	int j = 0;
	while (s->fdcase[j] != i)
		j++;
	return j;
}

/* Park, counted among the waiters on fds (there are FD cases): a worker then polls. */
static int park_on_fds(struct wait *w, int64_t deadline)
{
	poll_waiters_add(1);
	if (!sched_on_a_worker())
		sched_wake_idle(); /* a plain thread: make sure some worker comes round to poll */
	int r = wait_park(w, deadline);
	poll_waiters_add(-1);
	return r;
}

/* The select with FD or JOIN cases, the joiner slots held. w is armed. Returns as weft_select;
 * sets *taken to the JOIN case done, if one is. */
static int select_all(struct sel *s, struct wait *w, int64_t deadline, int *taken)
{
	weft_select_case *k = s->k;
	struct waiter nodes[s->n];
	for (;;) {
		struct poll_node *pwon = NULL;
		struct waiter *won = NULL, *wk = NULL;
		int linked, i = -1;
		int r = look_others(s, w, &pwon, &linked);
		if (!r) {
			lock_all(s->order, s->m);
			i = do_ready(k, s->n, s->ready, &wk);
			if (i < 0 && !(r = chan_may_wait(deadline))) {
				fill_nodes(k, s->n, nodes, w, &won);
				r = chan_park(nodes, s->n, s->order, s->m, w, deadline,
					      s->nfd ? park_on_fds : wait_park);
				poll_unlink_all(s->pnode, linked);
				if ((i = case_won(k, nodes, won, r)) >= 0)
					return i;
				if (pwon && r == -EBADF) { /* closed through weft: do not link it again */
					i = s->fdcase[pwon - s->pnode];
					k[i].result = -EBADF;
					return i;
				}
				if (r < 0 && r != -ETIMEDOUT)
					return r;
				/* An edge or an exit: look again. Timed out: look once more, as
				 * poll(2) under the shim does (the poller may be behind); with the
				 * deadline past, that look cannot park. */
				w = wait_begin("select", k);
				continue;
			}
			unlock_all(s->order, s->m);
		}
		poll_unlink_all(s->pnode, linked);
		wait_abandon(w); /* a wake-up that came meanwhile is moot: we have looked */
		if (i < 0)
			return r;
		if (is_chan(k[i].op))
			return chan_done(k, i, wk);
		if (k[i].op == WEFT_SELECT_FD)
			k[i].result = fd_result(&s->pfd[fd_index(s, i)]);
		else
			k[i].result = 0, *taken = i;
		sched_slice(); /* a loop on an fd that stays ready must not keep the worker */
		return i;
	}
}

int weft_select(weft_select_case *k, int n, int64_t deadline)
{
	int r = check_cases(k, n);
	if (r)
		return r;
	if (deadline == INT64_MIN) /* chan.c's mark for "never wait": a past deadline all the same */
		deadline++;
	weft_chan *order[WEFT_SELECT_MAX];
	int m = lock_order(k, n, order), nfd = 0, njoin = 0;
	for (int i = 0; i < n; i++) {
		nfd += k[i].op == WEFT_SELECT_FD && k[i].fd >= 0;
		njoin += k[i].op == WEFT_SELECT_JOIN && k[i].task;
	}
	if (!nfd && !njoin)
		return select_chans(k, n, order, m, deadline);
	struct pollfd pfd[nfd ? nfd : 1];
	struct poll_node pnode[nfd ? nfd : 1];
	int fdcase[nfd ? nfd : 1];
	weft_task *rec[n];
	bool ready[n];
	struct sel s = { .k = k, .n = n, .m = m, .nfd = nfd, .order = order, .pfd = pfd,
			 .fdcase = fdcase, .pnode = pnode, .rec = rec, .ready = ready };
	for (int i = 0, j = 0; i < n; i++)
		if (k[i].op == WEFT_SELECT_FD && k[i].fd >= 0) {
			short ev = (short)((k[i].events & EPOLLIN ? POLLIN : 0) |
					   (k[i].events & EPOLLOUT ? POLLOUT : 0));
			pfd[j] = (struct pollfd){ .fd = k[i].fd, .events = ev };
			fdcase[j++] = i;
		}
	struct wait *w = wait_begin("select", k);
	if ((r = joins_enter(&s, w))) {
		wait_abandon(w);
		return r;
	}
	int taken = -1;
	r = select_all(&s, w, deadline, &taken);
	joins_leave(&s, taken);
	return r;
}
