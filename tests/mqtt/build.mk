# tests/mqtt: end-to-end tests of weft-mqtt with real MQTT clients (mosquitto-clients, MQTT.js).
# The test binary is a script (see e2e.sh); it runs the broker built in the same build dir
# (not in cross builds, where it skips).
TESTS += $(B)/tests/mqtt-e2e

MQTT_E2E_BROKER := $(if $(ARCH),,$(if $(wildcard apps/mqtt/build.mk),$(B)/bin/weft-mqtt))

$(B)/tests/mqtt-e2e: tests/mqtt/e2e.sh $(MQTT_E2E_BROKER) | $(B)/tests
	sed 's|@SRC@|$(CURDIR)/tests/mqtt|' $< > $@
	chmod +x $@
