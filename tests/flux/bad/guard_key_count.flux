// expect: 3:22: guard 'G' takes 2 key arguments, not 1
exclusive G (int k, int j) => int *;
node A (int x, guard G(x) as g) => ();
