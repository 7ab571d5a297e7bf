# weft-mqtt: the MQTT broker (apps/mqtt). See docs/weft-mqtt.md.
#
#   make B=build build/bin/weft-mqtt      the broker
#   make mqtt-fuzz FUZZ_TIME=60           build the decoder's libFuzzer target with clang and
#                                         run it on the seed corpus for FUZZ_TIME seconds
#
# The broker's sources and tests are listed by name, so that modules still being written
# beside them do not change this build. The production modules (auth.c, acl.c, ws.c, tls.c,
# store.c; docs/weft-mqtt-security.md and weft-mqtt-durability.md) are in MQTT_SRC where their
# libraries are (OpenSSL, SQLite); prod_auth.mk and prod_store.mk build their unit tests.
MQTT_SRC := $(addprefix apps/mqtt/,codec.c encode.c config.c conn.c epoch.c msg.c pool.c \
	session.c delivery.c writer.c retained.c subscribe.c deadline.c stats.c topic.c access.c acl.c \
	persist.c metrics.c bridge.c ratelimit.c pace.c textfile.c kick.c login.c)
MQTT_HDR := $(addprefix apps/mqtt/,broker.h codec.h acl.h auth.h ws.h tls.h store.h store_queue.h \
	bridge.h ratelimit.h textfile.h) include/weft.h
MQTT_LIBS :=
MQTT_CFLAGS :=
# password_file (PBKDF2-SHA512), WebSockets (SHA-1 of the upgrade key) and TLS listeners need
# OpenSSL (Debian libssl-dev). Where it is missing (the aarch64 cross build, a host without
# libssl-dev) nocrypto.c stands in: the broker runs, and refuses to start with a
# password_file, a websockets listener or a certfile.
MQTT_CRYPTO := $(if $(filter aarch64,$(ARCH)),,$(wildcard /usr/include/openssl/evp.h))
ifneq ($(MQTT_CRYPTO),)
MQTT_SRC += apps/mqtt/auth.c apps/mqtt/ws.c apps/mqtt/tls.c
MQTT_LIBS += -lssl -lcrypto
else
MQTT_SRC += apps/mqtt/nocrypto.c
MQTT_CFLAGS += -DMQTT_NO_CRYPTO
endif
# persistence needs SQLite (Debian libsqlite3-dev); without it persist.c refuses
# `persistence true` at start.
ifneq ($(if $(filter aarch64,$(ARCH)),,$(wildcard /usr/include/sqlite3.h)),)
MQTT_SRC += apps/mqtt/store.c apps/mqtt/store_queue.c
MQTT_LIBS += -lsqlite3
else
MQTT_CFLAGS += -DMQTT_NO_STORE
endif
MQTT_OBJ := $(MQTT_SRC:apps/mqtt/%.c=$(B)/obj/mqtt/%.o)

ALL   += $(B)/bin/weft-mqtt
TESTS += $(B)/tests/mqtt_codec $(B)/tests/mqtt_topic $(B)/tests/mqtt_deadline $(B)/tests/mqtt_broker \
	$(B)/tests/mqtt_access $(B)/tests/mqtt_kick
# The isolation test (tests/isolation.c: others' p99 beside a flooder and a slow reader): with
# max_publish_rate in every `make test`; with the broker's defaults, where nothing limits the
# flood and the 2x target is missed on a shared 2-core machine (see the file's header), only
# in `make mqtt-isolation`.
TESTS += $(B)/tests/mqtt_isolation
mqtt-isolation: $(B)/tests/mqtt_isolation
	ISO_UNLIMITED=1 sh tests/run.sh $<
.PHONY: mqtt-isolation

$(B)/obj/mqtt:
	mkdir -p $@
$(B)/obj/mqtt/%.o: apps/mqtt/%.c $(MQTT_HDR) | $(B)/obj/mqtt
	$(CC) $(CFLAGS) $(MQTT_CFLAGS) -iquote apps/mqtt -c $< -o $@
$(B)/bin/weft-mqtt: apps/mqtt/main.c $(MQTT_OBJ) $(B)/libweft.a | $(B)/bin
	$(CC) $(CFLAGS) $(MQTT_CFLAGS) -iquote apps/mqtt $(LDFLAGS) -o $@ $< $(MQTT_OBJ) $(B)/libweft.a $(MQTT_LIBS) $(LDLIBS)
# The tests of the program (tests/broker.c) start the broker beside them: it is a prerequisite.
$(B)/tests/mqtt_%: apps/mqtt/tests/%.c $(MQTT_OBJ) tests/test.c tests/test.h $(B)/libweft.a $(B)/bin/weft-mqtt | $(B)/tests
	$(CC) $(CFLAGS) -Itests -iquote apps/mqtt $(LDFLAGS) -o $@ $< tests/test.c $(MQTT_OBJ) $(B)/libweft.a $(MQTT_LIBS) $(LDLIBS)

# The fuzz target needs clang (libFuzzer); it decodes with both protocol levels. `make fuzz`
# (part of make test-all) runs it for FUZZ_TIME seconds.
FUZZ_TIME ?= 60
FUZZ += mqtt-fuzz
MQTT_FUZZ_SRC := apps/mqtt/fuzz/decode.c apps/mqtt/codec.c apps/mqtt/encode.c
$(B)/fuzz/mqtt_decode: $(MQTT_FUZZ_SRC) apps/mqtt/codec.h
	@mkdir -p $(B)/fuzz
	clang -g -O1 -std=gnu11 -iquote apps/mqtt -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -o $@ $(MQTT_FUZZ_SRC)
mqtt-fuzz: $(B)/fuzz/mqtt_decode
	@mkdir -p $(B)/fuzz/corpus
	$(B)/fuzz/mqtt_decode -max_total_time=$(FUZZ_TIME) -timeout=5 -rss_limit_mb=1024 \
		-max_len=4096 -print_final_stats=1 $(B)/fuzz/corpus apps/mqtt/fuzz/corpus
.PHONY: mqtt-fuzz
