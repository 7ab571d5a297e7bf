# tests/shimlib: libraries that know nothing of weft, run inside tasks under the shim.
# libmosquitto (Debian libmosquitto-dev, which .ci/run installs for bench/mqtt) against the
# weft-mqtt broker of the same build. Native builds only, where the header is installed.
ifeq ($(ARCH)$(wildcard /usr/include/mosquitto.h),/usr/include/mosquitto.h)
TESTS += $(B)/tests/shim-mosquitto

$(B)/tests/shim-mosquitto: tests/shimlib/mosquitto.c tests/test.c tests/test.h $(B)/libweft.so $(B)/libweft-shim.so $(B)/bin/weft-mqtt | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< tests/test.c -L$(B) -lweft -Wl,-rpath,'$$ORIGIN/..' -lmosquitto $(LDLIBS)
endif

# liblockheld.so: a library of our own, written for threads, that holds a pthread mutex across
# usleep and read (tests/shimlib/locks.c). Built everywhere: it needs nothing installed.
TESTS += $(B)/tests/shim-locks

$(B)/tests/liblockheld.so: tests/shimlib/lockheld.c tests/shimlib/lockheld.h | $(B)/tests
	$(CC) $(CFLAGS) -shared $(LDFLAGS) -o $@ $< $(LDLIBS)
$(B)/tests/shim-locks: tests/shimlib/locks.c tests/shimlib/lockheld.h tests/test.c tests/test.h $(B)/libweft.so $(B)/libweft-shim.so $(B)/tests/liblockheld.so | $(B)/tests
	$(CC) $(CFLAGS) -Itests $(LDFLAGS) -o $@ $< tests/test.c -L$(B) -L$(B)/tests -lweft -llockheld -Wl,-rpath,'$$ORIGIN/..' -Wl,-rpath,'$$ORIGIN' $(LDLIBS)

# sqlite (tests/shimlib/sqlite.c): built with it where its header is installed (native builds),
# and skipped elsewhere.
TESTS += $(B)/tests/shim-sqlite
ifeq ($(ARCH)$(wildcard /usr/include/sqlite3.h),/usr/include/sqlite3.h)
SHIM_SQLITE := -DWEFT_TEST_SQLITE
SHIM_SQLITE_LIBS := -lsqlite3
endif
$(B)/tests/shim-sqlite: tests/shimlib/sqlite.c tests/test.c tests/test.h $(B)/libweft.so $(B)/libweft-shim.so | $(B)/tests
	$(CC) $(CFLAGS) $(SHIM_SQLITE) -Itests $(LDFLAGS) -o $@ $< tests/test.c -L$(B) -lweft -Wl,-rpath,'$$ORIGIN/..' $(SHIM_SQLITE_LIBS) $(LDLIBS)
