# weft-mqtt's bridges (apps/mqtt/bridge.c): tests against a real mosquitto as the remote broker.
# The test binary is a script (apps/mqtt/tests/bridge_test.sh) that runs the broker built in the
# same build dir, so it is built with it; it skips itself where mosquitto or mosquitto-clients
# are missing. Not in cross builds: qemu-user cannot run a script.
ifeq ($(ARCH),)
TESTS += $(B)/tests/mqtt-bridge

$(B)/tests/mqtt-bridge: apps/mqtt/tests/bridge_test.sh $(B)/bin/weft-mqtt | $(B)/tests
	cp $< $@
	chmod +x $@
endif
