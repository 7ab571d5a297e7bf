# bench/mqtt: the MQTT load generator (on libmosquitto, Debian libmosquitto-dev) and the broker
# benchmark, weft-mqtt against mosquitto. Native builds only, and only where libmosquitto's
# header is installed (.ci/run installs it); otherwise there is nothing to build here.
ifeq ($(ARCH)$(wildcard /usr/include/mosquitto.h),/usr/include/mosquitto.h)
ALL     += $(B)/bin/weft-mqtt-load $(B)/bin/mqtt-floor
BENCHES += $(B)/bench/mqtt $(B)/bench/mqtt-persist

$(B)/bin/weft-mqtt-load: $(filter-out bench/mqtt/floor.c,$(wildcard bench/mqtt/*.c)) bench/mqtt/loadgen.h | $(B)/bin
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $(filter %.c,$^) -lmosquitto -lm $(LDLIBS)

# The floor bench/mqtt measures the brokers against (floor.c).
$(B)/bin/mqtt-floor: bench/mqtt/floor.c | $(B)/bin
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(LDLIBS)

# The benchmark is a script: it finds the load generator and the broker beside itself (in
# $(B)/bin), so `make bench` builds the broker too.
$(B)/bench/mqtt: bench/mqtt/run.sh $(B)/bench/mqtt-lib.sh $(B)/bin/weft-mqtt-load $(B)/bin/mqtt-floor | $(B)/bench $(if $(wildcard apps/mqtt/weft-mqtt.mk),$(B)/bin/weft-mqtt)
	cp $< $@
	chmod +x $@
# What persistence costs with persistent subscribers, weft-mqtt against mosquitto (persist.sh).
$(B)/bench/mqtt-persist: bench/mqtt/persist.sh $(B)/bench/mqtt-lib.sh $(B)/bin/weft-mqtt-load | $(B)/bench $(if $(wildcard apps/mqtt/weft-mqtt.mk),$(B)/bin/weft-mqtt)
	cp $< $@
	chmod +x $@
# Sourced by the two above; not executable, so that `make bench` does not run it.
$(B)/bench/mqtt-lib.sh: bench/mqtt/lib.sh | $(B)/bench
	cp $< $@
	chmod -x $@
endif
