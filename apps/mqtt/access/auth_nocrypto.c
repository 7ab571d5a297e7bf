/*
 * auth_nocrypto.c - stands in for auth.c where weft-mqtt is built without OpenSSL (the aarch64
 * cross build has no libcrypto): there is no password checking (PBKDF2-SHA512 needs
 * libcrypto), so a configured password_file stops the broker at start instead of being
 * ignored. Its twin for the transports is conn/nocrypto.c.
 */
#include <stdio.h>

#include "auth.h"

int auth_reload(const char *path, const auth_opts *o, char *err, size_t errcap)
{
	(void)o;
	snprintf(err, errcap, "%s: password_file needs a weft-mqtt built with OpenSSL", path);
	return -1;
}

long auth_count(void)
{
	return -1;
}

auth_result auth_check(const auth_req *r)
{
	(void)r;
	return AUTH_NOT_AUTHORIZED;
}
