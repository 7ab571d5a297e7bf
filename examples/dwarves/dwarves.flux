/* Snow White and the dwarves: every 0.1 ms Snow White hands out an apple, and a Dwarf takes
 * ten 0.1 ms naps to eat it. Both call plain usleep(). */
node SnowWhite () => (int apple_id);
node Dwarf (int apple_id) => ();
source SnowWhite -> Dwarf;
