# weft-mqtt production modules, part 1: password_file (auth.c), acl_file (acl.c) and MQTT over
# WebSockets (ws.c), and their unit tests. Self-contained: they need OpenSSL's libcrypto and
# weft, nothing of the broker. See docs/weft-mqtt-security.md.
#
#   make B=build build/tests/mqtt_auth build/tests/mqtt_acl build/tests/mqtt_ws
#   make mqtt-ws-fuzz FUZZ_TIME=60      libFuzzer over the WebSocket decoder (clang)
#
# There is no OpenSSL for the aarch64 cross build, so these tests are left out of it, and out of
# any build where OpenSSL's headers are missing (Debian: libssl-dev).
PROD_AUTH_SRC := apps/mqtt/codec.c apps/mqtt/auth.c apps/mqtt/pace.c apps/mqtt/acl.c apps/mqtt/ws.c apps/mqtt/ratelimit.c \
	apps/mqtt/textfile.c
PROD_AUTH_OBJ := $(PROD_AUTH_SRC:apps/mqtt/%.c=$(B)/obj/mqtt-prod/%.o)
PROD_AUTH_HDR := apps/mqtt/codec.h apps/mqtt/textfile.h apps/mqtt/ratelimit.h apps/mqtt/auth.h apps/mqtt/acl.h apps/mqtt/ws.h include/weft.h

ifneq ($(ARCH),aarch64)
ifneq ($(wildcard /usr/include/openssl/evp.h),)
TESTS += $(B)/tests/mqtt_auth $(B)/tests/mqtt_acl $(B)/tests/mqtt_ws
endif
endif

# The broker links these modules through build.mk's MQTT_SRC (see docs/weft-mqtt-security.md,
# "Wiring into the broker"); the objects here are the modules' own tests'.

$(B)/obj/mqtt-prod:
	mkdir -p $@
$(B)/obj/mqtt-prod/%.o: apps/mqtt/%.c $(PROD_AUTH_HDR) | $(B)/obj/mqtt-prod
	$(CC) $(CFLAGS) -iquote apps/mqtt -c $< -o $@
$(B)/tests/mqtt_auth $(B)/tests/mqtt_acl $(B)/tests/mqtt_ws: $(B)/tests/mqtt_%: \
		apps/mqtt/tests/%_test.c $(PROD_AUTH_OBJ) tests/test.c tests/test.h $(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests -iquote apps/mqtt -DMQTT_TEST_DATA='"$(CURDIR)/apps/mqtt/tests/data"' \
		-DWEFT_SRC_DIR='"$(CURDIR)"' $(LDFLAGS) -o $@ $< tests/test.c $(PROD_AUTH_OBJ) \
		$(B)/libweft.a -lcrypto $(LDLIBS)

FUZZ_TIME ?= 60

# The WebSocket decoder under libFuzzer: ws_test.c built with WS_FUZZ is the fuzz target.
$(B)/fuzz/mqtt_ws: apps/mqtt/tests/ws_test.c apps/mqtt/ws.c apps/mqtt/ws.h
	@mkdir -p $(B)/fuzz
	clang -g -O1 -std=gnu11 -DWS_FUZZ -iquote apps/mqtt -Iinclude -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -o $@ apps/mqtt/tests/ws_test.c apps/mqtt/ws.c -lcrypto
mqtt-ws-fuzz: $(B)/fuzz/mqtt_ws
	@mkdir -p $(B)/fuzz/ws-corpus
	$(B)/fuzz/mqtt_ws -max_total_time=$(FUZZ_TIME) -timeout=5 -rss_limit_mb=1024 \
		-max_len=4096 -print_final_stats=1 $(B)/fuzz/ws-corpus
.PHONY: mqtt-ws-fuzz
FUZZ += mqtt-ws-fuzz
