/*
 * topic.h - the topic tree (topic.c): subscriptions and retained messages, matched without a
 * global lock, and the routing of a published message to its subscribers.
 */
#ifndef WEFT_MQTT_TOPIC_H
#define WEFT_MQTT_TOPIC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msg.h"
#include "records.h"

/* subscription options as in the SUBSCRIBE byte: qos bits 0-1, no-local 2, rap 3, rh 4-5 */
#define SUB_NL 4
#define SUB_RAP 8

void topic_init(void);
/* Add or replace s's subscription; returns 1 if it replaced one, 0 if new. */
int topic_subscribe(session *s, const char *filter, uint16_t len, uint8_t opts, uint32_t subid);
/* Remove it; returns 1 if it existed. */
int topic_unsubscribe(session *s, const char *filter, uint16_t len);
/* Set (or with an empty payload clear) the retained message of m's topic. */
void topic_retain(msg *m);
/* Send s every retained message matching filter (qos capped at max_qos), as the client takes
 * them: a backlog of s (retained.c) that replaces one pending for the same filter, in place
 * of the `reserved` bytes retained_admit reserved for it (0: none). */
void topic_send_retained(session *s, const char *filter, uint16_t len, int max_qos,
			 uint32_t subid, uint64_t reserved, struct conn *by);
/* What a backlog of the retained messages matching filter would cost now (retained_cost of
 * each), counted without taking them; the walk stops once it passes limit. */
uint64_t topic_retained_cost(const char *filter, uint16_t len, uint64_t limit);
/* The hash of topic names and levels the tree uses. */
uint32_t topic_hash(const char *s, size_t n);
long topic_retained_count(void);
long topic_sub_count(void);
long topic_node_count(void); /* nodes in the tree, the root included */
long topic_bytes(void);      /* bytes its nodes, child tables and subscriber arrays hold */
void topic_free_all(void);

/* Route m to every matching subscription: one copy per session at the highest matching QoS
 * with all its subscription ids; one member of each shared group. Returns the number of
 * deliveries. from is the publishing session (no-local), by its connection. */
int topic_publish(msg *m, session *from, struct conn *by);

#endif
