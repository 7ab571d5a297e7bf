/* bench/flowchain: a source and four nodes in a chain, no sleeps: the run-time's cost. */
node Gen () => (long v);
node A (long v) => (long v);
node B (long v) => (long v);
node C (long v) => (long v);
node D (long v) => ();
source Gen -> A -> B -> C -> D;
