/*
 * handle_ping.c - PINGREQ: a PINGRESP, in the session's output (or written at once when there
 * is none). The keep-alive it serves is the read loop's (loop.c): any packet counts.
 */
#include <stdint.h>

#include "codec.h"
#include "conn.h"
#include "records.h"

int handle_pingreq(conn *c)
{
	uint8_t b[2];
	conn_send(c, b, mq_enc_simple(b, MQ_PINGRESP));
	return 0;
}
