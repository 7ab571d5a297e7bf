# tests/mqtt: end-to-end tests of weft-mqtt with real MQTT clients (mosquitto-clients, MQTT.js).
# The test binary is a script (see e2e.sh) that runs the broker built in the same build dir.
# Not in cross builds: qemu-user cannot run a script, and the broker under emulation would be
# too slow for tests that time keep-alives and expiries.
ifeq ($(ARCH),)
TESTS += $(B)/tests/mqtt-e2e

MQTT_E2E_BROKER := $(if $(wildcard apps/mqtt/weft-mqtt.mk),$(B)/bin/weft-mqtt)

$(B)/tests/mqtt-e2e: tests/mqtt/e2e.sh $(MQTT_E2E_BROKER) | $(B)/tests
	sed 's|@SRC@|$(CURDIR)/tests/mqtt|' $< > $@
	chmod +x $@
endif
