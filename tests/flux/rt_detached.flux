/* A detached node that blocks its thread for 100 ms beside nodes that must keep going. */
node DGen () => (int i);
node abstract Both (int i) => ();
node detached Block (int i) => ();
node Quick (int i) => ();
source DGen -> Both;
Both : [isFourth] = Block;
Both : [*] = Quick;
condition isFourth (int i) => bool;
