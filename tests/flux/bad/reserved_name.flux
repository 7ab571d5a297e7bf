// expect: 2:6: 'weft_x' is reserved (names starting with weft_ or WEFT_, init, deinit)
node weft_x () => ();
