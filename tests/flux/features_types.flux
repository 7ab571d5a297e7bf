/* included by features.flux */
node Stats (uint64_t n) => ();
