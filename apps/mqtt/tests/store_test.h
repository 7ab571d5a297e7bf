/*
 * store_test.h - what the store's tests (store_test.c, store_fail_test.c: one binary,
 * mqtt_store) share: a fresh directory per test, opening, messages, and the store's content
 * read back as lines of text. Defined in store_test.c.
 */
#ifndef WEFT_MQTT_STORE_TEST_H
#define WEFT_MQTT_STORE_TEST_H

#include <string.h>

#include "store.h"
#include "test.h"

#define S(str) (str), (uint16_t)strlen(str)

/* The store directory the running test uses, and a fresh one in the test's scratch
 * directory (store_open creates it). */
extern const char *path;
const char *fresh(void);
/* store_open that fails the test, saying why. */
store *open_ok(const char *path, const store_opts *o);
store_msg msg(const char *topic, const char *payload, int qos);
/* A delivery at qos, with the RETAIN flag and subscription ids given (up to 2, 0 ends). */
store_dlv dl(int qos, int retain, uint32_t id1, uint32_t id2);
/* What store_load gives back, a line per row ("S id ...", "Q id topic ...", "R id pid", ...):
 * malloc'd. */
char *load_text(store *st);
/* Fail the test, showing both, unless text is want. */
void expect(const char *text, const char *want);
/* The first column of the first row sql returns on the (closed) database at path. */
long long sql_int(const char *sql);

#endif
