/* Types for tests/flux/features.flux, so that its generated C can be compiled (tests/flux.c). */
struct account;
struct table;
struct conn;
struct config;
