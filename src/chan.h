/* chan.h - what the rest of weft needs of channels beyond weft.h. */
#ifndef WEFT_CHAN_H
#define WEFT_CHAN_H

#include <stdbool.h>
#include <stddef.h>

/* If obj is a named channel that has not been freed, copy its name into out and return true.
 * Safe to call with obj any address at all (the dump's snapshot of what a task waits on).
 * may_wait false (a signal handler): gives up rather than wait for the lock. */
bool chan_name_of(const void *obj, char *out, size_t cap, bool may_wait);

/* Whether channels are biased to the worker that locks them most (chan.c, WEFT_CHAN_BIAS), and
 * how many times a bias was revoked: for tests. */
enum chan_bias_mode { CHAN_BIAS_OFF, CHAN_BIAS_ON, CHAN_BIAS_EAGER };
enum chan_bias_mode chan_bias_mode(void);
long chan_bias_revocations(void);
/* 1 + the id of the worker c is biased to, or 0: for tests. */
struct weft_chan;
int chan_bias_owner(struct weft_chan *c);
#endif
