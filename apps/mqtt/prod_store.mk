# weft-mqtt production modules, part 2: TLS over weft sockets (tls.c) and durable storage on
# SQLite (store.c), with their tests and the store benchmark. See docs/weft-mqtt-durability.md.
#
#   make B=build build/tests/mqtt_tls build/tests/mqtt_store build/bench/mqtt-store
#   make B=build build/tests/mqtt_exactly_once
#
# They link -lssl -lcrypto -lsqlite3 (Debian libssl-dev, libsqlite3-dev), which the aarch64
# cross build does not have: there the modules and their tests are left out.
#
# The broker links tls.c (build.mk's MQTT_SRC); these are the modules' own tests.
# bench/*.c names the store benchmark too; it is built (below) only where SQLite links
BENCHES  := $(filter-out $(B)/bench/mqtt-store,$(BENCHES))

ifneq ($(ARCH),aarch64)
PROD2_DIR := $(B)/obj/mqtt-prod2
PROD2_TLS_LIBS := -lssl -lcrypto
PROD2_STORE_LIBS := -lsqlite3

# Each only where its library's header is installed, so that `make test` works on a machine
# with nothing but gcc and make (.ci/run installs both).
ifneq ($(wildcard /usr/include/openssl/ssl.h),)
TESTS   += $(B)/tests/mqtt_tls
endif
ifneq ($(wildcard /usr/include/sqlite3.h),)
TESTS   += $(B)/tests/mqtt_store
# the broker with persistence on, killed and starved (build.mk's rule for apps/mqtt/tests/*.c)
TESTS   += $(B)/tests/mqtt_exactly_once
BENCHES += $(B)/bench/mqtt-store
endif

$(PROD2_DIR):
	mkdir -p $@
$(PROD2_DIR)/%.o: apps/mqtt/%.c apps/mqtt/%.h include/weft.h | $(PROD2_DIR)
	$(CC) $(CFLAGS) -iquote apps/mqtt -c $< -o $@
# the store is two files (store.c, the writer and SQLite; store_queue.c, what callers run)
PROD2_STORE := $(PROD2_DIR)/store.o $(PROD2_DIR)/store_queue.o
$(PROD2_STORE): apps/mqtt/store.h apps/mqtt/store_queue.h

$(B)/tests/mqtt_tls: apps/mqtt/tests/tls_test.c $(PROD2_DIR)/tls.o tests/test.c tests/test.h \
		$(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests -iquote apps/mqtt $(LDFLAGS) -o $@ $< tests/test.c \
		$(PROD2_DIR)/tls.o $(B)/libweft.a $(PROD2_TLS_LIBS) $(LDLIBS)
# its tests are in two files (store_fail_test.c: a store that cannot write)
MQTT_STORE_TESTS := apps/mqtt/tests/store_test.c apps/mqtt/tests/store_fail_test.c
$(B)/tests/mqtt_store: $(MQTT_STORE_TESTS) apps/mqtt/tests/store_test.h $(PROD2_STORE) \
		tests/test.c tests/test.h $(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests -iquote apps/mqtt $(LDFLAGS) -o $@ $(MQTT_STORE_TESTS) tests/test.c \
		$(PROD2_STORE) $(B)/libweft.a $(PROD2_STORE_LIBS) $(LDLIBS)
$(B)/bench/mqtt-store: bench/mqtt-store.c bench/bench.h $(PROD2_STORE) $(B)/libweft.a \
		| $(B)/bench
	$(CC) $(CFLAGS) -Ibench -iquote apps/mqtt $(LDFLAGS) -o $@ $< $(PROD2_STORE) \
		$(B)/libweft.a $(PROD2_STORE_LIBS) $(LDLIBS)
endif
