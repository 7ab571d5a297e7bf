/* The same flow with the Dwarf detached: it runs on the blocking pool, outside the workers. */
node SnowWhite () => (int apple_id);
node detached Dwarf (int apple_id) => ();
source SnowWhite -> Dwarf;
