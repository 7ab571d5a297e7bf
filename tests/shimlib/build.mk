# tests/shimlib: third-party libraries that know nothing of weft, run inside tasks under the
# shim. libmosquitto (Debian libmosquitto-dev, which .ci/run installs for bench/mqtt) against
# the weft-mqtt broker of the same build. Native builds only, where the header is installed.
ifeq ($(ARCH)$(wildcard /usr/include/mosquitto.h),/usr/include/mosquitto.h)
TESTS += $(B)/tests/shim-mosquitto

$(B)/tests/shim-mosquitto: tests/shimlib/mosquitto.c tests/test.c tests/test.h $(B)/libweft.so $(B)/libweft-shim.so $(B)/bin/weft-mqtt | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< tests/test.c -L$(B) -lweft -Wl,-rpath,'$$ORIGIN/..' -lmosquitto $(LDLIBS)
endif
