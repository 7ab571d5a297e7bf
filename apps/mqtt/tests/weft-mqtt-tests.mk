# weft-mqtt's tests (included by apps/mqtt/weft-mqtt.mk).
#
#   make B=build build/tests/mqtt_broker ...     the broker's tests (apps/mqtt/tests/*.c)
#   make mqtt-isolation                           the isolation test with the broker's defaults
#   make mqtt-ws-fuzz FUZZ_TIME=60                libFuzzer over the WebSocket decoder (clang)
#
# Three kinds:
# - tests of the broker (mqtt_codec, _topic, _deadline, _broker, _access, _kick, _isolation,
#   _exactly_once): linked with the broker's objects; the ones that run the program have it
#   as a prerequisite;
# - the modules' own tests (mqtt_auth, _acl, _ws: OpenSSL's libcrypto; mqtt_tls: libssl;
#   mqtt_store and the store benchmark: SQLite), built from objects of their own
#   (obj/mqtt-modules/), with nothing of the broker; left out of the aarch64 cross build and of
#   any build where the library's headers are missing (Debian libssl-dev, libsqlite3-dev);
# - scripts that run the broker built in the same build dir: the bridges against a real
#   mosquitto (bridge_test.sh, which skips itself without mosquitto) and the layering of the
#   objects (layers.sh). Not in cross builds: qemu-user cannot run a script.
TESTS += $(B)/tests/mqtt_codec $(B)/tests/mqtt_topic $(B)/tests/mqtt_deadline $(B)/tests/mqtt_broker \
	$(B)/tests/mqtt_broker_retained $(B)/tests/mqtt_access $(B)/tests/mqtt_kick
# The broker's program tests share their harness (starting the broker, packets, clients).
$(B)/tests/mqtt_broker $(B)/tests/mqtt_broker_retained: apps/mqtt/tests/broker_harness.h
# The isolation test (tests/isolation.c: others' p99 beside a flooder and a slow reader): with
# max_publish_rate in every `make test`; with the broker's defaults, where nothing limits the
# flood and the 2x target is missed on a shared 2-core machine (see the file's header), only
# in `make mqtt-isolation`.
TESTS += $(B)/tests/mqtt_isolation
mqtt-isolation: $(B)/tests/mqtt_isolation
	ISO_UNLIMITED=1 sh tests/run.sh $<
.PHONY: mqtt-isolation

# The tests of the program (tests/broker.c, broker_retained.c) start the broker beside them: it is a prerequisite.
$(B)/tests/mqtt_%: apps/mqtt/tests/%.c $(MQTT_OBJ) tests/test.c tests/test.h $(B)/libweft.a $(B)/bin/weft-mqtt | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(MQTT_INC) $(LDFLAGS) -o $@ $< tests/test.c $(MQTT_OBJ) $(B)/libweft.a $(MQTT_LIBS) $(LDLIBS)

# ---- the modules' own tests -------------------------------------------------------------------

MQTT_MOD := $(B)/obj/mqtt-modules
$(MQTT_MOD)/%.o: apps/mqtt/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(MQTT_INC) -c $< -o $@

# password_file (auth.c), acl_file (acl.c) and MQTT over WebSockets (ws.c): they need OpenSSL's
# libcrypto and weft. See docs/weft-mqtt-security.md.
MQTT_SEC_OBJ := $(addprefix $(MQTT_MOD)/,wire/codec.o access/auth.o access/pace.o access/acl.o \
	conn/ws.o base/ratelimit.o base/textfile.o)
$(MQTT_SEC_OBJ): $(addprefix apps/mqtt/,wire/codec.h base/textfile.h base/ratelimit.h \
	access/auth.h access/acl.h conn/ws.h) include/weft.h

ifneq ($(ARCH),aarch64)
ifneq ($(wildcard /usr/include/openssl/evp.h),)
TESTS += $(B)/tests/mqtt_auth $(B)/tests/mqtt_acl $(B)/tests/mqtt_ws
endif
endif

