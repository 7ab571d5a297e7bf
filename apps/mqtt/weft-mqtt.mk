# weft-mqtt: the MQTT broker (apps/mqtt). See docs/weft-mqtt.md ("Folders") for the layers.
#
#   make B=build build/bin/weft-mqtt      the broker
#   make mqtt-fuzz FUZZ_TIME=60           build the decoder's libFuzzer target with clang and
#                                         run it on the seed corpus for FUZZ_TIME seconds
#
# The sources sit in one folder per layer, lowest first: wire/ (the protocol's bytes), base/
# (messages, memory, reclamation, counters, configuration values), access/ (who may do what),
# persist/ (the store), route/ (topic tree, sessions, delivery), conn/ (connections and their
# packets), bridge/ (connections to other brokers), and the program on top (main.c, config.c,
# metrics.c, sys.c, restore.c). A folder uses only the folders below it and includes only their
# headers (each folder's headers sit beside its code): tests/layers.sh checks both, on the
# objects and on the #include lines. The sources are listed by name, so that modules still being
# written beside them do not change this build. The broker's unit tests and their own builds of the
# modules are in tests/weft-mqtt-tests.mk.
MQTT_DIRS := wire base access persist route conn bridge
MQTT_INC  := -iquote apps/mqtt $(addprefix -iquote apps/mqtt/,$(MQTT_DIRS))
MQTT_SRC := $(addprefix apps/mqtt/,wire/codec.c wire/encode.c \
	base/conf.c base/msg.c base/pool.c base/epoch.c base/stats.c base/scratch.c base/ratelimit.c \
	base/textfile.c \
	access/access.c access/acl.c access/pace.c \
	persist/persist.c \
	route/topic.c route/retained.c route/session.c route/delivery.c route/deadline.c route/writer.c \
	conn/conn.c conn/loop.c conn/output.c conn/handle_connect.c conn/login.c conn/handle_publish.c \
	conn/acks.c conn/handle_ack.c conn/handle_subscribe.c conn/handle_unsubscribe.c \
	conn/handle_ping.c conn/handle_disconnect.c conn/kick.c \
	bridge/bridge.c bridge/bridge_conf.c \
	config.c metrics.c sys.c restore.c)
MQTT_HDR := $(addprefix apps/mqtt/,broker.h wire/codec.h base/conf.h base/pool.h base/msg.h \
	base/epoch.h base/scratch.h base/stats.h base/records.h base/ratelimit.h base/textfile.h \
	access/access.h access/acl.h access/auth.h persist/persist.h persist/store.h \
	persist/store_queue.h route/peer.h route/session.h route/topic.h route/retained.h \
	conn/conn_public.h conn/conn.h conn/ws.h conn/tls.h bridge/bridge.h bridge/bridge_conf.h) \
	include/weft.h
MQTT_LIBS :=
MQTT_CFLAGS :=
# password_file (PBKDF2-SHA512), WebSockets (SHA-1 of the upgrade key) and TLS listeners need
# OpenSSL (Debian libssl-dev). Where it is missing (the aarch64 cross build, a host without
# libssl-dev) the stubs beside them stand in (access/auth_nocrypto.c, conn/nocrypto.c): the
# broker runs, and refuses to start with a password_file, a websockets listener or a certfile.
MQTT_CRYPTO := $(if $(filter aarch64,$(ARCH)),,$(wildcard /usr/include/openssl/evp.h))
ifneq ($(MQTT_CRYPTO),)
MQTT_SRC += apps/mqtt/access/auth.c apps/mqtt/conn/ws.c apps/mqtt/conn/tls.c
MQTT_LIBS += -lssl -lcrypto
else
MQTT_SRC += apps/mqtt/access/auth_nocrypto.c apps/mqtt/conn/nocrypto.c
MQTT_CFLAGS += -DMQTT_NO_CRYPTO
endif
# persistence needs SQLite (Debian libsqlite3-dev); without it persist/persist.c refuses
# `persistence true` at start.
MQTT_SQLITE := $(if $(filter aarch64,$(ARCH)),,$(wildcard /usr/include/sqlite3.h))
ifneq ($(MQTT_SQLITE),)
MQTT_SRC += apps/mqtt/persist/store.c apps/mqtt/persist/store_queue.c
MQTT_LIBS += -lsqlite3
else
MQTT_CFLAGS += -DMQTT_NO_STORE
endif
MQTT_OBJ := $(MQTT_SRC:apps/mqtt/%.c=$(B)/obj/mqtt/%.o)

ALL   += $(B)/bin/weft-mqtt

$(B)/obj/mqtt/%.o: apps/mqtt/%.c $(MQTT_HDR)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(MQTT_CFLAGS) $(MQTT_INC) -c $< -o $@
$(B)/bin/weft-mqtt: apps/mqtt/main.c $(MQTT_OBJ) $(B)/libweft.a | $(B)/bin
	$(CC) $(CFLAGS) $(MQTT_CFLAGS) $(MQTT_INC) $(LDFLAGS) -o $@ $< $(MQTT_OBJ) $(B)/libweft.a $(MQTT_LIBS) $(LDLIBS)

# The fuzz target needs clang (libFuzzer); it decodes with both protocol levels. `make fuzz`
# (part of make test-all) runs it for FUZZ_TIME seconds.
FUZZ_TIME ?= 60
FUZZ += mqtt-fuzz
MQTT_FUZZ_SRC := apps/mqtt/fuzz/decode.c apps/mqtt/wire/codec.c apps/mqtt/wire/encode.c
$(B)/fuzz/mqtt_decode: $(MQTT_FUZZ_SRC) apps/mqtt/wire/codec.h
	@mkdir -p $(B)/fuzz
	clang -g -O1 -std=gnu11 -iquote apps/mqtt/wire -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -o $@ $(MQTT_FUZZ_SRC)
mqtt-fuzz: $(B)/fuzz/mqtt_decode
	@mkdir -p $(B)/fuzz/corpus
	$(B)/fuzz/mqtt_decode -max_total_time=$(FUZZ_TIME) -timeout=5 -rss_limit_mb=1024 \
		-max_len=4096 -print_final_stats=1 $(B)/fuzz/corpus apps/mqtt/fuzz/corpus
.PHONY: mqtt-fuzz

include apps/mqtt/tests/weft-mqtt-tests.mk
