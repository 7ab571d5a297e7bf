/*
 * ratelimit.h - a rate limit per source address: a GCRA cell per IPv4 address or IPv6 /64.
 *
 * Two users: auth.c counts failed authentications with it (rl_blocked before checking a
 * password, rl_charge after a failure), and the acceptor counts new connections with it
 * (rl_take: admitted and counted, or refused and not counted). See ratelimit.c for the table.
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
/* Whether from has used its burst (an event now would be over the limit). Records nothing. */
bool rl_blocked(rl_table *t, const struct sockaddr *from, int64_t now);
/* Record an event from `from`, whether or not it was over the limit. */
void rl_charge(rl_table *t, const struct sockaddr *from, int64_t now);
/* Admit an event within the limit (recording it) and return true, or return false. */
bool rl_take(rl_table *t, const struct sockaddr *from, int64_t now);
/* Forget every address. */
void rl_reset(rl_table *t);

#endif
