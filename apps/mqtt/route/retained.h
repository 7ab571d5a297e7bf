/*
 * retained.h - retained backlogs (retained.c): the retained messages a SUBSCRIBE sends, as the
 * client takes them, within a budget per session and for the broker. s's lock held unless
 * said.
 */
#ifndef WEFT_MQTT_RETAINED_H
#define WEFT_MQTT_RETAINED_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msg.h"
#include "records.h"

typedef struct rbacklog rbacklog;
/* What a pending backlog entry of m is counted as: its slots in the backlog and m itself,
 * which the entry keeps alive once the store lets m go. */
uint64_t retained_cost(const msg *m);
/* Before a SUBSCRIBE's filter is subscribed: whether the backlog of its retained messages fits
 * s's budget (retained_backlog_bytes) and the broker's (retained_backlog_bytes_total), a
 * backlog pending for the same filter counted as gone. If it does, its cost is reserved
 * (*reserved; topic_send_retained or retained_unreserve gives it back) and true is returned.
 * Takes s's lock and the tree's: call it with neither. */
bool retained_admit(session *s, const char *filter, uint16_t len, uint64_t *reserved);
void retained_unreserve(session *s, uint64_t reserved); /* takes the lock */
/* What the pending backlogs of every session cost together, reservations included. */
uint64_t retained_backlog_bytes(void);
/* Start s's backlog for filter: v[0..n) the matching retained messages, referenced (the array
 * becomes the backlog's), charged in place of `reserved`; one pending for the filter is
 * dropped first. */
void retained_start(session *s, const char *filter, uint16_t len, msg **v, uint32_t n,
		    int max_qos, uint32_t subid, uint64_t reserved);
/* Move what has room now into s's output and window: whether anything was added. */
bool retained_drain(session *s);
/* A live delivery of m to s at qos comes: the entry of m's topic pending in a backlog goes
 * first, if the limits of live delivery leave it room. -1, or, when an entry of the same QoS
 * stays for want of room, the limit (session_limit) that m is to be dropped at: it would
 * overtake that entry. */
int retained_overtake(session *s, const msg *m, int qos, struct conn *by);
/* A SUBSCRIBE replaced filter's subscription and sends no retained messages: a backlog
 * pending for it goes on with the new options (takes the lock). */
void retained_resubscribed(session *s, const char *filter, uint16_t len, int max_qos,
			   uint32_t subid);
/* filter was unsubscribed: its backlog ends. */
void retained_forget(session *s, const char *filter, uint16_t len);
/* s ends: every backlog goes. */
void retained_drop_all(session *s);

#endif