$(B)/tests/mqtt_auth $(B)/tests/mqtt_acl $(B)/tests/mqtt_ws: $(B)/tests/mqtt_%: \
		apps/mqtt/tests/%_test.c $(MQTT_SEC_OBJ) tests/test.c tests/test.h $(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(MQTT_INC) -DMQTT_TEST_DATA='"$(CURDIR)/apps/mqtt/tests/data"' \
		-DWEFT_SRC_DIR='"$(CURDIR)"' $(LDFLAGS) -o $@ $< tests/test.c $(MQTT_SEC_OBJ) \
		$(B)/libweft.a -lcrypto $(LDLIBS)

# The WebSocket decoder under libFuzzer: ws_test.c built with WS_FUZZ is the fuzz target.
$(B)/fuzz/mqtt_ws: apps/mqtt/tests/ws_test.c apps/mqtt/conn/ws.c apps/mqtt/conn/ws.h
	@mkdir -p $(B)/fuzz
	clang -g -O1 -std=gnu11 -DWS_FUZZ $(MQTT_INC) -Iinclude -fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -o $@ apps/mqtt/tests/ws_test.c apps/mqtt/conn/ws.c -lcrypto
mqtt-ws-fuzz: $(B)/fuzz/mqtt_ws
	@mkdir -p $(B)/fuzz/ws-corpus
	$(B)/fuzz/mqtt_ws -max_total_time=$(FUZZ_TIME) -timeout=5 -rss_limit_mb=1024 \
		-max_len=4096 -print_final_stats=1 $(B)/fuzz/ws-corpus
.PHONY: mqtt-ws-fuzz
FUZZ += mqtt-ws-fuzz

# TLS over weft sockets (tls.c) and durable storage on SQLite (store.c: the writer and SQLite;
# store_queue.c: what callers run), their tests and the store benchmark. See
# docs/weft-mqtt-durability.md. bench/*.c names the store benchmark too; it is built (below)
# only where SQLite links.
BENCHES  := $(filter-out $(B)/bench/mqtt-store,$(BENCHES))

ifneq ($(ARCH),aarch64)
# Each only where its library's header is installed, so that `make test` works on a machine
# with nothing but gcc and make (.ci/run installs both).
ifneq ($(wildcard /usr/include/openssl/ssl.h),)
TESTS   += $(B)/tests/mqtt_tls
endif
ifneq ($(wildcard /usr/include/sqlite3.h),)
TESTS   += $(B)/tests/mqtt_store
# the broker with persistence on, killed and starved (the rule above for apps/mqtt/tests/*.c)
TESTS   += $(B)/tests/mqtt_exactly_once
BENCHES += $(B)/bench/mqtt-store
endif

$(MQTT_MOD)/conn/tls.o: apps/mqtt/conn/tls.h include/weft.h
MQTT_STORE_OBJ := $(MQTT_MOD)/persist/store.o $(MQTT_MOD)/persist/store_queue.o
$(MQTT_STORE_OBJ): apps/mqtt/persist/store.h apps/mqtt/persist/store_queue.h include/weft.h

$(B)/tests/mqtt_tls: apps/mqtt/tests/tls_test.c $(MQTT_MOD)/conn/tls.o tests/test.c tests/test.h \
		$(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(MQTT_INC) $(LDFLAGS) -o $@ $< tests/test.c \
		$(MQTT_MOD)/conn/tls.o $(B)/libweft.a -lssl -lcrypto $(LDLIBS)
# its tests are in two files (store_fail_test.c: a store that cannot write)
MQTT_STORE_TESTS := apps/mqtt/tests/store_test.c apps/mqtt/tests/store_fail_test.c
$(B)/tests/mqtt_store: $(MQTT_STORE_TESTS) apps/mqtt/tests/store_test.h $(MQTT_STORE_OBJ) \
		tests/test.c tests/test.h $(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(MQTT_INC) $(LDFLAGS) -o $@ $(MQTT_STORE_TESTS) tests/test.c \
		$(MQTT_STORE_OBJ) $(B)/libweft.a -lsqlite3 $(LDLIBS)
$(B)/bench/mqtt-store: bench/mqtt-store.c bench/bench.h $(MQTT_STORE_OBJ) $(B)/libweft.a \
		| $(B)/bench
	$(CC) $(CFLAGS) -Ibench $(MQTT_INC) $(LDFLAGS) -o $@ $< $(MQTT_STORE_OBJ) \
		$(B)/libweft.a -lsqlite3 $(LDLIBS)
endif

# ---- scripts that run the broker ---------------------------------------------------------------

# The bridges against a real mosquitto as the remote broker (docs/weft-mqtt-bridges.md).
ifeq ($(ARCH),)
TESTS += $(B)/tests/mqtt-bridge

$(B)/tests/mqtt-bridge: apps/mqtt/tests/bridge_test.sh $(B)/bin/weft-mqtt | $(B)/tests
	cp $< $@
	chmod +x $@

# The layering of the broker: its objects (layers.sh reads them with nm) and its sources'
# #include lines.
TESTS += $(B)/tests/mqtt-layers

$(B)/tests/mqtt-layers: apps/mqtt/tests/layers.sh $(MQTT_OBJ) | $(B)/tests
	sed 's|@OBJS@|$(MQTT_OBJ:$(B)/obj/mqtt/%=%)|; s|@SRC@|$(CURDIR)/apps/mqtt|' $< > $@
	chmod +x $@
endif
