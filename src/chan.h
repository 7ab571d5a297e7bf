/* chan.h - what the rest of weft needs of channels beyond weft.h. */
#ifndef WEFT_CHAN_H
#define WEFT_CHAN_H

#include <stdbool.h>
#include <stddef.h>

/* If obj is a named channel that has not been freed, copy its name into out and return true.
 * Safe to call with obj any address at all (the dump's snapshot of what a task waits on).
 * may_wait false (a signal handler): gives up rather than wait for the lock. */
bool chan_name_of(const void *obj, char *out, size_t cap, bool may_wait);
/* A channel's name (chan_name.c): its storage in the channel, CHAN_NAME_MAX bytes; and taking
 * it out of the set the dump reads, before the channel is freed. */
#define CHAN_NAME_MAX 32
struct weft_chan;
char *chan_name_buf(const struct weft_chan *c);
void chan_name_forget(struct weft_chan *c);

/* Whether channels are biased to the worker that locks them most (chan.c, WEFT_CHAN_BIAS), and
 * how many times a bias was revoked: for tests. */
enum chan_bias_mode { CHAN_BIAS_OFF, CHAN_BIAS_ON, CHAN_BIAS_EAGER };
enum chan_bias_mode chan_bias_mode(void);
long chan_bias_revocations(void);
/* 1 + the id of the worker c is biased to, or 0: for tests. */
struct weft_chan;
int chan_bias_owner(struct weft_chan *c);

/* ---- what select (select.c) uses of a channel ----
 * A waiter node: a task or thread parked on a channel (chan.c, "Waiters"). It lives on the
 * waiter's stack; select queues one per case, all pointing to the one wait record. */
#include <stdint.h>
#include "waitq.h"
struct wait;
typedef struct weft_chan weft_chan;
struct waiter {
	union {
		struct waitq_link link;  /* while queued (waitq.h) */
		struct waiter *next;     /* once claimed: weft_chan_close's chain */
	};
	struct wait *w;          /* the owner's wait record; several nodes may share it (select) */
	union {
		const void *src; /* sender: its packet */
		void *dst;       /* receiver: its buffer */
	};
	size_t len;              /* sender: the packet's length; receiver: cap */
	size_t got;              /* receiver: the sent length, written by the sender */
	struct waiter **won;     /* the claimer stores this node there before finishing */
	weft_chan *c;            /* the channel it is queued on (NULL: none, a select's other case) */
	bool send;               /* on c's sendq, else its recvq */
	_Atomic bool queued;
};
_Static_assert(offsetof(struct waiter, link) == 0, "waitq.h: the link comes first");

/* Lock and unlock c; select locks its channels in address order, one at a time. */
void chan_select_lock(weft_chan *c);
void chan_select_unlock(weft_chan *c);
size_t chan_packet_size(const weft_chan *c);
/* Lock held: could a send (a receive) be done on c right now? True when c is closed. */
bool chan_ready(weft_chan *c, bool send);
/* Lock held: send p (len bytes) or receive into p (cap len) without waiting. Returns as
 * send_now / recv_now: 0 or the sent length, -EPIPE, -ENOMEM, or -EAGAIN (must wait). *wk: a
 * claimed waiter to finish with chan_wake once the lock is dropped. */
int chan_try(weft_chan *c, bool send, void *p, size_t len, struct waiter **wk);
void chan_wake(weft_chan *c, struct waiter *n, int result);
/* Lock held: 0 when a caller with this deadline may park, else -ETIMEDOUT or -EAGAIN. */
int chan_may_wait(int64_t deadline);
/* With locked[0..nlocked) locked and nothing ready (chan_may_wait said 0): queue the nodes
 * that have a channel (their fields filled in, all on w), unlock, park with `park`, and take
 * off their queues the nodes no waker completed. Returns park's result; the node a waker
 * completed is in *node->won. The waiting half of a send or receive, for several (chan.c). */
int chan_park(struct waiter *nodes, int n, weft_chan *const *locked, int nlocked,
	      struct wait *w, int64_t deadline, int (*park)(struct wait *, int64_t));
#endif
