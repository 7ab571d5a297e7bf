/*
 * ratelimit.h - a rate limit per source address: a GCRA cell per IPv4 address or IPv6 /64.
 *
 * Two users: the acceptor counts new connections with it (rl_take: admitted and counted, or
 * refused and not counted), and pace.c spaces out password checks per address and per
 * (address, username) (rl_reserve: booked, and how long to wait for its turn; rl_refund after
 * a success). See ratelimit.c for the table.
 */
#ifndef WEFT_MQTT_RATELIMIT_H
#define WEFT_MQTT_RATELIMIT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct rl_table rl_table;

/* A table allowing `burst` events at once, then one per interval_ns; burst 0: no limit (every
 * call admits, nothing is recorded). NULL when memory is out. */
rl_table *rl_new(int burst, int64_t interval_ns);
void rl_free(rl_table *t);
void rl_set(rl_table *t, int burst, int64_t interval_ns);
/* Admit an event from `from` within the limit (recording it) and return true, or return false. */
bool rl_take(rl_table *t, const struct sockaddr *from, int64_t now);
/* Record an event of (from, tag) and return how long (ns) it must wait for its place: 0 within
 * the burst, then one interval after the place before. -1, and nothing recorded, when that
 * would be more than cap (places are not booked further ahead than that). */
int64_t rl_reserve(rl_table *t, const struct sockaddr *from, uint64_t tag, int64_t now,
		   int64_t cap);
/* Give back one event's place (all: clear the cell). */
void rl_refund(rl_table *t, const struct sockaddr *from, uint64_t tag, int64_t now, bool all);
/* Forget every address. */
void rl_reset(rl_table *t);

#endif
