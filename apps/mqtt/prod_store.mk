# weft-mqtt production modules, part 2: TLS over weft sockets (tls.c) and durable storage on
# SQLite (store.c), with their tests and the store benchmark. See docs/weft-mqtt-durability.md.
#
#   make B=build build/tests/mqtt_tls build/tests/mqtt_store build/bench/mqtt-store
#
# They link -lssl -lcrypto -lsqlite3 (Debian libssl-dev, libsqlite3-dev), which the aarch64
# cross build does not have: there the modules and their tests are left out.
#
# The broker does not link these modules yet (see the report of issue #8 for the calls to
# wire in); when it does, build.mk's MQTT_OBJ/MQTT_LIBS take them. An older build.mk gathered
# every apps/mqtt/*.c into the broker and every apps/mqtt/tests/*.c into a test: while such a
# wildcard is in place, take tls.o and store.o out of its link lines (its recipe expands
# MQTT_OBJ when it runs), give the names its prerequisites hold an empty body, and drop the
# test binaries it would make of tls_test.c and store_test.c. With build.mk listing its
# sources by name this block does nothing.
PROD2_PHANTOM := $(filter $(B)/obj/mqtt/tls.o $(B)/obj/mqtt/store.o,$(MQTT_OBJ))
ifneq ($(PROD2_PHANTOM),)
MQTT_OBJ := $(filter-out $(PROD2_PHANTOM),$(MQTT_OBJ))
TESTS    := $(filter-out $(B)/tests/mqtt_tls_test $(B)/tests/mqtt_store_test,$(TESTS))
$(PROD2_PHANTOM): | $(B)/obj/mqtt
	echo 'typedef int weft_mqtt_not_linked_yet;' | $(CC) $(CFLAGS) -x c -c - -o $@
endif
# bench/*.c names the store benchmark too; it is built (below) only where SQLite links
BENCHES  := $(filter-out $(B)/bench/mqtt-store,$(BENCHES))

ifneq ($(ARCH),aarch64)
PROD2_DIR := $(B)/obj/mqtt-prod2
PROD2_TLS_LIBS := -lssl -lcrypto
PROD2_STORE_LIBS := -lsqlite3

TESTS   += $(B)/tests/mqtt_tls $(B)/tests/mqtt_store
BENCHES += $(B)/bench/mqtt-store

$(PROD2_DIR):
	mkdir -p $@
$(PROD2_DIR)/%.o: apps/mqtt/%.c apps/mqtt/%.h include/weft.h | $(PROD2_DIR)
	$(CC) $(CFLAGS) -iquote apps/mqtt -c $< -o $@

$(B)/tests/mqtt_tls: apps/mqtt/tests/tls_test.c $(PROD2_DIR)/tls.o tests/test.c tests/test.h \
		$(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests -iquote apps/mqtt $(LDFLAGS) -o $@ $< tests/test.c \
		$(PROD2_DIR)/tls.o $(B)/libweft.a $(PROD2_TLS_LIBS) $(LDLIBS)
$(B)/tests/mqtt_store: apps/mqtt/tests/store_test.c $(PROD2_DIR)/store.o tests/test.c \
		tests/test.h $(B)/libweft.a | $(B)/tests
	$(CC) $(CFLAGS) -Itests -iquote apps/mqtt $(LDFLAGS) -o $@ $< tests/test.c \
		$(PROD2_DIR)/store.o $(B)/libweft.a $(PROD2_STORE_LIBS) $(LDLIBS)
$(B)/bench/mqtt-store: bench/mqtt-store.c bench/bench.h $(PROD2_DIR)/store.o $(B)/libweft.a \
		| $(B)/bench
	$(CC) $(CFLAGS) -Ibench -iquote apps/mqtt $(LDFLAGS) -o $@ $< $(PROD2_DIR)/store.o \
		$(B)/libweft.a $(PROD2_STORE_LIBS) $(LDLIBS)
endif
