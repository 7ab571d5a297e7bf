// expect: 3:22: readwrite guard 'R' is taken as R/read or R/write
readwrite R (int k) => int *;
node A (int x, guard R(x) as g) => ();
